"""One line number everywhere (logview.py): every stored line of a run has one number, 1-based,
in the log's order over both streams; `logs -n`, `search`, `show`'s evidence, `export` and the
job page's entries give the same one, from the spool and from the store (a run captured with
the real `logcapture run` and shipped with the real `logcapture upload`), and the SQL numbers
as the Python does."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import env_for, lc
from pages import Serve

from logcapture.logview import LogView, numbered_lines, sort_key
from logcapture.pipeline import Pipeline
from logcapture.records import Command, Line, Metadata, Note
from logcapture.spool.layout import create_run_dir, segments
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

R = "r"

# Both streams interleaved, metadata (shown in mode metadata only), two commands, a line a
# mode drops, repeats (a note), and a failure whose traceback `show` quotes as evidence.
JOB = r"""
import json, sys, time
print("starting", flush=True)
for i in range(40):
    print(f"out {i}", flush=True)
    if i % 3 == 0:
        print(f"err {i}", file=sys.stderr, flush=True)
    time.sleep(0.005)
print(json.dumps({"step": 1}), flush=True)
time.sleep(0.2)
print('/LOGCOMMAND {"mode": "metadata"}', flush=True)
print("private text", flush=True)
print(json.dumps({"step": 2}), flush=True)
print('/LOGCOMMAND {"mode": "enabled"}', flush=True)
time.sleep(0.2)
for i in range(3):
    print("again", flush=True)
time.sleep(0.1)
raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


def test_the_view_numbers_lines_and_commands_of_both_streams_and_nothing_else():
    recs = [
        Line(R, "stdout", 0, 1.0, "a"),
        Line(R, "stdout", 1, 1.0, '{"x": 1}'),
        Metadata(R, "stdout", 2, 1.0, {"x": 1}),  # its line is shown: no entry
        Line(R, "stderr", 0, 1.5, "b"),
        Command(R, "stdout", 3, 2.0, '/LOGCOMMAND {"mode": "metadata"}', {"mode": "metadata"}),
        Note(R, "stdout", 4, 2.0, "mode", 0, "mode changed"),
        Metadata(R, "stdout", 5, 3.0, {"x": 2}),  # shown, as the only trace of its line
        Note(R, "run", 0, 4.0, "warning", 0, "sampler stopped"),
        Line(R, "stderr", 1, 5.0, "c"),
    ]
    both = [(e.text, e.line) for e in LogView(stderr=True).feed(recs)]
    assert both == [("a", 1), ('{"x": 1}', 2), ("b", 3), ('/LOGCOMMAND {"mode": "metadata"}', 4),
                    ("[logcapture: mode changed]", 0), ('{"x":2}', 0),
                    ("[logcapture: warning: sampler stopped]", 0), ("c", 5)]
    # A stream not shown still counts: the numbers are the run's, not the view's.
    assert [(e.text, e.line) for e in LogView(streams=("stderr",)).feed(recs)
            if e.line] == [("b", 3), ("c", 5)]
    # Fed in pieces, or from a count of the lines before (a page), the same numbers.
    view = LogView(stderr=True)
    pieces = [e.line for r in recs for e in view.feed([r])]
    assert pieces == [n for _, n in both]
    assert [e.line for e in LogView(stderr=True, lines=2).feed(recs[3:])] == [3, 4, 0, 0, 0, 5]


def test_a_segment_counts_its_lines_by_the_kind_at_the_end():
    recs = [Line(R, "stdout", 0, 1.0, '"kind":"line"}'),  # the text cannot fool it
            Metadata(R, "stdout", 1, 1.0, {"kind": "line"}),
            Command(R, "stderr", 0, 1.0, "/LOGCOMMAND {}", {}),
            Note(R, "stdout", 2, 1.0, "repeat", 1, "")]
    assert numbered_lines(r.to_json().encode() for r in recs) == 2


