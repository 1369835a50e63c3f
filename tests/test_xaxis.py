"""The X-axis rule of metadata graphs: every level, ties, non-numbers, NaN; and the SQL
version agreeing with the Python one on generated jobs, run by the real engine (chDB)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcapture.classify import big_ints_as_text
from logcapture.records import Metadata
from logcapture.store import Identity, open_store
from logcapture.xaxis import (
    LEVEL_ANY_NUMBERS,
    LEVEL_EPOCH,
    LEVEL_INCREASING_INTEGERS,
    LEVEL_INCREASING_NUMBERS,
    LEVEL_INTEGERS,
    LEVEL_NUMBERS,
    LEVEL_PROGRESS,
    choose_x_axis,
    choose_x_axis_of_records,
    key_levels,
    own_labels,
    values_sql,
    x_axis_sql,
)

# --- the rule, level by level -------------------------------------------------------------


def test_no_rows_no_axis():
    assert choose_x_axis([]) is None


def test_no_numbers_no_axis():
    rows = [{"size": "big", "ok": True, "x": None, "l": [1, 2], "o": {"a": 1}, "s": "3"}]
    assert choose_x_axis(rows) is None


def test_progress_beats_everything():
    rows = [{"progress": 0.5, "epoch": 1, "step": 1}, {"progress": 0.2, "epoch": 2, "step": 2}]
    assert choose_x_axis(rows) == "progress"  # even though progress went down


def test_progress_needs_only_one_number():
    rows = [{"progress": "starting", "step": 1}, {"progress": 10, "step": 2}]
    assert key_levels(rows)["progress"] == LEVEL_PROGRESS
    assert choose_x_axis(rows) == "progress"


def test_progress_without_numbers_does_not_qualify():
    rows = [{"progress": "10%", "epoch": 1}, {"progress": "20%", "epoch": 2}]
    assert choose_x_axis(rows) == "epoch"


def test_epoch_beats_increasing_integers():
    rows = [{"epoch": 3, "a": 1}, {"epoch": 1, "a": 2}]
    assert key_levels(rows)["epoch"] == LEVEL_EPOCH
    assert choose_x_axis(rows) == "epoch"


def test_keys_are_exact_and_case_sensitive():
    rows = [{"Progress": 1, "train.epoch": 1, "z": 1}, {"Progress": 0, "train.epoch": 0, "z": 2}]
    assert choose_x_axis(rows) == "z"


def test_increasing_integers_beat_increasing_numbers():
    rows = [{"a": 0.5, "step": 10}, {"a": 1.5, "step": 20}]
    levels = key_levels(rows)
    assert levels == {"a": LEVEL_INCREASING_NUMBERS, "step": LEVEL_INCREASING_INTEGERS}
    assert choose_x_axis(rows) == "step"


def test_increasing_numbers_beat_unordered_integers():
    rows = [{"batch": 32, "t": 0.1}, {"batch": 16, "t": 0.2}]
    assert key_levels(rows) == {"batch": LEVEL_INTEGERS, "t": LEVEL_INCREASING_NUMBERS}
    assert choose_x_axis(rows) == "t"


def test_integers_beat_numbers():
    rows = [{"a": 0.5, "b": 3}, {"a": 0.1, "b": 1}]
    assert key_levels(rows) == {"a": LEVEL_NUMBERS, "b": LEVEL_INTEGERS}
    assert choose_x_axis(rows) == "b"


def test_numbers_beat_any_numbers():
    rows = [{"a": 1, "b": 0.5}, {"a": "n/a", "b": 0.1}]
    assert key_levels(rows) == {"a": LEVEL_ANY_NUMBERS, "b": LEVEL_NUMBERS}
    assert choose_x_axis(rows) == "b"


def test_any_numbers_is_the_last_resort():
    rows = [{"a": "x", "b": True}, {"a": 2, "b": False}]
    assert choose_x_axis(rows) == "a"


def test_strictly_increasing_constant_is_not_increasing():
    # a constant batch_size must not beat the real counter, whatever the alphabet says
    rows = [{"batch_size": 32, "step": 1}, {"batch_size": 32, "step": 2}]
    assert key_levels(rows)["batch_size"] == LEVEL_INTEGERS
    assert choose_x_axis(rows) == "step"


def test_single_value_is_increasing():
    assert key_levels([{"n": 7}]) == {"n": LEVEL_INCREASING_INTEGERS}


def test_float_literal_is_not_an_integer():
    rows = [{"a": 1.0, "b": 5}, {"a": 2.0, "b": 6}]
    assert key_levels(rows) == {"a": LEVEL_INCREASING_NUMBERS, "b": LEVEL_INCREASING_INTEGERS}


def test_mixed_ints_and_floats_are_numbers():
    rows = [{"a": 1}, {"a": 1.5}, {"a": 2}]
    assert key_levels(rows) == {"a": LEVEL_INCREASING_NUMBERS}


def test_ties_go_to_the_alphabetically_first_key():
    rows = [{"zeta": 1, "beta": 1, "alpha2": 1, "Alpha": 1}, {"zeta": 2, "beta": 2, "alpha2": 2,
                                                           "Alpha": 2}]
    assert choose_x_axis(rows) == "Alpha"  # code-point order: upper case before lower case


def test_ties_at_every_level():
    assert choose_x_axis([{"b": 1.5, "a": 2.5}, {"b": 0.5, "a": 0.5}]) == "a"  # numbers
    assert choose_x_axis([{"b": 2, "a": 2}, {"b": 1, "a": 1}]) == "a"  # integers
    assert choose_x_axis([{"b": "x", "a": "y"}, {"b": 1, "a": 1}]) == "a"  # any numbers


def test_bools_are_not_numbers():
    rows = [{"flag": False, "v": 0.3}, {"flag": True, "v": 0.1}]
    assert key_levels(rows) == {"v": LEVEL_NUMBERS}
    assert choose_x_axis([{"flag": True}]) is None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"),
                                 "NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_numbers(bad):
    rows = [{"a": 1, "b": 1.5}, {"a": bad, "b": 2.5}, {"a": 3, "b": 3.5}]
    assert key_levels(rows) == {"a": LEVEL_ANY_NUMBERS, "b": LEVEL_INCREASING_NUMBERS}
    assert choose_x_axis(rows) == "b"
    assert choose_x_axis([{"a": bad}]) is None


def test_nan_as_progress_alone_does_not_qualify():
    assert choose_x_axis([{"progress": float("nan"), "x": 0.5}]) == "x"


def test_numeric_strings_are_not_numbers():
    assert choose_x_axis([{"a": "1"}, {"a": "2"}]) is None


def test_absent_and_null_values_are_skipped():
    rows = [{"step": 1}, {"loss": 0.5}, {"step": None, "loss": 0.4}, {"step": 3}]
    assert key_levels(rows) == {"step": LEVEL_INCREASING_INTEGERS, "loss": LEVEL_NUMBERS}
    assert choose_x_axis(rows) == "step"


def test_integers_beyond_64_bits_are_not_numbers():
    rows = [{"big": 2**63, "n": 0.1}, {"big": 2**64 + 1, "n": 0.2}]
    assert key_levels(rows) == {"n": LEVEL_INCREASING_NUMBERS}
    assert key_levels([{"a": 2**63 - 1}, {"a": -(2**63)}]) == {"a": LEVEL_INTEGERS}


def test_guide_examples():
    rows = [{"epoch": 1, "loss": 7.2355865, "acc": 0.00123},
            {"epoch": 2, "loss": 3.1, "acc": 0.2}]
    assert choose_x_axis(rows) == "epoch"
    rows = [{"step": 151100, "lr": 0.07938926, "flops": 789773523480.1762, "time": 16520},
            {"step": 151200, "lr": 0.07, "flops": 7.9e11, "time": 16530}]
    assert choose_x_axis(rows) == "step"  # step and time both increasing integers: s < t
    assert choose_x_axis([{"size": "big", "speed": "slow", "lr": 0.1}]) == "lr"


# --- SQL and Python agree, on the real engine ----------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The real store (schema, ingest path and all) on the embedded engine: the rule's SQL
    reads the ``metadata`` table exactly as the dashboards do."""
    with open_store(f"chdb://{tmp_path_factory.mktemp('xaxis')}/store") as s:
        yield s


