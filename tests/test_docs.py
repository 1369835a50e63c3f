"""The user, admin and CLI docs against the code: every command, option and configuration key
a user can give is described where a user looks for it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from logcapture.cli import cli
from logcapture.config import admin as admin_config
from logcapture.config import optin as optin_config

DOCS = Path(__file__).parent.parent / "docs"
CLI_MD = (DOCS / "cli.md").read_text(encoding="utf-8")

# Commands started by logcapture's own parts, not typed by a person: their options are an
# interface between those parts, and the section says who starts them.
INTERNAL = {"logcapture slurm task": "the SPANK plugin starts it in each task",
            "logcapture slurm sampler": "the prolog starts it, the epilog stops it"}


def commands(group: click.Group, path: tuple[str, ...] = ("logcapture",)
             ) -> Iterator[tuple[str, click.Command]]:
    for name, sub in group.commands.items():
        if sub.hidden:
            continue
        if isinstance(sub, click.Group):
            yield from commands(sub, (*path, name))
        else:
            yield " ".join((*path, name)), sub


def section(name: str) -> str:
    """The text of the command's ``###`` section in cli.md, with the intro of the ``##``
    section it is in (options several commands share are described there once) and the docs
    the section links to."""
    heads = [(m.start(), m.group(0)) for m in re.finditer(r"^#+ .*$", CLI_MD, re.M)]
    at = [i for i, (_, head) in enumerate(heads)
          if head.startswith("### ") and re.search("`" + re.escape(name) + r"(\W|$)", head)]
    assert at, f"docs/cli.md has no section for `{name}`"
    i = at[0]
    own = CLI_MD[heads[i][0]:heads[i + 1][0] if i + 1 < len(heads) else len(CLI_MD)]
    parent = max(j for j in range(i) if heads[j][1].startswith("## "))
    intro = CLI_MD[heads[parent][0]:heads[parent + 1][0]]
    linked = [(DOCS / link).read_text(encoding="utf-8")
              for link in re.findall(r"\]\(([a-z]+\.md)(?:#[^)]*)?\)", own)]
    return "\n".join([own, intro, *linked])


@pytest.mark.parametrize(("name", "command"), list(commands(cli)), ids=lambda x: str(x))
def test_every_command_and_option_is_in_the_cli_doc(name: str, command: click.Command) -> None:
    text = section(name)
    if name in INTERNAL:
        return
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = [o for o in param.opts + param.secondary_opts if o != "--help"]
        assert any(re.search(re.escape(o) + r"(?![\w-])", text) for o in names), (
            f"docs/cli.md: `{name}` does not describe {' / '.join(names)}")


def test_every_admin_config_key_is_in_the_admin_doc() -> None:
    admin = (DOCS / "admin.md").read_text(encoding="utf-8")
    missing = [k for k in admin_config._ADMIN_SCHEMA if not re.search(rf"`{k}\b", admin)]
    assert not missing, f"docs/admin.md does not describe {missing}"


def test_every_logoptin_key_is_in_the_user_doc() -> None:
    user = (DOCS / "user.md").read_text(encoding="utf-8")
    missing = [k for k in optin_config._OPTIN_SCHEMA if not re.search(rf"`{k}\b", user)]
    assert not missing, f"docs/user.md does not describe {missing}"
