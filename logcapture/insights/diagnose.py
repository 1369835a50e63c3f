"""Why a run ended badly: its log lines, its End record and Slurm's state, read once.

``Diagnoser.feed(stream, seq, text)`` takes a run's stored output lines in stream order (all of
them, or only the candidates: lines holding a matcher's needle or an error-looking word, plus
every line of the last traceback of each stream; ``wants(text)`` says which) and keeps only
what it needs: the matches of ``matchers.MATCHERS``, the last traceback of each stream and
the last error-looking lines. ``Diagnoser.result(outcome)`` turns them into insights once the
run's outcome is known; a run that ended well gets none (a printed, caught traceback is not a
failure).
"""

from __future__ import annotations

import signal as _signal
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND
from ..records import LOST
from . import matchers as M
from .model import FAILURE, Evidence, Insight

if TYPE_CHECKING:
    from typing import Any

# A traceback is the run's fatal one when at most this many lines of its stream follow it
# (an interpreter at exit, a launcher's summary and a logger flushing print a few dozen).
TRAILING_LINES = 100
MAX_TRACEBACK_LINES = 2000  # a traceback longer than this is cut (recursion)
MAX_EVIDENCE = 6  # lines quoted per insight
LAST_ERROR_LINES = 3  # lines the catch-all points at

# Slurm's job states (squeue(1), "JOB STATE CODES") that are a diagnosis in themselves.
SLURM_STATES = {
    "TIMEOUT": ("time-limit", "Slurm stopped the job at its time limit",
                "ask for more time (--time), or save checkpoints and resume from the last one"),
    "DEADLINE": ("time-limit", "Slurm stopped the job at its deadline (--deadline)", ""),
    "CANCELLED": ("cancelled", "the job was cancelled", ""),
    "NODE_FAIL": ("node-fail", "a node of the job failed",
                  "resubmit; tell the administrators if the same node fails again"),
    "PREEMPTED": ("preempted", "Slurm preempted the job (a job of higher priority needed its "
                  "resources)", "save checkpoints and resubmit with --requeue so that a "
                  "preempted job resumes"),
    "OUT_OF_MEMORY": ("oom-kill", "the job ran out of memory: the kernel's OOM killer killed "
                      "it (Slurm: OUT_OF_MEMORY)",
                      "ask for more memory (--mem or --mem-per-cpu), or use less"),
    "BOOT_FAIL": ("node-fail", "a node of the job failed to boot", "resubmit"),
}
_STOPPED_BY_SLURM = ("time-limit", "cancelled", "preempted", "node-fail")
GOOD_STATES = ("", "COMPLETED", "RUNNING", "COMPLETING", "PENDING", "SUSPENDED")
# The order insights are listed in: the cause first, its consequences after.
ORDER = ("oom-kill", "cuda-oom", "time-limit", "node-fail", "preempted", "cancelled",
         "nccl-error", "mpi-abort", "disk-full", "quota", "command-not-found",
         "python-exception", "signal", "lost", "failed")


class Outcome:
    """How a run ended: its End record's ``exit_status``, ``signal`` and ``state``, Slurm's
    ``slurm_state`` (``CANCELLED by 1000`` as sacct writes it is understood) and when it
    ended (``ended``, epoch seconds)."""

    __slots__ = ("exit_status", "signal", "state", "slurm_state", "ended", "ended_badly")

    def __init__(self, exit_status: int | None = None, signal: int | None = None,
                 state: str = "", slurm_state: str = "", ended: float | None = None):
        self.exit_status = exit_status
        self.signal = signal
        self.state = state or ""
        self.slurm_state = (slurm_state or "").strip()
        self.ended = ended
        base = self.slurm_state.split(" ", 1)[0].upper()
        self.ended_badly = bool(
            (exit_status not in (None, 0)) or signal is not None
            or (self.state not in GOOD_STATES) or (base not in GOOD_STATES))

    @classmethod
    def of(cls, end: Mapping[str, Any] | None, slurm_state: str = "") -> Outcome:
        """From an End record (object or dict) and Slurm's state."""
        if end is None:
            return cls(slurm_state=slurm_state)
        get = end.get if isinstance(end, Mapping) else lambda k: getattr(end, k, None)
        return cls(get("exit_status"), get("signal"), get("state") or "", slurm_state,
                   get("ts"))


