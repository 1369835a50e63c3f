"""The diagnosis of failed runs, from the wordings real programs print.

Every line below is the real program's wording (PyTorch's CUDA caching allocator of several
versions, TensorFlow's BFC allocator, PyTorch's ProcessGroupNCCL watchdog, NCCL, Open MPI's and
MPICH's abort messages, bash's and dash's, glibc's strsignal names as bash prints them,
slurmstepd's and srun's), as found in those projects' sources and issue trackers; lookalikes
must not match.
"""

from __future__ import annotations

import re

import pytest

from logcapture.insights import Diagnoser, Outcome, diagnose
from logcapture.insights import matchers as M

FAILED = Outcome(exit_status=1, state="FAILED")
OK = Outcome(exit_status=0, state="COMPLETED")


def _lines(text: str, stream: str = "stderr", first: int = 0) -> list[tuple[str, int, str]]:
    return [(stream, first + i, line) for i, line in enumerate(text.strip("\n").split("\n"))]


def _kinds(text: str, outcome: Outcome = FAILED) -> dict[str, object]:
    return {i.kind: i for i in diagnose(_lines(text), outcome)}


# (kind, real line, words the message must hold)
REAL = [
    # PyTorch 2.2+ (torch.OutOfMemoryError; 2.1 spelled "capacty")
    ("cuda-oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 "
     "has a total capacity of 79.15 GiB of which 11.06 MiB is free. Including non-PyTorch "
     "memory, this process has 79.13 GiB memory in use. Of the allocated memory 78.24 GiB is "
     "allocated by PyTorch, and 245.02 MiB is reserved by PyTorch but unallocated. If reserved "
     "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
     "True to avoid fragmentation.  See documentation for Memory Management  "
     "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
     ["GPU 0", "20.00 MiB", "11.06 MiB", "79.15 GiB"]),
    ("cuda-oom", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. "
     "GPU 0 has a total capacty of 6.00 GiB of which 0 bytes is free. Of the allocated memory "
     "2.93 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch but unallocated.",
     ["1.70 GiB", "0 bytes", "6.00 GiB"]),
    # PyTorch 1.x
    ("cuda-oom", "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 "
     "GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)",
     ["12.50 MiB", "10.92 GiB", "9.28 GiB free", "8.57 MiB allocated"]),
    ("cuda-oom", "RuntimeError: CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB "
     "total capacity; 781.59 MiB already allocated; 3.03 GiB free; 1.24 GiB reserved in total "
     "by PyTorch)", ["2.26 GiB", "3.03 GiB free"]),
    ("cuda-oom", "RuntimeError: CUDA error: out of memory", ["CUDA error: out of memory"]),
    # TensorFlow
    ("cuda-oom", "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
     "allocating tensor with shape[25088,4096] and type float on "
     "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
     ["[25088,4096]", "float", "device:GPU:0"]),
    ("cuda-oom", "2021-01-01 00:00:00.000000: E tensorflow/stream_executor/cuda/"
     "cuda_driver.cc:806] failed to allocate 2.00G (2147483648 bytes) from device: "
     "CUDA_ERROR_OUT_OF_MEMORY: out of memory", ["2.00 GiB"]),
    ("cuda-oom", "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
     "trying to allocate 17179869184 bytes.", ["16.00 GiB"]),
    # NCCL
    ("nccl-error", "[rank3]:[E1024 12:00:00.123456789 ProcessGroupNCCL.cpp:616] [Rank 3] "
     "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
     "NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds "
     "before timing out.", ["ALLREDUCE", "SeqNum 808", "10.0 min", "rank(s) 3"]),
    ("nccl-error", "[E ProcessGroupNCCL.cpp:458] [Rank 0] Watchdog caught collective operation "
     "timeout: WorkNCCL(SeqNum=96120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 25624887 "
     "milliseconds before timing out.", ["ALLREDUCE", "96120", "7.1 h", "30.0 min"]),
    ("nccl-error", "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
     "c10d/ProcessGroupNCCL.cpp:1333, unhandled system error (run with NCCL_DEBUG=INFO for "
     "details), NCCL version 2.18.1", ["unhandled system error", "NCCL 2.18.1"]),
    ("nccl-error", "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:"
     "518, unhandled system error, NCCL version 2.4.8", ["unhandled system error", "2.4.8"]),
    ("nccl-error", "node01:4533:4667 [0] NCCL WARN NET/IB : Got completion from peer "
     "10.0.0.2<1234> with error 12, opcode 0, len 0, vendor err 129", ["node01", "NET/IB"]),
    ("nccl-error", "[2026-11-27 11:50:55] vm:616:616 [0] init.cc:904 NCCL WARN Duplicate GPU "
     "detected : rank 1 and rank 0 both on CUDA device 60", ["on vm (device 0): Duplicate GPU"]),
    # PyTorch's TCPStore on the rank that hosts it (tests/captured/torch-2.11-h100/rdzv.err)
    ("rendezvous-timeout", "torch.distributed.DistStoreError: Timed out after 16 seconds "
     "waiting for clients. 1/2 clients joined.", ["16 s", "1 of 2 ranks joined", "1 rank never"]),
    # MPI
    ("mpi-abort", "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD",
     ["rank 3", "MPI_COMM_WORLD"]),
    ("mpi-abort", "application called MPI_Abort(MPI_COMM_WORLD, 1) - process 10",
     ["process 10", "error code 1"]),
    # Slurm's lines
    ("time-limit", "slurmstepd: error: *** STEP 123.0 ON node1 CANCELLED AT 2024-01-01T00:00:00 "
     "DUE TO TIME LIMIT ***", ["time limit", "2024-01-01T00:00:00"]),
    ("preempted", "slurmstepd: error: *** JOB 123 ON node1 CANCELLED AT 2024-01-01T00:00:00 DUE "
     "TO PREEMPTION ***", ["preempted"]),
    ("node-fail", "slurmstepd: error: *** JOB 123 ON node7 CANCELLED AT 2024-01-01T00:00:00 DUE "
     "TO NODE FAILURE ***", ["node7"]),
    ("cancelled", "slurmstepd: error: *** STEP 3495064.0 ON orion-01-01 CANCELLED AT "
     "2021-10-27T19:35:36 ***", ["cancelled", "2021-10-27T19:35:36"]),
    ("oom-kill", "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the "
     "step tasks have been OOM Killed.", ["OOM killer", "1 process"]),
    ("oom-kill", "slurmstepd: error: Detected 2 oom-kill event(s) in step 3756240.batch cgroup.",
     ["2 process"]),
    ("oom-kill", "srun: error: nid001277: tasks 1-3: Out Of Memory", ["1-3", "nid001277"]),
    # signals, as bash and srun print them
    ("signal", "./run.sh: line 5: 12345 Segmentation fault      (core dumped) ./a.out",
     ["Segmentation fault", "core dumped", "./a.out"]),
    ("signal", "Segmentation fault (core dumped)", ["SIGSEGV", "core dumped"]),
    ("signal", "/var/spool/slurmd/job42/slurm_script: line 4: 991 Bus error               "
     "python train.py", ["Bus error", "python train.py"]),
    ("signal", "./job.sh: line 9: 1234 Killed                  python big.py", ["SIGKILL"]),
    ("signal", "Illegal instruction (core dumped)", ["Illegal instruction"]),
    ("signal", "Aborted (core dumped)", ["SIGABRT", "core dumped"]),
    ("signal", "srun: error: node1: task 3: Segmentation fault (core dumped)",
     ["task 3", "node1", "Segmentation fault"]),
    ("signal", "Fatal Python error: Segmentation fault", ["faulthandler"]),
    # files
    ("disk-full", "OSError: [Errno 28] No space left on device: '/scratch/u/ckpt.pt'",
     ["/scratch/u/ckpt.pt"]),
    ("disk-full", "cp: error writing 'out.bin': No space left on device", ["full"]),
    ("quota", "OSError: [Errno 122] Disk quota exceeded: '/home/u/out'", ["quota", "/home/u/out"]),
    # shells
    ("command-not-found", "/var/spool/slurmd/job42/slurm_script: line 3: pyhton: command not "
     "found", ["pyhton", "line 3"]),
    ("command-not-found", "bash: nvidia-smi: command not found", ["nvidia-smi"]),
    ("command-not-found", "/bin/sh: 1: foo: not found", ["foo"]),
    ("command-not-found", "./job.sh: line 2: ./a.out: cannot execute binary file: Exec format "
     "error", ["./a.out", "Exec format error"]),
    ("command-not-found", "bash: ./run.sh: Permission denied", ["./run.sh"]),
]


