"""The spool as a write-ahead log: round trips, torn lines, rotation, failures."""

from __future__ import annotations

import gzip
import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import lc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcapture.errors import SpoolError
from logcapture.records import Line, Metadata, Note, Record, Start, from_dict
from logcapture.spool.layout import create_run_dir, segments
from logcapture.spool.reading import ReadStats, iter_run, lines_of_kinds
from logcapture.spool.writer import SpoolWriter

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                         st.floats(allow_nan=False, allow_infinity=False), texts)


@st.composite
def record_lists(draw: st.DrawFn) -> list[Record]:
    out: list[Record] = []
    for seq in range(draw(st.integers(0, 60))):
        kind = draw(st.sampled_from(["line", "note", "metadata"]))
        ts = draw(st.floats(0, 2e9, allow_nan=False))
        if kind == "line":
            out.append(Line(run="r", stream="stdout", seq=seq, ts=ts, text=draw(texts)))
        elif kind == "note":
            out.append(Note(run="r", stream="stdout", seq=seq, ts=ts, note="repeat",
                            count=draw(st.integers(0, 10**6)), text=draw(texts)))
        else:
            out.append(Metadata(run="r", stream="stdout", seq=seq, ts=ts,
                                fields=draw(st.dictionaries(texts, json_scalars, max_size=5))))
    return out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=record_lists(), segment_bytes=st.integers(1024, 8192))
def test_round_trip_through_rotated_compressed_segments(tmp_path_factory: pytest.TempPathFactory,
                                                        records: list[Record],
                                                        segment_bytes: int) -> None:
    root = tmp_path_factory.mktemp("spool")
    run_dir = create_run_dir(root, "r")
    w = SpoolWriter(run_dir, segment_bytes=segment_bytes, flush_records=7, fsync=False)
    for i in range(0, len(records), 5):
        w.write(records[i:i + 5])
    w.close()
    stats = ReadStats()
    assert list(iter_run(run_dir, stats)) == records
    assert stats.torn == 0 and stats.bad == []
    assert all(s.closed for s in segments(run_dir))


def test_files_are_private(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path / "root", "r")
    w = SpoolWriter(run_dir)
    w.write([Line(run="r", stream="stdout", seq=0, ts=1.0, text="x")])
    w.close()
    assert stat.S_IMODE(os.stat(tmp_path / "root").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    for seg in segments(run_dir):
        assert stat.S_IMODE(os.stat(seg.path).st_mode) == 0o600


def test_a_torn_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "r")
    good = [Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"l{i}") for i in range(3)]
    (run_dir / "seg-000000.ndjson").write_text(
        "".join(r.to_json() + "\n" for r in good) + '{"run":"r","stream":"std')
    stats = ReadStats()
    assert list(iter_run(run_dir, stats)) == good
    # The run's only segment is open: its last line may still be being written.
    assert stats.torn == 0
    with gzip.open(run_dir / "seg-000000.ndjson.gz", "wb") as f:
        f.write((run_dir / "seg-000000.ndjson").read_bytes())
    stats = ReadStats()
    assert list(iter_run(run_dir, stats)) == good
    assert stats.torn == 1


@pytest.mark.parametrize("gz", [False, True])
def test_lines_of_kinds_finds_records_by_kind_not_text_that_looks_like_one(tmp_path: Path,
                                                                           gz: bool) -> None:
    run_dir = create_run_dir(tmp_path, "r")
    records: list[Record] = [
        Line(run="r", stream="stdout", seq=0, ts=1.0, text='x "kind":"metadata"}'),
        Metadata(run="r", stream="stdout", seq=1, ts=1.0, fields={"loss": 0.5}),
        Line(run="r", stream="stdout", seq=2, ts=1.0, text='{"kind":"sample"}'),
        Metadata(run="r", stream="stdout", seq=3, ts=2.0, fields={"loss": 0.25}),
    ]
    data = "".join(r.to_json() + "\n" for r in records).encode()
    torn = Metadata(run="r", stream="stdout", seq=4, ts=3.0, fields={"loss": 0.1}).to_json()
    data += torn.encode()  # no newline: still being written, not a line yet
    if gz:
        (run_dir / "seg-000000.ndjson.gz").write_bytes(gzip.compress(data))
    else:
        (run_dir / "seg-000000.ndjson").write_bytes(data)
    found = lines_of_kinds(segments(run_dir)[0], ["metadata", "sample", "end"])
    assert [from_dict(json.loads(x)) for x in found["metadata"]] == [records[1], records[3]]
    assert found["sample"] == [] and found["end"] == []


