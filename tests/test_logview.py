"""The log view's rules on records (the SQL side is held equal to these in test_web.py and
test_grafana.py, on runs in the real store)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logcapture.logview import LogView, entries, note_text
from logcapture.records import Command, Line, Metadata, Note

R = "r"


def records():
    return [
        Line(R, "stdout", 0, 1.0, "start"),
        Line(R, "stdout", 1, 1.0, '{"epoch": 1}'),
        Metadata(R, "stdout", 2, 1.0, {"epoch": 1}),  # printed just before: shown once
        Line(R, "stderr", 0, 1.5, "oops"),
        Command(R, "stdout", 3, 2.0, '/LOGCOMMAND {"mode": "metadata"}', {"mode": "metadata"}),
        Note(R, "stdout", 4, 2.0, "mode", 0, "mode changed to metadata"),
        Note(R, "stderr", 1, 2.0, "mode", 0, "mode changed to metadata"),
        Metadata(R, "stdout", 5, 3.0, {"epoch": 2}),  # only the record kept: shown
        Note(R, "run", 0, 4.0, "warning", 0, "sampler stopped"),
        Note(R, "stderr", 2, 4.0, "repeat", 1, ""),
    ]


def test_stdout_only():
    assert [(e.kind, e.text) for e in entries(records())] == [
        ("line", "start"), ("line", '{"epoch": 1}'),
        ("command", '/LOGCOMMAND {"mode": "metadata"}'),
        ("note", "[logcapture: mode changed to metadata]"),
        ("metadata", '{"epoch":2}'),
        ("note", "[logcapture: warning: sampler stopped]")]


def test_with_stderr_each_mode_change_once():
    got = [(e.stream, e.text) for e in entries(records(), stderr=True)]
    assert got.count(("stdout", "[logcapture: mode changed to metadata]")) == 1
    assert not any(s == "stderr" and "mode changed" in t for s, t in got)
    assert ("stderr", "oops") in got
    assert ("stderr", "[logcapture: previous line repeated 1 more time, dropped]") in got


def test_stderr_alone_shows_its_copy_of_a_mode_change():
    # `logs --stream stderr`: the mode change still shows once, from the stream shown.
    got = [(e.stream, e.text) for e in LogView(streams=("stderr",)).feed(records())]
    assert got == [("stderr", "oops"), ("stderr", "[logcapture: mode changed to metadata]"),
                   ("run", "[logcapture: warning: sampler stopped]"),
                   ("stderr", "[logcapture: previous line repeated 1 more time, dropped]")]


def test_note_words():
    assert note_text("blank", 2, "") == "[logcapture: 2 more blank lines dropped]"
    assert note_text("cut", 10, "") == "[logcapture: line cut, 10 characters dropped]"


@given(st.lists(st.integers(0, 10), max_size=6), st.booleans())
def test_fed_in_pieces_or_at_once_the_same(cuts, stderr):
    recs = records()
    view = LogView(stderr)
    pieces = []
    start = 0
    for c in sorted(cuts):
        pieces += view.feed(recs[start:c])
        start = max(start, c)
    pieces += view.feed(recs[start:])
    assert pieces == entries(recs, stderr)
