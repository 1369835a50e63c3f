"""The dashboards, as code (grafana-foundation-sdk builders; no hand-edited JSON).

- **Job details** (``logcapture-job``): header (user, job, state, exit, duration, nodes, GPUs),
  the logs (stdout; stderr on the ``stderr`` switch; logcapture's notes about dropped
  repetitions and warnings as their own lines), the metadata table newest first, metadata
  graphs by time and by the X axis the guide's rule picks (logcapture/xaxis.py, the same SQL
  the tests check against the Python rule), and a row of GPU and CPU panels per node.
- **Jobs** (``logcapture-jobs``): a user's jobs with state, duration and GPU utilisation,
  linking to the job details.
- **Compare jobs** (``logcapture-compare``): one metadata key of several jobs on one graph,
  by each job's X axis and by time since the job started.
- **Search** (``logcapture-search``): the newest lines, in the dashboard's time range, holding
  every token typed in the search box (the ``text_tokens`` index answers, as for
  ``logcapture search``), each linking to its job's details.

Every query reads through the row policies of the store (docs/storage.md): the data source
connects as the Grafana user's ClickHouse identity (docs/grafana.md), so a user sees only
their own runs and nothing here filters by user for security. Variables are interpolated
with ``:sqlstring``/``:singlequote`` so a value is always a quoted SQL string; the free text
of the search box with ``:percentencode`` inside ``decodeURLComponent('...')`` (Grafana's
``sqlstring`` doubles quotes but leaves backslashes, which ClickHouse reads as escapes;
percent-encoded text is letters, digits and ``-_.~%`` only).
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import logs as glogs
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.builders import xychart as gxy
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import xychart as xym

from ..logview import log_sql
from ..summary_row import duration_sql, exit_sql, name_sql, state_sql
from ..xaxis import LEVEL_NAMES, values_sql, x_axis_sql
from .query import FORMAT_LOGS, FORMAT_TABLE, FORMAT_TIME_SERIES, ClickHouseQuery, datasource_ref

JOB_UID = "logcapture-job"
JOBS_UID = "logcapture-jobs"
COMPARE_UID = "logcapture-compare"
SEARCH_UID = "logcapture-search"
TAGS = ["logcapture"]
DEFAULT_DATABASE = "logcapture"

RUN = "${run:sqlstring}"
PATTERN = "decodeURLComponent('${pattern:percentencode}')"  # the search box's text
SEARCH_TOKENS = 8  # tokens of the search box each line must hold (the first 8)
# Auto-refresh, so a running job's dashboard moves: Grafana's interval strings. Grafana's
# min_refresh_interval (default 5s) bounds them from below.
JOB_REFRESH = "10s"
LIST_REFRESH = "1m"


# --- SQL, one function per panel ----------------------------------------------------------
# {db} is the database name (an identifier chosen by the administrator, checked by install).

def _metadata_values(db: str, where: str) -> str:
    """The metadata values of the runs matching ``where``, classified as by the X-axis rule."""
    source = f"(SELECT run, seq, ts, fields, label FROM {db}.metadata FINAL WHERE {where})"
    return values_sql(source, carry=("ts",))


# ``ranklabel.number_of`` of a metadata row's ``label`` (``local rank 3``: '3'), in SQL.
# (No '$' in it: Grafana reads one as a variable.) Labels name series only when one repeats
# in the run (xaxis.own_labels): ``_labels_name_series``.
_LAST_WORD = "splitByChar(' ', label)[-1]"
LABEL_NUMBER = (f"if(length({_LAST_WORD}) BETWEEN 1 AND 18 AND NOT match({_LAST_WORD}, "
                f"'[^0-9]'), toString(toUInt64OrZero({_LAST_WORD})), '')")


def _labels_name_series(db: str) -> str:
    return (f"(SELECT count() > uniqExact(label) FROM {db}.metadata FINAL "
            f"WHERE run = {RUN} AND label != '')")


def _job_metadata(db: str) -> str:
    """The metadata rows the job's panels show: of the ranks ``$rank`` picks among the job's
    task runs (``_task_runs``), or of ``$run`` itself when it has none (of its rows behind a
    launcher's label, those whose label's number ``$rank`` picks; its unlabelled rows all);
    ``run`` is ``$run`` (one X axis for the job), ``task`` the run a row is of and ``rank``
    its rank ('' for the job's own), so the X-axis rule reads one series per task run
    (xaxis: per rank)."""
    tasks = _task_runs(db)
    return f"""(
    SELECT {RUN} AS run, m.task AS task, t.trank AS rank, m.seq AS seq, m.ts AS ts,
           m.fields AS fields, m.label AS label
    FROM (SELECT run AS task, seq, ts, fields, label FROM {db}.metadata FINAL
          WHERE run IN (SELECT run FROM ({tasks}) WHERE has([${{rank:singlequote}}], rank))
             OR (run = {RUN} AND (SELECT count() FROM ({tasks})) = 0
                 AND (label = '' OR NOT {_labels_name_series(db)} OR {LABEL_NUMBER} = ''
                      OR has([${{rank:singlequote}}], {LABEL_NUMBER})))) AS m
    LEFT JOIN (SELECT run AS trun, rank AS trank FROM ({tasks})) AS t ON t.trun = m.task
)"""


def _job_values(db: str) -> str:
    return values_sql(_job_metadata(db), carry=("ts", "task", "rank"), series="task")


def _series(key: str, row: str = "") -> str:
    """A graph's series name: the key, and whose the row is (``row``: the values' table alias
    with its dot, or ''): its launcher's label where labels name series (``rank 1``, ``local
    rank 1``: values_sql's ``label``), after its task's rank when it has one, else its own
    ``rank`` where that names a series within its run (xaxis, ``own``), else its task's rank
    ('' for the job's own rows). As ``web.reads.whose``."""
    whose = (f"multiIf({row}label != '', if({row}rank != '', concat('rank ', {row}rank, ', ', "
             f"{row}label), {row}label), {row}own != '', concat('rank ', {row}own), "
             f"{row}rank != '', concat('rank ', {row}rank), '')")
    return f"if({whose} = '', {key}, concat({key}, ' (', {whose}, ')'))"


def _level_names_sql() -> str:
    return "[" + ", ".join(f"'{n}'" for n in LEVEL_NAMES) + "]"


def _summary_row() -> str:
    """A run's name, exit, duration and state as every reader shows them (``summary_row``),
    as ``run_name``, ``run_exit``, ``run_duration``, ``run_state`` over the runs table."""
    return (f"{name_sql()} AS run_name, {exit_sql()} AS run_exit, "
            f"{duration_sql()} AS run_duration, {state_sql()} AS run_state")


def sql_header(db: str) -> str:
    return f"""
SELECT r.owner AS user, r.run_name AS job, r.run_state AS state, r.run_exit AS exit_status,
       r.run_duration AS duration,
       if(s.nodes = '', r.host, s.nodes) AS nodes,
       greatest(s.gpu_count, r.job_gpus) AS gpus
FROM (
    SELECT run, owner, ifNull(host, '') AS host, {_summary_row()},
           length(JSONExtractArrayRaw(ifNull(inventory, ''), 'job_gpus')) AS job_gpus
    FROM {db}.runs FINAL
    WHERE run = {RUN}
) AS r
LEFT JOIN (
    SELECT run,
           arrayStringConcat(arraySort(groupUniqArray(node)), ', ') AS nodes,
           uniqExactIf(JSONExtractString(g, 'uuid'), JSONExtractString(g, 'uuid') != '')
               AS gpu_count
    FROM {db}.samples FINAL
    LEFT ARRAY JOIN JSONExtractArrayRaw(gpus) AS g
    WHERE run = {RUN}
    GROUP BY run
) AS s ON s.run = r.run
"""


def _level_and_source(e: str = "") -> str:
    """A log entry's level and source columns for Grafana's logs panel (``e``: the entries'
    table alias with its dot, or '')."""
    return f"""multiIf({e}kind = 'note' AND startsWith({e}text, '[logcapture: warning'), 'warning',
               {e}kind IN ('note', 'command', 'section', 'section_end', 'section_expand'),
               'debug', {e}stream = 'stderr', 'error', 'info') AS level,
       if({e}kind IN ('note', 'section', 'section_end', 'section_expand'), 'logcapture',
          {e}stream) AS source"""


def sql_logs(db: str) -> str:
    # The job's log as the page and `logcapture logs` show it (logview.log_sql: each metadata
    # line and each mode change once), newest 10000; stderr only when the switch is on.
    return f"""
SELECT ts AS timestamp, text AS body,
       {_level_and_source()}
FROM ({log_sql(db, f"run = {RUN}", "${stderr}")})
ORDER BY timestamp DESC, stream DESC, seq DESC
"""


def _task_runs(db: str) -> str:
    """The task runs of the job run ``$run`` (``slurm.task``: run id ``<run>.<step>.<rank>``,
    a ``rank`` in the Start record's Slurm identity), with their rank and node."""
    return f"""
    SELECT run, JSONExtractString(ifNull(slurm, ''), 'rank') AS rank,
           JSONExtractString(ifNull(slurm, ''), 'node') AS node
    FROM {db}.runs FINAL
    WHERE startsWith(run, concat({RUN}, '.')) AND rank != ''
      AND length(splitByChar('.', substring(run, length({RUN}) + 2))) = 2"""


def sql_rank_variable(db: str) -> str:
    # the ranks of the job's task runs; of a run without any, the numbers of its metadata
    # rows' labels where they name series (``_job_metadata``)
    tasks = _task_runs(db)
    return f"""
SELECT DISTINCT rank FROM (
    SELECT rank FROM ({tasks})
    UNION ALL
    SELECT {LABEL_NUMBER} AS rank FROM {db}.metadata FINAL
    WHERE run = {RUN} AND label != '' AND (SELECT count() FROM ({tasks})) = 0
      AND {_labels_name_series(db)})
WHERE rank != ''
ORDER BY toUInt64OrZero(rank), rank"""


def sql_logs_by_rank(db: str) -> str:
    # The lines of the job's tasks of the chosen ranks on the chosen nodes, each run's as
    # logview shows a log, labelled "RANK: " as srun --label does (rankview.label).
    tasks = (f"SELECT run FROM ({_task_runs(db)}) WHERE has([${{rank:singlequote}}], rank) "
             "AND has([${node:singlequote}], node)")
    return f"""
SELECT e.ts AS timestamp, concat(t.rank, ': ', e.text) AS body,
       {_level_and_source("e.")}, t.rank AS rank, t.node AS node
FROM ({log_sql(db, f"run IN ({tasks})", "${stderr}", runs=True)}) AS e
INNER JOIN ({_task_runs(db)}) AS t ON t.run = e.run
ORDER BY timestamp DESC, toUInt64OrZero(rank) DESC, e.stream DESC, e.seq DESC
"""


def sql_metadata_table(db: str) -> str:
    return f"""
SELECT ts AS time, rank, label, seq, fields
FROM {_job_metadata(db)}
ORDER BY ts DESC, seq DESC, rank
LIMIT 5000
"""


def sql_metadata_by_time(db: str) -> str:
    return f"""
SELECT ts AS time, {_series("key")} AS key, num AS value
FROM ({_job_values(db)})
WHERE kind != 'other' AND $__timeFilter(ts)
ORDER BY time, seq, key
"""


def sql_x_axis(db: str) -> str:
    return f"""
SELECT x_key AS x_axis, {_level_names_sql()}[x_level + 1] AS chosen_because
FROM ({x_axis_sql(_job_values(db))})
"""


def sql_x_key_variable(db: str) -> str:
    return f"SELECT x_key FROM ({x_axis_sql(_job_values(db))})"


def sql_metadata_by_x(db: str) -> str:
    return f"""
WITH v AS ({_job_values(db)}),
     chosen AS ({x_axis_sql("SELECT * FROM v")})
SELECT x.num AS x, {_series("y.key", "y.")} AS key, y.num AS value
FROM v AS y
INNER JOIN v AS x ON x.task = y.task AND x.seq = y.seq
WHERE x.key = (SELECT any(x_key) FROM chosen)
  AND x.kind != 'other' AND y.kind != 'other' AND y.key != x.key
ORDER BY x, key
"""


# Per-GPU figures of the samples' ``gpus`` array (records.Sample) and the job's own figures.
GPU_METRICS = {
    "utilization_gpu_percent": ("GPU utilisation", "percent"),
    "memory_used_bytes": ("GPU memory used", "bytes"),
    "job_memory_used_bytes": ("GPU memory used by the job", "bytes"),
    "power_watts": ("GPU power", "watt"),
    "temperature_celsius": ("GPU temperature", "celsius"),
}
JOB_METRICS = {
    "cpu_percent": ("CPU (100% = one core)", "percent"),
    "memory_rss_bytes": ("Memory (RSS)", "bytes"),
    "io_read_bytes": ("Read (cumulative)", "bytes"),
    "io_write_bytes": ("Written (cumulative)", "bytes"),
}


def sql_gpu(db: str, metric: str) -> str:
    if metric not in GPU_METRICS:
        raise ValueError(metric)
    return f"""
SELECT ts AS time,
       concat('GPU ', toString(JSONExtractInt(g, 'index')), ' ', JSONExtractString(g, 'name'))
           AS gpu,
       JSONExtractFloat(g, '{metric}') AS value
FROM {db}.samples FINAL
ARRAY JOIN JSONExtractArrayRaw(gpus) AS g
WHERE run = {RUN} AND node = ${{node:sqlstring}} AND $__timeFilter(ts)
  AND JSONType(g, '{metric}') IN ('Int64', 'UInt64', 'Double')
ORDER BY time, gpu
"""


def sql_job_metric(db: str, metric: str) -> str:
    if metric not in JOB_METRICS:
        raise ValueError(metric)
    return f"""
SELECT ts AS time, '{metric}' AS metric, job_metrics['{metric}'] AS value
FROM {db}.samples FINAL
WHERE run = {RUN} AND node = ${{node:sqlstring}} AND $__timeFilter(ts)
  AND mapContains(job_metrics, '{metric}')
ORDER BY time
"""


def sql_run_variable(db: str) -> str:
    # Newest first; the row policy already limits the list to the viewer's own runs.
    return f"""
SELECT run FROM {db}.runs FINAL
WHERE ifNull(start_ts, last_ts) <= $__toTime AND last_ts >= $__fromTime
ORDER BY ifNull(start_ts, last_ts) DESC
LIMIT 1000
"""


def sql_node_variable(db: str) -> str:
    # The nodes the job's samples came from, and those its tasks ran on.
    return (f"SELECT DISTINCT node FROM (SELECT node FROM {db}.samples FINAL WHERE run = {RUN}"
            f" UNION ALL SELECT node FROM ({_task_runs(db)})) WHERE node != '' ORDER BY node")


def _jobs_in_range(db: str) -> str:
    return f"""
    SELECT run, owner, ifNull(host, '') AS host, job_id,
           ifNull(start_ts, last_ts) AS start, end_ts, {_summary_row()}
    FROM {db}.runs FINAL
    WHERE ifNull(start_ts, last_ts) <= $__toTime AND last_ts >= $__fromTime
      AND owner IN (${{user:singlequote}})"""


def sql_jobs_table(db: str) -> str:
    return f"""
SELECT j.run AS run, j.job_id AS job_id,
       j.run_name AS job, j.owner AS user, j.run_state AS state, j.run_exit AS exit_status,
       j.start AS start, j.run_duration AS duration,
       if(s.nodes = '', j.host, s.nodes) AS nodes,
       s.gpu_count AS gpus,
       s.gpu_utilization AS gpu_utilization,
       toUnixTimestamp64Milli(j.start) AS start_ms,
       toUnixTimestamp64Milli(ifNull(j.end_ts, now64(9))) AS end_ms
FROM ({_jobs_in_range(db)}
) AS j
LEFT JOIN (
    SELECT run,
           arrayStringConcat(arraySort(groupUniqArray(node)), ', ') AS nodes,
           uniqExactIf(JSONExtractString(g, 'uuid'), JSONExtractString(g, 'uuid') != '')
               AS gpu_count,
           avgIf(JSONExtractFloat(g, 'utilization_gpu_percent'),
                 JSONType(g, 'utilization_gpu_percent') IN ('Int64', 'UInt64', 'Double'))
               AS gpu_utilization
    FROM {db}.samples FINAL
    LEFT ARRAY JOIN JSONExtractArrayRaw(gpus) AS g
    WHERE run IN (SELECT run FROM ({_jobs_in_range(db)}))
    GROUP BY run
) AS s ON s.run = j.run
ORDER BY j.start DESC
LIMIT 1000
"""


def sql_job_insights(db: str) -> str:
    """The run's insights (docs/insights.md): failures first, then efficiency, then live."""
    return f"""
SELECT kind, category, message, hint, ts
FROM {db}.insights FINAL
WHERE run = {RUN}
ORDER BY category = 'live', category = 'efficiency', ts, kind
"""


def sql_insights_by_kind(db: str) -> str:
    """Per kind: jobs, users, and the GPU hours held idle (``gpu-idle``) in the time range."""
    return f"""
SELECT kind, any(category) AS category, count() AS jobs, uniqExact(owner) AS users,
       round(sum(numbers['gpu_hours_idle']), 2) AS gpu_hours_idle
FROM {db}.insights FINAL
WHERE $__timeFilter(ts) AND owner IN (${{user:singlequote}})
GROUP BY kind
ORDER BY jobs DESC, kind
"""


def sql_jobs_by_state(db: str) -> str:
    return f"""
SELECT run_state AS state, count() AS jobs
FROM ({_jobs_in_range(db)})
GROUP BY state
ORDER BY state
"""


def sql_jobs_gpu_utilization(db: str) -> str:
    return f"""
SELECT $__timeInterval(ts) AS time, run, avg(JSONExtractFloat(g, 'utilization_gpu_percent'))
           AS value
FROM {db}.samples FINAL
ARRAY JOIN JSONExtractArrayRaw(gpus) AS g
WHERE $__timeFilter(ts) AND owner IN (${{user:singlequote}})
  AND JSONType(g, 'utilization_gpu_percent') IN ('Int64', 'UInt64', 'Double')
GROUP BY time, run
ORDER BY time, run
"""


def sql_user_variable(db: str) -> str:
    return f"SELECT DISTINCT owner FROM {db}.runs FINAL ORDER BY owner"


def sql_runs_variable(db: str) -> str:
    return sql_run_variable(db)


def sql_key_variable(db: str) -> str:
    values = _metadata_values(db, "run IN (${runs:singlequote})")
    return f"SELECT DISTINCT key FROM ({values}) WHERE kind != 'other' ORDER BY key"


def sql_compare_by_x(db: str) -> str:
    values = _metadata_values(db, "run IN (${runs:singlequote})")
    return f"""
WITH v AS ({values}),
     chosen AS ({x_axis_sql("SELECT * FROM v")})
SELECT x.num AS x, y.run AS run, y.num AS value
FROM v AS y
INNER JOIN v AS x ON x.run = y.run AND x.seq = y.seq
INNER JOIN chosen AS c ON c.run = x.run AND c.x_key = x.key
WHERE y.key = ${{key:sqlstring}} AND x.kind != 'other' AND y.kind != 'other'
ORDER BY run, x
"""


def sql_compare_x_axes(db: str) -> str:
    values = _metadata_values(db, "run IN (${runs:singlequote})")
    return f"""
SELECT run, x_key AS x_axis, {_level_names_sql()}[x_level + 1] AS chosen_because
FROM ({x_axis_sql(values)})
ORDER BY run
"""


def sql_compare_by_elapsed(db: str) -> str:
    values = _metadata_values(db, "run IN (${runs:singlequote})")
    return f"""
SELECT dateDiff('millisecond', r.start, v.ts) / 1000 AS elapsed_seconds, v.run AS run,
       v.num AS value
FROM ({values}) AS v
INNER JOIN (SELECT run, min(ifNull(start_ts, last_ts)) AS start FROM {db}.runs FINAL
            WHERE run IN (${{runs:singlequote}}) GROUP BY run) AS r ON r.run = v.run
WHERE v.key = ${{key:sqlstring}} AND v.kind != 'other'
ORDER BY run, elapsed_seconds
"""


# --- panels -------------------------------------------------------------------------------

def sql_search_condition() -> str:
    """Every token of the search box (up to ``SEARCH_TOKENS``) is a token of the line: each
    ``hasToken`` takes a constant the engine folds from the box's text, so the token index
    skips the blocks without it; a box with fewer tokens repeats its first, and a box with
    none matches nothing (``hasToken`` of '')."""
    toks = f"tokens({PATTERN})"
    return "\n      AND ".join(
        f"hasToken(text, if(length({toks}) >= {k}, {toks}[{k}], {toks}[1]))"
        for k in range(1, SEARCH_TOKENS + 1))


def _search_window(db: str, newer: str, older: str) -> str:
    """The newest 1000 matching lines of the dashboard's users in one stretch of time."""
    return f"""
    SELECT run, owner, stream, seq, ts, text
    FROM {db}.lines
    WHERE $__timeFilter(ts) AND owner IN (${{user:singlequote}})
      AND run IN (SELECT run FROM {db}.runs WHERE owner IN (${{user:singlequote}}))
      AND {newer} AND {older}
      AND {sql_search_condition()}
    ORDER BY ts DESC
    LIMIT 1000"""


def sql_search_lines(db: str) -> str:
    # Newest first cannot stop early in a table sorted by run: the newest day is asked first,
    # then the week before it, then the rest, each only while fewer than 1000 lines were found
    # (a scalar subquery the engine evaluates first: a window it rules out is never read), as
    # ``logcapture search`` does (Store.search). The runs subquery lets the primary key skip
    # other users' runs. No FINAL (it made a common word's search 10x slower): the copies a
    # repeated upload leaves until merges are dropped by LIMIT 1 BY.
    day = "$__toTime - INTERVAL 1 DAY"
    week = "$__toTime - INTERVAL 8 DAY"
    return f"""
WITH w1 AS ({_search_window(db, f"ts > {day}", "1")}),
w2 AS ({_search_window(db, f"ts > {week}", f"ts <= {day}")})
SELECT l.ts AS time, l.run AS run, r.job AS job, r.state AS state, l.owner AS user,
       l.stream AS stream, l.seq AS seq, l.text AS text,
       toUnixTimestamp64Milli(r.start) AS start_ms, toUnixTimestamp64Milli(r.end) AS end_ms
FROM (
    SELECT * FROM w1
    UNION ALL
    SELECT * FROM w2 WHERE (SELECT count() FROM w1) < 1000
    UNION ALL
    SELECT * FROM ({_search_window(db, "1", f"ts <= {week}")})
    WHERE (SELECT count() FROM w1) + (SELECT count() FROM w2) < 1000
) AS l
LEFT JOIN (
    SELECT run, owner, {name_sql()} AS job, {state_sql()} AS state,
           ifNull(start_ts, last_ts) AS start,
           ifNull(end_ts, now64(9)) AS end
    FROM {db}.runs FINAL
    WHERE owner IN (${{user:singlequote}})
) AS r ON r.run = l.run AND r.owner = l.owner
ORDER BY time DESC, stream, seq
LIMIT 1 BY l.run, l.owner, l.stream, l.seq
LIMIT 1000
"""


def _q(sql: str, fmt: int = FORMAT_TABLE, ref: str = "A") -> ClickHouseQuery:
    return ClickHouseQuery(sql).format(fmt).ref_id(ref)


def _long_to_wide(series_field: str, x_field: str) -> list[dm.DataTransformerConfig]:
    """Rows (x, series, value) -> one frame: x plus one field per series (xychart wants one
    frame with an X field and Y fields)."""
    return [
        dm.DataTransformerConfig(id_val="partitionByValues", options={
            "fields": [series_field], "keepFields": False,
            "naming": {"asLabels": True}}),
        dm.DataTransformerConfig(id_val="joinByField", options={
            "byField": x_field, "mode": "outer"}),
    ]


def _xy(title: str, sql: str, x_field: str, series_field: str, x_label: str,
        description: str) -> gxy.Panel:
    return (gxy.Panel().title(title).description(description).datasource(datasource_ref())
            .with_target(_q(sql))
            .transformations(_long_to_wide(series_field, x_field))
            .series_mapping(xym.SeriesMapping.AUTO)
            .dims(gxy.XYDimensionConfig().x(x_field))
            .display_name(f"${{__field.labels.{series_field}}}")
            .axis_label(x_label)
            .height(10).span(12))


def _series_per_node_row(db: str) -> gdash.Row:
    row = gdash.Row("Node $node").repeat("node")
    for metric, (title, unit) in GPU_METRICS.items():
        row = row.with_panel(
            gts.Panel().title(title).datasource(datasource_ref()).unit(unit)
            .with_target(_q(sql_gpu(db, metric), FORMAT_TIME_SERIES))
            .height(8).span(8))
    for metric, (title, unit) in JOB_METRICS.items():
        row = row.with_panel(
            gts.Panel().title(title).datasource(datasource_ref()).unit(unit)
            .with_target(_q(sql_job_metric(db, metric), FORMAT_TIME_SERIES))
            .height(8).span(6))
    return row


def _query_variable(name: str, label: str, sql: str, *, multi: bool = False,
                    include_all: bool = False, hide: bool = False) -> gdash.QueryVariable:
    v = (gdash.QueryVariable(name).label(label).datasource(datasource_ref())
         .query(sql.strip()).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
         .multi(multi).include_all(include_all))
    if hide:
        v = v.hide(dm.VariableHide.HIDE_VARIABLE)
    return v


def job_details(db: str = DEFAULT_DATABASE) -> gdash.Dashboard:
    stderr = (gdash.CustomVariable("stderr").label("stderr")
              .values("hide : 0, show : 1")
              .current(dm.VariableOption(text="hide", value="0", selected=True)))
    header = (gstat.Panel().title("Job").datasource(datasource_ref())
              .with_target(_q(sql_header(db)))
              .reduce_options(_reduce_all_fields())
              .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
              .graph_mode(cm.BigValueGraphMode.NONE).color_mode(cm.BigValueColorMode.NONE)
              .override_by_name("duration", [dm.DynamicConfigValue(id_val="unit", value="s")])
              .height(4).span(24))
    logs = (glogs.Panel().title("Output").datasource(datasource_ref())
            .description("stdout (stderr with the stderr switch); [logcapture] lines say "
                         "what was dropped (repeated lines, blank runs) and why")
            .with_target(_q(sql_logs(db), FORMAT_LOGS))
            .show_time(True).wrap_log_message(True).enable_log_details(True)
            .sort_order(cm.LogsSortOrder.ASCENDING).dedup_strategy(cm.LogsDedupStrategy.NONE)
            .height(14).span(24))
    by_rank = (glogs.Panel().title("Output by rank").datasource(datasource_ref())
               .description("The lines of the job's tasks (each task of its srun steps) of "
                            "the ranks and nodes chosen above, each labelled RANK: as srun "
                            "--label does; empty for a job without captured tasks")
               .with_target(_q(sql_logs_by_rank(db), FORMAT_LOGS))
               .show_time(True).wrap_log_message(True).enable_log_details(True)
               .sort_order(cm.LogsSortOrder.ASCENDING)
               .dedup_strategy(cm.LogsDedupStrategy.NONE).height(14).span(24))
    table = (gtable.Panel().title("Metadata (newest first)").datasource(datasource_ref())
             .with_target(_q(sql_metadata_table(db)))
             .with_transformation(dm.DataTransformerConfig(id_val="extractFields", options={
                 "source": "fields", "format": "json", "replace": False, "keepTime": True}))
             .with_transformation(dm.DataTransformerConfig(id_val="organize", options={
                 "excludeByName": {"fields": True, "seq": True}}))
             .height(10).span(24))
    by_time = (gts.Panel().title("Metadata by time").datasource(datasource_ref())
               .with_target(_q(sql_metadata_by_time(db), FORMAT_TIME_SERIES))
               .height(10).span(12))
    by_x = _xy("Metadata by $x_axis", sql_metadata_by_x(db), "x", "key", "$x_axis",
               "Numeric metadata against the X axis the cluster guide's rule picks for this "
               "job: progress, epoch, increasing integers, increasing numbers, integers, "
               "numbers, any numbers; ties to the alphabetically first key.")
    x_axis = (gtable.Panel().title("X axis").datasource(datasource_ref())
              .with_target(_q(sql_x_axis(db))).height(3).span(24))
    insights = (gtable.Panel().title("Insights").datasource(datasource_ref())
                .description("Why the job failed, what it held and did not use, and what "
                             "was found while it ran (logcapture show says the same)")
                .with_target(_q(sql_job_insights(db))).height(5).span(24))
    return (
        gdash.Dashboard("logcapture: job details").uid(JOB_UID).tags(TAGS)
        .time("now-7d", "now").refresh(JOB_REFRESH).readonly()
        .with_variable(_query_variable("run", "run", sql_run_variable(db)))
        .with_variable(stderr)
        .with_variable(_query_variable("x_axis", "X axis", sql_x_key_variable(db), hide=True))
        .with_variable(_query_variable("node", "node", sql_node_variable(db), multi=True,
                                       include_all=True))
        # rank 0 by default: a job of many ranks opens on one rank's output and metadata
        .with_variable(_query_variable("rank", "rank", sql_rank_variable(db), multi=True,
                                       include_all=True)
                       .current(dm.VariableOption(text="0", value="0", selected=True)))
        .with_panel(header)
        .with_panel(insights)
        .with_panel(logs)
        .with_panel(by_rank)
        .with_panel(table)
        .with_panel(x_axis)
        .with_panel(by_time)
        .with_panel(by_x)
        .with_row(_series_per_node_row(db))
    )


def _reduce_all_fields() -> Any:
    from grafana_foundation_sdk.builders import common as gcommon

    return gcommon.ReduceDataOptions().values(True).fields("/.*/").calcs(["lastNotNull"])


def _job_details_link() -> list[dm.DynamicConfigValue]:
    """A run cell's link to its job details over the run's span (the query's start_ms and
    end_ms columns)."""
    return [dm.DynamicConfigValue(id_val="links", value=[{
        "title": "Job details",
        "url": f"/d/{JOB_UID}?var-run=${{__value.raw}}"
               "&from=${__data.fields.start_ms}&to=${__data.fields.end_ms}",
    }])]


def _hide_link_times() -> dm.DataTransformerConfig:
    return dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"start_ms": True, "end_ms": True}})


