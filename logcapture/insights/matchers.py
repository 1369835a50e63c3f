"""What a failed job's log says, as data: one ``Matcher`` per wording of a real program.

Each matcher is a ``needle`` (a plain string every matching line contains: the cheap test that
finds candidate lines, in Python or in the store's engine with ``multiSearchAny``), a
``pattern`` (a Python regular expression with named groups, searched in the candidate line),
the insight ``kind`` it is evidence of, a one-line ``message`` and an optional ``hint``.

Messages are templates: ``{name}`` is a named group of the pattern (or ``{name|filter}``, with
the filters of ``FILTERS``); ``[...]`` is an optional part, kept only when every group it names
matched. ``collect`` names groups whose distinct values are gathered across every matching
line of the run (``{ranks}``: the NCCL ranks that reported a timeout); the other groups keep
the first value found, so a banner spread over two lines (Open MPI's) fills one insight.

To add a wording: append a ``Matcher`` and a test in tests/test_insights.py that feeds the real
program's line (and a lookalike that must not match). Every pattern is tried only on lines
containing its needle, so a needle must be a substring of every line the pattern matches
(a test checks the examples).
"""

from __future__ import annotations

import re
from collections import namedtuple
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


class Matcher(namedtuple("Matcher", ("kind", "needle", "pattern", "message", "hint",
                                     "collect"), defaults=("", ()))):
    """One wording: see the module docstring."""

    __slots__ = ()
    if TYPE_CHECKING:
        kind: str
        needle: str
        pattern: str
        message: str
        hint: str
        collect: tuple[str, ...]


_SIZE = r"[\d.]+ ?(?:[KMGTP]i?B|bytes|B)"  # PyTorch: "20.00 MiB", "0 bytes"; TF: "1.20GiB"

CUDA_OOM_HINT = ("reduce the batch size (or accumulate gradients), use mixed precision or "
                 "activation checkpointing, or ask for a GPU with more memory")
NCCL_HINT = ("a collective that times out usually waits for a rank that crashed, hung or took "
             "another code path; look at that rank's last lines. NCCL_DEBUG=WARN shows why "
             "NCCL failed")
NCCL_ERROR_HINT = ("NCCL's reason, when it printed one (\"Last error:\", NCCL WARN), is in the "
                   "message; else NCCL_DEBUG=WARN prints it. A failing collective makes the "
                   "other ranks fail too: the rank that failed first is the one to read")
SHELL_HINT = "check the spelling, the PATH and the modules your job script loads"

