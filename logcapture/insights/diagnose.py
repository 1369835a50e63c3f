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

from .. import ranklabel
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
CAUSE_LINES = 64  # lines of other ranks that may come between "Last error:" and its cause

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
         "nccl-error", "rendezvous-timeout", "mpi-abort", "disk-full", "quota",
         "command-not-found", "python-exception", "root-cause", "signal", "other-ranks",
         "lost", "failed")


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
                 "done", "explained_by", "label")

    def __init__(self, stream: str, seq: int, head: str, label: ranklabel.Labelled):
        self.label = label  # the launcher's label of its lines (ranklabel): which rank
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

    __slots__ = ("matcher", "values", "evidence", "count", "by_needle")

    def __init__(self, matcher: M.Matcher):
        self.matcher = matcher
        self.values: dict[str, Any] = {}
        self.evidence: list[Evidence] = []
        self.count = 0
        # the first match of each needle: (matcher, its groups)
        self.by_needle: dict[str, tuple[M.Matcher, dict[str, str | None]]] = {}

    def add(self, matcher: M.Matcher, groups: dict[str, str | None], ev: Evidence) -> None:
        self.by_needle.setdefault(matcher.needle, (matcher, groups))
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
        # the traceback being read, per stream and rank label (ranklabel: two ranks'
        # tracebacks interleave on one terminal)
        self._tb: dict[tuple[str, str | None], _Traceback] = {}
        self._last_tb: _Traceback | None = None  # the last complete one of any stream
        self._fatal: dict[str | None, _Traceback] = {}  # the last complete one per rank label
        self._ranks: set[int] = set()  # the global ranks whose labels were seen
        self._root: dict[str, str] | None = None  # torchrun's "Root Cause" block, as read
        self._root_left = 0  # lines of that block still to read
        # a "Last error:" was read: its rank's next line is wanted, within CAUSE_LINES lines
        self._want_cause: dict[tuple[str, str | None], int] = {}
        self._cause = ""  # the line after the first "Last error:"
        self._last_seq: dict[str, int] = {}
        self._errors: deque[Evidence] = deque(maxlen=LAST_ERROR_LINES)
        self._search = M.CANDIDATE.search

    @staticmethod
    def wants(text: str) -> bool:
        """Whether a line is a candidate (a needle or an error-looking word)."""
        return M.CANDIDATE.search(text) is not None

    @property
    def in_traceback(self) -> bool:
        """Whether a traceback (or another block: torchrun's root cause, the cause after an
        exception's "Last error:") is being read: the next lines are wanted, whatever they
        hold."""
        return bool(self._tb) or self._root_left > 0 or bool(self._want_cause)

    def note_last_seq(self, stream: str, seq: int) -> None:
        """The last sequence number of ``stream`` when only candidates were fed."""
        if seq > self._last_seq.get(stream, -1):
            self._last_seq[stream] = seq

    def feed(self, stream: str, seq: int, text: str) -> None:
        self._last_seq[stream] = seq
        # most lines carry no launcher label: split only those that may (ranklabel.STARTS)
        label = ranklabel.split(text) if text[:1] in ranklabel.STARTS else None
        key = label.key if label is not None else None
        if key is not None or self._root_left or self._want_cause:
            label = label or ranklabel.Labelled(None, None, text)
            self._follow(stream, label)
        tb = self._tb.get((stream, key)) if self._tb else None
        if tb is not None and self._traceback_line(
                tb, seq, text, label or ranklabel.Labelled(None, None, text)):
            return  # a frame or its source line: quoted code, not what happened
        hit = self._search(text)
        if hit is None:
            return
        label = label or ranklabel.Labelled(None, None, text)
        if M.TRACEBACK_HEAD in text:
            self._tb[(stream, key)] = _Traceback(stream, seq, text, label)
            return
        if self._block_head(stream, label):
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
                tb = self._fatal.get(key)
                if tb is not None and tb.exc_seq == seq and tb.stream == stream:
                    tb.explained_by = matcher.kind
                break
        if not matched and M.ERROR_LOOKING.search(text):
            self._errors.append(ev)

    # --- tracebacks
    def _follow(self, stream: str, label: ranklabel.Labelled) -> None:
        """What a line says beyond the matchers: its rank label, the next line of torchrun's
        root cause block, the cause after a "Last error:" of the same rank."""
        if label.rank is not None:
            self._ranks.add(label.rank)
        if self._root_left > 0:
            self._root_line(label.text)
        if self._want_cause:
            if self._want_cause.pop((stream, label.key), None) is not None:
                if not self._cause and label.text.strip():
                    self._cause = label.text.strip()
            for where, left in list(self._want_cause.items()):
                if left <= 1:
                    del self._want_cause[where]
                else:
                    self._want_cause[where] = left - 1

    def _block_head(self, stream: str, label: ranklabel.Labelled) -> bool:
        """Whether the line opens a block read by ``_follow``."""
        if M.ROOT_CAUSE_HEAD in label.text:
            self._root, self._root_left = {}, M.ROOT_CAUSE_LINES
            return True
        if label.text.strip() == M.LAST_ERROR:
            self._want_cause[(stream, label.key)] = CAUSE_LINES
            return True
        return False

    def _root_line(self, text: str) -> None:
        """One line of torchrun's "Root Cause (first observed failure)" block."""
        self._root_left -= 1
        m = M.ROOT_CAUSE_FIELD.match(text)
        if m is not None and self._root is not None:
            self._root.setdefault(m["key"], m["value"].strip())
        elif text.startswith("="):
            self._root_left = 0  # the block's end

    def _traceback_line(self, tb: _Traceback, seq: int, text: str,
                        label: ranklabel.Labelled) -> bool:
        """Read one line of a traceback; True when it is a frame or quoted source."""
        tb.lines += 1
        line = M.LINE_PREFIX.sub("", label.text, count=1)
        where = (tb.stream, tb.label.key)
        if tb.lines > MAX_TRACEBACK_LINES:
            del self._tb[where]
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
        del self._tb[where]
        if exc is None or not tb.frames:
            return False  # not a traceback after all
        tb.exc = (exc["type"], exc["message"] or "")
        tb.exc_seq = seq
        tb.exc_text = text
        tb.done = True
        self._last_tb = tb
        self._fatal[tb.label.key] = tb
        return False

    def _is_fatal(self, tb: _Traceback) -> bool:
        """Printed at most TRAILING_LINES before its stream's end (else the run went on after
        it: caught, printed, not fatal)."""
        return self._last_seq.get(tb.stream, tb.exc_seq) - tb.exc_seq <= TRAILING_LINES

    def root_rank(self) -> tuple[int, int, str] | None:
        """torchrun's root cause: (rank, local rank, host), when its block was read."""
        m = M.ROOT_CAUSE_RANK.match((self._root or {}).get("rank", ""))
        if m is None:
            return None
        return int(m["rank"]), int(m["local"]), (self._root or {}).get("host", "")

    def _fatal_tracebacks(self) -> list[_Traceback]:
        """The fatal traceback of each rank label, the root cause first: the rank torchrun
        names, else the first (by its stream's order) whose error is not a consequence of
        another rank's (``matchers.CONSEQUENCE``)."""
        if set(self._fatal) == {None}:  # no labels: the last traceback of the run, as ever
            tb = self._last_tb
            return [tb] if tb is not None and tb.exc is not None and self._is_fatal(tb) else []
        found = [tb for tb in self._fatal.values() if tb.exc is not None and self._is_fatal(tb)]
        root = self.root_rank()
        named = {str(root[0]), f"local {root[1]}"} if root is not None else set()

        def order(tb: _Traceback) -> tuple[bool, bool, int]:
            return (tb.label.key not in named,
                    M.CONSEQUENCE.search(tb.exc_text) is not None, tb.exc_seq)
        return sorted(found, key=order)

    def _python_exception(self, tb: _Traceback, origin: tuple[int | None, str]
                          ) -> Insight:
        etype, emsg = tb.exc or ("", "")
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
        rank, node = self._rank_of(tb, origin)
        on = f" on rank {rank}" if rank is not None else (
            f" on {tb.label.describe()}" if tb.label.key else "")
        if on and node:
            on += f" (node {node})"
        if rank is not None:
            details["rank"] = rank
        elif tb.label.local_rank is not None:
            details["local_rank"] = tb.label.local_rank
        if node:
            details["node"] = node
        short = emsg if len(emsg) <= 160 else emsg[:157] + "..."
        message = f"{etype}{on}{': ' + short if short else ''}{where}"
        hint = M.PYTHON_HINT if own else ("the exception was raised inside a library; the "
                                          "frames above show which call of yours led there")
        return Insight("python-exception", message, tuple(evidence), hint, FAILURE, details)

    def _rank_of(self, tb: _Traceback, origin: tuple[int | None, str]
                 ) -> tuple[int | None, str]:
        """The global rank and node of a traceback: its label's (the node from torchrun's
        root cause when it names this rank), else the run's own (a task run's)."""
        rank, node = origin
        if tb.label.rank is not None:
            rank = tb.label.rank
        elif tb.label.local_rank is not None:
            rank = None
        root = self.root_rank()
        if root is not None and tb.label.key in (str(root[0]), f"local {root[1]}"):
            rank, node = root[0], node or root[2]
        return rank, node

    # --- the answer
    def result(self, outcome: Outcome, rank: int | None = None, node: str = ""
               ) -> list[Insight]:
        """The insights of a run that ended badly (none for a run that ended well); ``rank``
        and ``node``: the run's own, when it is one task of a job (its lines' labels, when
        they have some, say better which rank printed them)."""
        if not outcome.ended_badly:
            return []
        out: dict[str, Insight] = {}
        for kind, found in self._found.items():
            matcher, values = self._derived(kind, found)
            message = M.render(matcher.message, values)
            hint = M.render(matcher.hint, values) if matcher.hint else ""
            details = {k: v for k, v in values.items() if v is not None}
            details.update({f"{k}_bytes": n for k, v in values.items()
                            if isinstance(v, str) and (n := M.size_bytes(v)) is not None})
            if found.count > 1:
                details["lines"] = found.count
            out[kind] = Insight(kind, message, tuple(found.evidence), hint, FAILURE, details)
        self._slurm_state(outcome, out)
        fatal = self._fatal_tracebacks()
        if fatal:
            exc = self._python_exception(fatal[0], (rank, node))
            explained = fatal[0].explained_by
            if explained in out:
                # one error, one insight: the specific one, with where the user's code was
                out[explained] = _with_frame(out[explained], exc)
            else:
                out["python-exception"] = exc
            # the launcher's own summary (torchrun's ChildFailedError) is not another rank
            others = [tb for tb in fatal[1:] if tb.label.key is not None]
            if others:
                out["other-ranks"] = self._other_ranks(exc, others, (rank, node))
        root = self._root_cause(fatal)
        if root is not None:
            out["root-cause"] = root
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

    def _root_cause(self, fatal: list[_Traceback]) -> Insight | None:
        """torchrun's root cause, said when no traceback of that rank was read."""
        root = self.root_rank()
        if root is None or any(tb.label.key in (str(root[0]), f"local {root[1]}")
                               for tb in fatal):
            return None
        code = (self._root or {}).get("exitcode", "")
        return Insight(
            "root-cause", f"torchrun: the first worker that failed was rank {root[0]} "
            f"(local rank {root[1]}, node {root[2] or '?'})"
            + (f", exit code {code}" if code else ""), (),
            "look at that rank's last lines; the other workers' errors follow from it",
            FAILURE, {"rank": root[0], "local_rank": root[1], "node": root[2]})

    def _derived(self, kind: str, found: _Found) -> tuple[M.Matcher, dict[str, Any]]:
        """The matcher and values an insight is written from, with what its lines alone do
        not say: the cause NCCL gave for an error (the line after "Last error:", or its own
        WARN line), how many ranks a rendezvous missed, which ranks a watchdog did not hear."""
        matcher, values = found.matcher, dict(found.values)
        if kind == "nccl-error":
            error = found.by_needle.get("NCCL error")
            warn = found.by_needle.get("NCCL WARN")
            if error is not None and "Watchdog" not in matcher.needle:
                matcher, values = error[0], {**values, **{
                    k: v for k, v in error[1].items() if v is not None}}
            cause = self._cause or (warn[1].get("what") or "" if warn is not None else "")
            if cause and matcher.needle != "NCCL WARN":
                values["cause"] = cause
                matcher = matcher._replace(message=matcher.message + ": {cause}")
            reported = {int(r) for r in values.get("rank") or () if str(r).isdigit()}
            silent = sorted(self._ranks - reported) if reported else []
            if silent:
                values["silent"] = [str(r) for r in silent]
        elif kind == "rendezvous-timeout":
            joined, world = str(values.get("joined")), str(values.get("world"))
            if joined.isdigit() and world.isdigit():
                n = int(world) - int(joined)
                values["missing"] = f"{n} rank{'s' if n != 1 else ''}"
                if joined == "1" and n > 0:
                    # the store's host is rank 0 (env:// rendezvous) and counts itself: only
                    # it joined, so every other rank is the one missing
                    values["never"] = "rank 1" if n == 1 else f"ranks 1-{int(world) - 1}"
        return matcher, values

    def _other_ranks(self, root: Insight, others: list[_Traceback],
                     origin: tuple[int | None, str]) -> Insight:
        """The errors of the ranks that failed after the root cause, said once."""
        parts, ranks = [], []
        first = (root.details or {}).get("rank")
        for tb in others:
            rank, _ = self._rank_of(tb, origin)
            who = f"rank {rank}" if rank is not None else tb.label.describe()
            etype, emsg = tb.exc or ("", "")
            short = emsg if len(emsg) <= 100 else emsg[:97] + "..."
            then = " (a consequence" + (f" of rank {first}'s failure)" if first is not None
                                        else ")") if M.CONSEQUENCE.search(tb.exc_text) else ""
            parts.append(f"{who}: {etype}{': ' + short if short else ''}{then}")
            ranks.append(rank if rank is not None else tb.label.key)
        return Insight("other-ranks", "also failed: " + "; ".join(parts),
                       tuple(Evidence(tb.stream, tb.exc_seq, tb.exc_text) for tb in others
                             )[:MAX_EVIDENCE], "the first error above is the root cause",
                       FAILURE, {"ranks": ranks})

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
        return specific._replace(details={**(specific.details or {}), **{
            k: details[k] for k in ("rank", "node") if k in details}})
    on = f" on rank {details['rank']}" if "rank" in details else ""
    on += f" (node {details['node']})" if on and details.get("node") else ""
    where = f"{on} at {details['file']}:{details['line']} in {details['function']}"
    frame = [e for e in exc.evidence[1:-1] if e not in specific.evidence]
    evidence = sorted((*frame, *specific.evidence), key=lambda e: (e.stream, e.seq))
    merged: dict[str, Any] = {k: details[k] for k in ("file", "line", "function", "code",
                                                      "own_code", "rank", "node")
                              if k in details}
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
