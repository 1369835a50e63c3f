"""Insights of distributed jobs whose ranks share one log, golden from real output: PyTorch
2.11 on an H100 (tests/captured/torch-2.11-h100/, what the programs wrote to their stdout and
stderr; tests/captured/torch-2.11-h100/README.md says what each program did). The root cause is
the rank that failed first, not the errors the other ranks got from it; an NCCL error carries
the cause NCCL gave; a rendezvous timeout says how many ranks never came. Each log is read in
full and, as the spool and the store read it, candidates only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import lc

from logcapture import ranklabel
from logcapture.insights import Diagnoser, Outcome
from logcapture.insights import matchers as M
from logcapture.insights.report import diagnose_stored
from logcapture.store import open_store

REAL = Path(__file__).parent / "captured" / "torch-2.11-h100"
FAILED = Outcome(exit_status=1, state="FAILED")


def _lines(name: str) -> list[tuple[str, int, str]]:
    return [(stream, i, text) for stream in ("stdout", "stderr")
            for i, text in enumerate((REAL / f"{name}.{stream[3:]}").read_text().splitlines())]


def _diagnose(name: str, candidates_only: bool = False, **where: object) -> dict[str, object]:
    d = Diagnoser()
    for stream, seq, text in _lines(name):
        if not candidates_only or d.in_traceback or Diagnoser.wants(text):
            d.feed(stream, seq, text)
        else:
            d.note_last_seq(stream, seq)
    return {i.kind: i for i in d.result(FAILED, **where)}  # type: ignore[arg-type]


@pytest.mark.parametrize("candidates_only", [False, True])
@pytest.mark.parametrize("name", ["ddp_fail", "ddp_tee"])
def test_the_root_cause_is_the_rank_torchrun_names_not_the_gloo_error_it_caused(
        name: str, candidates_only: bool) -> None:
    found = _diagnose(name, candidates_only)
    exc = found["python-exception"]
    assert exc.message == ("ValueError on rank 1 (node localhost): shard 7 is corrupt on this "
                           "rank at /work/steering/.gpu/work/ddp_fail.py:11 in <module>")
    assert exc.details["rank"] == 1 and exc.details["node"] == "localhost"
    assert [e.text for e in exc.evidence][-1].endswith(
        "[rank1]: ValueError: shard 7 is corrupt on this rank")
    # rank 0's error is said, as what followed from rank 1's
    other = found["other-ranks"]
    assert other.message.startswith("also failed: rank 0: RuntimeError: ")
    assert "Connection closed by peer" in other.message
    assert other.message.endswith("(a consequence of rank 1's failure)")
    assert other.details["ranks"] == [0]
    assert list(found) == ["python-exception", "other-ranks"]


def test_without_torchruns_summary_the_first_error_that_is_not_a_consequence_wins() -> None:
    lines = [t for _, _, t in _lines("ddp_fail") if t.startswith("[rank")]
    # rank 0's gloo error printed first: still a consequence, rank 1's ValueError the cause
    rank0 = [t for t in lines if t.startswith("[rank0]")]
    rank1 = [t for t in lines if t.startswith("[rank1]")]
    d = Diagnoser()
    for i, text in enumerate(rank0 + rank1):
        d.feed("stderr", i, text)
    exc = {i.kind: i for i in d.result(FAILED)}["python-exception"]
    assert exc.message.startswith("ValueError on rank 1: shard 7")  # no node: none was said


def test_two_ranks_tracebacks_interleaved_line_by_line_are_read_apart() -> None:
    lines = [t for _, _, t in _lines("ddp_fail") if t.startswith("[rank")]
    rank0 = [t for t in lines if t.startswith("[rank0]")]
    rank1 = [t for t in lines if t.startswith("[rank1]")]
    mixed = [t for pair in zip(rank1, rank0, strict=False) for t in pair] + rank0[len(rank1):]
    d = Diagnoser()
    for i, text in enumerate(mixed):
        d.feed("stderr", i, text)
    found = {i.kind: i for i in d.result(FAILED)}
    assert found["python-exception"].details["function"] == "<module>"
    assert found["python-exception"].details["line"] == 11  # rank 1's frame, not rank 0's
    assert found["other-ranks"].details["ranks"] == [0]


@pytest.mark.parametrize("candidates_only", [False, True])
def test_an_nccl_error_carries_the_cause_nccl_printed_after_it(candidates_only: bool) -> None:
    found = _diagnose("nccl_dup", candidates_only)
    nccl = found["nccl-error"]
    assert nccl.message.startswith(
        "NCCL error: invalid usage (NCCL 2.28.9): Duplicate GPU detected : rank 1 and rank 0 "
        "both on CUDA device 60 on rank 0 (node localhost) at ")
    assert nccl.details["cause"] == ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
                                     "device 60")
    assert nccl.details["rank"] == 0  # torchrun's root cause
    assert "python-exception" not in found


def test_an_nccl_warn_line_alone_is_the_cause_when_no_last_error_follows() -> None:
    d = Diagnoser()
    d.feed("stdout", 0, "[2026-11-27 11:50:55] vm:616:616 [0] init.cc:904 NCCL WARN Duplicate "
                        "GPU detected : rank 1 and rank 0 both on CUDA device 60")
    d.feed("stderr", 0, "torch.distributed.DistBackendError: NCCL error in: x.cpp:93, invalid "
                        "usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9")
    (nccl,) = d.result(FAILED)
    assert nccl.message == ("NCCL error: invalid usage (NCCL 2.28.9): Duplicate GPU detected : "
                            "rank 1 and rank 0 both on CUDA device 60")


@pytest.mark.parametrize("candidates_only", [False, True])
def test_a_rendezvous_timeout_says_how_many_ranks_never_came(candidates_only: bool) -> None:
    found = _diagnose("rdzv", candidates_only)
    assert list(found) == ["rendezvous-timeout"]
    rdzv = found["rendezvous-timeout"]
    assert rdzv.message.startswith("rendezvous timed out after 16 s: 1 of 2 ranks joined, 1 "
                                   "rank never came (rank 1) at ")
    assert (rdzv.details["joined"], rdzv.details["world"]) == ("1", "2")


def test_a_task_runs_exception_names_its_rank_and_node() -> None:
    d = Diagnoser()
    for i, text in enumerate(["Traceback (most recent call last):",
                              '  File "/home/u/train.py", line 9, in <module>',
                              '    raise ValueError("bad shard")', "ValueError: bad shard"]):
        d.feed("stderr", i, text)
    (exc,) = d.result(FAILED, 1, "n3")
    assert exc.message == "ValueError on rank 1 (node n3): bad shard at /home/u/train.py:9 in " \
                          "<module>"


def test_a_watchdog_timeout_lists_the_ranks_that_did_not_report() -> None:
    d = Diagnoser()
    for r in range(4):
        d.feed("stderr", 2 * r, f"[rank{r}]: step 9 done")
    for i, r in enumerate((0, 2, 3)):
        d.feed("stderr", 10 + i, f"[rank{r}]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] [Rank {r}]"
               " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType="
               "ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600060 "
               "milliseconds before timing out.")
    (nccl,) = d.result(FAILED)
    assert nccl.message.endswith("reported by rank(s) 0, 2, 3, not by rank(s) 1")
    assert nccl.details["silent"] == ["1"]


@pytest.mark.parametrize(("line", "rank", "local", "rest"), [
    ("[default1]:[rank1]: Traceback (most recent call last):", 1, 1,
     "Traceback (most recent call last):"),
    ("[default0]:rank 0 step 0 sum 3.0", None, 0, "rank 0 step 0 sum 3.0"),
    ("[rank0]:[W1127 11:50:56.855582190 ProcessGroupNCCL.cpp:1575] x", 0, None,
     "[W1127 11:50:56.855582190 ProcessGroupNCCL.cpp:1575] x"),
    ("[rank1]:   File \"a.py\", line 1, in <module>", 1, None,
     '  File "a.py", line 1, in <module>'),
    ("0: hello", 0, None, "hello"),
    (" 7: hello", 7, None, "hello"),
    ("[1,3]<stdout>:hello", 3, None, "hello"),
    ("[1,3]<stderr>: hello", 3, None, "hello"),
    ("rank 1 step 0 sum 3.0rank 0 step 0 sum 3.0", None, None,
     "rank 1 step 0 sum 3.0rank 0 step 0 sum 3.0"),
    ("12:30:00 started", None, None, "12:30:00 started"),
    ("[INFO1]: x", None, None, "[INFO1]: x"),
])
def test_the_launcher_labels(line: str, rank: int | None, local: int | None, rest: str) -> None:
    assert ranklabel.split(line) == (rank, local, rest)


def test_the_structure_lines_are_candidates() -> None:
    # the spool and the store find these by their needles, like the matchers' lines
    for needle in M.STRUCTURE_NEEDLES:
        assert Diagnoser.wants(needle) and needle in M.NEEDLES


def test_show_names_rank_1_from_the_spool_and_the_store(lc_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    """torchrun's real output, replayed under `logcapture run` (stdout and stderr as the
    workers wrote them, exit 1): `show` from the spool and, once uploaded, from the store."""
    body = (f"import shutil, sys\nfor name, out in (('out', sys.stdout), ('err', sys.stderr)):\n"
            f"    with open('{REAL}/ddp_fail.' + name) as f:\n"
            f"        shutil.copyfileobj(f, out)\n    out.flush()\nsys.exit(1)\n")
    script = tmp_path / "replay.py"
    script.write_text(body)
    lc(["run", "--no-sample", "--run-id", "ddp-1", "--", sys.executable, str(script)],
           lc_env)
    spool = json.loads(lc(["show", "ddp-1", "--json", "--source", "spool"], lc_env).stdout)
    assert [i["kind"] for i in spool["insights"]] == ["python-exception", "other-ranks"]
    assert spool["insights"][0]["message"].startswith(
        "ValueError on rank 1 (node localhost): shard 7 is corrupt on this rank")
    store = f"chdb://{tmp_path}/store"
    assert lc(["upload", "--store", store, "ddp-1"], lc_env).returncode == 0
    stored = json.loads(lc(["show", "ddp-1", "--json", "--store", store], lc_env).stdout)
    assert [(i["kind"], i["message"]) for i in stored["insights"]] == \
        [(i["kind"], i["message"]) for i in spool["insights"]]
    # both workers' JSON lines in one run, each with its rank: step, counted on each, is the
    # X axis (xaxis: a row's own rank), not rank
    assert spool["x_axis"] == stored["x_axis"] == "step"
    with open_store(store, must_exist=True) as st:  # the store's own diagnosis agrees
        again = diagnose_stored(st, "ddp-1")
    assert [(i.kind, i.message) for i in again] == \
        [(i["kind"], i["message"]) for i in spool["insights"]]


@pytest.mark.parametrize("label", ["{r}: ", "[1,{r}]<stderr>:", "[default{r}]:", "[rank{r}]: "])
def test_every_launchers_label_attributes_a_traceback_to_its_rank(label: str) -> None:
    """srun --label, Open MPI --tag-output, torchrun --tee and PyTorch: rank 0's consequence
    printed first and interleaved with rank 1's cause, which is named."""
    def tb(r: int, exc: str) -> list[str]:
        return [label.format(r=r) + t for t in (
            "Traceback (most recent call last):", '  File "/home/u/train.py", line 9, in step',
            "    loss = model(batch)", exc)]
    zero = tb(0, "RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection reset by peer")
    one = tb(1, "ValueError: shard 7 is corrupt")
    d = Diagnoser()
    for i, text in enumerate(t for pair in zip(zero, one, strict=True) for t in pair):
        d.feed("stderr", i, text)
    found = {i.kind: i for i in d.result(FAILED)}
    who = "local rank 1" if "default" in label else "rank 1"
    assert found["python-exception"].message.startswith(f"ValueError on {who}: shard 7")
    assert "(a consequence" in found["other-ranks"].message