MATCHERS: tuple[Matcher, ...] = (
    # --- CUDA out of memory -------------------------------------------------------------------
    # PyTorch 2.1+ (c10/cuda/CUDACachingAllocator.cpp): "torch.OutOfMemoryError: CUDA out of
    # memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which
    # 11.06 MiB is free. ..." (2.1 spelled it "capacty").
    Matcher("cuda-oom", "CUDA out of memory",
            r"CUDA out of memory\. Tried to allocate (?P<size>" + _SIZE + r")\. GPU (?P<gpu>\d+)"
            r" has a total capac(?:i|)ty of (?P<total>" + _SIZE + r") of which (?P<free>"
            + _SIZE + r") is free",
            "CUDA out of memory on GPU {gpu}: tried to allocate {size} with {free} free of "
            "{total}", CUDA_OOM_HINT),
    # PyTorch 1.x-2.0: "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0;
    # 10.92 GiB total capacity; 8.57 MiB already allocated; 9.28 GiB free; ...)"
    Matcher("cuda-oom", "CUDA out of memory",
            r"CUDA out of memory\. Tried to allocate (?P<size>" + _SIZE + r") \(GPU (?P<gpu>\d+);"
            r" (?P<total>" + _SIZE + r") total capacity; (?P<allocated>" + _SIZE
            + r") already allocated; (?P<free>" + _SIZE + r") free",
            "CUDA out of memory on GPU {gpu}: tried to allocate {size} with {free} free of "
            "{total} ({allocated} allocated by PyTorch)", CUDA_OOM_HINT),
    # Any other "CUDA out of memory" (a wording not listed above).
    Matcher("cuda-oom", "CUDA out of memory",
            r"CUDA out of memory(?:\. Tried to allocate (?P<size>" + _SIZE + r"))?",
            "CUDA out of memory[: tried to allocate {size}]", CUDA_OOM_HINT),
    # The CUDA runtime's own error string, through PyTorch: "RuntimeError: CUDA error: out of
    # memory".
    Matcher("cuda-oom", "CUDA error: out of memory", r"CUDA error: out of memory",
            "CUDA out of memory (CUDA error: out of memory)", CUDA_OOM_HINT),
    # TensorFlow: "ResourceExhaustedError: OOM when allocating tensor with shape[256,1024]
    # and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc"
    Matcher("cuda-oom", "OOM when allocating tensor",
            r"OOM when allocating tensor with shape ?(?P<shape>\[[^\]]*\]) and type "
            r"(?P<dtype>\w+) on (?P<device>\S+?)(?: by allocator (?P<allocator>\w+))?$",
            "GPU out of memory (TensorFlow): a {dtype} tensor of shape {shape} on {device}",
            CUDA_OOM_HINT),
    # TensorFlow's stream executor: "failed to allocate 2.00G (2147483648 bytes) from device:
    # CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    Matcher("cuda-oom", "CUDA_ERROR_OUT_OF_MEMORY",
            r"(?:failed to allocate (?P<size>\S+) \((?P<bytes>\d+) bytes\) from device: )?"
            r"CUDA_ERROR_OUT_OF_MEMORY",
            "GPU out of memory (CUDA_ERROR_OUT_OF_MEMORY)[: failed to allocate {bytes|bytes}]",
            CUDA_OOM_HINT),
    # XLA (JAX, TensorFlow with XLA): "RESOURCE_EXHAUSTED: Out of memory while trying to
    # allocate 17179869184 bytes."
    Matcher("cuda-oom", "Out of memory while trying to allocate",
            r"Out of memory while trying to allocate (?P<bytes>\d+) bytes",
            "GPU out of memory (XLA): tried to allocate {bytes|bytes}", CUDA_OOM_HINT),

    # --- NCCL ---------------------------------------------------------------------------------
    # PyTorch's ProcessGroupNCCL watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp):
    # "[rank3]:[E1024 12:00:00.123 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught
    # collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1,
    # NumelOut=1, Timeout(ms)=600000) ran for 600085 milliseconds before timing out."
    Matcher("nccl-error", "Watchdog caught collective operation timeout",
            r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
            r"WorkNCCL\(SeqNum=(?P<seqnum>\d+), OpType=(?P<op>\w+)[^)]*?"
            r"Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for (?P<ran_ms>\d+) milliseconds",
            "NCCL collective timeout: {op} (SeqNum {seqnum}) ran for {ran_ms|ms} "
            "(timeout {timeout_ms|ms}), reported by rank(s) {rank}[, not by rank(s) {silent}]",
            NCCL_HINT + "; the rank(s) missing from this list are the first suspects",
            ("rank",)),
    # "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/
    # ProcessGroupNCCL.cpp:1333, unhandled system error (run with NCCL_DEBUG=INFO for
    # details), NCCL version 2.18.1" (older: "RuntimeError: NCCL error in: ...")
    Matcher("nccl-error", "NCCL error",
            r"NCCL error(?: in: \S+?)?,? (?P<what>[^,(]+?)(?: \(run with NCCL_DEBUG=\w+ for "
            r"details\))?(?:, NCCL version (?P<version>[\w.+-]+))?(?:$|\n| ncclSystemError|[.,])",
            "NCCL error: {what}[ (NCCL {version})]", NCCL_ERROR_HINT),
    # NCCL's own warnings (NCCL_DEBUG=WARN or INFO): "host:1234:5678 [0] NCCL WARN NET/IB :
    # Got completion from peer 10.0.0.2<1234> with error 12, ..."; NCCL 2.28 adds the time
    # before and its source line after: "[2026-11-27 11:50:55] vm:616:616 [0] init.cc:904
    # NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60"
    Matcher("nccl-error", "NCCL WARN",
            r"(?P<host>[^\s:]+):\d+:\d+ \[(?P<device>\d+)\](?: [\w./-]+:\d+)? NCCL WARN "
            r"(?P<what>.+)",
            "NCCL warning on {host} (device {device}): {what}", NCCL_ERROR_HINT),

    # --- rendezvous -------------------------------------------------------------------------
    # PyTorch's TCPStore (torch/csrc/distributed/c10d/TCPStore.cpp), on the rank that hosts
    # it: "torch.distributed.DistStoreError: Timed out after 16 seconds waiting for clients.
    # 1/2 clients joined."
    Matcher("rendezvous-timeout", "clients joined",
            r"Timed out after (?P<seconds>\d+) seconds waiting for clients\. (?P<joined>\d+)/"
            r"(?P<world>\d+) clients joined",
            "rendezvous timed out after {seconds} s: {joined} of {world} ranks joined, "
            "{missing} never came[ ({never})]",
            "a rank that never joins did not start, crashed before init_process_group, or "
            "cannot reach MASTER_ADDR:MASTER_PORT; look at that rank's output"),

    # --- MPI ----------------------------------------------------------------------------------
    # Open MPI (ompi/mpi/help-mpi-api.txt / help-mpi-runtime.txt): a banner
    # "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD" / "with errorcode 1."
    # (Open MPI 5: "  Proc: [[...],0]" / "  Errorcode: 1").
    Matcher("mpi-abort", "MPI_ABORT was invoked",
            r"MPI_ABORT was invoked on rank (?P<rank>\d+) in communicator (?P<comm>\S+)",
            "MPI_ABORT called by rank {rank} in {comm}[ with error code {code}]",
            "look at the lines rank {rank} printed before it aborted"),
    Matcher("mpi-abort", "with errorcode", r"^with errorcode (?P<code>-?\d+)\.$",
            "MPI_ABORT called[ by rank {rank}] with error code {code}"),
    Matcher("mpi-abort", "Errorcode:", r"^\s+Errorcode: (?P<code>-?\d+)$",
            "MPI_ABORT called[ by rank {rank}] with error code {code}"),
    # MPICH (src/mpi/init/abort.c): "application called MPI_Abort(MPI_COMM_WORLD, 1) -
    # process 0"
    Matcher("mpi-abort", "application called MPI_Abort",
            r"application called MPI_Abort\((?P<comm>[^,]+), (?P<code>-?\d+)\) - process "
            r"(?P<rank>\d+)",
            "MPI_Abort called by process {rank} in {comm} with error code {code}",
            "look at the lines process {rank} printed before it aborted"),

    # --- Slurm's own lines (slurmstepd, srun) -------------------------------------------------
    # slurmstepd (src/slurmd/slurmstepd/req.c): "slurmstepd: error: *** STEP 123.0 ON node1
    # CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***"
    Matcher("time-limit", "DUE TO TIME LIMIT",
            r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+) "
            r"DUE TO TIME LIMIT",
            "Slurm stopped the job at its time limit ({at})",
            "ask for more time (--time), or save checkpoints and resume from the last one"),
    Matcher("preempted", "DUE TO PREEMPTION",
            r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+) "
            r"DUE TO PREEMPTION",
            "Slurm preempted the job at {at} (a job of higher priority needed its resources)",
            "save checkpoints and resubmit with --requeue so that a preempted job resumes"),
    Matcher("node-fail", "DUE TO NODE FAILURE",
            r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+) "
            r"DUE TO NODE FAILURE",
            "a node of the job failed ({node}, {at})",
            "resubmit; tell the administrators if the same node fails again"),
    Matcher("cancelled", "CANCELLED AT",
            r"\*\*\* (?P<what>JOB|STEP) (?P<id>\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)"
            r"(?: BY (?P<by>\S+))? \*\*\*",
            "the job was cancelled at {at}[ by {by}]"),
    # slurmstepd's cgroup OOM accounting (src/plugins/task/cgroup, jobacct_gather): "Detected 1
    # oom_kill event in StepId=11300781.0. Some of the step tasks have been OOM Killed." (older:
    # "Detected 2 oom-kill event(s) in step 3756240.batch cgroup.")
    Matcher("oom-kill", "kill event",
            r"Detected (?P<count>\d+) oom[-_]kill event",
            "the kernel's OOM killer killed {count} process(es) of the job (out of memory)",
            "ask for more memory (--mem or --mem-per-cpu), or use less: smaller batches, "
            "fewer data loader workers"),
    # srun: "srun: error: node1: task 0: Out Of Memory"
    Matcher("oom-kill", "Out Of Memory",
            r"srun: error: (?P<node>\S+): tasks? (?P<task>[\d,-]+): Out Of Memory",
            "task {task} on {node} ran out of memory (killed by the OOM killer)",
            "ask for more memory (--mem or --mem-per-cpu), or use less"),

    # --- signals, as shells and srun report them -----------------------------------------------
    # bash (jobs.c) for a child of a script: "./run.sh: line 5: 12345 Segmentation fault
    # (core dumped) ./a.out"; strsignal's names (glibc).
    Matcher("signal", "Segmentation fault",
            r"(?:line \d+: +\d+ +|^)(?P<signame>Segmentation fault)"
            r"(?P<core> +\(core dumped\))?(?: +(?P<command>\S.*))?$",
            "a process died of {signame} (SIGSEGV)[ ({core|strip})][: {command}]",
            "a crash in compiled code: a library built for another machine, a mismatch of "
            "library versions, or a bug; run it under gdb or with a core dump"),
    Matcher("signal", "Bus error",
            r"(?:line \d+: +\d+ +|^)(?P<signame>Bus error)"
            r"(?P<core> +\(core dumped\))?(?: +(?P<command>\S.*))?$",
            "a process died of {signame} (SIGBUS)[ ({core|strip})][: {command}]",
            "often a file that was truncated or changed while mapped, or /dev/shm full"),
    Matcher("signal", "Illegal instruction",
            r"(?:line \d+: +\d+ +|^)(?P<signame>Illegal instruction)"
            r"(?P<core> +\(core dumped\))?(?: +(?P<command>\S.*))?$",
            "a process died of {signame}[ ({core|strip})][: {command}]",
            "the program uses CPU instructions this node lacks: build it for this node or "
            "ask for nodes with the CPU it was built for"),
    Matcher("signal", "Aborted",
            r"(?:line \d+: +\d+ +|^)(?P<signame>Aborted)(?P<core> +\(core dumped\))?"
            r"(?: +(?P<command>\S.*))?$",
            "a process aborted (SIGABRT)[ ({core|strip})][: {command}]",
            "the lines just before usually say why (a failed assertion, an uncaught C++ "
            "exception)"),
    Matcher("signal", "Killed",
            r"line \d+: +\d+ +(?P<signame>Killed)(?: +(?P<command>\S.*))?$",
            "a process was killed (SIGKILL)[: {command}]",
            "SIGKILL usually comes from the OOM killer or from Slurm at the end of the job"),
    Matcher("signal", "Floating point exception",
            r"(?:line \d+: +\d+ +|^)(?P<signame>Floating point exception)"
            r"(?P<core> +\(core dumped\))?(?: +(?P<command>\S.*))?$",
            "a process died of SIGFPE (an integer division by zero)[ ({core|strip})]"
            "[: {command}]"),
    # srun: "srun: error: node1: task 3: Segmentation fault (core dumped)"
    Matcher("signal", "srun: error:",
            r"srun: error: (?P<node>\S+): tasks? (?P<task>[\d,-]+): (?P<signame>Segmentation "
            r"fault|Bus error|Illegal instruction|Aborted|Killed|Floating point exception)"
            r"(?P<core> \(core dumped\))?",
            "task {task} on {node} died of {signame}[ ({core|strip})]"),
    # Python's faulthandler: "Fatal Python error: Segmentation fault"
    Matcher("signal", "Fatal Python error",
            r"Fatal Python error: (?P<signame>Segmentation fault|Bus error|Aborted|"
            r"Illegal instruction|Floating point exception)",
            "Python died of {signame} (faulthandler's report)",
            "the traceback printed after this line shows where"),

    # --- files --------------------------------------------------------------------------------
    # strerror(ENOSPC) and strerror(EDQUOT) (glibc), as Python prints OSError: "OSError:
    # [Errno 28] No space left on device: '/scratch/x'"
    Matcher("disk-full", "No space left on device",
            r"No space left on device(?:: '(?P<path>[^']*)')?",
            "a file system is full (No space left on device)[: {path}]",
            "free space or write to another file system (scratch); `df -h` shows which is full"),
    Matcher("quota", "Disk quota exceeded",
            r"Disk quota exceeded(?:: '(?P<path>[^']*)')?",
            "your disk quota is exceeded[: {path}]",
            "remove files or write to a file system with more quota; ask the administrators "
            "for your quota"),

    # --- shells -------------------------------------------------------------------------------
    # bash: "./job.sh: line 3: pyhton: command not found", "bash: foo: command not found"
    Matcher("command-not-found", "command not found",
            r"^(?P<shell>[^:]+): (?:line (?P<line>\d+): )?(?P<command>[^:]+): command not found$",
            "command not found: {command}[ (line {line} of {shell})]", SHELL_HINT),
    # dash (/bin/sh on Debian): "/bin/sh: 1: foo: not found"
    Matcher("command-not-found", ": not found",
            r"^(?P<shell>[^:]+): (?P<line>\d+): (?P<command>[^:]+): not found$",
            "command not found: {command} (line {line} of {shell})", SHELL_HINT),
    # bash, exit 126: "bash: ./run.sh: Permission denied",
    # "./job.sh: line 2: ./a.out: cannot execute binary file: Exec format error"
    Matcher("command-not-found", "cannot execute",
            r"^(?P<shell>[^:]+): (?:line (?P<line>\d+): )?(?P<command>[^:]+): cannot execute"
            r"(?: binary file)?(?:: (?P<why>.+))?$",
            "cannot execute {command}[: {why}]",
            "check that the file is a program built for this machine and is executable"),
    Matcher("command-not-found", "Permission denied",
            r"^(?P<shell>bash|sh|[^:]*\.sh|[^:]*slurm_script): (?:line (?P<line>\d+): )?"
            r"(?P<command>[^:]+): Permission denied$",
            "cannot run {command}: permission denied",
            "make it executable (chmod +x) or run it through its interpreter"),
)