def test_a_segment_closed_between_listing_and_reading_is_read_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``logs`` and ``show`` of a live run: the writer closes the open segment (gzip, rename,
    # unlink) after iter_run listed it as open and before it opens it.
    from logcapture.spool import reading as spool_reading

    run_dir = create_run_dir(tmp_path, "r")
    good = [Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"l{i}") for i in range(3)]
    plain = run_dir / "seg-000000.ndjson"
    plain.write_text("".join(r.to_json() + "\n" for r in good))
    real = spool_reading.segments

    def listed_then_closed(path: Path) -> list:  # type: ignore[type-arg]
        segs = real(path)
        with gzip.open(run_dir / "seg-000000.ndjson.gz", "wb") as f:
            f.write(plain.read_bytes())
        plain.unlink()
        return segs

    monkeypatch.setattr(spool_reading, "segments", listed_then_closed)
    assert list(iter_run(run_dir)) == good


def test_the_latest_run_is_the_one_begun_last_not_the_one_touched_last(tmp_path: Path) -> None:
    # The shipper saves its cursor in a run's directory, which changes the directory's mtime:
    # that must not make an old run the latest (``logcapture upload``/``logs`` default to it).
    from logcapture.spool.layout import began, find_run_dirs

    old, new = create_run_dir(tmp_path, "old"), create_run_dir(tmp_path, "new")
    for i, rd in enumerate((old, new)):
        seg = rd / "seg-000000.ndjson"
        seg.write_text("")
        os.utime(seg, (1000.0 + i, 1000.0 + i))
    (old / ".logcapture-cursor.json").write_text("{}")  # touches old's directory now
    assert find_run_dirs(tmp_path) == [old, new]
    assert began(tmp_path / "removed-meanwhile") == 0.0