SLURM = Path(__file__).parent / "captured" / "slurm-h100" / "spool"


@pytest.fixture
def slurm_jobs(lc_env: dict[str, str], spool: Path) -> dict[str, str]:
    """Jobs 2 and 3 as a real Slurm node's spool held them (tests/captured/slurm-h100)."""
    import shutil
    shutil.copytree(SLURM, spool)
    return lc_env


def _job(env: dict[str, str], job: str, *where: str) -> dict:
    done = lc(["show", job, "--json", *where], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_job_whose_every_rank_got_an_nccl_error_names_the_first_and_its_cause(
        slurm_jobs: dict[str, str], tmp_path: Path) -> None:
    """Job 3: both tasks of `srun -n 2` put NCCL on one GPU; each task's capture found an
    NCCL error of its own rank (a rank, not the list of ranks a watchdog timeout gives)."""
    spool = _job(slurm_jobs, "3", "--source", "spool")
    first, other = spool["insights"][:2]
    assert first["kind"] == "nccl-error"
    assert first["message"].startswith(
        "NCCL error: invalid usage (NCCL 2.28.9): Duplicate GPU detected : rank 0 and rank 1 "
        "both on CUDA device 60 on rank 0 (node vm) at /home/lcuser1/gpu_train.py:26")
    assert first["hint"].startswith("NCCL's reason, when it printed one")
    assert other["kind"] == "other-ranks" and "on rank 1 (node vm)" in other["message"]
    store = f"chdb://{tmp_path}/store"
    for run in ("3", "3.0.0", "3.0.1"):
        assert lc(["upload", "--store", store, run], slurm_jobs).returncode == 0
    stored = _job(slurm_jobs, "3", "--store", store)
    assert [i["message"] for i in stored["insights"]] == [i["message"] for i in
                                                         spool["insights"]]


def test_a_job_on_a_real_node_names_the_rank_that_raised_not_the_gloo_error(
        slurm_jobs: dict[str, str]) -> None:
    """Job 2: rank 1 raised at step 12; rank 0's all-reduce then lost its peer."""
    info = _job(slurm_jobs, "2", "--source", "spool")
    first, other = info["insights"][:2]
    assert first["message"].startswith("ValueError on rank 1 (node vm): bad batch at step 12")
    assert other["message"].startswith("also failed after rank 1: RuntimeError on rank 0 "
                                       "(node vm): ") and other["message"].endswith(
        "(a consequence)")
    assert info["x_axis"] == "step" and [r["rank"] for r in info["ranks"]] == [0, 1]


def test_torchrun_tee_s_objects_are_metadata_of_each_worker(lc_env: dict[str, str]) -> None:
    """Real `torchrun --tee 3` output: both workers print a JSON line per step behind their
    labels; each is a metadata row with its label, one series per worker, whose `step` is
    the X axis although the merged steps read 0, 0, 1, 1 ..."""
    src = REAL / "ddp_tee.out"
    assert lc(["run", "--no-sample", "--run-id", "tee-1", "--", "cat", str(src)],
              lc_env).returncode == 0
    info = json.loads(lc(["show", "tee-1", "--json", "--source", "spool"], lc_env).stdout)
    assert (info["metadata_keys"], info["x_axis"]) == (["loss", "rank", "step"], "step")
    done = lc(["export", "tee-1", "--what", "metadata"], lc_env, text=True)
    head, *lines = done.stdout.splitlines()
    assert head.split(",") == ['"ts"', '"label"', '"seq"', '"step"', '"loss"', '"rank"']
    rows = [ln.replace('"', "").split(",") for ln in lines]
    printed = [json.loads(ln.split(":", 1)[1]) for ln in src.read_text().splitlines()
               if ln.startswith(("[default0]:{", "[default1]:{"))]
    assert len(rows) == len(printed) == 8
    assert [(r[1], r[3], r[5]) for r in rows] == [
        (f"local rank {p['rank']}", str(p["step"]), str(p["rank"])) for p in printed]


def test_show_and_compare_judge_labelled_workers_per_label(lc_env: dict[str, str]) -> None:
    from logcapture.xaxis import choose_x_axis

    """Two workers behind torchrun --tee's labels, each counting `step` and a time `t`: per
    worker `step` is the X axis (increasing integers); the merged rows would give `t`."""
    code = ("import json\nfor s in range(4):\n    for w in (0, 1):\n"
            "        print(f'[default{w}]:' + json.dumps({'step': s, 't': s + 0.1 * w + 0.05}))\n")
    assert lc(["run", "--no-sample", "--run-id", "tee-t", "--", sys.executable, "-c", code],
              lc_env).returncode == 0
    info = json.loads(lc(["show", "tee-t", "--json", "--source", "spool"], lc_env).stdout)
    assert info["x_axis"] == "step"
    # one worker's rows on request, by its label's number
    one = json.loads(lc(["show", "tee-t", "--json", "--rank", "1"], lc_env).stdout)
    assert (one["metadata_ranks"], one["metadata_keys"], one["x_axis"]) == ("1", ["step", "t"],
                                                                          "step")
    assert lc(["run", "--no-sample", "--run-id", "plain", "--", "true"], lc_env).returncode == 0
    refused = lc(["show", "plain", "--rank", "1"], lc_env, text=True)
    assert refused.returncode != 0 and "launchers' labels" in refused.stderr
    from logcapture.query.local_reader import LocalReader
    from logcapture.web.reads import compare_one

    reader = LocalReader(Path(lc_env["LOGCAPTURE_SPOOL"]), None, "spool")
    rows = reader.metadata("tee-t")[::-1]
    one = compare_one(reader.summary("tee-t"), rows, "t")
    assert one["x_key"] == "step"
    assert choose_x_axis([r["fields"] for r in rows]) == "t"  # the rows as one series
