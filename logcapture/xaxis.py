"""The X-axis rule of metadata graphs, implemented once.

A job's metadata graphs are drawn by time and by one X key chosen per job, in this order:

=====  ==========================================================================
level  the key qualifies when
=====  ==========================================================================
0      it is ``progress`` and at least one of its values is a number
1      it is ``epoch`` and at least one of its values is a number
2      every value is an integer, strictly increasing from row to row
3      every value is a number, strictly increasing from row to row
4      every value is an integer (any order)
5      every value is a number (any order)
6      at least one value is a number ("any numbers": mixed with text, bools, NaN, ...)
=====  ==========================================================================

The chosen key is the one with the lowest level; among keys of the same level the
alphabetically first (code-point order, which is also UTF-8 byte order, so ClickHouse's
string order agrees). No key qualifies -> ``None`` (the dashboard then shows graphs by time
only).

Precise definitions (decided here, documented in docs/grafana.md, tested in
tests/test_xaxis.py; the SQL of :func:`x_axis_sql` implements exactly the same):

- *rows* are the ``fields`` of one job's Metadata records, in time order (stream order:
  ``seq``). A key's *values* are its values in the rows where it is present; a row where the
  key is absent, or its value is JSON ``null``, is skipped (null carries nothing to plot).
- a *number* is a JSON number: a finite ``float``, or an ``int`` in the signed 64-bit range;
  never a ``bool`` (JSON ``true`` is not 1). ``NaN``/``Infinity``, whether Python floats or
  the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` that records.dumps writes for them,
  are not numbers; nor are numeric strings (``"3"``), lists, objects, and integers beyond
  64 bits (ClickHouse reads those as UInt64 or as text, not as a number it can compare).
- an *integer* is a JSON integer literal (``3``; ``3.0`` is a number, not an integer, since
  it is written as a float and ClickHouse reads it as Float64).
- *strictly increasing* compares the values as IEEE doubles, each value greater than the one
  before; a single value is strictly increasing. Strict, not non-decreasing, so a constant
  such as ``batch_size`` never beats a real counter such as ``step``.
- keys are compared exactly (case-sensitive); only the exact keys ``progress`` and ``epoch``
  get levels 0 and 1 (a nested ``train.epoch`` is an ordinary key).
- *per rank*: the rows of a job of several ranks (each task of an ``srun`` step is a run of
  its own, with its rank) form one *series* per run (one rank of one step). "Strictly
  increasing" holds within each series, in its own order, not across the merged rows: a
  ``step`` that every rank counts 0, 1, 2 ... is increasing although the merged rows read 0,
  0, 1, 1 ... . Every other condition (a number, an integer, any number) is about the values
  themselves and reads all rows. One run alone is one series: the rule as above, save for
  the next point.
- *a row's own rank*: a row whose ``rank`` is an integer belongs to that rank's series within
  its run (``RANK``), when some rank occurs in more than one of the rows (``own_ranks``).
  Several processes of one task that share its terminal without labels (torchrun's workers
  without ``--tee``, a multiprocessing pool) print their JSON lines into one run; when each
  says its ``rank``, as ``{"step": 3, "loss": 0.2, "rank": 1}`` does, a ``step`` that every
  worker counts is the axis, not ``rank``, which is constant within each series and so not
  increasing (its values are still read as any key's). A ``rank`` that differs in every row
  (a sweep's, a ranking's) names no series: one-row series would make every key increasing.
- *a row's label*: a row whose object a launcher's label stood before (``[default1]:{...}``
  from ``torchrun --tee``, ``1: {...}`` from ``srun --label``: the record's ``label``, ``rank
  1``) belongs to that label's series within its run, whatever its fields say, when some
  label occurs in more than one of the rows (``own_labels``: a program printing ``7: {...}``
  with its step in front has a label on every row, and names no series).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

PROGRESS = "progress"
EPOCH = "epoch"
RANK = "rank"  # a row's own rank: the series it belongs to within its run

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Levels, in the order of the cluster guide.
LEVEL_PROGRESS = 0
LEVEL_EPOCH = 1
LEVEL_INCREASING_INTEGERS = 2
LEVEL_INCREASING_NUMBERS = 3
LEVEL_INTEGERS = 4
LEVEL_NUMBERS = 5
LEVEL_ANY_NUMBERS = 6
LEVEL_NAMES = (
    "progress",
    "epoch",
    "monotonically increasing integers",
    "monotonically increasing numbers",
    "integers of any monotonicity",
    "numbers of any monotonicity",
    "any numbers",
)


def is_integer(value: Any) -> bool:
    """A JSON integer literal in the signed 64-bit range (``3``, not ``3.0``, not ``True``)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and INT64_MIN <= value <= INT64_MAX)


