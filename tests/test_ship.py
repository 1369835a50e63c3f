"""Shipping against the real embedded engine (chDB): spool -> store equals the spool, the
shared cursor, an agent killed with SIGKILL, unreachable and locked stores, 100 concurrent
runs, every failure class with its exit code and message. Spools are made with SpoolWriter.
"""

from __future__ import annotations

import gzip
import http.server
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from logcapture import ownership, ship
from logcapture import store as S
from logcapture.records import OUTPUT_STREAMS, End, Line, Metadata, Note, Start
from logcapture.ship import agent as ship_agent
from logcapture.ship import pending as ship_pending
from logcapture.ship import uploading as ship_uploading
from logcapture.spool.layout import Segment, create_run_dir, segments
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

T0 = time.time()
HELPER = r"""
import sys, time
from pathlib import Path
from logcapture import ship, store
from logcapture.ship import agent as ship_agent  # where the agent opens the store
mode, root, dsn = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if sys.argv[5:] == ["server-async"]:  # a server's write path on the embedded engine
    real_open = ship_agent.open_store
    def server_like(*args, **kw):
        st = real_open(*args, **kw)
        st.embedded = False  # every record through ingest, no file reads
        st.async_insert = True
        return st
    ship_agent.open_store = server_like
if mode == "agent-killed":  # SIGKILLs itself right after its third insert, cursor not saved
    import os, signal
    inserts = [0]
    def killing(real):
        def insert(self, *args, **kw):
            out = real(self, *args, **kw)
            inserts[0] += 1
            if inserts[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return insert
    store.Store.insert_segments = killing(store.Store.insert_segments)
    store.Store.insert_many = killing(store.Store.insert_many)
    mode = "agent"
if mode == "agent":
    a = ship.Agent(root, dsn, batch_bytes=int(sys.argv[4]), batch_interval=0.05, poll=0.02,
                   retention_days=None)
    a.install_signal_handlers()
    print("ready", flush=True)
    st = a.run()
    print("stopped", st.records, flush=True)
elif mode == "outage":  # the fake server's DSN until a flag file appears, then the store
    fake, flag, remind, read_timeout = sys.argv[4], Path(sys.argv[5]), sys.argv[6], sys.argv[7]
    real_open = ship_agent.open_store
    ship_agent.open_store = lambda _dsn, **kw: real_open(dsn if flag.exists() else fake, **kw)
    a = ship.Agent(root, dsn, batch_interval=0.05, poll=0.02, retention_days=None,
                   log=lambda m: print(m, flush=True), retry=ship.RetryPolicy(0.05, 0.2),
                   remind_every=float(remind), timeouts=(1, int(read_timeout)))
    a.install_signal_handlers()
    print("ready", flush=True)
    st = a.run()
    print("stopped", st.records, flush=True)
elif mode == "hold":
    with store.open_store(dsn):
        print("holding", flush=True)
        time.sleep(60)
"""


def make_run(root: Path, run: str, n: int, *, segment_bytes: int = 64 * 1024,
             end: bool = True, extra: list[bytes] | None = None) -> Path:
    rd = create_run_dir(root, run)
    w = SpoolWriter(rd, segment_bytes=segment_bytes, fsync=False, flush_interval=60)
    w.write([Start(run=run, stream="run", seq=0, ts=T0, command=["job"], user="u",
                   uid=os.getuid())])
    w.write([Line(run=run, stream=OUTPUT_STREAMS[i % 2], seq=i // 2, ts=T0 + i * 1e-6,
                  text=f"{run} line {i} " + "x" * (i % 50)) for i in range(n)])
    w.write([Note(run=run, stream="stdout", seq=(n + 1) // 2, ts=T0 + 1, note="repeat",
                  count=2, text="2 repeats"),
             Metadata(run=run, stream="stdout", seq=(n + 1) // 2 + 1, ts=T0 + 2,
                      fields={"epoch": 1, "loss": 0.5})])
    w.flush()
    if extra:
        seg = segments(rd)[-1]
        with open(seg.path, "ab") as f:
            f.write(b"".join(x + b"\n" for x in extra))
    if end:
        w.write([End(run=run, stream="run", seq=1, ts=T0 + 3, exit_status=0,
                     state="COMPLETED")])
        w.close()
    else:
        w.flush()
        w._closed = True  # leave the segment open, as a running job's (no compress)
        w._wake.set()
        w._thread.join()
    return rd


def counts(dsn: str, run: str) -> tuple[int, int, int]:
    """(rows with FINAL, rows without FINAL, distinct identities) of the run's lines."""
    with S.open_store(dsn, wait=30) as st:
        q = st.client.command
        final = int(q("SELECT count() FROM lines FINAL WHERE run = {r:String}",
                      parameters={"r": run}))
        raw = int(q("SELECT count() FROM lines WHERE run = {r:String}", parameters={"r": run}))
        distinct = int(q("SELECT uniqExact(stream, seq) FROM lines WHERE run = {r:String}",
                         parameters={"r": run}))
    return final, raw, distinct


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb://{tmp_path_factory.mktemp('shipstore') / 'store'}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_spool_to_store_equals_the_spool(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    rd = make_run(root, "eq1", 3000, segment_bytes=16 * 1024)
    assert len(segments(rd)) > 3
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0, res
    assert res.runs == ["eq1"] and res.records == 3000 + 4
    spool = [r.to_dict() for r in iter_run(rd)]
    with S.open_store(dsn) as st:
        shown = st.lines("eq1")
        everything = st.records("eq1")
    want = [d for d in spool if d["kind"] not in ("start", "end", "sample")]
    key = lambda d: (d["ts"], d["stream"], d["seq"])  # noqa: E731
    assert shown == sorted(want, key=key)
    assert sorted(everything, key=lambda d: (d["stream"], d["seq"])) == \
        sorted(spool, key=lambda d: (d["stream"], d["seq"]))