class _Traceback:
    __slots__ = ("start", "head", "stream", "frames", "exc", "exc_seq", "exc_text", "lines",
                 "done", "explained_by")

    def __init__(self, stream: str, seq: int, head: str):
        self.stream = stream
        self.start = seq
        self.head = head
        self.exc_text = ""
        # file, line, func, code, seq, the line as stored
        self.frames: list[tuple[str, int, str, str, int, str]] = []
        self.exc: tuple[str, str] | None = None
        self.exc_seq = seq
        self.lines = 0
        self.done = False
        self.explained_by = ""  # the kind whose matcher matched the exception line


class _Found:
    """The matches of one kind: values by group, evidence lines."""

    __slots__ = ("matcher", "values", "evidence", "count")

    def __init__(self, matcher: M.Matcher):
        self.matcher = matcher
        self.values: dict[str, Any] = {}
        self.evidence: list[Evidence] = []
        self.count = 0

    def add(self, matcher: M.Matcher, groups: dict[str, str | None], ev: Evidence) -> None:
        if self.count == 0 or (self.matcher.needle != matcher.needle
                               and _specific(matcher) > _specific(self.matcher)):
            self.matcher = matcher
        self.count += 1
        for k, v in groups.items():
            if v is None:
                continue
            if k in matcher.collect:
                seen = self.values.setdefault(k, [])
                if v not in seen:
                    seen.append(v)
            else:
                self.values.setdefault(k, v)
        if len(self.evidence) < MAX_EVIDENCE:
            self.evidence.append(ev)
        else:
            self.evidence[-1] = ev  # keep the first ones and the last


def _specific(m: M.Matcher) -> int:
    return M.re.compile(m.pattern).groups


