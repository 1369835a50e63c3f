"""What several commands share: the --spool, --store, --source and retention options, the
spool root a command reads, and the Reader a reading command asks (``open_reader``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..config.defaults import SPOOL_RETENTION_DAYS
from ..spool.layout import default_root


def spool_option(f: Any) -> Any:
    return click.option(
        "--spool", "spool", type=click.Path(path_type=Path), default=None,
        help="Spool directory (default: $LOGCAPTURE_SPOOL or "
             "$XDG_STATE_HOME/logcapture/spool).")(f)


def spool_root(spool: Path | None) -> Path:
    return spool if spool is not None else default_root()


def store_option(f: Any) -> Any:
    return click.option(
        "--store", "store_dsn", default=None, metavar="DSN",
        help="The store: chdb:///PATH (embedded) or http(s)://USER:PASS@HOST:8123/DB "
             "(default: $LOGCAPTURE_STORE, the config file's `store`, else "
             "chdb://$XDG_STATE_HOME/logcapture/store).")(f)


def source_option(f: Any) -> Any:
    return click.option(
        "--source", type=click.Choice(["auto", "spool", "store"]), default="auto",
        show_default=True,
        help="Where to read: auto = the store once the run is shipped (or gone from the "
             "spool), else the spool.")(f)


def node_option(f: Any) -> Any:
    """--node NAME, repeatable: only the tasks of a job's srun steps that ran on that node."""
    return click.option("--node", "nodes", multiple=True, metavar="NAME",
                        help="Only the tasks that ran on this node; repeatable.")(f)


def retention_options(f: Any) -> Any:
    """--retention-days and --keep (the shipper's ``retention_days``: None with --keep)."""
    f = click.option("--keep", is_flag=True, help="Never delete shipped spool segments.")(f)
    return click.option(
        "--retention-days", type=float, default=SPOOL_RETENTION_DAYS, show_default=True,
        help="Delete a closed spool segment this many days after the store accepted "
             "it (0: at once).")(f)


def open_reader(spool: Path | None, store_dsn: str | None, source: str = "auto") -> Any:
    """The Reader a reading command asks (``query.Reader``): the caller's own spool, and the
    read service where this machine has one (``reader.client.expected_socket``; not with
    ``--store``), else the caller's own store."""
    from ..query import LocalReader

    def warn(message: str) -> None:
        click.echo(f"logcapture: {message}", err=True)

    remote = None
    if store_dsn is None and source != "spool":
        from ..reader.client import expected_socket

        path = expected_socket()
        if path is not None:
            remote = _service(path, own_spool=spool is not None, warn=warn)
    return LocalReader(spool_root(spool), store_dsn, source=source, warn=warn, remote=remote)


def _service(path: Path, own_spool: bool, warn: Callable[[str], None]) -> Any:
    """The read service on ``path``, once it answered. Where it does not, the command cannot
    do its work (the service alone reads this machine's store and the job spools): the error
    says so (``reader.client.unreachable``) and nothing else is read in its place, unless the
    caller named a spool of their own (``--spool``): then that and their own store, with a
    warning."""
    from ..errors import ServiceUnavailable
    from ..reader.client import ServiceReader

    remote = ServiceReader(path)
    try:
        remote.whoami()
    except ServiceUnavailable as e:
        if not own_spool:
            raise ServiceUnavailable(f"{e.message}. To read a spool or store of your own "
                                     "instead: --spool DIR, --store DSN") from None
        warn(f"{e.message}; reading your own spool and store")
        return None
    return remote