# --- Python tracebacks (the structure the traceback printer writes: traceback.py) ------------
TRACEBACK_HEAD = "Traceback (most recent call last):"
TRACEBACK_NEEDLES = (TRACEBACK_HEAD,)
FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?:: (?P<message>.*))?$")
# What Ray puts before each line of a worker ("(pid=123) ", "(RayWorker pid=123) "); the rank
# labels of other launchers (torchrun, PyTorch, srun --label, Open MPI) are ranklabel's.
LINE_PREFIX = re.compile(r"^\([\w]*\s?pid=\d+(?:, ip=\S+)?\) ")
# torchrun's summary of a failed job (torch.distributed.elastic.multiprocessing.errors,
# ChildFailedError.format_msg): a "Root Cause (first observed failure):" block whose
# "  host      : NAME" and "  rank      : 1 (local_rank: 1)" lines name the first worker
# that failed; the other workers' entries are under "Failures:".
ROOT_CAUSE_HEAD = "Root Cause (first observed failure)"
ROOT_CAUSE_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode)\s+: (?P<value>.*)$")
ROOT_CAUSE_RANK = re.compile(r"^(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
ROOT_CAUSE_LINES = 8  # the block's lines after its head
# An exception whose message goes on over several lines (PyTorch's DistBackendError: "NCCL
# error in: ...", "ncclInvalidUsage: ...", "Last error:", then the cause NCCL gave).
LAST_ERROR = "Last error:"
# Structure a diagnosis follows beyond the matchers: candidate lines too.
STRUCTURE_NEEDLES = (ROOT_CAUSE_HEAD, LAST_ERROR)
# An error one rank gets because another rank failed first (its peer went away, a collective
# waited for it, the launcher stopped it): never the root cause while another rank's error
# is not one of these.
CONSEQUENCE = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|[Rr]emote process exited|Watchdog caught "
    r"collective operation timeout|Some NCCL operations have failed or timed out|"
    r"ChildFailedError|SIGTERM|SIGKILL|Signal 15|closing signal|Terminated")