def test_follow_reads_a_closed_segment_once(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # ``logs --follow`` polls the run; a closed segment cannot change, so it is read (and
    # decompressed) once, not at every poll of a long run.
    from logcapture import runs
    from logcapture.records import End

    run_dir = create_run_dir(tmp_path, "r")
    lines = [Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"l{i}") for i in range(3)]
    with gzip.open(run_dir / "seg-000000.ndjson.gz", "wb") as f:
        f.write("".join(r.to_json() + "\n" for r in lines[:2]).encode())
    live = run_dir / "seg-000001.ndjson"
    live.write_text(lines[2].to_json() + "\n")
    end = End(run="r", stream="run", seq=1, ts=2.0, exit_status=0, state="COMPLETED")
    real = runs.read_segment
    reads: list[str] = []

    def spy(seg, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        reads.append(seg.path.name)
        if reads.count(live.name) == 3:  # the job ends after a few polls
            with open(live, "a") as f:
                f.write(end.to_json() + "\n")
        return real(seg, *args, **kw)

    monkeypatch.setattr(runs, "read_segment", spy)
    assert list(runs.follow_records(run_dir, poll=0)) == [*lines, end]
    assert reads.count("seg-000000.ndjson.gz") == 1 and reads.count(live.name) == 3


def test_invalid_lines_are_skipped_counted_and_located(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "r")
    ok = Line(run="r", stream="stdout", seq=0, ts=1.0, text="ok")
    (run_dir / "seg-000000.ndjson").write_text(
        "not json\n" + ok.to_json() + "\n" + '{"kind":"nope"}\n' + "[1]\n")
    stats = ReadStats()
    assert list(iter_run(run_dir, stats)) == [ok]
    assert [(name, line) for name, line, _ in stats.bad] == [
        ("seg-000000.ndjson", 1), ("seg-000000.ndjson", 3), ("seg-000000.ndjson", 4)]


@given(st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_decoding_arbitrary_bytes_never_crashes(data: bytes) -> None:
    import json

    from logcapture.errors import RecordError
    try:
        from_dict(json.loads(data))
    except (ValueError, RecordError):
        pass


def test_non_finite_numbers_are_written_as_strict_json(tmp_path: Path) -> None:
    run_dir = create_run_dir(tmp_path, "r")
    w = SpoolWriter(run_dir)
    w.write([Metadata(run="r", stream="stdout", seq=0, ts=1.0,
                      fields={"loss": float("nan"), "lr": float("inf")})])
    w.close()
    raw = gzip.decompress(segments(run_dir)[0].path.read_bytes())
    assert b"NaN" in raw and b'"NaN"' in raw  # quoted: strict JSON
    (rec,) = iter_run(run_dir)
    assert rec.fields == {"loss": "NaN", "lr": "Infinity"}  # type: ignore[attr-defined]


def test_a_run_id_is_validated_and_never_reused(tmp_path: Path) -> None:
    create_run_dir(tmp_path, "job-1")
    with pytest.raises(SpoolError, match="already exists"):
        create_run_dir(tmp_path, "job-1")
    for bad in ("../x", ".hidden", "a/b", "", "x" * 200):
        with pytest.raises(SpoolError, match="invalid run id"):
            create_run_dir(tmp_path, bad)


def test_one_rule_says_which_spool_root_a_process_uses() -> None:
    from logcapture.spool.layout import SYSTEM_ROOT, default_root

    home = {"HOME": "/home/u"}
    user = Path("/home/u/.local/state/logcapture/spool")
    assert default_root(home) == user
    assert default_root({**home, "XDG_STATE_HOME": "/x"}) == Path("/x/logcapture/spool")
    assert default_root({**home, "LOGCAPTURE_SPOOL": "/s"}) == Path("/s")
    # Slurm's side (wrapper, hooks, node sampler): the admin's root, whatever the user's is.
    named = {**home, "LOGCAPTURE_SPOOL": "/s"}
    assert default_root(named, process="slurm") == Path(SYSTEM_ROOT) == Path(
        "/var/spool/logcapture")
    assert default_root(named, process="slurm", configured="/c") == Path("/c")
    assert default_root({"LOGCAPTURE_SPOOL_ROOT": "/e"}, process="slurm") == Path("/e")
    # The agent: root's ships what Slurm's side wrote (unless told another spool); a user's,
    # the user's own.
    assert default_root(home, process="agent", euid=0) == Path(SYSTEM_ROOT)
    assert default_root(home, process="agent", euid=0, configured="/c") == Path("/c")
    assert default_root(named, process="agent", euid=0, configured="/c") == Path("/c")
    assert default_root(named, process="agent", euid=0) == Path("/s")
    assert default_root(home, process="agent", euid=1000, configured="/c") == user


def test_a_failing_disk_buffers_then_recovers(tmp_path: Path) -> None:
    # RLIMIT_FSIZE in a child process: writes past the limit fail with EFBIG (Python ignores
    # SIGXFSZ), exactly like a full disk for the writer.
    script = f"""
import resource, sys
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from pathlib import Path
from logcapture.records import Line
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
warnings = []
w = SpoolWriter(create_run_dir(Path({str(tmp_path)!r}), "r"), fsync=False,
                segment_bytes=1 << 20, warn=warnings.append)
w.write([Line(run="r", stream="stdout", seq=i, ts=1.0, text="x" * 100) for i in range(100)])
w.flush()
assert w.errors >= 1 and len(warnings) == 1, warnings
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
w.close()
print(w.written, w.lost, len(warnings))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["100", "0", "2"]  # all written in the end, none lost
    recs = list(iter_run(tmp_path / "r"))
    assert [r.seq for r in recs] == list(range(100))


def test_unwritable_spool_does_not_hurt_the_command(lc_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    lc_env["LOGCAPTURE_SPOOL"] = str(tmp_path / "a-file" / "spool")
    res = lc(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 4"], lc_env)
    assert res.returncode == 4
    assert res.stdout == b"out\n"
    lines = res.stderr.decode().splitlines()
    assert lines[0] == "err" or lines[-1] == "err"
    warnings = [ln for ln in lines if ln.startswith("logcapture:")]
    assert len(warnings) == 1 and "capture disabled" in warnings[0]


def test_a_full_spool_disk_does_not_hurt_the_command(lc_env: dict[str, str]) -> None:
    # The whole wrapper under RLIMIT_FSIZE: its spool writes fail; the command's output goes
    # to pipes (not limited) and must be complete.
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    res = subprocess.run(
        [sys.executable, "-m", "logcapture", "run", "--", sys.executable, "-c",
         "for i in range(20000): print('line', i)"],
        env=lc_env, capture_output=True, timeout=60, preexec_fn=limit)
    assert res.returncode == 0
    assert res.stdout == b"".join(f"line {i}\n".encode() for i in range(20000))
    warnings = [ln for ln in res.stderr.decode().splitlines() if ln.startswith("logcapture:")]
    assert 1 <= len(warnings) <= 5


@given(text=texts, seq=st.integers(0, 2**62), ts=st.floats(0, 4e9, allow_nan=False))
def test_the_fast_line_encoding_equals_the_generic_one(text: str, seq: int, ts: float) -> None:
    import json

    from logcapture.records import dumps
    line = Line(run="run-1", stream="stdout", seq=seq, ts=ts, text=text)
    assert line.to_json() == dumps(line.to_dict())
    assert from_dict(json.loads(line.to_json())) == line


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=200_000) | st.text(max_size=5000).map(str.encode))
def test_gzip_compress_gives_one_gzip_member_with_or_without_isal(data: bytes) -> None:
    """Closed segments are gzip whichever engine compressed them: ISA-L (isal) or, where isal
    is missing, zlib; the readers (Python's gzip, zlib with wbits=31, the store's file()
    'gzip') read both."""
    import zlib

    import logcapture.spool.layout as sp

    ours = sp.gzip_compress(data)
    assert gzip.decompress(ours) == data
    assert zlib.decompressobj(wbits=31).decompress(ours) == data
    saved = sys.modules.get("isal")
    sys.modules["isal"] = None  # type: ignore[assignment]  # import isal: ImportError
    try:
        fallback = sp.gzip_compress(data)
    finally:
        if saved is None:
            del sys.modules["isal"]
        else:
            sys.modules["isal"] = saved
    assert fallback == gzip.compress(data, compresslevel=sp.COMPRESS_LEVEL, mtime=0)


def test_isal_compresses_closed_segments_where_it_is_installed() -> None:
    """The dependency is installed on x86_64/aarch64 Linux (pyproject.toml), and then used."""
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("isal is a dependency on x86_64 and aarch64 only")
    from isal import isal_zlib

    import logcapture.spool.layout as sp

    data = b'{"run":"r","stream":"stdout","seq":1,"text":"x"}\n' * 1000
    assert sp.gzip_compress(data) == isal_zlib.compress(data, sp.COMPRESS_LEVEL, wbits=31)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=record_lists(), segment_bytes=st.integers(1024, 4096),
       batch=st.integers(1, 9))
def test_segments_end_at_line_ends_within_their_size(tmp_path_factory: pytest.TempPathFactory,
                                                     records: list[Record], segment_bytes: int,
                                                     batch: int) -> None:
    """Each closed segment holds whole lines; a segment is rotated by the line that takes it
    to ``segment_bytes`` or past it (so every one but the last reached it, and none is bigger
    without its last line); together they are the records' lines in order."""
    run_dir = create_run_dir(tmp_path_factory.mktemp("spool"), "r")
    w = SpoolWriter(run_dir, segment_bytes=segment_bytes, flush_records=3, fsync=False)
    for i in range(0, len(records), batch):
        w.write(records[i:i + batch])
    w.close()
    bodies = [gzip.decompress(s.path.read_bytes()) for s in segments(run_dir)]
    for i, body in enumerate(bodies):
        assert body.endswith(b"\n") or not body
        last = body.rstrip(b"\n").rfind(b"\n") + 1  # where its last line starts
        assert last < segment_bytes, (last, segment_bytes)
        assert i == len(bodies) - 1 or len(body) >= segment_bytes, (len(body), segment_bytes)
    want = b"".join((r.to_json() + "\n").encode("utf-8", "surrogatepass") for r in records)
    assert b"".join(bodies) == want


def test_past_max_pending_the_writer_writes_the_backlog_itself(tmp_path: Path) -> None:
    """Flow control, not loss: a producer faster than the flusher (here a flusher that would
    wait an hour) writes the backlog in its own thread once max_pending records wait, so it
    is slowed to the disk's pace and nothing is dropped."""
    run_dir = create_run_dir(tmp_path, "r")
    w = SpoolWriter(run_dir, max_pending=10, flush_records=1000, flush_interval=3600,
                    fsync=False)
    recs = [Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"line {i}") for i in range(25)]
    for i in range(0, 25, 4):
        w.write(recs[i:i + 4])
    assert w.written >= 15  # by the writer, while the flusher slept
    assert w.lost == 0 and w.loss is None
    w.close()
    assert list(iter_run(run_dir)) == recs


_REFUSING_DISK = """
import errno, os, sys
sys.path.insert(0, {src!r})
from pathlib import Path
from logcapture.records import End, Line, Note
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter
warnings = []
w = SpoolWriter(create_run_dir(Path({tmp!r}), "r"), fsync=False, max_pending=10,
                flush_interval=3600, warn=warnings.append)
real_write = os.write
refuse = True
def write(fd, data):
    if refuse and fd == w._fd:
        raise OSError(errno.EIO, "Input/output error")
    return real_write(fd, data)
os.write = write
line = lambda i: Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"line {{i}}")
for i in range(0, 40, 4):
    w.write([line(j) for j in range(i, i + 4)])
    w.flush()
assert w.loss is None  # still failing: nothing to report yet
w.write([Note(run="r", stream="run", seq=0, ts=1.0, text="a warning")])  # kept though full
refuse = False
w.write([line(40)])
w.flush()
lost = w.loss
w.write([End(run="r", stream="run", seq=1, ts=2.0, exit_status=0, signal=None,
             state="COMPLETED", duration=1.0)])
w.close()
print(w.lost, lost[0], lost[1], len(warnings), sep="|")
"""


def test_records_are_lost_only_when_the_disk_refuses_them_and_the_loss_is_reported(
        tmp_path: Path) -> None:
    """While every write fails, max_pending output records wait and the rest are counted
    lost; records about the run are kept whatever the buffer holds; once the disk takes
    writes again, ``loss`` says how many were lost and why (the caller's note)."""
    script = _REFUSING_DISK.format(src=str(Path(__file__).parent.parent), tmp=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    lost, reported, why, warnings = res.stdout.strip().split("|")
    assert lost == reported == "32" and why == "Input/output error" and warnings == "2"
    recs = list(iter_run(tmp_path / "r"))
    kinds = [(r.kind, r.seq) for r in recs]
    # The batches that found room in max_pending (a batch is kept or dropped whole).
    assert kinds[:8] == [("line", i) for i in range(8)] and ("line", 8) not in kinds
    assert ("note", 0) in kinds and kinds[-2:] == [("line", 40), ("end", 1)]


def test_a_busy_spool_flushes_on_its_own_clock(tmp_path: Path) -> None:
    """While records keep coming, the flusher writes every flush_interval without being woken
    by the writes (each wake-up takes the GIL from the rendering thread); a quiet spool's
    flusher sleeps until the next record, which is still on disk within flush_interval."""
    import threading
    import time

    class CountingEvent(threading.Event):
        sets = 0

        def set(self) -> None:
            CountingEvent.sets += 1
            super().set()

    run_dir = create_run_dir(tmp_path, "r")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threading, "Event", CountingEvent)
        w = SpoolWriter(run_dir, flush_interval=0.1, fsync=False)
    time.sleep(0.05)  # the flusher is asleep: nothing was written yet
    for i in range(100):  # 1 s of a record every 10 ms
        w.write([Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"x{i}")])
        time.sleep(0.01)
    busy_sets = CountingEvent.sets

    def texts() -> list[str]:
        return [x.text for x in iter_run(run_dir) if x.kind == "line"]  # type: ignore[attr-defined]

    def wait_for(text: str) -> None:  # written on the flusher's clock, without close()
        deadline = time.monotonic() + 10
        while text not in texts():
            assert time.monotonic() < deadline, texts()[-3:]
            time.sleep(0.02)

    wait_for("x99")
    time.sleep(0.35)  # quiet: the flusher goes back to sleep
    w.write([Line(run="r", stream="stdout", seq=100, ts=1.0, text="late")])
    wait_for("late")  # the first record woke it
    w.close()
    assert len(texts()) == 101
    # 1 (the first record), a few more if this thread stalled past an interval; ~10 when each
    # interval woke it.
    assert busy_sets <= 6, busy_sets