class Diagnoser:
    """Feed a run's lines in order (``feed``), then ask ``result(outcome)``."""

    def __init__(self) -> None:
        self._found: dict[str, _Found] = {}
        self._tb: dict[str, _Traceback] = {}  # the traceback being read, per stream
        self._last_tb: _Traceback | None = None  # the last complete one of any stream
        self._last_seq: dict[str, int] = {}
        self._errors: deque[Evidence] = deque(maxlen=LAST_ERROR_LINES)
        self._search = M.CANDIDATE.search

    @staticmethod
    def wants(text: str) -> bool:
        """Whether a line is a candidate (a needle or an error-looking word)."""
        return M.CANDIDATE.search(text) is not None

    @property
    def in_traceback(self) -> bool:
        """Whether a traceback is being read: the next lines are wanted, whatever they hold."""
        return bool(self._tb)

    def note_last_seq(self, stream: str, seq: int) -> None:
        """The last sequence number of ``stream`` when only candidates were fed."""
        if seq > self._last_seq.get(stream, -1):
            self._last_seq[stream] = seq

    def feed(self, stream: str, seq: int, text: str) -> None:
        self._last_seq[stream] = seq
        tb = self._tb.get(stream)
        if tb is not None and self._traceback_line(tb, seq, text):
            return  # a frame or its source line: quoted code, not what happened
        hit = self._search(text)
        if hit is None:
            return
        if M.TRACEBACK_HEAD in text:
            self._tb[stream] = _Traceback(stream, seq, text)
            return
        ev = Evidence(stream, seq, text)
        matched = False
        for needle in M.NEEDLES:
            if needle not in text:
                continue
            for i in M.BY_NEEDLE[needle]:
                m = M.COMPILED[i].search(text)
                if m is None:
                    continue
                matcher = M.MATCHERS[i]
                found = self._found.get(matcher.kind)
                if found is None:
                    found = self._found[matcher.kind] = _Found(matcher)
                found.add(matcher, m.groupdict(), ev)
                matched = True
                tb = self._last_tb
                if tb is not None and tb.exc_seq == seq and tb.stream == stream:
                    tb.explained_by = matcher.kind
                break
        if not matched and M.ERROR_LOOKING.search(text):
            self._errors.append(ev)

    # --- tracebacks
    def _traceback_line(self, tb: _Traceback, seq: int, text: str) -> bool:
        """Read one line of a traceback; True when it is a frame or quoted source."""
        tb.lines += 1
        line = M.LINE_PREFIX.sub("", text, count=1)
        if tb.lines > MAX_TRACEBACK_LINES:
            del self._tb[tb.stream]
            return False
        frame = M.FRAME.match(line)
        if frame is not None:
            tb.frames.append((frame["file"], int(frame["line"]), frame["func"], "", seq, text))
            return True
        if not line.strip():
            return False
        if line[:1] in (" ", "\t"):
            if tb.frames and not tb.frames[-1][3] and set(line.strip()) - set("^~ "):
                f = tb.frames[-1]
                tb.frames[-1] = (f[0], f[1], f[2], line.strip(), f[4], f[5])
            return bool(tb.frames)
        if line.startswith(("During handling of the above exception",
                            "The above exception was the direct cause")):
            return False
        exc = M.EXCEPTION_LINE.match(line)
        del self._tb[tb.stream]
        if exc is None or not tb.frames:
            return False  # not a traceback after all
        tb.exc = (exc["type"], exc["message"] or "")
        tb.exc_seq = seq
        tb.exc_text = text
        tb.done = True
        self._last_tb = tb
        return False

    def _python_exception(self) -> Insight | None:
        tb = self._last_tb
        if tb is None or tb.exc is None:
            return None
        if self._last_seq.get(tb.stream, tb.exc_seq) - tb.exc_seq > TRAILING_LINES:
            return None  # the run went on after it: caught, printed, not fatal
        etype, emsg = tb.exc
        own = [f for f in tb.frames if not M.LIBRARY_FILE.search(f[0])]
        frame = own[-1] if own else (tb.frames[-1] if tb.frames else None)
        where = ""
        details: dict[str, Any] = {"type": etype, "message": emsg}
        evidence = [Evidence(tb.stream, tb.start, tb.head)]
        if frame is not None:
            where = f" at {frame[0]}:{frame[1]} in {frame[2]}"
            details.update(file=frame[0], line=frame[1], function=frame[2],
                           own_code=bool(own))
            if frame[3]:
                details["code"] = frame[3]
            evidence.append(Evidence(tb.stream, frame[4], frame[5]))
        evidence.append(Evidence(tb.stream, tb.exc_seq, tb.exc_text))
        short = emsg if len(emsg) <= 160 else emsg[:157] + "..."
        message = f"{etype}{': ' + short if short else ''}{where}"
        hint = M.PYTHON_HINT if own else ("the exception was raised inside a library; the "
                                          "frames above show which call of yours led there")
        return Insight("python-exception", message, tuple(evidence), hint, FAILURE, details)

    # --- the answer
    def result(self, outcome: Outcome) -> list[Insight]:
        """The insights of a run that ended badly (none for a run that ended well)."""
        if not outcome.ended_badly:
            return []
        out: dict[str, Insight] = {}
        for kind, found in self._found.items():
            values = found.values
            message = M.render(found.matcher.message, values)
            hint = M.render(found.matcher.hint, values) if found.matcher.hint else ""
            details = {k: v for k, v in values.items() if v is not None}
            details.update({f"{k}_bytes": n for k, v in values.items()
                            if isinstance(v, str) and (n := M.size_bytes(v)) is not None})
            if found.count > 1:
                details["lines"] = found.count
            out[kind] = Insight(kind, message, tuple(found.evidence), hint, FAILURE, details)
        self._slurm_state(outcome, out)
        exc = self._python_exception()
        explained = self._last_tb.explained_by if self._last_tb is not None else ""
        if exc is not None and explained in out:
            # one error, one insight: the specific one, with where the user's code was
            out[explained] = _with_frame(out[explained], exc)
        elif exc is not None:
            out["python-exception"] = exc
        self._exit(outcome, out)
        if outcome.state == LOST:
            out["lost"] = Insight(
                "lost", "the capture went away before the command's outcome was known (its "
                "wrapper was killed, or its node crashed or rebooted): the log ends at the "
                "last line stored, and the command may have gone on after it", (),
                "the job's own output files hold whatever it printed after that", FAILURE, {})
        if not out:
            out["failed"] = self._catch_all(outcome)
        return sorted(out.values(), key=lambda i: ORDER.index(i.kind)
                      if i.kind in ORDER else len(ORDER))

    def _slurm_state(self, outcome: Outcome, out: dict[str, Insight]) -> None:
        state, _, rest = outcome.slurm_state.partition(" ")
        spec = SLURM_STATES.get(state.upper())
        if spec is None:
            return
        kind, message, hint = spec
        by = rest.removeprefix("by ").strip() if rest.startswith("by ") else ""
        details: dict[str, Any] = {"slurm_state": outcome.slurm_state}
        if by:
            details["by"] = by
            message += f" by {_user(by)}"
        if outcome.ended:
            import time

            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(outcome.ended))
            details["at"] = at
            message += f" at {at}"
        have = out.get(kind)
        evidence = have.evidence if have is not None else ()
        out[kind] = Insight(kind, message, evidence, hint or (have.hint if have else ""),
                            FAILURE, {**(have.details or {} if have else {}), **details})

    def _exit(self, outcome: Outcome, out: dict[str, Insight]) -> None:
        sig = outcome.signal
        status = outcome.exit_status
        shell_signal = status is not None and 128 < status <= 128 + 64
        if status in (EXIT_NOT_FOUND, EXIT_CANNOT_EXECUTE) and "command-not-found" not in out:
            what = "a command was not found" if status == EXIT_NOT_FOUND else \
                "a command could not be executed"
            out["command-not-found"] = Insight(
                "command-not-found", f"exit status {status}: {what} (the shell's convention)",
                (), M.SHELL_HINT, FAILURE, {"exit_status": status})
        if sig is None and not shell_signal:
            return
        number = sig if sig is not None else status - 128  # type: ignore[operator]
        name = _signal_name(number)
        have = out.get("signal")
        if sig is None and have is None and outcome.slurm_state.split(" ")[0] in SLURM_STATES:
            return  # 128+N from a shell after Slurm's own stop: the state says it
        if have is not None:
            details = dict(have.details or {})
            details.setdefault("signal", name)
            out["signal"] = have._replace(details=details)
            return
        if sig is not None:
            message = f"killed by {name} (signal {number})"
        else:
            message = f"exit status {status}: a process was killed by {name} (128 + {number})"
        hint = {"SIGKILL": "SIGKILL usually comes from the OOM killer or from Slurm at the "
                           "end of the job",
                "SIGSEGV": "a crash in compiled code; run it under gdb or with a core dump",
                "SIGTERM": "something asked the job to stop (scancel, Slurm at the time limit)"}
        if "oom-kill" in out and name == "SIGKILL":
            return  # the OOM killer's SIGKILL: oom-kill says it
        if name in ("SIGTERM", "SIGKILL") and any(k in out for k in _STOPPED_BY_SLURM):
            return  # how Slurm stops a job at its time limit, on scancel, on preemption
        out["signal"] = Insight("signal", message, (), hint.get(name, ""), FAILURE,
                                {"signal": name, "number": number})

    def _catch_all(self, outcome: Outcome) -> Insight:
        how = _how_it_ended(outcome)
        if self._errors:
            last = self._errors[-1]
            text = last.text or ""
            short = text if len(text) <= 160 else text[:157] + "..."
            return Insight("failed", f"{how}; the last error-looking line: {short}",
                           tuple(self._errors), "", FAILURE, {})
        return Insight("failed", f"{how}; no error message found in the stored output",
                       (), "", FAILURE, {})