def is_number(value: Any) -> bool:
    """A number of the rule: an integer (above) or a finite float; never bool or NaN."""
    return is_integer(value) or (isinstance(value, float) and math.isfinite(value))


def key_level(key: str, values: Iterable[Any], series: Iterable[Any] | None = None
              ) -> int | None:
    """The level (0 best … 6) at which ``key`` qualifies as X axis given its values in time
    order (absent/null values already skipped), or ``None`` when it has no number at all.
    ``series``: the series of each value (the module docstring: per rank), None: one."""
    any_number = False
    all_numbers = True
    all_integers = True
    increasing = True
    previous: dict[Any, float] = {}
    for value, one in zip(values, series if series is not None else _ONE, strict=False):
        if value is None:
            continue
        if is_number(value):
            any_number = True
            x = float(value)
            if one in previous and not x > previous[one]:
                increasing = False
            previous[one] = x
            if not is_integer(value):
                all_integers = False
        else:
            all_numbers = False
            all_integers = False
    if not any_number:
        return None
    if key == PROGRESS:
        return LEVEL_PROGRESS
    if key == EPOCH:
        return LEVEL_EPOCH
    if all_numbers:
        if increasing:
            return LEVEL_INCREASING_INTEGERS if all_integers else LEVEL_INCREASING_NUMBERS
        return LEVEL_INTEGERS if all_integers else LEVEL_NUMBERS
    return LEVEL_ANY_NUMBERS


class _One:
    """The series of every value when there is one (an endless iterable of None)."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


_ONE = _One()


def own_ranks(rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Each row's own rank (the module docstring): its ``rank`` when that is an integer and
    some rank occurs in more than one of ``rows``, else None."""
    owns = [r if is_integer(r := row.get(RANK)) else None for row in rows]
    given = [o for o in owns if o is not None]
    return owns if len(set(given)) < len(given) else [None] * len(owns)


def key_levels(rows: Iterable[Mapping[str, Any]], series: Iterable[Any] | None = None
               ) -> dict[str, int]:
    """Every qualifying key of one job's metadata rows (time order) with its level;
    ``series``: the series of each row (per rank), None: one."""
    rows = list(rows)
    values: dict[str, tuple[list[Any], list[Any]]] = {}
    for row, of, own in zip(rows, series if series is not None else _ONE, own_ranks(rows),
                            strict=False):
        one = (of, own)
        for key, value in row.items():
            if value is not None:
                vals, ones = values.setdefault(key, ([], []))
                vals.append(value)
                ones.append(one)
    levels = {}
    for key, (vals, ones) in values.items():
        level = key_level(key, vals, ones)
        if level is not None:
            levels[key] = level
    return levels


def choose_x_axis(rows: list[dict[str, Any]], series: list[Any] | None = None) -> str | None:
    """The X key of one job's metadata graphs (rows in time order), or ``None``; ``series``:
    the series (rank) of each row, for a job of several ranks."""
    levels = key_levels(rows, series)
    if not levels:
        return None
    return min(levels, key=lambda k: (levels[k], k))


