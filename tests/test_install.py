"""The plain install: ``pip install logcapture`` has no embedded engine, no data-frame stack and
no Grafana SDK. Every command is run here with those modules made unimportable (a finder
that refuses them, as a venv without them would), in a process of its own: what works,
what says in one line how to get a store, and that nothing imports them on the way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("chdb", "pyarrow", "pandas", "numpy", "grafana_foundation_sdk")

# Runs the CLI with HEAVY absent from the path finder (what a venv without them gives:
# importlib.util.find_spec answers None, an import raises ModuleNotFoundError), then prints,
# as the last line of stderr, the HEAVY modules that some code looked for.
PLAIN = """
import importlib.machinery, json, sys
HEAVY = {heavy!r}
tried = []
path_find_spec = importlib.machinery.PathFinder.find_spec
def find_spec(name, path=None, target=None):
    if name.split(".")[0] in HEAVY:
        tried.append(name)
        return None
    return path_find_spec(name, path, target)
importlib.machinery.PathFinder.find_spec = find_spec
from logcapture.cli import main
try:
    main(sys.argv[1:])
finally:
    sys.stderr.write("\\nTRIED " + json.dumps(sorted(set(tried))) + "\\n")
"""


def plain(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str, list[str]]:
    p = subprocess.run([sys.executable, "-c", PLAIN.format(heavy=HEAVY), *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    err, _, tried = p.stderr.rstrip("\n").rpartition("\nTRIED ")
    return p.returncode, err.strip("\n"), json.loads(tried)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("LOGCAPTURE_")}
    e.update(HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state"),
             LOGCAPTURE_CONFIG=str(tmp_path / "no-config.yaml"),
             LOGCAPTURE_SPOOL=str(tmp_path / "spool"), PYTHONPATH=str(ROOT))
    return e


def test_dependencies_are_split_the_conventional_way() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for d in project["dependencies"]}
    assert not names & {"chdb", "chdb-core", "chdb-core-lite", "pyarrow", "pandas", "numpy",
                        "grafana-foundation-sdk", "pexpect"}, names
    extras = project["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["embedded"]] == ["chdb-core-lite"]
    assert [d.split(">")[0] for d in extras["grafana"]] == ["grafana-foundation-sdk"]
    assert "logcapture[embedded,grafana]" in extras["test"] and any(
        d.startswith("pexpect") for d in extras["test"])
    readme = (ROOT / "README.md").read_text()
    assert "pip install -q -e '.[embedded]'" in readme  # the quick start: the embedded store


def test_capture_works_and_store_commands_say_how_to_get_a_store(env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    code, err, tried = plain(["run", "--", sys.executable, "-c", "print('hello')"], env)
    assert code == 0, err
    assert tried == [], "capturing imported " + ", ".join(tried)
    code, out, tried = plain(["ls"], env)
    assert code == 0 and tried == [], (out, tried)
    store = tmp_path / "state" / "logcapture" / "store"
    for args in (["upload"], ["upload", "--all"], ["agent"], ["db", "init"]):
        code, err, _ = plain(args, env)
        assert code == 2, (args, code, err)
        line = f"logcapture: error: the embedded store ({store}) needs the chDB engine"
        assert err.startswith(line), (args, err)
        assert "\n" not in err, (args, err)  # one line
        assert "pip install 'logcapture[embedded]'" in err and "LOGCAPTURE_STORE=" in err
    assert not store.exists()
    # export reads the unshipped run from the spool; the engine writes the file
    code, err, _ = plain(["export", "latest"], env)
    assert code == 2 and "\n" not in err, err
    assert err.startswith("logcapture: error: writing an export needs the ClickHouse engine"), err
    assert "pip install 'logcapture[embedded]'" in err and "LOGCAPTURE_STORE=" in err
    # a store named on a server: no engine needed to try it (nothing listens there)
    code, err, tried = plain(["db", "init", "--store", "http://u:p@127.0.0.1:9/db"], env)
    assert code != 0 and "chDB" not in err and "Traceback" not in err, err
    assert tried == [], tried


def test_grafana_install_says_how_to_get_the_sdk(env: dict[str, str], tmp_path: Path) -> None:
    code, err, _ = plain(["grafana", "install", str(tmp_path / "g"), "--store-url",
                          "http://grafana:secret@ch:8123/logcapture"], env)
    assert code == 2 and "\n" not in err, err
    assert err == ("logcapture: error: building the dashboards needs Grafana's SDK, which is "
                   "not installed: pip install 'logcapture[grafana]'")