def test_single_run_refused_when_shipped_all_skips_force_reships(tmp_path: Path,
                                                                  dsn: str) -> None:
    root = tmp_path / "spool"
    make_run(root, "a1", 10)
    make_run(root, "a2", 10)
    res = ship.upload(root, all=True, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and res.runs == ["a1", "a2"]
    res = ship.upload(root, dsn=dsn)  # latest run, already shipped
    assert res.exit_code == 2
    assert "run a2 was already uploaded on" in res.error and "--force" in res.error
    res = ship.upload(root, run="a1", dsn=dsn)
    assert res.exit_code == 2 and "a1 was already uploaded" in res.error
    res = ship.upload(root, all=True, dsn=dsn)
    assert res.exit_code == 0 and res.skipped == ["a1", "a2"] and res.records == 0
    res = ship.upload(root, run="a1", force=True, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and res.records == 14
    final, raw, _ = counts(dsn, "a1")
    assert final == 10 and raw in (10, 20)  # re-sent: a second copy until merged, shown once


def test_cursor_keys_by_segment_index_across_gzip_rename(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    rd = make_run(root, "grow", 100, end=False)
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and res.records == 103
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    assert cur["lines"] == {"0": 103} and not cur["shipped_at"]
    # the open segment is closed (renamed to .gz) and the run goes on in a new segment
    seg = segments(rd)[0]
    assert not seg.closed
    data = seg.path.read_bytes()
    (rd / (seg.path.name + ".gz")).write_bytes(gzip.compress(data))
    seg.path.unlink()
    w = SpoolWriter(rd, fsync=False)  # continues at the next index
    w._index = 0
    w._fd = -1
    w.write([Line(run="grow", stream="stdout", seq=1000 + i, ts=T0, text="more")
             for i in range(5)])
    w.write([End(run="grow", stream="run", seq=1, ts=T0 + 9, state="COMPLETED")])
    w.close()
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and res.records == 6, res
    assert counts(dsn, "grow") == (105, 105, 105)
    assert json.loads((rd / ship.CURSOR_NAME).read_text())["shipped_at"]


def test_corrupt_and_torn_lines_skipped_counted_reported(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    rd = make_run(root, "corrupt", 20, extra=[b"this is not json", b'{"kind":"nope"}'])
    seg = segments(rd)[-1]
    raw = gzip.decompress(seg.path.read_bytes()) + b'{"kind":"line","run":"corr'
    seg.path.write_bytes(gzip.compress(raw))  # a torn last line in a closed segment
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 1
    assert [(r, no) for r, _, no, _ in res.bad_lines] == [("corrupt", 24), ("corrupt", 25)]
    assert res.torn == 1 and res.records == 20 + 4
    assert "2 corrupt line(s) skipped" in res.summary() and "1 torn" in res.summary()
    assert counts(dsn, "corrupt") == (20, 20, 20)


@pytest.mark.parametrize("closing_call", [1, 2])
def test_a_segment_the_writer_closes_while_shipping_is_read_closed(
        tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch, closing_call: int) -> None:
    """A live run's open segment is closed by its writer (gzip, rename, unlink:
    ``SpoolWriter._compress``) between the shipper's listing and its reading: when the shipper
    reads the run's identity (call 1) or its pending lines (call 2). The shipper reads the
    closed segment: nothing is set aside and the run is complete (it was once set aside for
    good, and the agent never finished the run)."""
    root = tmp_path / "spool"
    rd = make_run(root, "closing", 500, end=False)
    end = End(run="closing", stream="run", seq=1, ts=T0 + 3, exit_status=0, state="COMPLETED")
    real = segments
    calls: list[bool] = []

    def listing_then_close(run_dir: Path) -> list:  # type: ignore[type-arg]
        segs = real(run_dir)
        closing = len(calls) + 1 == closing_call
        calls.append(closing)
        for s in segs:
            if closing and not s.closed:
                data = s.path.read_bytes() + end.to_json().encode() + b"\n"
                s.path.with_name(s.path.name + ".gz").write_bytes(gzip.compress(data))
                s.path.unlink()
        return segs

    for module in (ownership, ship_pending):  # the identity's reading, the lines'
        monkeypatch.setattr(module, "segments", listing_then_close)
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert calls[closing_call - 1], calls
    assert res.exit_code == 0, res
    assert not res.set_aside and not res.warnings, res
    assert res.records == 500 + 4  # start, lines, note, metadata, end
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    assert cur["shipped_at"] and cur["end_shipped"]


def test_closed_segments_are_read_by_the_store_itself(tmp_path: Path, dsn: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole closed segments are not decompressed here: the engine reads the descriptors the
    shipper opened (only the open segment, and a closed one partly shipped, are read here)."""
    root = tmp_path / "spool"
    rd = make_run(root, "direct", 3000, segment_bytes=16 * 1024, end=False)
    read_here: list[str] = []
    real = ship_pending.read_segment_bytes

    def spy(seg, skip=0):  # noqa: ANN001, ANN202
        read_here.append(seg.path.name)
        return real(seg, skip)

    monkeypatch.setattr(ship_pending, "read_segment_bytes", spy)
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0, res
    segs = segments(rd)
    assert sum(s.closed for s in segs) > 3
    assert read_here == [s.path.name for s in segs if not s.closed]
    assert res.records == 3000 + 3
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    with_lines = {s.index: len(gzip.decompress(s.path.read_bytes()).splitlines())
                  for s in segs if s.closed}
    assert {int(k): v for k, v in cur["lines"].items() if int(k) in with_lines} == with_lines
    assert counts(dsn, "direct") == (3000, 3000, 3000)
    with S.open_store(dsn) as st:
        got = st.records("direct")
    assert got == sorted((r.to_dict() for r in iter_run(rd)),
                         key=lambda d: (d["kind"] != "start", d["ts"], d["stream"], d["seq"]))


def test_closed_segment_bad_records_reported_symlink_set_aside(tmp_path: Path, dsn: str) -> None:
    """In a closed segment read by the engine: a line record with a key of another record or
    an owner of its own, or without seq, is reported by line number and never stored; a
    segment that is a symlink (here to another run's segment) is set aside, never read."""
    root = tmp_path / "spool"
    other = make_run(root, "victim", 50, segment_bytes=1 << 20)
    rd = make_run(root, "forger", 20, segment_bytes=1 << 20)
    seg = segments(rd)[0]
    lines = gzip.decompress(seg.path.read_bytes()).splitlines(keepends=True)
    lines[3:3] = [b'{"run":"forger","stream":"stdout","seq":900,"ts":1.5,"owner":"root",'
                  b'"text":"x","kind":"line"}\n',
                  b'{"run":"forger","stream":"stdout","seq":901,"ts":1.5,"note":"repeat",'
                  b'"text":"y","kind":"line"}\n',
                  b'{"run":"forger","stream":"stdout","ts":1.5,"text":"z","kind":"line"}\n']
    seg.path.write_bytes(gzip.compress(b"".join(lines)))
    os.symlink(segments(other)[0].path, rd / "seg-000007.ndjson.gz")
    res = ship.upload(root, run="forger", dsn=dsn, retention_days=None)
    assert res.exit_code == 1
    assert [no for _, _, no, _ in res.bad_lines] == [4, 5, 6]
    assert [(r, s) for r, s, _ in res.set_aside] == [("forger", "seg-000007.ndjson.gz")]
    assert counts(dsn, "forger") == (20, 20, 20)
    with S.open_store(dsn) as st:
        assert {d["text"] for d in st.lines("forger") if d["kind"] == "line"} == \
            {f"forger line {i} " + "x" * (i % 50) for i in range(20)}
        assert not st.has_run("victim")
    # a segment of line records only is read with their keys alone: an owner is refused too
    rd = create_run_dir(root, "forger2")
    lines = [Line(run="forger2", stream="stdout", seq=i, ts=T0 + i, text=f"t{i}").to_json()
             .encode() + b"\n" for i in range(5)]
    lines[2] = (b'{"run":"forger2","stream":"stdout","seq":2,"ts":1.5,"owner":"root",'
                b'"text":"x","kind":"line"}\n')
    (rd / "seg-000000.ndjson.gz").write_bytes(gzip.compress(b"".join(lines)))
    res = ship.upload(root, run="forger2", dsn=dsn, retention_days=None)
    assert res.exit_code == 1 and [no for _, _, no, _ in res.bad_lines] == [3]
    assert "unknown field" in res.bad_lines[0][3]
    assert counts(dsn, "forger2") == (4, 4, 4)


def test_data_error_sets_segment_aside_rest_continues(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    rd = create_run_dir(root, "aside")
    w = SpoolWriter(rd, segment_bytes=1024, fsync=False)
    w.write([Start(run="aside", stream="run", seq=0, ts=T0)])
    w.write([Line(run="aside", stream="stdout", seq=i, ts=T0, text="y" * 100)
             for i in range(30)])
    w.flush()
    # a record the spool reader accepts but the store refuses (seq < 0 into UInt64, code 72)
    w.write([Line(run="aside", stream="stdout", seq=-1, ts=T0, text="bad")])
    w.write([Line(run="aside", stream="stdout", seq=100 + i, ts=T0, text="z" * 100)
             for i in range(30)])
    w.write([End(run="aside", stream="run", seq=1, ts=T0, state="COMPLETED")])
    w.close()
    res = ship.upload(root, dsn=dsn, retention_days=0)
    assert res.exit_code == 1
    assert len(res.set_aside) == 1
    run, seg_name, why = res.set_aside[0]
    assert run == "aside" and "refused the data" in why and "Code: 72" in why
    assert (rd / seg_name).exists()  # never deleted
    final = counts(dsn, "aside")[0]
    assert 50 <= final < 60  # everything but the set-aside segment's lines
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    assert list(cur["aside"]) and not cur["shipped_at"]
    # the log says where lines are missing, once, however often the run is shipped again
    ship.upload(root, dsn=dsn, retention_days=0)
    with S.open_store(dsn, wait=30) as st:
        notes = [d for d in st.lines("aside") if d["kind"] == "note"]
    assert len(notes) == 1 and seg_name in notes[0]["text"]
    assert "the lines it held are missing here" in notes[0]["text"]
    with S.open_store(dsn, wait=30) as st:
        [row] = st.runs(None, "aside")
        stored = st.insights("aside")
    assert "incomplete" in row["insights"]  # ls marks it
    [gap] = [i for i in stored if i["kind"] == "incomplete"]
    assert gap["details"]["segments"] == 1


def test_retention_deletes_only_accepted_closed_segments(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    rd = make_run(root, "ret", 500, segment_bytes=4096, end=False)
    n_before = len(segments(rd))
    res = ship.upload(root, dsn=dsn, retention_days=0)
    assert res.exit_code == 0
    left = segments(rd)
    assert len(left) == 1 and not left[0].closed  # the open one stays
    assert res.deleted == n_before - 1
    assert counts(dsn, "ret")[0] == 500


def test_unreachable_http_store_keeps_spool_later_upload_ships(tmp_path: Path,
                                                               dsn: str) -> None:
    root = tmp_path / "spool"
    rd = make_run(root, "unreach", 50)
    before = sorted(p.name for p in rd.iterdir())
    url = f"http://default:x@127.0.0.1:{_free_port()}/logcapture"
    t = time.monotonic()
    res = ship.upload(root, dsn=url, deadline=1.0, sleep=lambda s: time.sleep(min(s, 0.2)))
    assert res.exit_code == 2 and time.monotonic() - t < 30
    assert "gave up after 1s" in res.error and "spool is kept" in res.error
    assert sorted(p.name for p in rd.iterdir() if "cursor" not in p.name) == \
        [b for b in before if "cursor" not in b]
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and res.records == 54
    assert counts(dsn, "unreach")[0] == 50


def test_locked_chdb_store_keeps_spool_later_upload_ships(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    make_run(root, "locked", 40)
    holder = subprocess.Popen([sys.executable, "-c", HELPER, "hold", str(root), dsn],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        res = ship.upload(root, dsn=dsn, deadline=0.5)
        assert res.exit_code == 2
        assert "in use by another process" in res.error and f"pid {holder.pid}" in res.error
    finally:
        holder.kill()
        holder.communicate()
    res = ship.upload(root, dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and counts(dsn, "locked")[0] == 40


class _ClickHouseError(http.server.BaseHTTPRequestHandler):
    """A ClickHouse HTTP endpoint that answers every request with one error, as the server
    does: the status, the code in ``X-ClickHouse-Exception-Code`` and the message."""

    def _error(self, status: int, code: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("X-ClickHouse-Exception-Code", str(code))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


class _Refuse(_ClickHouseError):
    def _answer(self) -> None:
        self._error(self.server.status, 516,  # type: ignore[attr-defined]
                    b"Code: 516. DB::Exception: alice: Authentication failed: password is "
                    b"incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)")


@pytest.mark.parametrize("status", [401, 403])
def test_auth_failure_stops_at_once(tmp_path: Path, status: int) -> None:
    """A server refusing the credentials (ClickHouse answers 401/403 with code 516 in the
    body): exit 2 at once, no retries, spool kept."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    srv.status = status  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        root = tmp_path / "spool"
        rd = make_run(root, "auth", 5)
        slept: list[float] = []
        res = ship.upload(root, dsn=f"http://alice:wrong@127.0.0.1:{srv.server_port}/lc",
                          deadline=30, sleep=slept.append)
        assert res.exit_code == 2 and not slept
        assert "refused the credentials" in res.error and "stopping at once" in res.error
        assert "wrong" not in res.error
        assert len(segments(rd)) >= 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_missing_spool_and_run(tmp_path: Path, dsn: str) -> None:
    res = ship.upload(tmp_path / "nothing", dsn=dsn)
    assert res.exit_code == 2 and "does not exist" in res.error
    (tmp_path / "empty").mkdir()
    res = ship.upload(tmp_path / "empty", run="x", dsn=dsn)
    assert res.exit_code == 2 and "no run 'x'" in res.error
    assert ship.upload(tmp_path / "empty", dsn=dsn).exit_code == 0


def test_a_cluster_spool_root_ships_a_run_by_its_slurm_job_id(tmp_path: Path, dsn: str) -> None:
    # The Slurm layout: one folder per job (root/JOB/RUN); `upload --run 77` names the job as
    # `ls` shows it, not a folder of the root.
    root = tmp_path / "root"
    for job in ("77", "78"):
        (root / job).mkdir(parents=True)
        w = SpoolWriter(create_run_dir(root / job, job), fsync=False)
        w.write([Start(run=job, stream="run", seq=0, ts=T0, command=["job"], user="u",
                       uid=os.getuid(), slurm={"job_id": job}),
                 Line(run=job, stream="stdout", seq=0, ts=T0, text=f"job {job} says hi"),
                 End(run=job, stream="run", seq=1, ts=T0 + 1, exit_status=0,
                     state="COMPLETED")])
        w.close()
    res = ship.upload(root, run="77", dsn=dsn)
    assert (res.exit_code, res.runs) == (0, ["77"]), res.error
    assert counts(dsn, "77")[0] == 1 and counts(dsn, "78")[0] == 0
    res = ship.upload(root, run="79", dsn=dsn)
    assert res.exit_code == 2 and "no run '79'" in res.error


def test_identity_is_the_run_directory_owner_not_the_start_record(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    rd = create_run_dir(root, "who")
    w = SpoolWriter(rd, fsync=False)
    w.write([Start(run="someone-else", stream="run", seq=0, ts=T0, user="root", uid=0,
                   slurm={"cluster": "c9", "job_id": "123"})])
    w.close()
    ident = ship.identity_from_spool(rd)
    assert ident.uid == os.stat(rd).st_uid and ident.run == "who"
    assert (ident.cluster, ident.job_id) == ("c9", "123")


def test_agent_and_upload_together_never_duplicate(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    for i in range(3):
        make_run(root, f"both{i}", 2000, segment_bytes=8192)
    agent = ship.Agent(root, dsn, batch_bytes=32768, batch_interval=0.01, poll=0.01,
                       retention_days=None)
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        res = ship.upload(root, all=True, dsn=dsn, deadline=60, retention_days=None)
        assert res.exit_code == 0, res
    finally:
        agent.stop()
        t.join()
    for i in range(3):
        assert counts(dsn, f"both{i}") == (2000, 2000, 2000)  # not even a raw duplicate


def test_hundred_concurrent_runs_one_agent(tmp_path: Path, dsn: str) -> None:
    root = tmp_path / "spool"
    writers = []
    for i in range(100):
        rd = create_run_dir(root, f"many{i:03d}")
        w = SpoolWriter(rd, fsync=False, flush_interval=0.05)
        w.write([Start(run=rd.name, stream="run", seq=0, ts=T0)])
        writers.append(w)
    warnings: list[str] = []
    agent = ship.Agent(root, dsn, batch_bytes=1 << 20, batch_interval=0.1, poll=0.02,
                       retention_days=None, warn=warnings.append)
    t = threading.Thread(target=agent.run)
    t.start()
    try:
        for k in range(5):  # the runs write while the agent ships
            for i, w in enumerate(writers):
                w.write([Line(run=f"many{i:03d}", stream="stdout", seq=k * 10 + j, ts=T0,
                              text=f"{i} {k} {j}") for j in range(10)])
            time.sleep(0.05)
        for i, w in enumerate(writers):
            w.write([End(run=f"many{i:03d}", stream="run", seq=1, ts=T0, state="COMPLETED")])
            w.close()

        def all_shipped() -> bool:
            for i in range(100):
                cursor = root / f"many{i:03d}" / ship.CURSOR_NAME
                try:
                    if not json.loads(cursor.read_text()).get("shipped_at"):
                        return False
                except (OSError, ValueError):
                    return False
            return True

        # Wait for the agent to catch up (a hang guard, not a speed claim: a loaded machine
        # may take a while).
        deadline = time.monotonic() + 120
        while not all_shipped() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        agent.stop()
        t.join()
    assert not warnings, warnings[:5]
    assert agent.stats.records == 100 * 52
    with S.open_store(dsn) as st:
        rows = st.client.query("SELECT run, count() FROM lines FINAL WHERE run LIKE 'many%' "
                               "GROUP BY run").result_rows
        raw = int(st.client.command("SELECT count() FROM lines WHERE run LIKE 'many%'"))
        states = {r["run"]: r["state"] for r in st.runs() if r["run"].startswith("many")}
    assert len(rows) == 100 and {c for _, c in rows} == {50} and raw == 5000
    assert set(states.values()) == {"COMPLETED"} and len(states) == 100
    for i in range(100):
        cur = json.loads((root / f"many{i:03d}" / ship.CURSOR_NAME).read_text())
        assert cur["shipped_at"]


def test_the_agent_goes_on_when_a_listed_run_is_removed_before_it_is_locked(
        tmp_path: Path, dsn: str) -> None:
    # The epilog ships a job itself and removes its directory; the agent may have listed it
    # just before. It skips the vanished run and ships the others (it used to die).
    root = tmp_path / "spool"
    keep = make_run(root, "kept", 10)
    gone = make_run(root, "gone", 10)
    agent = ship.Agent(root, dsn, retention_days=None)
    listed = agent.run_dirs()
    assert gone in listed
    import shutil
    shutil.rmtree(gone)
    agent.run_dirs = lambda: listed  # type: ignore[method-assign]
    res = agent.flush()
    assert res.runs == ["kept"] and agent.stats.failures == 0
    assert json.loads((keep / ship.CURSOR_NAME).read_text())["shipped_at"]


def test_segments_of_a_shipped_run_are_deleted_once_they_outlive_the_retention(
        tmp_path: Path, dsn: str) -> None:
    # A run is shipped while its segments are young; the agent's sweep and `upload --all`
    # (which skips shipped runs) come back to it and delete them once they are old enough.
    root = tmp_path / "spool"
    rd = make_run(root, "aged", 3000, segment_bytes=16 * 1024)
    res = ship.upload(root, run="aged", dsn=dsn, retention_days=7)
    assert res.exit_code == 0 and res.deleted == 0
    closed = [s.path for s in segments(rd) if s.closed]
    assert len(closed) > 2
    agent = ship.Agent(root, dsn, retention_days=7)
    assert agent.sweep().deleted == 0  # young: kept
    old = time.time() - 8 * 86400
    os.utime(closed[0], (old, old))
    assert agent.sweep().deleted == 1 and not closed[0].exists() and closed[1].exists()
    for path in closed[1:]:
        os.utime(path, (old, old))
    again = ship.upload(root, all=True, dsn=dsn, retention_days=7)
    assert again.exit_code == 0 and again.skipped == ["aged"] and again.deleted == len(closed) - 1
    assert not any(s.closed for s in segments(rd))
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    assert sorted(cur["deleted"]) == sorted(int(p.name[4:10]) for p in closed)
    assert counts(dsn, "aged")[0] == 3000  # the store keeps every line


def test_the_agent_waits_for_a_runs_first_line_before_it_reads_its_identity(
        tmp_path: Path, dsn: str) -> None:
    # The agent can see a new run's segment before its Start record is written. Had it read
    # the identity then, and the Start and a line landed before it read the data (here: the
    # moment its identity was read), those rows would miss the Start's cluster and job id.
    root = tmp_path / "spool"
    rd = create_run_dir(root, "young")
    seg = rd / "seg-000000.ndjson"
    seg.write_text("")
    start = Start(run="young", stream="run", seq=0, ts=T0, command=["job"], user="u",
                  uid=os.getuid(), slurm={"cluster": "c9", "job_id": "909"})
    line = Line(run="young", stream="stdout", seq=0, ts=T0, text="hello")
    written: list[bool] = []

    def write_once() -> None:
        if not written:
            written.append(True)
            seg.write_text(start.to_json() + "\n" + line.to_json() + "\n")

    def identify(run_dir: Path) -> S.Identity:
        identity = ship.identity_from_spool(run_dir)
        write_once()  # the writer's first flush lands right after
        return identity

    agent = ship.Agent(root, dsn, retention_days=None, identify=identify)
    agent.flush()
    write_once()
    agent.flush()
    assert agent.stats.records == 2
    with S.open_store(dsn) as st:
        [run] = [r for r in st.runs() if r["run"] == "young"]
    assert (run["cluster"], run["job_id"]) == ("c9", "909")


@pytest.mark.parametrize("path", ["embedded", "server-async"])
def test_agent_sigkill_mid_batch_then_restart_loses_and_duplicates_nothing(
        tmp_path: Path, dsn: str, path: str) -> None:
    """Also along a server's path (every record through ``ingest``) with asynchronous
    inserts (``ASYNC_INSERT_SETTINGS``; the embedded engine accepts them and inserts at once,
    so this checks the settings and the collapse of the re-sent batch, not a server's
    batching)."""
    root = tmp_path / "spool"
    n = 30_000
    run = f"killed-{path}"
    rd = make_run(root, run, n, segment_bytes=256 * 1024)
    cursor = rd / ship.CURSOR_NAME
    # The agent is killed (SIGKILL) right after the store took its third batch and before its
    # cursor says so: the worst moment, chosen inside the agent, not by a racing test.
    agent = subprocess.Popen([sys.executable, "-c", HELPER, "agent-killed", str(root), dsn,
                              "65536", path], stdout=subprocess.PIPE, text=True)
    try:
        agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert agent.returncode == -signal.SIGKILL
    shipped = json.loads(cursor.read_text())["records"]
    assert 0 < shipped < n + 4, "the kill should land mid-run"
    # restart: a new agent finishes and exits cleanly on TERM
    agent = subprocess.Popen([sys.executable, "-c", HELPER, "agent", str(root), dsn,
                              str(4 << 20), path], stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not json.loads(cursor.read_text())["shipped_at"]:
        time.sleep(0.05)
    agent.send_signal(signal.SIGTERM)
    out, _ = agent.communicate(timeout=60)
    assert agent.returncode == 0 and out.startswith("stopped")
    final, raw, distinct = counts(dsn, run)
    assert final == n and distinct == n  # nothing lost, nothing shown twice
    # the batch in flight at the kill was inserted twice; FINAL hides the copy (and a merge
    # in the restarted agent may have dropped it already)
    assert raw >= n


def _samples_run(root: Path, job: str) -> Path:
    """A node sampler's run as slurm.node_sampler leaves it: no Start, no End, closed."""
    from logcapture.records import Sample

    rd = create_run_dir(root / ship.SAMPLES_DIR / job, job)
    w = SpoolWriter(rd, fsync=False)
    w.write([Sample(run=job, stream="sample:n1", seq=i, ts=T0 + i, node="n1", gpus=[],
                    job={"cpu_percent": float(i)}) for i in range(5)])
    w.close()
    return rd


def test_agent_ships_the_samples_spool_and_finishes_samples_runs(tmp_path: Path,
                                                                  dsn: str) -> None:
    """One agent on the spool root also ships ``.samples`` (no second agent); a samples-only
    run is done when its job's record says the job ended, or once idle, not watched forever."""
    root = tmp_path / "spool"
    make_run(root, "main1", 10)
    ended = _samples_run(root, "9001")
    idle = _samples_run(root, "9002")
    live = _samples_run(root, "9003")
    for rd in (ended, idle):
        os.utime(rd / "seg-000000.ndjson.gz", (T0 - 7200, T0 - 7200))

    def ident(rd: Path) -> S.Identity:
        return S.Identity(run=rd.name, user="alice", uid=1000, job_id=rd.parent.name)

    agent = ship.Agent(root, dsn, retention_days=None, identify=ident,
                       job_ended=lambda rd: rd.parent.name == "9001", samples_idle=3600,
                       wall=lambda: T0)
    assert {p.name for p in agent.run_dirs()} == {"main1", "9001", "9002", "9003"}
    res = agent.flush()
    assert res.exit_code == 0 and res.records == 14 + 3 * 5
    assert sorted(res.runs) == ["9001", "9002", "main1"]  # 9003: its sampler may go on
    with S.open_store(dsn, wait=30) as st:
        assert len(st.samples("9001")) == 5 and len(st.samples("9003")) == 5
        assert st.run_info("9001")["owner"] == "alice"
    shipped = json.loads((live / ship.CURSOR_NAME).read_text())
    assert not shipped["shipped_at"] and shipped["records"] == 5
    assert json.loads((ended / ship.CURSOR_NAME).read_text())["shipped_at"]
    again = agent.flush()
    assert again.records == 0 and not again.runs


# --- root in a user's run directory ----------------------------------------------------------
PLANTERS = ("lcuser1", "lcuser2")


def _no_planters() -> str | None:
    if os.geteuid() != 0:
        return "needs root: root ships, the test users plant"
    for user in PLANTERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no user {user}: run slurm/ci-setup.sh"
    return None


def _as_user(user: str, code: str) -> None:
    """Python ``code`` run as ``user`` (no extra groups), which must succeed."""
    pw = pwd.getpwnam(user)
    res = subprocess.run([sys.executable, "-c", code], user=pw.pw_uid, group=pw.pw_gid,
                         extra_groups=[], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def _lines_of(run: str, text: str, n: int) -> bytes:
    return b"".join(Line(run=run, stream="stdout", seq=1000 + i, ts=T0 + 10 + i,
                         text=f"{text} {i}").to_json().encode() + b"\n" for i in range(n))


@pytest.mark.skipif(_no_planters() is not None, reason=str(_no_planters()))
@pytest.mark.parametrize("shipper", ["upload", "agent"])
def test_root_ships_and_writes_nothing_a_user_planted_in_their_run_directory(
        dsn: str, shipper: str) -> None:
    """The attack as a user makes it: lcuser1, in its job directory under a root-owned spool
    root, hard-links root's files as the cursor lock, the cursor, the cursor's temporary
    file and two segments (one closed, which the engine would read itself, one open), and
    lcuser2 leaves a segment of its own there; then root runs the real shipper (``upload``,
    or the agent's flush). Root's files keep their owner, mode and content, nothing of them
    or of lcuser2's file is shipped, each refused file gets one warning naming it and why,
    and the run's own lines are shipped all the same.

    The links are made by lcuser1 itself, so the kernel's rules hold: with
    ``fs.protected_hardlinks = 1`` (the default, and this machine's) a user may hard-link
    only files they own or may read and write, so root's files here are 0666. The shipper
    never looks at a mode: it refuses by ``fstat`` after opening (owner, link count), so this
    is the same path a 0600 file of root takes on a node where that setting is 0."""
    base = Path(tempfile.mkdtemp(prefix="logcapture-plant-", dir="/tmp"))
    try:
        base.chmod(0o755)
        u1, u2 = pwd.getpwnam("lcuser1"), pwd.getpwnam("lcuser2")
        root = base / "spool"
        job = root / "4242"
        job.mkdir(parents=True)
        rd = make_run(job, "4242", 20, segment_bytes=1 << 20)
        for path in (job, rd, *rd.iterdir()):
            os.chown(path, u1.pw_uid, u1.pw_gid)
        job.chmod(0o711)  # lcuser1 lets lcuser2 in, to leave a file of lcuser2's
        rd.chmod(0o777)
        theirs = base / "root-files"
        theirs.mkdir(mode=0o755)
        victims = {
            ship.CURSOR_LOCK_NAME: b"root's lock-like file\n",
            ship.CURSOR_NAME: json.dumps({"version": 1, "lines": {"0": 10 ** 6},
                                          "shipped_at": "2020-01-01T00:00:00Z"}).encode(),
            ship.CURSOR_NAME + ".tmp": b"root's file that a cursor save would truncate\n",
            "seg-000001.ndjson.gz": gzip.compress(_lines_of("4242", "ROOT-GZ", 5)),
            "seg-000002.ndjson": _lines_of("4242", "ROOT-PLAIN", 5),
        }
        for name, data in victims.items():
            (theirs / name).write_bytes(data)
            (theirs / name).chmod(0o666)
        before = {name: (theirs / name).stat() for name in victims}
        _as_user("lcuser1", "import os\n" + "".join(
            f"os.link({str(theirs / name)!r}, {str(rd / name)!r})\n" for name in victims))
        _as_user("lcuser2", f"import gzip\nopen({str(rd / 'seg-000003.ndjson.gz')!r}, 'wb')"
                 f".write(gzip.compress({_lines_of('4242', 'LCUSER2', 5)!r}))\n")
        assert (rd / "seg-000003.ndjson.gz").stat().st_uid == u2.pw_uid

        warnings: list[str] = []
        if shipper == "upload":
            res = ship.upload(job, run="4242", dsn=dsn, retention_days=0)
            said = [f"run {r}: {s} set aside: {w}" for r, s, w in res.set_aside] + res.warnings
            records = res.records
        else:
            agent = ship.Agent(root, dsn, retention_days=0, warn=warnings.append)
            agent.sweep()  # it takes the run's lock first: the refused one is said there
            res = agent.flush()
            said, records = warnings, res.records

        for name, data in victims.items():
            st = (theirs / name).stat()
            assert (theirs / name).read_bytes() == data, name
            assert (st.st_uid, st.st_gid, st.st_mode) == (0, 0, before[name].st_mode), name
            assert st.st_nlink == 1 or name.startswith("seg-"), name  # names replaced
        assert records == 20 + 4  # the run's own lines, and only them
        with S.open_store(dsn) as st:
            stored = st.records("4242", "lcuser1")
        texts = [d.get("text", "") for d in stored]
        assert sum(d.get("kind") == "line" for d in stored) == 20
        # each refused segment is said in the log, where its lines are missing
        assert sum("could not be stored" in t for t in texts) == len(
            [r for r in said if "set aside" in r]) or shipper == "agent"
        assert not [t for t in texts if "ROOT-" in t or "LCUSER2" in t]
        for name in (ship.CURSOR_LOCK_NAME, ship.CURSOR_NAME):
            mine = (rd / name).stat()
            assert (mine.st_uid, mine.st_nlink) == (u1.pw_uid, 1), name
        assert not (rd / (ship.CURSOR_NAME + ".tmp")).exists()
        text = "\n".join(said)
        roots = (f"owned by uid 0, not by the directory's owner (uid {u1.pw_uid}); "
                 "2 links (a hard link)")
        assert f"refused {rd / ship.CURSOR_LOCK_NAME}: {roots}: replaced" in text
        assert f"refused {rd / ship.CURSOR_NAME}: {roots}: not read" in text
        for name in ("seg-000001.ndjson.gz", "seg-000002.ndjson"):
            assert f"refused {rd / name}: {roots}: not shipped" in text
        assert (f"refused {rd / 'seg-000003.ndjson.gz'}: owned by uid {u2.pw_uid}, not by "
                f"the directory's owner (uid {u1.pw_uid}): not shipped") in text
        assert len(said) == 5, said  # one warning a file
        assert "root's" not in text and "ROOT-" not in text
    finally:
        shutil.rmtree(base, ignore_errors=True)
@pytest.mark.parametrize("how", ["agent", "upload"])
def test_a_backlog_is_read_one_segment_at_a_time_as_its_batches_ship(
        tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A backlog of many batches along a server's path (every segment read here): at each
    insert, what the shipper has read and not yet sent is at most a batch and a segment, not
    the backlog; what is shipped is the whole spool, once."""
    root = tmp_path / "spool"
    n, seg_bytes, batch = 3000, 64 * 1024, 128 * 1024
    runs = [f"backlog-{how}-{i}" for i in range(4)]
    for run in runs:
        make_run(root, run, n, segment_bytes=seg_bytes)
    real_open, real_read = S.open_store, ship_pending.read_segment_bytes
    read = [0]  # bytes the shipper read from the spool
    sent = [0]  # bytes the store was given
    held: list[int] = []  # read and not yet sent, at each insert

    def server_like(*args: object, **kw: object) -> S.Store:
        st = real_open(*args, **kw)  # type: ignore[arg-type]
        st.embedded = False  # every record through ingest, the segments read here
        return st

    def reading(seg: Segment, skip: int = 0) -> tuple[bytes, int, bool, Segment]:
        out = real_read(seg, skip)
        read[0] += len(out[0])
        return out

    real_insert = S.Store.insert_many

    def inserting(self: S.Store, batches: list[tuple[bytes, S.Identity]]) -> int:
        held.append(read[0] - sent[0])
        sent[0] += sum(len(b) for b, _ in batches)
        return real_insert(self, batches)

    monkeypatch.setattr(ship_agent, "open_store", server_like)
    monkeypatch.setattr(ship_uploading, "open_store", server_like)
    monkeypatch.setattr(ship_pending, "read_segment_bytes", reading)
    monkeypatch.setattr(S.Store, "insert_many", inserting)
    if how == "agent":
        agent = ship.Agent(root, dsn, batch_bytes=batch, retention_days=None)
        agent.scan()
        res = agent.flush()
    else:
        res = ship.upload(root, all=True, dsn=dsn, retention_days=None, max_bytes=batch)
    assert res.records == len(runs) * (n + 4) and not res.failed
    total = sum(len(data) for run in runs for data in _spool_bytes(root / run))
    assert read[0] == total == sent[0] and len(held) > 8  # many batches, each byte once
    assert max(held) <= batch + seg_bytes + 4096, (max(held), total)
    for run in runs:
        assert counts(dsn, run)[:2] == (n, n)


def _spool_bytes(rd: Path) -> list[bytes]:
    return [gzip.decompress(seg.path.read_bytes()) if seg.closed else seg.path.read_bytes()
            for seg in segments(rd)]


class _FakeStore(_ClickHouseError):
    """A ClickHouse HTTP endpoint that fails: ``hang`` accepts and never answers, ``500``
    answers every request with a server error."""

    def _answer(self) -> None:
        srv = self.server
        srv.requests.append(srv.mode)  # type: ignore[attr-defined]
        if srv.mode == "hang":  # type: ignore[attr-defined]
            srv.release.wait(120)  # type: ignore[attr-defined]
            return
        self._error(500, 241, b"Code: 241. DB::Exception: Memory limit (total) exceeded. "
                    b"(MEMORY_LIMIT_EXCEEDED)")


class _Faults:
    """The fake store on one port: closed (connections refused) until ``serve``."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.release = threading.Event()
        self.srv: http.server.ThreadingHTTPServer | None = None

    def serve(self, mode: str) -> None:
        if self.srv is None:
            self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), _FakeStore)
            self.srv.daemon_threads = True
            self.srv.requests = []  # type: ignore[attr-defined]
            self.srv.release = self.release  # type: ignore[attr-defined]
            threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.srv.mode = mode  # type: ignore[attr-defined]

    def close(self) -> None:
        self.release.set()
        if self.srv is not None:
            self.srv.shutdown()
            self.srv.server_close()
            self.srv = None


class _Lines:
    """A subprocess's stdout lines as they come (a reader thread), with when each came."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.lines: list[tuple[float, str]] = []
        self._new = threading.Condition()
        self._proc = proc
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        """After the process ended: every line read, the pipe closed."""
        self._thread.join(10)
        assert self._proc.stdout is not None
        self._proc.stdout.close()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._new:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._new.notify_all()

    def wait_for(self, *words: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        with self._new:
            while True:
                for _, line in self.lines:
                    if all(w in line for w in words):
                        return line
                left = end - time.monotonic()
                assert left > 0, f"no line with {words}: {self.texts()}"
                self._new.wait(left)

    def texts(self, start: str = "") -> list[str]:
        return [line for _, line in self.lines if line.startswith(start)]


def _outage_agent(root: Path, dsn: str, faults: _Faults, flag: Path, remind: float,
                  read_timeout: int) -> tuple[subprocess.Popen[str], _Lines]:
    agent = subprocess.Popen([sys.executable, "-c", HELPER, "outage", str(root), dsn,
                              f"http://default:x@127.0.0.1:{faults.port}/lc", str(flag),
                              str(remind), str(read_timeout)], stdout=subprocess.PIPE, text=True)
    out = _Lines(agent)
    out.wait_for("ready")
    return agent, out


def test_the_agent_logs_an_outage_once_reminds_at_a_bounded_rate_and_logs_the_recovery(
        tmp_path: Path, dsn: str) -> None:
    """A store refused (closed port), then hanging, then answering 500, then back; then
    refused again: each outage is one line with its reason, reminders come at most every
    ``remind_every`` seconds with what is waiting, the recovery is one line with how much
    was shipped."""
    root, flag, remind = tmp_path / "spool", tmp_path / "up", 0.5
    make_run(root, "outage1", 200)
    faults = _Faults()
    agent, out = _outage_agent(root, dsn, faults, flag, remind, read_timeout=1)
    try:
        out.wait_for("store unreachable:", "refused")
        out.wait_for("still unreachable", "refused", "waiting: 1 run(s)")
        faults.serve("hang")
        out.wait_for("still unreachable", "timed out")
        faults.serve("500")
        out.wait_for("still unreachable", "241")
        flag.touch()
        back = out.wait_for("store reachable again after")
        assert "shipped 204 records" in back
        # a second outage is told again
        flag.unlink()
        faults.close()
        make_run(root, "outage2", 10)
        out.wait_for("store unreachable:", "refused")
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
    finally:
        faults.close()
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        out.close()
    assert agent.returncode == 0
    lines = out.lines
    down = [t for t, line in lines if line.startswith("store unreachable:")]
    up = [t for t, line in lines if line.startswith("store reachable again")]
    reminders = [t for t, line in lines if line.startswith("store still unreachable")
                 and t < up[0]]
    assert len(down) == 2 and len(up) == 1 and down[0] < up[0] < down[1]
    # one reminder each phase at least, and at most one per ``remind`` seconds
    assert 3 <= len(reminders) <= (up[0] - down[0]) / remind + 1
    assert counts(dsn, "outage1")[:2] == (200, 200)


def test_term_ends_the_agent_within_10s_while_the_store_hangs(tmp_path: Path, dsn: str) -> None:
    """A store that accepts and never answers, and the agent's usual 60 s answer timeout:
    TERM ends it within 10 s; what it was sending is shipped by the next shipper, once."""
    root, flag = tmp_path / "spool", tmp_path / "up"
    make_run(root, "hung", 300)
    faults = _Faults()
    faults.serve("hang")
    agent, out = _outage_agent(root, dsn, faults, flag, 300.0, read_timeout=60)
    try:
        deadline = time.monotonic() + 30
        while not faults.srv.requests:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the agent never called the store"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the store call
        t = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)
        assert time.monotonic() - t < 10
    finally:
        faults.close()
        if agent.poll() is None:
            agent.kill()
        agent.wait()
        out.close()
    assert agent.returncode == 0
    assert any(line.startswith("stopped") for line in out.texts())
    assert not (root / "hung" / ship.CURSOR_NAME).exists()  # nothing counted as shipped
    res = ship.upload(root, run="hung", dsn=dsn, retention_days=None)
    assert res.exit_code == 0 and counts(dsn, "hung")[:2] == (300, 300)


def test_a_users_daily_bound_keeps_the_run_whole_but_its_lines(
        tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """user_daily_bytes, enforced where the store is written: past it the batch's output
    lines are left in the spool and counted, the run's own records (start, end) still reach
    the store, so it ends there, and a note says how many lines were not stored and why."""
    import getpass

    with S.open_store(dsn, wait=30) as st:  # what other tests stored today, as this user
        today = time.time() // 86400 * 86400
        before = st.user_text_bytes_since(getpass.getuser(), today)
    monkeypatch.setenv("LOGCAPTURE_CONFIG", str(tmp_path / "no-config.yaml"))
    monkeypatch.setenv("LOGCAPTURE_USER_DAILY_BYTES", str(before + 20000))
    root = tmp_path / "spool"
    rd = make_run(root, "quota", 500)
    res = ship.upload(root, dsn=dsn, retention_days=None, max_bytes=4096)
    assert res.exit_code == 0, res
    stored = counts(dsn, "quota")[0]
    assert 0 < stored < 500
    with S.open_store(dsn, wait=30) as st:
        notes = [d for d in st.lines("quota") if "daily bound" in d.get("text", "")]
        info = st.run_info("quota", None, counts=False)
    # every output record was stored or counted: 500 lines, a repeat note, a metadata row
    assert len(notes) == 1 and 500 <= notes[0]["count"] + stored <= 502
    assert info["state"] == "COMPLETED"
    assert any("daily bound reached" in w for w in res.warnings)
    cur = json.loads((rd / ship.CURSOR_NAME).read_text())
    assert cur["shipped_at"]  # done: the lines left out are not shipped again