@pytest.mark.parametrize(("kind", "line", "words"), REAL, ids=[f"{k}-{i}" for i, (k, _, _)
                                                                in enumerate(REAL)])
def test_each_real_wording_gives_its_kind_and_figures(kind: str, line: str,
                                                      words: list[str]) -> None:
    found = _kinds(line)
    assert kind in found, f"{kind} not found in {line!r}: {list(found)}"
    insight = found[kind]
    for word in words:
        assert word in insight.message, (word, insight.message)
    assert insight.evidence and insight.evidence[0].text == line
    assert insight.evidence[0].seq == 0 and insight.evidence[0].stream == "stderr"
    assert "?" not in insight.message.replace("?)", "")


def test_every_matcher_has_a_real_example_and_its_needle_is_in_it() -> None:
    examples = [line for _, line, _ in REAL] + [
        "with errorcode 1.", "  Errorcode: 1", "Floating point exception (core dumped)"]
    for m, rx in zip(M.MATCHERS, M.COMPILED, strict=True):
        hits = [line for line in examples if rx.search(line)]
        assert hits, f"no example for {m.pattern!r}"
        for line in hits:
            if m.needle not in line:
                # an example of this pattern without the needle would never be tried
                raise AssertionError(f"needle {m.needle!r} missing from {m.pattern!r}")