_runs = itertools.count()


def sql_choices(store, jobs: list[list[dict[str, Any]]]) -> list[str | None]:
    """Ship each job's rows as Metadata records of a fresh run, apply the SQL rule to them.
    The rows as the classifier keeps them: an integer beyond 64 bits as its text."""
    ids = [f"r{next(_runs)}" for _ in jobs]
    batches = []
    for run, rows in zip(ids, jobs, strict=True):
        ndjson = "".join(Metadata(run=run, stream="stdout", seq=seq, ts=1000.0 + seq,
                                  fields=big_ints_as_text(row)).to_json() + "\n"
                         for seq, row in enumerate(rows))
        batches.append((ndjson.encode(), Identity(run=run, user="alice", uid=1000)))
    store.insert_many(batches)  # one insert for all the jobs of an example
    source = ("(SELECT run, seq, fields, label FROM metadata FINAL "
              "WHERE run IN {ids:Array(String)})")
    result = store.client.query(x_axis_sql(values_sql(source)), parameters={"ids": ids})
    chosen = {run: key for run, key, _level in result.result_rows}
    return [chosen.get(run) for run in ids]


def test_sql_agrees_on_the_hand_written_cases(store):
    jobs = [
        [],
        [{"progress": 0.5, "epoch": 1}, {"progress": 0.2, "epoch": 2}],
        [{"progress": "10%", "epoch": 1}],
        [{"batch_size": 32, "step": 1}, {"batch_size": 32, "step": 2}],
        [{"a": 1.0, "b": 5}, {"a": 2.0, "b": 4}],
        [{"a": 1, "b": 0.5}, {"a": "n/a", "b": 0.1}],
        [{"a": 1, "b": 1.5}, {"a": float("nan"), "b": 2.5}],
        [{"a": "Infinity", "flag": True}],
        [{"big": 2**63, "n": 0.1}, {"big": 2**64 + 1, "n": 0.2}],
        [{"huge": 2**65, "n": 0.3}, {"huge": -(2**65), "n": 0.1}, {"huge": None, "n": 0.2}],
        [{"big": 2**70}],
        [{"step": 1}, {"loss": 0.5}, {"step": None, "loss": 0.4}, {"step": 3}],
        [{"Alpha": 1, "alpha": 1}, {"Alpha": 2, "alpha": 2}],
        [{"é": 1, "z": 1}, {"é": 2, "z": 2}],
        [{"l": [1, 2], "o": {"a": 1}, "s": "3"}],
        # a row's own rank: its series within the run (only an integer names one)
        [{**row, "batch": 32} for row in TWO_RANKS],
        [{**row, "batch": 32, "rank": float(row["rank"])} for row in TWO_RANKS],
        [{**row, "batch": 32, "rank": str(row["rank"])} for row in TWO_RANKS],
        [{**row, "batch": 32} for row in TWO_RANKS] + [{"step": 0, "rank": 1}],
        [{"step": 1, "rank": 2**63}, {"step": 0, "rank": 2**64}],
        SWEEP,
        [*SWEEP, {"step": 4, "batch": 32, "rank": 3}],
        [{"a": 2, "rank": 0}, {"a": 1, "rank": 1}, {"a": 3, "rank": 0}],
    ]
    got = sql_choices(store, jobs)
    assert got == [choose_x_axis(rows) for rows in jobs]
    assert got[-8:] == ["step", "batch", "batch", "batch", "step", "step", "step", "a"]