def jobs_overview(db: str = DEFAULT_DATABASE) -> gdash.Dashboard:
    jobs = (gtable.Panel().title("Jobs").datasource(datasource_ref())
            .with_target(_q(sql_jobs_table(db)))
            .override_by_name("duration", [dm.DynamicConfigValue(id_val="unit", value="s")])
            .override_by_name("gpu_utilization", [
                dm.DynamicConfigValue(id_val="unit", value="percent")])
            .override_by_name("run", _job_details_link())
            .with_transformation(_hide_link_times())
            .height(14).span(24))
    states = (gstat.Panel().title("Jobs by state").datasource(datasource_ref())
              .with_target(_q(sql_jobs_by_state(db)))
              .reduce_options(_reduce_all_fields())
              .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
              .height(5).span(8))
    gpu = (gts.Panel().title("GPU utilisation per job").datasource(datasource_ref())
           .unit("percent").with_target(_q(sql_jobs_gpu_utilization(db), FORMAT_TIME_SERIES))
           .height(5).span(16))
    insights = (gtable.Panel().title("Insights by kind").datasource(datasource_ref())
                .description("Jobs per insight kind in the time range; gpu-idle: the GPU "
                             "hours held without being used")
                .with_target(_q(sql_insights_by_kind(db))).height(6).span(24))
    return (
        gdash.Dashboard("logcapture: jobs").uid(JOBS_UID).tags(TAGS)
        .time("now-7d", "now").refresh(LIST_REFRESH).readonly()
        .with_variable(_query_variable("user", "user", sql_user_variable(db), multi=True,
                                       include_all=True))
        .with_panel(states)
        .with_panel(gpu)
        .with_panel(insights)
        .with_panel(jobs)
    )


