"""Which rank printed a line, from the label a launcher put in front of it: the rule, once.

Several processes of one job often share one terminal (torchrun's workers, the tasks of an
``srun --label`` step seen from the batch script, ``mpirun --tag-output``). Their launchers
can put a label before each line; this module reads it:

=====================================  =====================================================
label                                  who writes it, and what its number is
=====================================  =====================================================
``[default0]:``                        torchrun ``--tee`` (``[{role}{local_rank}]:``, role
                                       ``default`` unless ``--role`` names another): the
                                       worker's *local* rank
``[rank0]:``, ``[rank0]: ``            PyTorch (``torch.distributed``) before what a worker's
                                       traceback and C++ warnings print: the *global* rank
``0: ``, `` 0: ``                      ``srun --label``: the task id (``SLURM_PROCID``, the
                                       global rank), right-aligned to the width of the last
``[1,0]<stdout>:``                     Open MPI ``--tag-output`` (``[jobid,rank]<stream>:``,
                                       ``<stderr>``, ``<stddiag>``): the MPI rank
=====================================  =====================================================

Labels nest (torchrun ``--tee`` around PyTorch's: ``[default1]:[rank1]: Traceback``); the
innermost global rank wins, and a local rank alone is kept as local (``[default1]`` is rank 1
only when the job has one node). ``split`` returns the line without its labels.

What cannot be told apart: lines that carry no label (workers' prints without ``--tee``)
belong to no rank; two unlabelled workers whose prints collide mid-line (``rank 1 step 0 sum
3.0rank 0 step 0 sum 3.0``, the bytes as the terminal got them) stay one line of no rank; a
program that itself prints ``3: text`` or ``[rank3]: text`` is read as rank 3; a torchrun
role other than ``default`` is not recognised.
"""

from __future__ import annotations

import re
from collections import namedtuple

TYPE_CHECKING = False  # not typing's: classify imports this on every capture's start path

# One label at the start of the text; group names say which launcher wrote it.
_LABEL = re.compile(
    r"\[default(?P<local>\d{1,7})\]:"  # torchrun --tee: no space of its own
    r"|\[rank(?P<rank>\d{1,7})\]: ?"  # PyTorch: "[rank1]: Traceback", "[rank0]:[W1127 ..."
    r"|\[\d{1,9},(?P<mpi>\d{1,7})\]<std(?:out|err|diag)>: ?"  # Open MPI --tag-output
    r"| {0,6}(?P<srun>\d{1,7}): ")  # srun --label
MAX_LABELS = 3  # torchrun's around PyTorch's is the deepest seen


class Labelled(namedtuple("Labelled", ("rank", "local_rank", "text"))):
    """A line split at its launcher labels: ``rank`` (global, or None), ``local_rank`` (or
    None), and ``text`` without the labels (the line itself when it has none). A
    ``collections.namedtuple``: ``typing.NamedTuple`` would import typing (~2 ms) into every
    capture."""

    __slots__ = ()
    if TYPE_CHECKING:
        rank: int | None
        local_rank: int | None
        text: str

    @property
    def key(self) -> str | None:
        """What tells this line's rank apart from the others of the same log: ``"3"`` for a
        global rank, ``"local 3"`` for a local one alone, None for an unlabelled line."""
        if self.rank is not None:
            return str(self.rank)
        return f"local {self.local_rank}" if self.local_rank is not None else None

    def describe(self) -> str:
        """``rank 3``, ``local rank 3``, or "" for an unlabelled line."""
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"local rank {self.local_rank}" if self.local_rank is not None else ""


def number_of(described: str) -> str:
    """The number of what ``Labelled.describe`` wrote (``rank 3``, ``local rank 3``: ``"3"``),
    in decimal without leading zeros; "" for "" and for text that ends in no number of at
    most 18 ASCII digits (a label read from a spool file may be anything). Readers pick
    labelled rows by it (the page's and Grafana's rank choice); Grafana's job dashboard does
    the same in SQL (``grafana.dashboards.LABEL_NUMBER``)."""
    n = described.rpartition(" ")[2]
    return str(int(n)) if n.isascii() and n.isdigit() and len(n) <= 18 else ""


STARTS = frozenset("[ 0123456789")  # what a label starts with: most lines are let go here


def split(text: str) -> Labelled:
    """The launcher labels at the start of ``text`` (the module docstring) and the rest."""
    if text[:1] not in STARTS:
        return Labelled(None, None, text)
    rank = local = None
    pos = 0
    for _ in range(MAX_LABELS):
        m = _LABEL.match(text, pos)
        if m is None:
            break
        if m.group("local") is not None:
            local = int(m.group("local"))
        else:
            rank = int(m.group("rank") or m.group("mpi") or m.group("srun"))
        pos = m.end()
    return Labelled(rank, local, text[pos:] if pos else text)


# A line that is launcher labels before a JSON object's opening brace (``[default0]:{``).
_LABELLED_OBJECT = re.compile(rf"(?m)^(?:{_LABEL.pattern}){{1,{MAX_LABELS}}}\{{")


def has_labelled_object(text: str) -> bool:
    """Whether a line of ``text`` (lines joined by newlines) is launcher labels before a
    JSON object (``[default0]:{...}``, `` 0: {...}``). Each label ends in ``:`` (and maybe a
    space) before the brace: text without ``:{`` or ``: {`` is let go without the pattern."""
    return (":{" in text or ": {" in text) and _LABELLED_OBJECT.search(text) is not None


def rank_key(rank: int | None, local_rank: int | None = None) -> str | None:
    """``Labelled.key`` for a rank known otherwise (a task run's ``SLURM_PROCID``)."""
    return Labelled(rank, local_rank, "").key