KEYS = ["progress", "epoch", "a", "b", "B", "step", "é", "a.b", "rank"]
values = st.one_of(
    st.integers(-5, 5),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-10, 10).map(lambda f: round(f, 1)),
    st.sampled_from([True, False, None, "NaN", "Infinity", "-Infinity", "3", "x", [1], {"k": 1},
                     0.0, -0.0, 1.0, 2**63 - 1, -(2**63), 2**63]),
)
# Each job draws from a few of the keys, so jobs without progress/epoch (and the lower levels)
# come up as often as jobs with them.
rows_strategy = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True).flatmap(
    lambda keys: st.lists(st.dictionaries(st.sampled_from(keys), values, max_size=4),
                          max_size=8))
# Monotone runs are rare by chance: build some on purpose.
increasing = st.lists(st.integers(-100, 100), min_size=1, max_size=8, unique=True).map(sorted)
monotone_rows = st.tuples(st.sampled_from(KEYS), increasing, st.booleans()).map(
    lambda t: [{t[0]: (float(v) / 4 if t[2] else v)} for v in t[1]])


def merge(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(r) for r in a]
    for i, r in enumerate(b):
        if i < len(out):
            out[i].update(r)
        else:
            out.append(dict(r))
    return out


# ... and keys holding only integers in any order, or only numbers.
unordered_rows = st.tuples(st.sampled_from(KEYS), st.lists(st.integers(-3, 3), min_size=2,
                                                            max_size=6), st.booleans()).map(
    lambda t: [{t[0]: (v / 2 if t[2] else v)} for v in t[1]])
