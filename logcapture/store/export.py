"""Exporting a run's lines, metadata, samples or progress points as CSV, NDJSON or Parquet,
written by the engine (the store's, else an in-memory embedded one)."""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from ..errors import LogcaptureError, NoEngine, UsageError
from ..logview import NUMBERED
from ..records import OUTPUT_STREAMS, dumps
from .connection import _Connection, _StoreLock, classify
from .queries import _Queries

EXPORTS = ("lines", "metadata", "samples", "progress")
EXPORT_FORMATS = ("csv", "ndjson", "parquet")


def check_export(what: str, fmt: str) -> None:
    if what not in EXPORTS:
        raise UsageError(f"--what must be lines, metadata, samples or progress, not {what!r}")
    if fmt not in EXPORT_FORMATS:
        raise UsageError(f"--format must be csv, ndjson or parquet, not {fmt!r}")


# The columns a job's rows carry when its task runs are exported together (records that carry
# ``rank``: jobview.job_records): which task of which step on which node.
TASK_COLUMNS = ("node", "step", "rank")


def export_rows(what: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows ``export`` writes from one run's record dicts of that kind: its output records
    (``lines``), metadata records (one column per key) or sample records (``job.KEY`` and
    ``gpuN.KEY`` columns) or progress records (one row a point: ``ts``, ``stream``, ``bar``,
    ``label``, ``n``, ``total``, ``unit``, ``rate``, ``elapsed``, ``done``). Records of a
    job's tasks (with ``rank``) add ``TASK_COLUMNS``; metadata records behind a launcher's
    label, the column ``label``."""
    tasks = any("rank" in d for d in records)

    def task(d: dict[str, Any]) -> dict[str, Any]:
        return {k: d.get(k) for k in TASK_COLUMNS} if tasks else {}
    if what == "progress":
        return [{"ts": d["ts"], "stream": str(d["stream"]).removeprefix("progress:"),
                 "bar": d["bar"], "label": d["label"], "n": d["n"], "total": d["total"],
                 "unit": d["unit"], "rate": d["rate"], "elapsed": d["elapsed"],
                 "done": bool(d["done"])}
                for d in sorted(records, key=lambda d: (d["ts"], d["stream"], d["seq"]))]
    if what == "lines":
        # ``line``: the line number (logview.py), counted over each run's records in the
        # log's order, both streams; null for a note or metadata.
        count: dict[str, int] = {}
        rows = []
        for d in records:
            n = None
            if d["kind"] in NUMBERED and d["stream"] in OUTPUT_STREAMS:
                n = count[d["run"]] = count.get(d["run"], 0) + 1
            rows.append({"line": n, "ts": d["ts"], **task(d), "stream": d["stream"],
                         "seq": d["seq"], "kind": d["kind"], "text": _line_text(d)})
        return rows
    if what == "metadata":
        recs = sorted(records, key=lambda d: (d["ts"], d["seq"]))
        # ``label``: whose object a row was behind a launcher's label (records.Metadata),
        # a column when any row has one
        labelled = ("label",) if any(d.get("label") for d in recs) else ()
        column = _metadata_columns({k for d in recs for k in d["fields"]},
                                   (*(TASK_COLUMNS if tasks else ()), *labelled))
        return [{"ts": d["ts"], **task(d), **{k: d.get(k) or "" for k in labelled},
                 "seq": d["seq"], **{column.get(k, k): v for k, v in d["fields"].items()}}
                for d in recs]
    rows = []
    for d in records:
        row: dict[str, Any] = {"ts": d["ts"], "node": d["node"]}
        row.update({f"job.{k}": v for k, v in d["job"].items()})
        for i, gpu in enumerate(d["gpus"]):
            if isinstance(gpu, dict):
                row.update({f"gpu{gpu.get('index', i)}.{k}": v for k, v in gpu.items()})
        rows.append(row)
    return rows


def _line_text(d: dict[str, Any]) -> str:
    if d["kind"] == "metadata":
        return dumps(d["fields"])
    return str(d.get("text", ""))


# The engine's output format for each export format.
ENGINE_FORMATS = {"csv": "CSVWithNames", "ndjson": "JSONEachRow", "parquet": "Parquet"}
# 64-bit integers as JSON numbers, "/" unescaped, NULL as an empty CSV field, Parquet text as
# strings (not binary) on servers of any age.
_EXPORT_SETTINGS = {
    "output_format_json_quote_64bit_integers": 0,
    "output_format_json_escape_forward_slashes": 0,
    "format_csv_null_representation": "",
    "output_format_parquet_string_as_string": 1,
}
_INT64 = range(-(1 << 63), 1 << 63)


def _export_column(values: list[Any]) -> tuple[str, bool]:
    """The engine type of an export column from its Python values (None: absent), and whether
    its values go in as text: whole numbers Int64, numbers Float64, booleans Bool, strings
    String; anything else (objects, lists, mixed) its JSON text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds == {int} and all(v in _INT64 for v in values if v is not None):
        return "Int64", False
    if kinds and kinds <= {int, float}:
        return "Float64", False
    if kinds == {bool}:
        return "Bool", False
    return "String", bool(kinds - {str})


def _as_text(v: Any) -> str | None:
    """A value of a text column: objects and lists as their JSON text (``dumps`` takes a list
    as well), anything else as ``str``."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        return dumps(v)  # type: ignore[arg-type]
    return dumps(v) if isinstance(v, dict) else str(v)


def write_rows(rows: list[dict[str, Any]], fmt: str, out: BinaryIO,
               store: _Connection | None = None) -> None:
    """Write export rows (``export_rows``) to ``out`` as ``csv``, ``ndjson`` or ``parquet``:
    the engine writes the file (``ENGINE_FORMATS``), one column per key in the order first
    seen, typed by ``_export_column``, NULL (an empty CSV field) where a row lacks it. The
    engine is ``store``'s (an embedded store reads the rows from a private temporary file, a
    server gets them as external data), else an in-memory embedded one. Values of a text
    column that are not strings are turned into their JSON text in ``rows`` itself."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    if not columns:
        columns = {"ts": None}
    types: dict[str, str] = {}
    for c in columns:
        values = [row.get(c) for row in rows]
        types[c], text = _export_column(values)
        if text:
            for row in rows:
                if c in row:
                    row[c] = _as_text(row[c])
    structure = ", ".join(f"`{_escape_ident(c)}` Nullable({t})" for c, t in types.items())
    body = "".join(dumps(row) + "\n" for row in rows).encode("utf-8", "surrogatepass")
    try:
        if store is None:
            with _memory_engine() as client:
                _write_through(client, True, body, structure, fmt, out)
        else:
            _write_through(store.client, store.embedded, body, structure, fmt, out)
    except LogcaptureError:
        raise
    except Exception as e:  # noqa: BLE001
        raise classify(e, "exporting") from None