# Files that are not the user's own code: installed packages, the standard library, frozen
# and generated modules.
LIBRARY_FILE = re.compile(r"(?:site-packages|dist-packages)/|/lib/python\d(?:\.\d+)?/|"
                          r"^<frozen |^<string>$|/lib64/python\d")
PYTHON_HINT = "the line above is where your code raised it; the message says why"

# The catch-all: lines that look like an error (these words, whole, when nothing more specific
# matched). ERROR_WORDS, in any case, finds the candidates (the store: one
# multiSearchAnyCaseInsensitive); ERROR_LOOKING decides.
ERROR_WORDS = ("error", "fatal", "exception", "failed", "panic", "abort")
ERROR_LOOKING = re.compile(r"(?<![\w-])(?:[Ee]rror|ERROR|[Ff]atal|FATAL|[Ee]xception|[Ff]ailed|"
                           r"FAILED|panic|[Aa]bort(?:ed|ing)?)(?![\w-])")


# --- message templates ------------------------------------------------------------------------
def _bytes(value: str) -> str:
    n = float(value)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024
    return value  # pragma: no cover


_SIZE_VALUE = re.compile(r"([\d.]+) ?([KMGTP]?)(i?)B|([\d.]+) bytes")


def size_bytes(text: str) -> int | None:
    """A size as the programs above print it ("20.00 MiB", "0 bytes", "1.20GiB"), in bytes."""
    m = _SIZE_VALUE.fullmatch(text)
    if m is None:
        return None
    try:
        if m.group(4) is not None:
            return int(float(m.group(4)))
        base = 1024 if m.group(3) or m.group(2) else 1
        return int(float(m.group(1)) * base ** "_KMGTP".index(m.group(2) or "_"))
    except ValueError:
        return None