job_strategy = st.one_of(rows_strategy, st.builds(merge, rows_strategy, monotone_rows),
                         st.builds(merge, rows_strategy, unordered_rows))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(job_strategy, min_size=1, max_size=5))
def test_sql_agrees_with_python(store, jobs):
    expected = [choose_x_axis(rows) for rows in jobs]
    got = sql_choices(store, jobs)
    assert got == expected


# --- per rank: one series per task run ---------------------------------------------------

TWO_RANKS = [{"step": s, "loss": 1.0 / (s + 1) + r, "rank": r} for s in range(3) for r in (1, 0)]


# The same rows without their own rank, and a constant integer: as several task runs' rows,
# whose series the reader gives (the task run each came from).
NO_RANK = [{"step": row["step"], "loss": row["loss"], "batch": 32} for row in TWO_RANKS]


def test_a_step_increasing_on_every_rank_is_the_axis_of_the_merged_rows():
    # merged, step reads 0, 0, 1, 1, 2, 2: one series, and the tie of integers (any order)
    # goes to the alphabetically first, "batch"
    assert choose_x_axis(NO_RANK) == "batch"
    series = [row["rank"] for row in TWO_RANKS]
    assert key_levels(NO_RANK, series)["step"] == LEVEL_INCREASING_INTEGERS
    assert choose_x_axis(NO_RANK, series) == "step"
    # a key that goes down on one rank is not increasing, whatever the others do
    bad = [*NO_RANK, {"step": 0}]
    assert choose_x_axis(bad, [*series, 1]) == "batch"


def test_a_rows_own_rank_is_its_series_within_its_run():
    # torchrun's workers without --tee, each printing its rank: one run, two series
    rows = [{**row, "batch": 32} for row in TWO_RANKS]
    assert key_levels(rows)["step"] == LEVEL_INCREASING_INTEGERS
    assert choose_x_axis(rows) == "step"
    # constant within each series, rank itself is not increasing (read as any key)
    assert key_levels(rows)["rank"] == LEVEL_INTEGERS
    # a step that goes down on rank 1 is not increasing
    assert choose_x_axis([*rows, {"step": 0, "rank": 1}]) == "batch"
    # only an integer rank names a series: text, a float, a bool are values like any other
    for odd in (str, float, bool):
        assert choose_x_axis([{**row, "rank": odd(row["rank"])} for row in rows]) == "batch"

SWEEP = [{"step": i, "batch": 32, "rank": r} for i, r in enumerate([3, 1, 2, 5])]


def test_a_rank_that_differs_in_every_row_names_no_series():
    # a LoRA rank sweep, a ranking: one-row series would make every key increasing (and the
    # constant batch the axis)
    assert choose_x_axis(SWEEP) == "step"
    # once a rank occurs twice, the rows are series by rank
    repeated = [*SWEEP, {"step": 4, "batch": 32, "rank": 3}]
    assert key_levels(repeated)["batch"] == LEVEL_INTEGERS
    assert choose_x_axis(repeated) == "step"