LOOKALIKES = [
    "Epoch 3: error rate 0.12, loss 0.4",
    "INFO: no error found in the configuration",
    "Using the CUDA out-of-memory handler from a library",
    "segmentation of the image: fault tolerant mode",
    "  File \"train.py\", line 3, in <module>",
    "Killed 3 zombie processes before start",
    "We did not abort training",
    "timeout=600 for collective operations",
    "the command was found",
]


@pytest.mark.parametrize("line", LOOKALIKES)
def test_lookalikes_give_no_specific_kind(line: str) -> None:
    kinds = set(_kinds(line))
    assert kinds <= {"failed"}, (line, kinds)


def test_a_run_that_ended_well_gets_no_diagnosis() -> None:
    log = "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB\nretrying\ndone"
    assert diagnose(_lines(log), OK) == []


TRACEBACK = '''\
Traceback (most recent call last):
  File "/home/u/proj/train.py", line 88, in <module>
    main()
  File "/home/u/proj/train.py", line 80, in main
    loss = step(model, batch)
  File "/home/u/proj/model.py", line 12, in step
    out = model(batch)
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1501, in _call_impl
    return forward_call(*args, **kwargs)
  File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 2210, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
IndexError: index out of range in self'''


def test_python_exception_names_the_innermost_frame_of_the_users_code() -> None:
    found = _kinds("epoch 1\n" + TRACEBACK)
    exc = found["python-exception"]
    assert exc.message.startswith("IndexError: index out of range in self at "
                                  "/home/u/proj/model.py:12 in step")
    assert exc.details["type"] == "IndexError" and exc.details["own_code"]
    seqs = [e.seq for e in exc.evidence]
    assert seqs == [1, 6, 12]  # the header, the user's frame, the exception line
    assert exc.evidence[-1].text == "IndexError: index out of range in self"


def test_the_last_traceback_wins_chained_and_prefixed() -> None:
    log = ("[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "a.py", line 1, in <module>\n'
           "[rank0]: KeyError: 'lr'\n"
           "[rank0]: \n"
           "[rank0]: During handling of the above exception, another exception occurred:\n"
           "[rank0]: Traceback (most recent call last):\n"
           '[rank0]:   File "b.py", line 7, in load\n'
           "[rank0]:     cfg = read()\n"
           "[rank0]: ValueError: bad config")
    exc = _kinds(log)["python-exception"]
    assert exc.message == "ValueError on rank 0: bad config at b.py:7 in load"
    assert exc.details["code"] if "code" in exc.details else True


OOM_TRACEBACK = TRACEBACK.rsplit("\n", 1)[0] + (
    "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
    "total capacity of 79.10 GiB of which 3.94 GiB is free. Including non-PyTorch memory, this "
    "process has 75.15 GiB memory in use. " + "x" * 300)


def test_an_error_a_specific_insight_explains_is_listed_once_with_the_users_frame() -> None:
    found = diagnose(_lines("loading model\n" + OOM_TRACEBACK), FAILED)
    assert [i.kind for i in found] == ["cuda-oom"]
    oom = found[0]
    assert oom.message.endswith(" at /home/u/proj/model.py:12 in step")
    assert oom.details["file"] == "/home/u/proj/model.py" and oom.details["line"] == 12
    assert oom.details["exception"] == "torch.OutOfMemoryError"
    assert oom.details["size_bytes"] == 20 * 2**30  # the matcher's figures stay
    assert [e.seq for e in oom.evidence] == [6, 12]  # the user's frame, the exception line
    # an exception no matcher explains stays a python-exception
    assert [i.kind for i in diagnose(_lines(TRACEBACK), FAILED)] == ["python-exception"]