def duration_text(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


FILTERS = {
    "ms": lambda v: duration_text(float(v) / 1000.0),
    "bytes": _bytes,
    "strip": lambda v: v.strip(" ()"),
}

_FIELD = re.compile(r"\{(\w+)(?:\|(\w+))?\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")


def render(template: str, values: dict[str, Any]) -> str:
    """A message template with ``values``: ``[...]`` parts whose fields are missing go, a
    missing field elsewhere is "?". Values are never read as template text."""
    def field(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        if value is None or value == "":
            raise KeyError(m.group(1))
        if isinstance(value, (list, tuple)):
            value = ", ".join(map(str, value))
        value = str(value)
        return str(FILTERS[m.group(2)](value)) if m.group(2) else value

    def required(m: re.Match[str]) -> str:
        try:
            return field(m)
        except (KeyError, ValueError):
            return "?"

    out = []
    pos = 0
    for part in _OPTIONAL.finditer(template):
        out.append(_FIELD.sub(required, template[pos:part.start()]))
        try:
            out.append(_FIELD.sub(field, part.group(1)))
        except (KeyError, ValueError):
            pass
        pos = part.end()
    out.append(_FIELD.sub(required, template[pos:]))
    return "".join(out)


COMPILED = tuple(re.compile(m.pattern) for m in MATCHERS)
NEEDLES = tuple(sorted({m.needle for m in MATCHERS} | set(TRACEBACK_NEEDLES)
                       | set(STRUCTURE_NEEDLES)))
# One search finds every candidate line: any needle, or a word of the catch-all.
CANDIDATE = re.compile("|".join(re.escape(n) for n in NEEDLES) + "|" + ERROR_LOOKING.pattern)
# What finds the candidates in a spool segment's bytes, lowered (NDJSON written with
# ensure_ascii=False holds a line's text as printed, only quotes, backslashes and control
# characters escaped): the error words and the needles that hold none of them nor another
# needle. One bytes.find pass each: a regular expression of them all took 6.6 times as long
# (bench/bench_insights.py, 3.: 17.6 s against 2.67 s for a 1M-line log).
def _lowered_needles() -> tuple[bytes, ...]:
    words = {w.encode() for w in ERROR_WORDS}
    needles = {n.lower().encode() for n in NEEDLES} | words
    return tuple(sorted(n for n in needles if n in words or not any(
        o != n and o in n for o in needles)))


LOWERED_NEEDLES = _lowered_needles()
BY_NEEDLE: dict[str, tuple[int, ...]] = {
    n: tuple(i for i, m in enumerate(MATCHERS) if m.needle == n) for n in NEEDLES}