def test_records_of_several_task_runs_are_one_series_each():
    recs = [{"run": f"7.0.{row['rank']}", "seq": i // 2, "ts": 1.0 + i,
             "fields": NO_RANK[i]} for i, row in enumerate(TWO_RANKS)]
    assert choose_x_axis_of_records(recs) == "step"
    one_run = [{**r, "run": "7", "seq": i} for i, r in enumerate(recs)]
    assert choose_x_axis_of_records(one_run) == "batch"
    # the same rows each with its rank, in one run: the rank of each row is its series
    own = [{**r, "fields": {**r["fields"], "rank": row["rank"]}}
           for r, row in zip(one_run, TWO_RANKS, strict=True)]
    assert choose_x_axis_of_records(own) == "step"


def sql_choices_by_rank(store, jobs: list[list[list[dict[str, Any]]]]) -> list[str | None]:
    """Each job's ranks shipped as task runs ``J.0.R``; the SQL rule per job, one series per
    task run, as a job's dashboard reads it."""
    ids, batches = [], []
    for ranks in jobs:
        job = f"r{next(_runs)}"
        ids.append(job)
        for rank, rows in enumerate(ranks):
            run = f"{job}.0.{rank}"
            ndjson = "".join(Metadata(run=run, stream="stdout", seq=seq, ts=1000.0 + seq,
                                      fields=big_ints_as_text(row)).to_json() + "\n"
                             for seq, row in enumerate(rows))
            batches.append((ndjson.encode(), Identity(run=run, user="alice", uid=1000)))
    store.insert_many(batches)
    # (ClickHouse's aliases are the query's: the task's run id is renamed one level down)
    source = ("(SELECT splitByChar('.', task)[1] AS run, task, seq, fields, label FROM (SELECT "
              "run AS task, seq, fields, label FROM metadata FINAL) "
              "WHERE run IN {ids:Array(String)})")
    result = store.client.query(x_axis_sql(values_sql(source, series="task")),
                                parameters={"ids": ids})
    chosen = {run: key for run, key, _level in result.result_rows}
    return [chosen.get(job) for job in ids]


def sql_choices_by_label(store, jobs: list[list[list[dict[str, Any]]]]) -> list[str | None]:
    """Each job's ranks in one run, each rank's rows behind its launcher label (the record's
    ``label``, as torchrun --tee's workers print into one task's terminal), interleaved by
    step; the SQL rule per run."""
    ids, batches = [], []
    for ranks in jobs:
        run = f"r{next(_runs)}"
        ids.append(run)
        merged = sorted(((seq, rank, row) for rank, rows in enumerate(ranks)
                         for seq, row in enumerate(rows)), key=lambda t: (t[0], t[1]))
        ndjson = "".join(Metadata(run=run, stream="stdout", seq=i, ts=1000.0 + i,
                                  fields=big_ints_as_text(row), label=f"rank {rank}"
                                  ).to_json() + "\n"
                         for i, (_, rank, row) in enumerate(merged))
        batches.append((ndjson.encode(), Identity(run=run, user="alice", uid=1000)))
    store.insert_many(batches)
    source = ("(SELECT run, seq, fields, label FROM metadata FINAL "
              "WHERE run IN {ids:Array(String)})")
    result = store.client.query(x_axis_sql(values_sql(source)), parameters={"ids": ids})
    chosen = {run: key for run, key, _level in result.result_rows}
    return [chosen.get(run) for run in ids]


def _python_by_label(ranks: list[list[dict[str, Any]]]) -> str | None:
    """The same as ``sql_choices_by_label``, in Python, from the records as a reader gives
    them (``choose_x_axis_of_records``)."""
    merged = sorted(((seq, rank, row) for rank, rows in enumerate(ranks)
                     for seq, row in enumerate(rows)), key=lambda t: (t[0], t[1]))
    return choose_x_axis_of_records(
        [{"run": "r", "seq": i, "ts": 1000.0 + i, "fields": row, "label": f"rank {rank}"}
         for i, (_, rank, row) in enumerate(merged)])


def _python_by_rank(ranks: list[list[dict[str, Any]]]) -> str | None:
    merged = sorted(((seq, rank, row) for rank, rows in enumerate(ranks)
                     for seq, row in enumerate(rows)), key=lambda t: (t[0], t[1]))
    return choose_x_axis([row for _, _, row in merged], [rank for _, rank, _ in merged])