def test_a_caught_traceback_the_run_went_on_after_is_not_the_cause() -> None:
    log = TRACEBACK + "\n" + "\n".join(f"step {i} loss 0.1" for i in range(500))
    found = _kinds(log, Outcome(exit_status=2, state="FAILED"))
    assert "python-exception" not in found
    assert set(found) == {"failed"}  # the catch-all: no error-looking line left after it


def test_an_exception_with_no_message_and_a_library_only_traceback() -> None:
    log = ('Traceback (most recent call last):\n'
           '  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main\n'
           'AssertionError')
    exc = _kinds(log)["python-exception"]
    assert exc.message.startswith("AssertionError at /usr/lib/python3.11/runpy.py:198")
    assert not exc.details["own_code"]


def test_signal_from_the_end_record_and_from_a_shell_exit_status() -> None:
    killed = diagnose([], Outcome(signal=9, state="SIGNALED"))
    assert [(i.kind, i.details["signal"]) for i in killed] == [("signal", "SIGKILL")]
    segv = diagnose([], Outcome(exit_status=139, state="FAILED"))
    assert segv[0].kind == "signal" and "SIGSEGV" in segv[0].message


def test_command_not_found_from_exit_127_alone() -> None:
    found = {i.kind: i for i in diagnose([], Outcome(exit_status=127, state="FAILED"))}
    assert "127" in found["command-not-found"].message


@pytest.mark.parametrize(("state", "kind"), [
    ("TIMEOUT", "time-limit"), ("CANCELLED by 1000", "cancelled"), ("NODE_FAIL", "node-fail"),
    ("PREEMPTED", "preempted"), ("OUT_OF_MEMORY", "oom-kill")])
def test_slurm_states(state: str, kind: str) -> None:
    found = {i.kind: i for i in diagnose([], Outcome(exit_status=0, slurm_state=state,
                                                    ended=1.7e9))}
    assert kind in found
    assert found[kind].details["slurm_state"] == state
    if state.startswith("CANCELLED"):
        assert "uid 1000" in found[kind].message
    assert "at 20" in found[kind].message  # when


def test_the_state_and_the_line_join_in_one_insight() -> None:
    line = ("slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME "
            "LIMIT ***")
    found = diagnose(_lines(line), Outcome(signal=15, slurm_state="TIMEOUT"))
    kinds = [i.kind for i in found]
    assert kinds.count("time-limit") == 1
    assert found[0].kind == "time-limit" and found[0].evidence[0].text == line


def test_nccl_timeouts_of_several_ranks_make_one_insight_listing_them() -> None:
    lines = "\n".join(
        f"[rank{r}]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, "
        "NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 "
        "milliseconds before timing out." for r in (0, 4, 2))
    nccl = _kinds(lines)["nccl-error"]
    assert "rank(s) 0, 4, 2" in nccl.message
    assert nccl.details["rank"] == ["0", "4", "2"] and nccl.details["lines"] == 3


def test_open_mpi_banner_over_two_lines() -> None:
    banner = ("-" * 74 + "\nMPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n"
              "with errorcode 1.\n\nNOTE: invoking MPI_ABORT causes Open MPI to kill all MPI "
              "processes.\n" + "-" * 74)
    mpi = _kinds(banner)["mpi-abort"]
    assert mpi.message == "MPI_ABORT called by rank 0 in MPI_COMM_WORLD with error code 1"
    assert [e.seq for e in mpi.evidence] == [1, 2]


def test_the_catch_all_points_at_the_last_error_looking_lines() -> None:
    log = "starting\nERROR: could not open data.csv\nWarning: x\nFATAL: giving up\nbye"
    (only,) = diagnose(_lines(log), Outcome(exit_status=3, state="FAILED"))
    assert only.kind == "failed"
    assert only.message == "exited with status 3; the last error-looking line: FATAL: giving up"
    assert [e.seq for e in only.evidence] == [1, 3]


def test_candidates_only_give_the_same_answer() -> None:
    log = ("x\n" * 5 + TRACEBACK + "\nRuntimeError: CUDA out of memory. Tried to allocate 2 "
           "MiB\n" + "y\n" * 3).splitlines()
    full = diagnose([("stderr", i, t) for i, t in enumerate(log)], FAILED)
    d = Diagnoser()
    tb = log.index(M.TRACEBACK_HEAD)
    for i, t in enumerate(log):
        if Diagnoser.wants(t) or tb <= i < tb + 12:
            d.feed("stderr", i, t)
    d.note_last_seq("stderr", len(log) - 1)
    assert d.result(FAILED) == full