def compare_jobs(db: str = DEFAULT_DATABASE) -> gdash.Dashboard:
    by_x = _xy("$key by each job's X axis", sql_compare_by_x(db), "x", "run", "X axis",
               "Each job against its own X axis (see the table: the rule can pick different "
               "keys for different jobs).")
    by_elapsed = _xy("$key by time since start", sql_compare_by_elapsed(db),
                     "elapsed_seconds", "run", "seconds since the job started",
                     "The same key of every selected job, by time since each job started.")
    axes = (gtable.Panel().title("X axis per job").datasource(datasource_ref())
            .with_target(_q(sql_compare_x_axes(db))).height(5).span(24))
    return (
        gdash.Dashboard("logcapture: compare jobs").uid(COMPARE_UID).tags(TAGS)
        .time("now-30d", "now").refresh(LIST_REFRESH).readonly()
        .with_variable(_query_variable("runs", "runs", sql_runs_variable(db), multi=True))
        .with_variable(_query_variable("key", "metadata key", sql_key_variable(db)))
        .with_panel(by_x)
        .with_panel(by_elapsed)
        .with_panel(axes)
    )


def search(db: str = DEFAULT_DATABASE) -> gdash.Dashboard:
    pattern = (gdash.TextBoxVariable("pattern").label("search")
               .description("Words (tokens: runs of letters and digits) that must all be in a "
                            "line, e.g. NCCL timeout"))
    lines = (gtable.Panel().title("Matching lines (newest 1000)").datasource(datasource_ref())
             .description("Lines holding every token of the search box (the first "
                          f"{SEARCH_TOKENS}), newest first; a run links to its job details. "
                          "Phrases, regular expressions and context: `logcapture search`.")
             .with_target(_q(sql_search_lines(db)))
             .override_by_name("run", _job_details_link())
             .with_transformation(_hide_link_times())
             .height(20).span(24))
    return (
        gdash.Dashboard("logcapture: search").uid(SEARCH_UID).tags(TAGS)
        .time("now-30d", "now").refresh(False).readonly()
        .with_variable(pattern)
        .with_variable(_query_variable("user", "user", sql_user_variable(db), multi=True,
                                       include_all=True))
        .with_panel(lines)
    )


def to_json(builder: gdash.Dashboard) -> dict[str, Any]:
    """The dashboard model as Grafana's JSON (what a provisioned file holds). An expanded
    row's panels follow the row at the top level, as in dashboards Grafana saves (only a
    collapsed row keeps its panels inside it)."""
    model = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    flat: list[dict[str, Any]] = []
    for panel in model.get("panels", []):
        flat.append(panel)
        if panel.get("type") == "row" and not panel.get("collapsed"):
            flat.extend(panel.pop("panels", []))
            panel["panels"] = []
    model["panels"] = flat
    return model


def all_dashboards(db: str = DEFAULT_DATABASE) -> dict[str, dict[str, Any]]:
    """File name (without .json) -> dashboard JSON, for every dashboard."""
    return {
        "job-details": to_json(job_details(db)),
        "jobs": to_json(jobs_overview(db)),
        "compare-jobs": to_json(compare_jobs(db)),
        "search": to_json(search(db)),
    }
