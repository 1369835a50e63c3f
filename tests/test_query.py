"""The read layer (logcapture/query/) on the real embedded engine: the owner filter on every
question, one summary and one describe whatever the source, following a run through the store,
and the one owner rule of spool runs."""

from __future__ import annotations

import os
import pwd
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from logcapture import query as Q
from logcapture import store as S
from logcapture.errors import NotFound
from logcapture.logview import parse_cursor
from logcapture.ownership import trusted_identity
from logcapture.records import End, Line, Metadata, Note, Sample, Start
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter

T0 = 1_790_000_000.5
ME = pwd.getpwuid(os.getuid()).pw_name


def records(run: str, who: str, uid: int, n: int = 20, secret: str = "") -> list:
    return [Start(run=run, stream="run", seq=0, ts=T0, command=["train.py", who], user=who,
                  uid=uid, host="n1", slurm={"job_id": run, "cluster": "c1"}),
            *[Line(run=run, stream="stdout", seq=i, ts=T0 + i / 100, text=f"{who} step {i}"
                   + secret) for i in range(n)],
            Note(run=run, stream="stdout", seq=n, ts=T0 + 1, note="repeat", count=2, text="x"),
            Metadata(run=run, stream="stdout", seq=n + 1, ts=T0 + 2, fields={"epoch": 1,
                                                                             "loss": 0.5}),
            Line(run=run, stream="stderr", seq=0, ts=T0 + 2.5, text=f"{who} err"),
            Sample(run=run, stream="sample:n1", seq=0, ts=T0 + 3, node="n1",
                   job={"cpu_seconds_total": 1.5, "memory_rss_bytes": 1 << 20}),
            End(run=run, stream="run", seq=1, ts=T0 + 4, exit_status=0, state="COMPLETED",
                duration=4.0, counts={"stdout": {"lines": n}, "stderr": {"lines": 1}})]


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A store holding run "900" of alice and of bob (the same run id: owners stay apart) and
    run "901" of bob alone."""
    dsn = f"chdb://{tmp_path_factory.mktemp('query') / 'store'}"
    with S.open_store(dsn) as st:
        for run, who, uid in (("900", "alice", 1001), ("900", "bob", 1002),
                              ("901", "bob", 1002)):
            st.insert_records(records(run, who, uid),
                              S.Identity(run=run, user=who, uid=uid, cluster="c1", job_id=run))
    yield dsn


@contextmanager
def held(dsn: str) -> Iterator[S.Store]:
    with S.open_store(dsn, must_exist=True) as st:
        yield st


def reader(dsn: str, owner: str | None) -> Q.StoreReader:
    return Q.StoreReader(lambda: held(dsn), owner)


def test_every_question_sees_the_owners_rows_only(dsn: str) -> None:
    alice, bob, admin = reader(dsn, "alice"), reader(dsn, "bob"), reader(dsn, None)
    assert [d["run"] for d in alice.runs()] == ["900"]
    assert sorted(d["run"] for d in bob.runs()) == ["900", "901"]
    assert len(admin.runs()) == 3
    assert {d["owner"] for d in alice.runs()} == {"alice"}
    texts = [d.get("text", "") for d in alice.lines("900")]
    assert texts and all("bob" not in t for t in texts)
    assert len(alice.lines("900", "stdout")) == 22  # 20 lines, the note, the metadata
    assert [d["kind"] for d in alice.lines("900", tail=3)] == ["note", "metadata", "line"]
    assert alice.lines("900", tail=1)[0]["text"] == "alice err"
    for question in (alice.lines, alice.describe, alice.metadata, alice.samples):
        with pytest.raises(NotFound):
            question("901")
    with pytest.raises(NotFound):
        alice.resolve("901")
    with pytest.raises(NotFound):
        alice.export_rows("901", "lines")
    assert len(alice.metadata("900")) == 1 and len(alice.samples("900")) == 1
    assert (alice.describe("900")["owner"], alice.describe("900")["uid"]) == ("alice", 1001)
    assert alice.describe("900")["lines"] == {"stdout": 20, "stderr": 1}
    assert [r["text"] for r in alice.export_rows("900", "lines")][:1] == ["alice step 0"]
    # The administrator reads both owners' rows of a shared run id.
    assert len(admin.lines("900", "stderr")) == 2


def test_a_summary_has_the_same_keys_from_spool_and_store(tmp_path: Path, dsn: str) -> None:
    rd = create_run_dir(tmp_path, "sp1")
    w = SpoolWriter(rd, fsync=False)
    w.write(records("sp1", ME, os.getuid()))
    w.close()
    [spool] = Q.LocalReader(tmp_path, f"chdb://{tmp_path / 'none'}").runs()
    [store] = [d for d in reader(dsn, "bob").runs() if d["run"] == "901"]
    assert tuple(spool) == tuple(store) == Q.SUMMARY_KEYS
    assert spool["source"] == "spool" and store["source"] == "store"
    assert spool["lines"] == 20 + 1 and store["lines"] == 21
    assert spool["owner"] == ME and store["owner"] == "bob"


def test_describe_is_one_mapping_from_spool_and_store(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'store'}"
    rd = create_run_dir(tmp_path / "spool", "same")
    w = SpoolWriter(rd, fsync=False)
    w.write(records("same", ME, os.getuid()))
    w.close()
    with S.open_store(dsn) as st:
        st.insert_records(records("same", ME, os.getuid()), trusted_identity(rd))
    from_spool = Q.LocalReader(tmp_path / "spool", dsn, source="spool")
    from_store = Q.LocalReader(tmp_path / "spool", dsn, source="store")
    try:
        a = from_spool.describe(from_spool.resolve("same"))
        b = from_store.describe(from_store.resolve("same"))
    finally:
        from_spool.close()
        from_store.close()
    assert b.pop("stored_in").startswith("chdb://") and a.pop("stored_in") is None
    assert a == b
    assert a["resources"]["cpu_seconds_total"] == 1.5


def test_a_cursor_opens_the_log_at_its_own_entry_from_spool_and_store(tmp_path: Path) -> None:
    # Time stamps whose float, times 1e9, is not their decimal value in ns (round(ts * 1e9)
    # of 1795528262.5871518 is ...151872, the store holds ...151800): a cursor must name the
    # very entry in both sources, so that the page after "ns - 1" begins with it.
    dsn = f"chdb://{tmp_path / 'store'}"
    stamps = [1795528262.5871518, 1795528262.5871523, 1795528263.1234567, 1795528263.9999998]
    recs = [Start(run="ns", stream="run", seq=0, ts=stamps[0], command=["x"], user=ME,
                  uid=os.getuid()),
            *[Line(run="ns", stream="stdout", seq=i, ts=t, text=f"line {i}")
              for i, t in enumerate(stamps)],
            End(run="ns", stream="run", seq=1, ts=stamps[-1], exit_status=0,
                state="COMPLETED")]
    assert any(round(t * 1e9) != int(f"{t:.7f}".replace(".", "")) * 100 for t in stamps)
    rd = create_run_dir(tmp_path / "spool", "ns")
    w = SpoolWriter(rd, fsync=False)
    w.write(recs)
    w.close()
    with S.open_store(dsn) as st:
        st.insert_records(recs, trusted_identity(rd))
    for source in ("spool", "store"):
        r = Q.LocalReader(tmp_path / "spool", dsn, source=source)
        try:
            entries = r.log("ns")["entries"]
            assert [e["text"] for e in entries] == [f"line {i}" for i in range(4)]
            for i, e in enumerate(entries):
                ns, stream, seq = parse_cursor(e["cursor"])
                after = r.log("ns", after=f"{ns - 1}:{stream}:{seq}")["entries"]
                assert [x["text"] for x in after] == [f"line {j}" for j in range(i, 4)], source
                before = r.log("ns", before=f"{ns + 1}:{stream}:{seq}")["entries"]
                assert [x["text"] for x in before] == [f"line {j}" for j in range(i + 1)], source
        finally:
            r.close()


def test_follow_reads_each_record_once_as_they_reach_the_store(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'store'}"
    recs = records("live", "alice", 1001, n=30)
    ident = S.Identity(run="live", user="alice", uid=1001)
    with S.open_store(dsn) as st:
        st.insert_records(recs[:5], ident)
    lock = threading.Lock()  # one process, one engine: the test's writer and reader alternate

    @contextmanager
    def session() -> Iterator[S.Store]:
        with lock, S.open_store(dsn, must_exist=True) as st:
            yield st

    def ship_the_rest() -> None:
        for i in range(5, len(recs), 7):
            time.sleep(0.2)
            with lock, S.open_store(dsn) as st:
                st.insert_records(recs[i:i + 7], ident)

    writer = threading.Thread(target=ship_the_rest)
    writer.start()
    got = list(Q.StoreReader(session, "alice").follow("live", poll=0.05, settle=0.3))
    writer.join()
    kinds = [d["kind"] for d in got]
    assert kinds[0] == "start" and kinds[-1] == "end"
    body = [(d["stream"], d["seq"]) for d in got[1:-1]]
    assert len(body) == len(set(body)) == len(recs) - 3  # start, sample and end aside
    assert [d["text"] for d in got if d["kind"] == "line"][:3] == [
        "alice step 0", "alice step 1", "alice step 2"]
    # Another owner follows nothing of it.
    with pytest.raises(NotFound):
        next(iter(Q.StoreReader(session, "bob").follow("live", poll=0.05)))


def test_a_spool_run_of_another_user_is_not_listed_or_read(tmp_path: Path) -> None:
    rd = create_run_dir(tmp_path, "theirs")
    w = SpoolWriter(rd, fsync=False)
    w.write(records("theirs", "nobody", 65534))
    w.close()
    os.chown(rd, 65534, 65534)
    r = Q.LocalReader(tmp_path, f"chdb://{tmp_path / 'none'}", source="spool")
    r.owner, r.uid = "someone", 4242  # as an ordinary user (the tests run as root)
    assert r.runs() == []
    with pytest.raises(NotFound):
        r.resolve("theirs")
    assert trusted_identity(rd).uid == 65534  # the directory's owner, not the Start record


def test_the_owner_rule_takes_a_slurm_runs_owner_from_roots_job_record(tmp_path: Path) -> None:
    import json

    root = tmp_path / "root"
    jobs = root / ".jobs"
    jobs.mkdir(parents=True, mode=0o700)
    (jobs / "55.json").write_text(json.dumps({"uid": 1234, "user": "carol",
                                              "cluster": "c9"}))
    rd = create_run_dir(root / "55", "55")
    ident = trusted_identity(rd)
    assert (ident.user, ident.uid, ident.cluster, ident.job_id) == ("carol", 1234, "c9", "55")
    # A record in a directory that is not root's alone does not count.
    jobs.chmod(0o777)
    assert trusted_identity(rd).uid == os.stat(rd).st_uid


def test_job_references_resolve_across_the_spool_and_the_store(tmp_path: Path) -> None:
    """Array 6: tasks 1 and 2 (job ids 7, 8) shipped to the store, task 3 (job id 6) still in
    the spool; job 12 requeued once, its first run in the store, its second in the spool."""
    from logcapture.errors import UsageError

    def task(run: str, t: str, job_id: str = "") -> list:
        recs = records(run, ME, os.getuid(), n=2)
        return [recs[0]._replace(slurm={"job_id": job_id or run, "array_job_id": "6",
                                         "array_task_id": t, "job_name": "sweep"}), *recs[1:]]

    dsn = f"chdb://{tmp_path / 'store'}"
    spool = tmp_path / "spool"
    local = {"6": task("6", "3"), "12.1": records("12.1", ME, os.getuid(), n=1)}
    local["12.1"][0] = local["12.1"][0]._replace(slurm={"job_id": "12"})
    for run, recs in local.items():
        w = SpoolWriter(create_run_dir(spool, run), fsync=False)
        w.write(recs)
        w.close()
    with S.open_store(dsn) as st:
        for run, recs in (("7", task("7", "1")), ("8", task("8", "2")),
                          ("12", records("12", ME, os.getuid(), n=1))):
            st.insert_records(recs, S.Identity(run=run, user=ME, uid=os.getuid(),
                                               job_id=run.partition(".")[0]))
    reader = Q.LocalReader(spool, dsn)
    try:
        assert reader.resolve("6_1") == "7" and reader.resolve("6_2") == "8"
        assert reader.resolve("6_3") == "6"  # not task 3's job id read as the array
        with pytest.raises(UsageError, match="6_1, 6_2, 6_3"):
            reader.resolve("6")
        assert reader.resolve("12") == "12.1" and reader.resolve("12.0") == "12"
        assert [d["text"] for d in reader.lines("7") if d["kind"] == "line"][0] == f"{ME} step 0"
        jobs = {d["job"] + (f".{d['restart']}" if d["restart"] else ""): d["source"]
                for d in reader.runs()}
        assert jobs == {"6_1": "store", "6_2": "store", "6_3": "spool", "12": "store",
                        "12.1": "spool"}
    finally:
        reader.close()