def test_render_keeps_optional_parts_only_when_filled() -> None:
    assert M.render("a[ b {x}][ c {y}]", {"x": "1"}) == "a b 1"
    assert M.render("{n|bytes}", {"n": "1073741824"}) == "1.00 GiB"
    assert M.render("{t|ms}", {"t": "600000"}) == "10.0 min"
    assert re.fullmatch(r"x \?", M.render("x {missing}", {}))


# --- efficiency notes ---------------------------------------------------------------------------
from logcapture.insights.efficiency import (  # noqa: E402
    Thresholds,
    efficiency_notes,
    parse_time_limit,
    slurm_request,
)


def _samples(util: float, mem_used: int, cpu_per_s: float, rss: int, n: int = 61,
             step: float = 60.0) -> list[dict]:
    return [{"kind": "sample", "run": "r", "stream": "sample:n1", "seq": i, "ts": i * step,
             "node": "n1",
             "gpus": [{"uuid": f"GPU-{g}", "index": g, "utilization_gpu_percent": util,
                       "memory_used_bytes": mem_used, "memory_total_bytes": 80 * 2**30}
                      for g in range(2)],
             "job": {"cpu_seconds_total": cpu_per_s * i * step, "memory_rss_bytes": rss,
                     "cpus_allocated": 8}} for i in range(n)]


def test_efficiency_notes_for_a_job_that_wasted_what_it_held() -> None:
    request = slurm_request({"cpus": "8", "mem_per_node_mb": str(64 * 1024),
                             "time_limit": "1-00:00:00"})
    assert request == {"cpus": 8, "memory_bytes": 64 * 2**30, "time_limit_seconds": 86400.0}
    notes = {n.kind: n for n in efficiency_notes(
        _samples(util=2.0, mem_used=2**30, cpu_per_s=1.0, rss=3 * 2**30), 3600.0, request)}
    assert set(notes) == {"gpu-idle", "cpu-low", "memory-overrequested", "time-overrequested"}
    assert notes["gpu-idle"].message == ("2 of 2 GPU(s) held for 60.0 min were idle: mean "
                                         "utilisation 2 % (under 10 %)")
    assert notes["gpu-idle"].details["gpu_hours_idle"] == 2.0
    assert "used about 1.0 of 8 cores" in notes["cpu-low"].message
    assert notes["memory-overrequested"].message == ("memory requested 64.0 GiB, peak used "
                                                     "3.0 GiB")
    assert notes["time-overrequested"].message == "time limit 24.0 h, ran 60.0 min"
    assert all(n.category == "efficiency" for n in notes.values())


def test_efficiency_notes_stay_quiet_for_a_job_that_used_what_it_held() -> None:
    request = {"cpus": 8, "memory_bytes": 4 * 2**30, "time_limit_seconds": 5400.0}
    assert efficiency_notes(_samples(util=85.0, mem_used=60 * 2**30, cpu_per_s=7.0,
                                     rss=3 * 2**30), 3600.0, request) == []


def test_gpu_memory_unused_and_thresholds() -> None:
    s = _samples(util=90.0, mem_used=4 * 2**30, cpu_per_s=7.0, rss=2**30)
    notes = efficiency_notes(s, 3600.0, {})
    assert [n.kind for n in notes] == ["gpu-memory-unused"]
    assert notes[0].message == "GPU memory mostly unused: peak 4.0 GiB of 80.0 GiB on 2 GPU(s)"
    assert efficiency_notes(s, 3600.0, {}, Thresholds(gpu_memory_used_fraction=0.01)) == []
    assert efficiency_notes(s, 60.0, {}) == []  # too short to judge


def test_a_run_that_asked_for_nothing_is_not_told_to_ask_for_less() -> None:
    # outside Slurm: the machine's 8 cores were nobody's request
    s = _samples(util=2.0, mem_used=2**30, cpu_per_s=1.0, rss=3 * 2**30)
    notes = {n.kind: n for n in efficiency_notes(s, 3600.0, {})}
    assert set(notes) == {"gpu-idle"}
    assert "ask for" not in notes["gpu-idle"].hint
    slurm = {n.kind: n for n in efficiency_notes(s, 3600.0, {"time_limit_seconds": 7200.0})}
    assert "cpu-low" in slurm and "ask for fewer GPUs" in slurm["gpu-idle"].hint


def test_slurm_time_formats() -> None:
    assert parse_time_limit("10") == 600
    assert parse_time_limit("10:30") == 630
    assert parse_time_limit("2:00:00") == 7200
    assert parse_time_limit("1-12") == 129600
    assert parse_time_limit("UNLIMITED") is None
