"""The store: ClickHouse tables, schema migrations, inserts and queries (clickhouse-connect).

One client library, one schema, one code path for both targets: the embedded engine (chDB,
``chdb:///PATH``, the default) and a ClickHouse server (``http(s)://USER:PASS@HOST:8123/DB``).
``open_store`` opens one as a ``Store``; the package is split by concern:

- ``connection``: the DSN (``resolve_dsn``), connecting (``connect``; ``open_store``, here where
  ``Store`` is composed, wraps it in one), the embedded store's lock and turns (one process per
  store folder), the connection's lifecycle, and the mapping of engine errors to the store's
  error classes (``classify``).
- ``schema``: tables, views, row policies and the versioned migrations (``MIGRATIONS``).
- ``ingest``: spool records into the tables as the rows of a trusted ``Identity``.
- ``queries``: every read (runs, a run's records and log, metadata, samples, insights, search).
- ``export``: a run's rows as CSV, NDJSON or Parquet, written by the engine.

``Store`` is the one class callers use; each concern adds its methods as a base class of it.

No SQL is built by pasting values or identifiers: values are clickhouse-connect server-side
parameters (``{name:Type}``) and table names come from the fixed allow-list ``TABLES``
(passed as ``{table:Identifier}``). Conditions are fixed text of the code, composed with
f-strings (``queries``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import NoEngine, StoreAuthError, StoreDataError, StoreError, StoreUnavailable
from .connection import (
    DEFAULT_DATABASE,
    NO_ENGINE,
    check_engine,
    classify,
    connect,
    default_store_path,
    engine_turns,
    engine_worn,
    flock_within,
    redact,
    resolve_dsn,
    store_wanted,
)
from .export import EXPORT_FORMATS, EXPORTS, _Export, check_export, export_rows, write_rows
from .ingest import (
    ASYNC_INSERT_SETTINGS,
    INGEST_SETTINGS,
    Identity,
    InsertResult,
    SegmentProbe,
    _Ingest,
    iter_ndjson_chunks,
    split_by_kind,
)
from .queries import SEARCH_WINDOWS, _Queries
from .schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLES,
    _Schema,
    check_sql_syntax,
    json_keys,
    row_policy_statements,
)


class Store(_Schema, _Ingest, _Export, _Queries):
    """A clickhouse-connect client on the logcapture schema. Use ``open_store``."""


def open_store(dsn: str | None = None, *, wait: float = 0.0, create: bool = True,
               must_exist: bool = False,
               connect_timeout: float = 5.0, send_receive_timeout: float = 60.0,
               env: Mapping[str, str] = os.environ) -> Store:
    """Open the store named by ``dsn`` (``resolve_dsn`` when None). A context manager: leaving
    it closes the client and releases the chDB lock. ``wait``: seconds to wait for an embedded
    store held by another process. ``create``: for the embedded store, create or migrate the
    schema when it is missing or old (a server needs ``logcapture db init``). ``must_exist``:
    raise NotFound instead of creating an embedded store that is not there (readers).
    ``connect_timeout`` and ``send_receive_timeout``: a server's, in seconds (clickhouse-connect's
    settings of the same names: the TCP connection, then each answer)."""
    store = Store(*connect(dsn, wait=wait, must_exist=must_exist,
                           connect_timeout=connect_timeout,
                           send_receive_timeout=send_receive_timeout, env=env))
    if create and store.embedded:
        try:
            if store.schema_version() < SCHEMA_VERSION:
                store.init_schema()
        except BaseException:
            store.close()
            raise
    return store


__all__ = [
    "ASYNC_INSERT_SETTINGS",
    "DEFAULT_DATABASE",
    "EXPORTS",
    "EXPORT_FORMATS",
    "INGEST_SETTINGS",
    "MIGRATIONS",
    "NO_ENGINE",
    "SCHEMA_VERSION",
    "SEARCH_WINDOWS",
    "TABLES",
    "Identity",
    "InsertResult",
    "NoEngine",
    "SegmentProbe",
    "Store",
    "StoreAuthError",
    "StoreDataError",
    "StoreError",
    "StoreUnavailable",
    "check_engine",
    "check_export",
    "check_sql_syntax",
    "classify",
    "default_store_path",
    "engine_turns",
    "engine_worn",
    "export_rows",
    "flock_within",
    "iter_ndjson_chunks",
    "json_keys",
    "open_store",
    "redact",
    "resolve_dsn",
    "row_policy_statements",
    "split_by_kind",
    "store_wanted",
    "write_rows",
]
