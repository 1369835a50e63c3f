"""The spool: an append-only write-ahead log of NDJSON segments on local disk.

The spool is the source of truth; the store is fed from it. Layout::

    <root>/<run id>/seg-000000.ndjson.gz   closed segments (gzip), never written again
    <root>/<run id>/seg-000001.ndjson      the open segment, append-only

The package is split by concern, each module using only those before it:

- ``layout``: the default root (``default_root``, the one rule), run directories, segment
  names and order, the gzip form of a closed segment, the writer's lock.
- ``reading``: the one reader of segment files (``open_segment``, ``segment_data``,
  ``read_segment``, ``iter_run``, ``read_segment_bytes``).
- ``writer``: ``SpoolWriter``, with its flow control and its handling of a full disk.
- ``abandoned``: ``close_abandoned``, the end of a run whose writer is gone.

Nothing is imported here: each caller imports the module it needs.

Writing (``writer.SpoolWriter``): buffered, flushed by a thread, flow control rather than loss,
and what a full disk costs: the ``writer`` module says how.

Reading (``reading.read_segment``, ``reading.iter_run``): a torn last line (no newline after a
crash) is skipped and counted; a line that is not a valid record is skipped, counted and
reported by line number.
"""