def test_an_early_flush_is_synced_when_the_job_goes_quiet(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush that flush_records triggered early writes without fdatasync (a flood syncs at
    most every flush_interval); if the job then goes quiet, that write is synced within the
    next interval, not left to a node crash until the job prints again."""
    import time

    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync",
                        lambda fd: (synced.append(os.fstat(fd).st_size), real(fd))[1])
    run_dir = create_run_dir(tmp_path, "r")
    w = SpoolWriter(run_dir, flush_interval=0.3, flush_records=10)
    try:
        w.write([Line(run="r", stream="stdout", seq=i, ts=1.0, text="x") for i in range(5)])
        time.sleep(0.45)  # flushed and synced at ~0.3 s
        w.write([Line(run="r", stream="stdout", seq=i, ts=1.0, text="y") for i in range(5, 20)])
        time.sleep(1.0)  # flushed early at once (15 >= flush_records), then quiet
        size = sum(seg.path.stat().st_size for seg in segments(run_dir))
        assert synced and synced[-1] == size, (synced, size)
    finally:
        w.close()


# ------------------------------------------------------------------ segments nobody wrote
def _run_with_a_huge_segment(root: Path, run: str) -> Path:
    """A run of three lines whose owner then planted a 20 GiB sparse segment (free to make)."""
    rd = create_run_dir(root, run)
    w = SpoolWriter(rd, fsync=False)
    w.write([Start(run=run, stream="run", seq=0, ts=1.0, command=["job"], user="u",
                   uid=os.getuid())])
    w.write([Line(run=run, stream="stdout", seq=i, ts=1.0 + i, text=f"line {i}")
             for i in range(3)])
    w.close()
    os.truncate(os.open(rd / "seg-000009.ndjson", os.O_CREAT | os.O_WRONLY, 0o600), 20 << 30)
    return rd


def test_a_segment_larger_than_any_logcapture_writes_is_not_read(tmp_path: Path,
                                                                  monkeypatch) -> None:
    from logcapture.spool import reading as spool

    rd = _run_with_a_huge_segment(tmp_path, "r1")
    huge = segments(rd)[-1]
    with pytest.raises(SpoolError, match=r"seg-000009.ndjson holds 21474836480 bytes, more "
                                         r"than the 256 MiB .*not read"):
        spool.read_lines(huge)
    # a small gzip file that inflates past the limit (here lowered to 1 MiB) is not inflated
    monkeypatch.setattr(spool, "MAX_SEGMENT_BYTES", 1 << 20)
    bomb = rd / "seg-000010.ndjson.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (2 << 20)))
    with pytest.raises(SpoolError, match="bytes decompressed, more than the 1 MiB"):
        spool.read_lines(segments(rd)[-1])
    bomb.write_bytes(gzip.compress(b"\n" * (1 << 20)))  # at the limit: read
    assert len(spool.read_lines(segments(rd)[-1])[0]) == 1 << 20


def test_ls_lists_a_run_holding_a_huge_segment_within_bounded_memory(tmp_path: Path) -> None:
    # Reading the planted segment whole would need 20 GiB; `ls` runs here under a 3 GiB
    # address-space limit and still lists the run.
    _run_with_a_huge_segment(tmp_path / "spool", "r1")
    env = {**os.environ, "LOGCAPTURE_SPOOL": str(tmp_path / "spool"),
           "XDG_STATE_HOME": str(tmp_path / "state"),
           "LOGCAPTURE_CONFIG": str(tmp_path / "none.yaml")}
    limit = 3 << 30
    r = lc(["ls", "--json", "--source", "spool"], env, preexec_fn=lambda:
               resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert [json.loads(x)["run"] for x in r.stdout.decode().splitlines()] == ["r1"]
    # and the rest of the run reads as ever
    r = lc(["logs", "r1", "--source", "spool"], env)
    assert (r.returncode, r.stdout) == (0, b"line 0\nline 1\nline 2\n"), r.stderr


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_a_restarted_flusher_takes_the_callers_policy_and_loses_nothing(
        tmp_path: Path) -> None:
    # The capture worker moves the flusher under SCHED_IDLE with its rendering thread, and
    # back to the normal policy when the rendering falls behind (capture.serve_in_idle_time).
    import threading
    import time

    run_dir = create_run_dir(tmp_path, "r")
    w = SpoolWriter(run_dir, flush_interval=0.05, fsync=False)
    seq = iter(range(10_000))

    def write(n: int) -> None:
        w.write([Line(run="r", stream="stdout", seq=i, ts=1.0, text=f"x{i}")
                 for i in [next(seq) for _ in range(n)]])

    def on_disk() -> list[str]:
        return [x.text for x in iter_run(run_dir) if x.kind == "line"]  # type: ignore[attr-defined]

    def wait_for(text: str) -> None:  # written by the flusher, without close()
        deadline = time.monotonic() + 10
        while text not in on_disk():
            assert time.monotonic() < deadline, on_disk()[-3:]
            time.sleep(0.02)

    first = w._thread
    write(5)
    flushers: list[threading.Thread] = []

    def idle_caller() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        write(5)
        w.restart_flusher()
        flushers.append(w._thread)
        write(5)

    t = threading.Thread(target=idle_caller)
    t.start()
    t.join()
    idle = flushers[0]
    first.join(5)
    assert not first.is_alive()  # the replaced thread ended
    assert idle.is_alive() and idle.native_id is not None
    assert os.sched_getscheduler(idle.native_id) == os.SCHED_IDLE
    wait_for("x14")  # the new flusher writes on its own
    write(5)
    w.restart_flusher()  # from this thread: back to the normal policy
    normal = w._thread
    assert normal.native_id is not None
    assert os.sched_getscheduler(normal.native_id) == os.SCHED_OTHER
    idle.join(5)
    assert not idle.is_alive()
    write(5)
    wait_for("x24")
    w.close()
    w.restart_flusher()  # after close: nothing to restart
    assert on_disk() == [f"x{i}" for i in range(25)]  # each once, in order


def test_a_flusher_that_cannot_be_restarted_stays_where_it_was(tmp_path: Path) -> None:
    import threading
    import time

    run_dir = create_run_dir(tmp_path, "r")
    w = SpoolWriter(run_dir, flush_interval=0.05, fsync=False)
    first = w._thread

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threading.Thread, "start", no_thread)
        with pytest.raises(RuntimeError):
            w.restart_flusher()
    assert w._thread is first and first.is_alive()
    w.write([Line(run="r", stream="stdout", seq=0, ts=1.0, text="kept")])
    deadline = time.monotonic() + 10
    while not any(x.kind == "line" for x in iter_run(run_dir)):  # the old flusher wrote it
        assert time.monotonic() < deadline
        time.sleep(0.02)
    w.close()
    assert [x.text for x in iter_run(run_dir) if x.kind == "line"] == ["kept"]  # type: ignore[attr-defined]