def _metadata_columns(keys: set[str], own: tuple[str, ...] = ()) -> dict[str, str]:
    """The column of each metadata key that cannot be its own name: the empty key (no
    column can be named so) and the export's own ``ts`` and ``seq`` (a line's own ``"ts"``
    must not overwrite when it was printed), and ``own`` (a job's ``rank``: the task's, not
    the one a program printed; a row's ``label``): ``metadata.KEY``, made longer while another
    key has that name."""
    renamed = {}
    for key in keys & {"", "ts", "seq", *own}:
        name = f"metadata.{key}"
        while name in keys:
            name = f"metadata.{name}"
        renamed[key] = name
    return renamed


def _escape_ident(name: str) -> str:
    return name.replace("\\", "\\\\").replace("`", "\\`")


def _write_through(client: Any, embedded: bool, body: bytes, structure: str, fmt: str,
                   out: BinaryIO) -> None:
    if not embedded:
        from clickhouse_connect.driver.external import ExternalData

        data = ExternalData(file_name="export_rows", data=body, fmt="JSONEachRow",
                            structure=structure)
        chunks = client.raw_stream("SELECT * FROM export_rows", fmt=ENGINE_FORMATS[fmt],
                                   settings=_EXPORT_SETTINGS, external_data=data)
        for chunk in chunks:
            out.write(chunk)
        return
    with tempfile.NamedTemporaryFile(prefix="logcapture-export-", suffix=".ndjson") as f:
        f.write(body)
        f.flush()
        chunks = client.raw_stream(
            "SELECT * FROM file({path:String}, 'JSONEachRow', {structure:String})",
            parameters={"path": f.name, "structure": structure}, fmt=ENGINE_FORMATS[fmt],
            settings=_EXPORT_SETTINGS)
        for chunk in chunks:
            out.write(chunk)


@contextmanager
def _memory_engine() -> Iterator[Any]:
    """An embedded engine for writing an export when no store is given: a new handle on the
    embedded store this process has open (chDB runs one engine per process, on one path),
    else an in-memory one (``chdb://memory``)."""
    if importlib.util.find_spec("chdb") is None:
        raise NoEngine("writing an export needs the ClickHouse engine: a store (LOGCAPTURE_STORE"
                       "=http(s)://USER:PASS@HOST:8123/DB or --store), or the embedded one: "
                       "pip install 'logcapture[embedded]'")
    import clickhouse_connect

    held = _StoreLock.held()  # ``<store>.lock``
    client = clickhouse_connect.get_client(
        dsn=f"chdb://{str(held).removesuffix('.lock')}" if held else "chdb://memory")
    try:
        yield client
    finally:
        client.close()


class _Export(_Queries):
    """``Store.export``: a run's rows read by the queries, written by the store's engine."""

    def export(self, run: str, what: str, fmt: str, out: BinaryIO,
               owner: str | None = None) -> int:
        """Write the run's ``lines``, ``metadata`` or ``samples`` as ``csv``, ``ndjson`` or
        ``parquet`` to ``out``; returns the number of rows. Metadata and sample fields become
        columns (dotted keys)."""
        check_export(what, fmt)
        self.run_info(run, owner)  # NotFound when absent
        if what == "lines":
            recs = self.lines(run, owner=owner)
        elif what == "progress":
            recs = self.progress(run, owner)
        else:
            recs = self.metadata(run, owner) if what == "metadata" else self.samples(run, owner)
        rows = export_rows(what, recs)
        write_rows(rows, fmt, out, self)
        return len(rows)