def own_labels(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each metadata record dict's ``label`` (the module docstring) when some label occurs in
    more than one of ``records``, else "" (a label on every row, as a program printing
    ``7: {...}`` gets, names no series, as a rank that differs in every row does not)."""
    given = [str(r.get("label") or "") for r in records]
    named = [g for g in given if g]
    return given if len(set(named)) < len(named) else [""] * len(given)


def series_of_records(records: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any, str]]:
    """The series of each metadata record dict: its run, its rank (``rank``, where the reader
    put the rank of the task run it belongs to) and its label where labels name series
    (``own_labels``)."""
    return [(r.get("run"), r.get("rank"), label)
            for r, label in zip(records, own_labels(records), strict=True)]


def choose_x_axis_of_records(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The X key of one run, or of a job's runs, from their metadata record dicts in any
    order (``Store.metadata`` returns them newest first; spool readers in stream order):
    sorted by ``(ts, seq)``, then :func:`choose_x_axis` on their ``fields``, one series per
    run, rank and label (``series_of_records``). For ``logcapture show``."""
    ordered = sorted((r for r in records if isinstance(r.get("fields"), Mapping)),
                     key=lambda r: (r.get("ts", 0.0), r.get("seq", 0)))
    return choose_x_axis([dict(r["fields"]) for r in ordered], series_of_records(ordered))


# --- The same rule in ClickHouse SQL -------------------------------------------------------
#
# Two layers, so the rule itself does not depend on how the store keeps metadata:
#   values_sql(...)  one row per (run, seq, key) with a non-null value, and its series:
#                    kind 'int' | 'float' | 'other' and num (Float64, meaningful unless 'other')
#   x_axis_sql(...)  the rule over those rows: one row per run with x_key and x_level.
# ``run`` is what one X axis is chosen for (a run, or a job of several task runs); ``series``
# is what "increasing" is read within (per rank: the task run), ordered by ``seq``.
# JSONType() says 'Int64' for an integer literal in range, 'UInt64' above it, 'Double' for a
# float literal (finite by construction: records.dumps writes non-finite floats as strings),
# 'Null' for null; anything else is 'other'. That is exactly is_integer / is_number above.

def values_sql(source: str, fields: str = "fields", carry: tuple[str, ...] = (),
               series: str = "''", label: str = "label") -> str:
    """Rows ``(run, seq, own, label, series, key, kind, num)`` from ``source``, a table or
    subquery with columns ``run``, ``seq``, ``fields`` (the metadata object as JSON text; another
    column name can be given) and ``label`` (the record's: whose object it was behind a
    launcher's label, '' for none; another expression can be given). ``carry`` names more
    columns of ``source`` passed through (e.g. ``ts``); ``series`` is an expression over
    ``source`` (per rank: the task run's id; the default, one series per ``run``), to which
    a row's own integer ``rank`` (the module docstring) and its label are added; ``own`` is
    that own rank as text ('' for none: ``own_ranks``), ``label`` the label where labels
    name series ('' otherwise: ``own_labels``)."""
    extra = "".join(f"{c}, " for c in carry)
    own = (f"if(JSONType({fields}, '{RANK}') = 'Int64', "
           f"toString(JSONExtractInt({fields}, '{RANK}')), '')")
    # own_ranks: a rank that occurs in more than one row of the run (_lc_n: the rows of each
    # rank, _lc_repeats: whether one occurs twice); own_labels the same of labels (_lc_ln,
    # _lc_label_repeats). The keys through a Map: the lightest chDB build has no
    # JSONExtractKeys.
    return f"""
SELECT run, seq, if(_lc_repeats, _lc_own, '') AS own,
       if(_lc_label_repeats, _lc_label, '') AS label,
       concat(ifNull(toString(_lc_series), ''), '|', own, '|', label) AS series, {extra}key,
       JSONType({fields}, key) AS json_type,
       multiIf(json_type = 'Int64', 'int', json_type = 'Double', 'float', 'other') AS kind,
       JSONExtractFloat({fields}, key) AS num
FROM (
    SELECT *, max(if(_lc_own != '', _lc_n, 0)) OVER (PARTITION BY run) > 1 AS _lc_repeats,
           max(if(_lc_label != '', _lc_ln, 0)) OVER (PARTITION BY run) > 1 AS _lc_label_repeats
    FROM (
        SELECT *, {series} AS _lc_series, {own} AS _lc_own, toString({label}) AS _lc_label,
               count() OVER (PARTITION BY run, _lc_own) AS _lc_n,
               count() OVER (PARTITION BY run, _lc_label) AS _lc_ln
        FROM {source}
    )
)
ARRAY JOIN mapKeys(JSONExtract({fields}, 'Map(String, String)')) AS key
WHERE json_type != 'Null'"""


def x_axis_sql(values: str) -> str:
    """ClickHouse SQL applying the rule per run to ``values`` (a subquery shaped like
    :func:`values_sql`'s result). Result columns: ``run``, ``x_key``, ``x_level``; runs
    without any qualifying key have no row."""
    return f"""
SELECT run, argMin(key, (level, key)) AS x_key, min(level) AS x_level
FROM (
    SELECT run, key,
           sum(s_numbers) AS n_numbers, sum(s_others) AS n_others, sum(s_floats) AS n_floats,
           min(s_increasing) AS increasing,
           multiIf(n_numbers = 0, 255,
                   key = '{PROGRESS}', {LEVEL_PROGRESS},
                   key = '{EPOCH}', {LEVEL_EPOCH},
                   n_others > 0, {LEVEL_ANY_NUMBERS},
                   increasing AND n_floats = 0, {LEVEL_INCREASING_INTEGERS},
                   increasing, {LEVEL_INCREASING_NUMBERS},
                   n_floats = 0, {LEVEL_INTEGERS},
                   {LEVEL_NUMBERS}) AS level
    FROM (
        SELECT run, series, key,
               countIf(kind != 'other') AS s_numbers,
               countIf(kind = 'other') AS s_others,
               countIf(kind = 'float') AS s_floats,
               arrayMap(p -> p.2, arraySort(groupArrayIf((seq, num), kind != 'other'))) AS xs,
               arrayAll((a, b) -> b > a, arrayPopBack(xs), arrayPopFront(xs)) AS s_increasing
        FROM ({values})
        GROUP BY run, series, key
    )
    GROUP BY run, key
)
WHERE level != 255
GROUP BY run"""