def _with_frame(specific: Insight, exc: Insight) -> Insight:
    """``specific`` (``cuda-oom``, ``nccl-error``...: its matcher matched the exception line
    of the fatal traceback) with the traceback's frame (``python-exception``'s): where in the
    user's code it was raised, and that frame's line among the evidence."""
    details = dict(exc.details or {})
    if "file" not in details:
        return specific
    where = f" at {details['file']}:{details['line']} in {details['function']}"
    frame = [e for e in exc.evidence[1:-1] if e not in specific.evidence]
    evidence = sorted((*frame, *specific.evidence), key=lambda e: (e.stream, e.seq))
    merged: dict[str, Any] = {k: details[k] for k in ("file", "line", "function", "code",
                                                      "own_code") if k in details}
    merged["exception"] = details.get("type", "")
    return specific._replace(message=specific.message + where,
                             evidence=tuple(evidence[-MAX_EVIDENCE:]),
                             details={**merged, **(specific.details or {})})


def _how_it_ended(outcome: Outcome) -> str:
    if outcome.signal is not None:
        return f"killed by {_signal_name(outcome.signal)}"
    if outcome.exit_status is not None:
        return f"exited with status {outcome.exit_status}"
    return f"ended {outcome.slurm_state or outcome.state or 'badly'}"


def _signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _user(by: str) -> str:
    if by.isdigit():
        import pwd

        try:
            return f"{pwd.getpwuid(int(by)).pw_name} (uid {by})"
        except KeyError:
            return f"uid {by}"
    return by


def diagnose(lines: Any, outcome: Outcome) -> list[Insight]:
    """The insights of a run from its ``(stream, seq, text)`` lines in order."""
    d = Diagnoser()
    for stream, seq, text in lines:
        d.feed(stream, seq, text)
    return d.result(outcome)