def test_the_spool_holds_both_streams_in_the_logs_order_when_they_share_a_read_time(
        tmp_path: Path):
    # One round's lines of both streams have one read time; stdout's are released first
    # (it was fed first), so stderr's, which sort first at the same time, get the next float:
    # the order of writing is the log's order, (ts, stream, seq).
    p = Pipeline(R, SpoolWriter(create_run_dir(tmp_path, R), fsync=False), mode="enabled",
                 columns=80, rows=24)
    t = 1000.0
    p.feed("stdout", b"o1\no2\n", t, t, [(6, t, False)])
    p.feed("stderr", b"e1\n", t, t, [(3, t, True)])
    p.feed("stdout", b'/LOGCOMMAND {"mode": "enabled"}\n', t + 1, t + 1)
    p.feed("stderr", b"e2\n", t + 1, t + 1)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    recs = [r for r in iter_run(tmp_path / R) if r.stream in ("stdout", "stderr")]
    keys = [(r.ts, r.stream, r.seq) for r in recs]
    assert keys == sorted(keys)
    assert [getattr(r, "text", "") for r in recs if r.kind == "line"][:3] == ["o1", "o2", "e1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run ``n``, read from the spool before it is shipped (``--source spool``) and from
    the store after (``--source store``): the same run, so the same numbers."""
    tmp = tmp_path_factory.mktemp("lines")
    env = env_for(tmp)
    done = lc(["run", "--run-id", "n", "--", sys.executable, "-c", JOB], env, check=False)
    assert done.returncode == 1  # the job's own status
    return env, tmp


def _logs_n(env: dict[str, str], source: str, *args: str) -> list[tuple[int, str]]:
    out = lc(["logs", "-n", "--source", source, *args, "n"], env, check=True).stdout.decode()
    got = []
    for row in out.splitlines():
        number, _, text = row.partition("\t")
        got.append((int(number) if number.strip() else 0, text))
    return got


def _search(env: dict[str, str], source: str, word: str) -> dict[str, int]:
    out = lc(["search", "--source", source, "-C", "2", word], env, check=True).stdout.decode()
    return {m.group(3): int(m.group(2)) for m in
            map(re.compile(r"^(stdout|stderr):(\d+)[:-](.*)$").match, out.splitlines()) if m}


def _evidence(env: dict[str, str], source: str) -> list[dict[str, Any]]:
    info = json.loads(lc(["show", "--json", "--source", source, "n"], env, check=True).stdout)
    return [e for i in info["insights"] for e in i["evidence"] if e.get("text")]


def _export(env: dict[str, str], source: str) -> dict[str, int]:
    out = lc(["export", "--source", source, "--what", "lines", "--format", "csv", "n"],
             env, check=True).stdout.decode()
    return {(r["stream"], r["seq"]): int(r["line"]) for r in csv.DictReader(io.StringIO(out))
            if r["line"]}


def _page(base: str, token: str, **params: Any) -> dict[str, Any]:
    return httpx.get(f"{base}/api/runs/n/log", params={"token": token, **params},
                     timeout=30).json()


def _views(env: dict[str, str], source: str) -> dict[str, Any]:
    return {"logs": _logs_n(env, source), "stderr": _logs_n(env, source, "--stream", "stderr"),
            "search out": _search(env, source, "out"), "search err": _search(env, source, "err"),
            "evidence": _evidence(env, source), "export": _export(env, source)}


def test_every_view_gives_every_line_one_number_from_the_spool_and_the_store(run):
    env, tmp = run
    spool = _views(env, "spool")
    records = list(iter_run(tmp / "spool" / "n"))
    truth = LogView(stderr=True).feed(records)
    assert [(e.line, e.text) for e in truth] == spool["logs"]
    numbered = [e for e in truth if e.line]
    assert [e.line for e in numbered] == list(range(1, len(numbered) + 1))
    assert {e.stream for e in numbered} == {"stdout", "stderr"}
    assert [e.line for e in truth if e.kind in ("note", "metadata")] == [0] * 4
    assert not any("private" in e.text for e in truth)
    by_text = {e.text: e.line for e in numbered}
    # logs --stream stderr: the run's numbers, not the stream's
    assert [x for x in spool["stderr"] if x[0]] == [(e.line, e.text) for e in numbered
                                                    if e.stream == "stderr"]
    # search: STREAM:N: for matches and context alike
    for found in (spool["search out"], spool["search err"]):
        assert found and all(by_text[t] == n for t, n in found.items())
    # show's evidence: the traceback's lines
    assert spool["evidence"] and all(by_text[e["text"]] == e["line"]
                                     for e in spool["evidence"])
    # export: a line column
    assert spool["export"] == {(e.stream, str(e.seq)): e.line for e in numbered}

    # The store: the same run shipped gives the same numbers everywhere.
    lc(["upload", "n"], env, check=True)
    assert _views(env, "store") == spool

    # The page's entries, from the spool and the store, in pages from either end, and the
    # page that a #L link opens.
    with Serve(env) as s:  # a shipped run is read from the store
        _page_numbers_are_the_logs(s.base, s.token, truth)
    with Serve({**env, "LOGCAPTURE_STORE": f"chdb://{tmp / 'elsewhere'}"}) as s:
        _page_numbers_are_the_logs(s.base, s.token, truth)  # no store has it: the spool


def _page_numbers_are_the_logs(base: str, token: str, truth: list[Any]) -> None:
    want = [(e.line or None, e.text) for e in truth]
    for limit in (7, 1000):
        got: list[tuple[int | None, str]] = []
        before = None
        while True:
            page = _page(base, token, stderr=1, limit=limit,
                         **({"before": before} if before else {}))
            got = [(e["line"], e["text"]) for e in page["entries"]] + got
            if not page["more"]:
                break
            before = page["entries"][0]["cursor"]
        assert got == want
    for n in (1, 17, max(e.line for e in truth)):
        page = _page(base, token, stderr=1, limit=3, line=n)
        first = page["entries"][0]
        if n == 1:  # a stream's first record: the page begins at its time stamp
            first = next(e for e in page["entries"] if e["line"])
        assert first["line"] == n and first["text"] == next(e.text for e in truth
                                                             if e.line == n)
    missing = httpx.get(f"{base}/api/runs/n/log", params={"token": token, "line": 100000},
                        timeout=30)
    assert missing.status_code == 404 and "no line 100000" in missing.text


def test_the_sql_numbers_as_the_python_does(run):
    # Store.line_numbers (logview.line_numbers_sql) against LogView, for every line and for
    # keys of one window (a count before, rows after), on the run in the real store.
    from logcapture.logview import ts_ns
    from logcapture.store import open_store

    env, tmp = run
    shipped = lc(["upload", "n"], env, check=False)  # unless the test before shipped it
    assert shipped.returncode == 0 or b"already" in shipped.stderr, shipped.stderr
    truth = [e for e in LogView(stderr=True).feed(iter_run(tmp / "spool" / "n")) if e.line]
    records = {(r.stream, r.seq): r for r in iter_run(tmp / "spool" / "n")}
    keys = [(e.stream, e.seq, ts_ns(records[(e.stream, e.seq)].ts)) for e in truth]
    st = open_store(f"chdb://{tmp / 'state' / 'logcapture' / 'store'}")
    try:
        assert st.line_numbers("n", None, keys) == {(e.stream, e.seq): e.line for e in truth}
        window = keys[10:20]
        assert st.line_numbers("n", None, window) == {
            (e.stream, e.seq): e.line for e in truth[10:20]}
        assert st.line_numbers("n", None, [(s, q) for s, q, _ in window[:2]]) == {
            (e.stream, e.seq): e.line for e in truth[10:12]}
        assert st.line_key("n", None, 5) == (keys[4][2], keys[4][0], keys[4][1])
        assert st.line_key("n", None, len(truth) + 1) is None
    finally:
        st.close()
    assert segments(tmp / "spool" / "n")  # read from the spool's own records
    assert sorted(truth, key=sort_key) == truth


def test_the_read_service_takes_a_line_number():
    from logcapture.errors import UsageError
    from logcapture.reader.protocol import parse_request

    req = parse_request(b'{"op": "log", "run": "r", "line": 12345678901}')
    assert req.args["line"] == 12345678901
    for bad in (b"0", b"-3", b'"7"', b"true", b"1.5"):
        with pytest.raises(UsageError, match="'line' must be a line number"):
            parse_request(b'{"op": "log", "run": "r", "line": ' + bad + b"}")
