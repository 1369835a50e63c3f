"""The read layer: the questions every reader asks. Which runs are mine, which run a job
reference names, its lines (all of them, the last N, or followed while it runs), its summary,
its metadata, its resource samples, the rows an export writes, and the lines of all of one's
runs that match a search.

One interface, ``interface.Reader``, answered three ways:

- ``store_reader.StoreReader``: the store alone, as one owner (or every owner, for an
  administrator). The read service (``logcapture.reader``) answers its clients with one per
  request.
- ``local_reader.LocalReader``: the caller's own spool and store, as on a laptop or on the
  node that runs the job: a run is read from the store once shipped, else from the spool.
- ``logcapture.reader.client.ServiceReader``: the same questions asked of the read service
  over its Unix socket, on a login node that sees neither the spools nor the store's
  credentials.

Everything a Reader returns is plain JSON data, so the read service sends it as it is:

- a run summary (``runs()``): a dict with the keys of ``interface.SUMMARY_KEYS``, whatever the
  source (``summaries``);
- records (``lines``, ``follow``, ``metadata``, ``samples``): record dicts as the spool writes
  them (``records.Record.to_dict``; ``records.from_dict`` makes them records again);
- ``describe(run)``: the mapping ``logcapture show`` prints (``show.describe``, the one place
  that builds it, from ``RunFacts`` that the spool or the store supply);
- ``log(run, ...)``: a page of a run's log by cursor (``spool_pages.SpoolRun`` finds one in a
  spool run without reading it whole);
- ``export_rows(run, what)``: the rows ``logcapture export`` writes (``store.write_rows``);
- ``search(request)``: ``search.answer``'s mapping (matching lines with their context,
  grouped by run), from the store (``Store.search``) and, for runs not yet shipped, the spool
  (``spool_search``: the same pattern).

The modules, each using only those before it: ``interface``, ``spool_insights``, ``show``,
``summaries``, ``spool_pages``, ``spool_search``, ``held_store``, ``store_reader``,
``local_reader``.

Every run a Reader names is the caller's own: ``owner`` (a user name; None means every owner)
filters every question (``ownership.trusted_identity`` decides whose a spool run is), and a
run of someone else is "not found", never "forbidden", so a reader learns nothing of other
people's job ids.
"""

from __future__ import annotations

from .held_store import HeldStore
from .interface import FOLLOW_POLL, LOG_PAGE, LOG_PAGE_MAX, SUMMARY_KEYS, Reader
from .local_reader import LocalReader, current_user
from .show import RunFacts, describe
from .store_reader import StoreReader, StoreSession

__all__ = ["FOLLOW_POLL", "LOG_PAGE", "LOG_PAGE_MAX", "SUMMARY_KEYS", "HeldStore", "LocalReader",
           "Reader", "RunFacts", "StoreReader", "StoreSession", "current_user", "describe"]
