"""records.kind_suffix: a record's kind is its last key. The writers keep to it, the byte-level
readers find records by it and nothing else, and no text can imitate it."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from logcapture.records import (
    KINDS,
    Command,
    End,
    Line,
    Lines,
    Metadata,
    Note,
    Progress,
    Record,
    Sample,
    Start,
    kind_suffix,
)
from logcapture.spool.reading import records_of_kinds

PACKAGE = Path(__file__).resolve().parent.parent / "logcapture"
TRICKY = 'he said "kind":"end"} and \\ left'  # text that spells an end record's suffix


def _one_of_each() -> list[Record]:
    return [
        Start(run="r", stream="run", seq=0, ts=1.0, command=["x"], host="h", pid=1),
        Line(run="r", stream="stdout", seq=0, ts=1.5, text=TRICKY),
        Line(run="r", stream="stdout", seq=1, ts=1.5, text="plain"),
        Note(run="r", stream="stdout", seq=2, ts=1.6, text=TRICKY),
        Command(run="r", stream="stdout", seq=3, ts=1.7, text="/LOGCOMMAND " + TRICKY),
        Metadata(run="r", stream="stdout", seq=4, ts=1.8, fields={"loss": 0.5, "k": TRICKY}),
        Metadata(run="r", stream="stdout", seq=5, ts=1.9, fields={"loss": math.nan}),
        Sample(run="r", stream="sample:h", seq=0, ts=2.0, node="h"),
        Progress(run="r", stream="progress:stdout", seq=0, ts=2.5, label=TRICKY, n=3.0,
                 total=10.0),
        End(run="r", stream="run", seq=1, ts=3.0, exit_status=0, signal=None,
            state="COMPLETED", duration=2.0),
    ]


def test_every_kind_is_written_last_by_every_writer() -> None:
    records = _one_of_each()
    assert {r.kind for r in records} == set(KINDS)  # a new kind must be added here
    for rec in records:
        line = rec.to_json().encode()
        assert line.endswith(kind_suffix(rec.kind)), line
        assert list(json.loads(line))[-1] == "kind"


def test_a_batch_of_lines_ends_each_line_with_its_kind() -> None:
    batch = Lines(run="r", stream="stdout", seq=7, ts=1.0, texts=("a", TRICKY, "é"))
    lines = batch.to_json().encode().split(b"\n")
    assert len(lines) == 3 and all(ln.endswith(kind_suffix("line")) for ln in lines)


def test_the_reader_finds_each_kind_and_text_never_imitates_one() -> None:
    records = _one_of_each()
    data = "".join(r.to_json() + "\n" for r in records).encode()
    found = records_of_kinds(data, KINDS)
    for kind in KINDS:
        assert [json.loads(ln) for ln in found[kind]] == [
            json.loads(r.to_json()) for r in records if r.kind == kind], kind
    assert len(found["end"]) == 1  # the Line, Note and Command spelling it are not ends


def test_kind_suffix_can_fail() -> None:
    assert not Line(run="r", stream="stdout", seq=0, ts=1.0, text="x").to_json().encode() \
        .endswith(kind_suffix("end"))
    assert kind_suffix("end") == b'"kind":"end"}'


def _kind_byte_literals(path: Path) -> list[int]:
    """Lines of ``path`` with a string or bytes literal that spells a record kind's JSON key."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            value = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            if '"kind":"' in value and not _is_docstring_text(value):
                out.append(node.lineno)
    return out


def _is_docstring_text(value: str) -> bool:
    return "``" in value  # prose quoting the contract, not a test of a kind


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_records_spells_the_kind_suffix(path: Path) -> None:
    # Every byte-level test of a record's kind goes through records.kind_suffix.
    if path == PACKAGE / "records.py":
        assert _kind_byte_literals(path), "the checker must see records.py's own literal"
        return
    assert not _kind_byte_literals(path), f"{path.name}: use records.kind_suffix"