def test_sql_agrees_per_rank_on_the_hand_written_cases(store):
    by_rank = [[row for row in TWO_RANKS if row["rank"] == r] for r in (0, 1)]
    jobs = [by_rank, [by_rank[0], [{"step": 5}, {"step": 1}]], [[{"a": 1}], [{"a": "x"}]],
            [[{"a": 1.5}, {"a": 2.5}], [{"a": 1}, {"a": 2}]]]
    assert sql_choices_by_rank(store, jobs) == [_python_by_rank(j) for j in jobs] == \
        ["step", "rank", "a", "a"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(st.lists(job_strategy, min_size=1, max_size=3), min_size=1, max_size=4))
def test_sql_agrees_with_python_per_rank(store, jobs):
    assert sql_choices_by_rank(store, jobs) == [_python_by_rank(ranks) for ranks in jobs]


def test_labelled_rows_of_one_run_are_one_series_per_label(store):
    # torchrun --tee: both workers' objects in one run, each behind its label; the merged
    # steps read 0, 0, 1, 1 ... and step is still the axis, in Python and in SQL
    by_rank = [[row for row in TWO_RANKS if row["rank"] == r] for r in (0, 1)]
    unranked = [[{k: v for k, v in row.items() if k != "rank"} for row in rows]
                for rows in by_rank]
    jobs = [by_rank, unranked, [[{"a": 1}], [{"a": "x"}]]]
    assert sql_choices_by_label(store, jobs) == [_python_by_label(j) for j in jobs] == [
        _python_by_rank(j) for j in jobs] == ["step", "step", "a"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(st.lists(job_strategy, min_size=1, max_size=3), min_size=1, max_size=4))
def test_sql_agrees_with_python_by_label(store, jobs):
    # one series per label within a run is the rule per task run (once a label repeats:
    # own_labels): the same axis
    by_label = [_python_by_label(ranks) for ranks in jobs]
    assert sql_choices_by_label(store, jobs) == by_label
    assert [b for b, ranks in zip(by_label, jobs, strict=True) if max(map(len, ranks)) > 1] \
        == [_python_by_rank(ranks) for ranks in jobs if max(map(len, ranks)) > 1]


def test_python_is_total_on_odd_values():
    # nothing a job can print makes the rule raise
    rows = [{"a": math.pi, "b": object(), "c": 10**400, "d": b"x"}]
    assert choose_x_axis(rows) == "a"


def test_records_in_any_order():
    recs = [{"kind": "metadata", "seq": 1, "ts": 2.0, "fields": {"a": 5, "b": 0.5}},
            {"kind": "metadata", "seq": 0, "ts": 1.0, "fields": {"a": 1, "b": 0.7}}]
    assert choose_x_axis_of_records(recs) == "a"  # increasing once sorted by time
    assert choose_x_axis_of_records(reversed(recs)) == "a"
    assert choose_x_axis_of_records([]) is None


def test_a_label_on_every_row_names_no_series(store):
    # a program that prints its step before each object ("7: {...}") reads as srun --label's
    # rank 7 on every row: one-row series would make every key increasing (own_labels)
    rows = [{"step": s, "bucket": b} for s, b in zip(range(5), (3, 1, 4, 1, 5), strict=True)]
    recs = [{"run": "r", "seq": s, "ts": 1000.0 + s, "fields": row, "label": f"rank {s}"}
            for s, row in enumerate(rows)]
    assert own_labels(recs) == [""] * 5
    assert choose_x_axis_of_records(recs) == "step"
    # once a label occurs twice, the labels are series
    again = [*recs, {**recs[0], "seq": 5, "ts": 1005.0}]
    assert own_labels(again) == [r["label"] for r in again]
    run = f"r{next(_runs)}"
    ndjson = "".join(Metadata(run=run, stream="stdout", seq=r["seq"], ts=r["ts"],
                              fields=r["fields"], label=r["label"]).to_json() + "\n"
                     for r in recs)
    store.insert_many([(ndjson.encode(), Identity(run=run, user="alice", uid=1000))])
    source = "(SELECT run, seq, fields, label FROM metadata FINAL WHERE run = {run:String})"
    [(_, key, _)] = store.client.query(x_axis_sql(values_sql(source)),
                                       parameters={"run": run}).result_rows
    assert key == "step"
