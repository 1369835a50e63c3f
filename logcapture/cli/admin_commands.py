"""The administrator's and the shipper's commands: ``upload``, ``agent``, ``db init``, the read
service (``reader serve``, ``reader whoami``) and ``grafana install``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..errors import LogcaptureError, Warner
from ..spool.layout import default_root
from .options import retention_options, spool_option, spool_root, store_option


@click.command()
@spool_option
@store_option
@click.argument("run_arg", metavar="[RUN]", required=False)
@click.option("--run", "run_opt", default=None, metavar="ID",
              help="Ship this run (default: the latest run).")
@click.option("--all", "all_runs", is_flag=True,
              help="Ship every run not yet shipped, oldest first (shipped runs are skipped).")
@click.option("--force", is_flag=True,
              help="Ship again runs that were already shipped (the store drops duplicates).")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Total seconds to keep retrying an unreachable store.")
@retention_options
def upload(spool: Path | None, store_dsn: str | None, run_arg: str | None,
           run_opt: str | None, all_runs: bool, force: bool, timeout: float,
           retention_days: float, keep: bool) -> None:
    """Ship runs from the spool to the store: the latest run, RUN (or --run ID), or --all.

    Exit status 0 when everything selected is in the store, 1 when part of it is (corrupt
    lines skipped, segments the store refused set aside), 2 on failure (store unreachable
    past --timeout, credentials refused, no such run, run already shipped without --force).
    Safe to run while `logcapture agent` runs: they share a cursor per run.
    """
    from ..errors import UsageError
    from ..ship import describe_dsn
    from ..ship import upload as do_upload
    from ..store import check_engine

    if run_arg and run_opt and run_arg != run_opt:
        raise UsageError("give the run once: RUN or --run ID")
    run = run_opt or run_arg
    if run and all_runs:
        raise UsageError("--run and --all are mutually exclusive")
    check_engine(store_dsn)
    warn = Warner(limit=20)
    res = do_upload(spool_root(spool), run=run, all=all_runs, force=force, dsn=store_dsn,
                    deadline=timeout, retention_days=None if keep else retention_days,
                    identify=_trusted_identity, warn=warn, job_info=_trusted_job_info)
    for run_id, seg, no, why in res.bad_lines[:20]:
        click.echo(f"logcapture: warning: run {run_id}: {seg} line {no}: corrupt line "
                   f"skipped: {why}", err=True)
    for run_id, seg, why in res.set_aside:
        click.echo(f"logcapture: warning: run {run_id}: segment {seg} set aside: {why}",
                   err=True)
    for w in res.warnings[:20]:
        click.echo(f"logcapture: warning: {w}", err=True)
    # A failure that shipped nothing says only what failed.
    if not res.exit_code or res.runs or res.records:
        click.echo(f"logcapture: {res.summary()} to {describe_dsn(store_dsn)}", err=True)
    if res.exit_code:
        err = LogcaptureError(res.error or ("partly shipped; see the warnings above"
                                            if res.exit_code == 1 else "upload failed"))
        err.exit_code = res.exit_code
        raise err


@click.command()
@spool_option
@store_option
@click.option("--batch-bytes", type=int, default=64 * 1024 * 1024, show_default=True,
              help="Ship when this many new spool bytes are waiting.")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="Ship at least this often (seconds) when anything is waiting.")
@click.option("--live-every", type=float, default=30.0, show_default=True,
              help="Look for stalled runs this often (seconds); the admin config's "
                   "stall_seconds says how long without output is a stall.")
@retention_options
def agent(spool: Path | None, store_dsn: str | None, batch_bytes: int, interval: float,
          live_every: float, retention_days: float, keep: bool) -> None:
    """Tail the spool and ship new lines to the store in batches, until TERM or INT (then
    ship what is waiting and exit 0). Holds an embedded store only while shipping a batch.
    Run as root on each node for every user's spool (the admin config's spool_root, default
    /var/spool/logcapture), the node samplers' samples (<spool root>/.samples) included.
    While jobs run it finds stalls and metrics that turned NaN, stores every finished run's
    insights, and sends the messages users asked for in their .logoptin (docs/insights.md)."""
    from ..config.admin import load_admin
    from ..insights.notify import Notifier
    from ..recycle import start_afresh
    from ..ship import Agent, describe_dsn
    from ..slurm.jobrecords import NOTIFIED_DIR, samples_job_ended
    from ..store import check_engine, engine_turns

    check_engine(store_dsn)  # a store to ship to, before waiting for anything to ship
    admin = load_admin(warn=Warner())
    # Root's agent ships the node's spool root, where the prolog and the job wrapper write.
    root = spool if spool is not None else default_root(process="agent",
                                                        configured=admin.spool_root)
    notifier = Notifier(root / NOTIFIED_DIR, mail_prog=admin.mail_prog,
                        webhook=admin.notify_webhook)
    a = Agent(root, store_dsn, batch_bytes=batch_bytes, batch_interval=interval,
              retention_days=None if keep else retention_days,
              identify=_trusted_identity, job_ended=samples_job_ended,
              job_info=_trusted_job_info, notifier=notifier,
              stall_seconds=admin.stall_seconds, live_every=live_every,
              warn=Warner(limit=1000), end_when_worn=True,
              log=lambda m: click.echo(f"logcapture: {m}", err=True))
    a.install_signal_handlers()
    click.echo(f"logcapture: agent shipping {root} to {describe_dsn(store_dsn)}", err=True)
    stats = a.run()
    if a.worn:
        start_afresh(f"logcapture: agent starting afresh after {engine_turns()} turns on the "
                     "embedded store (chDB leaves threads behind each turn; nothing pending "
                     "is lost: the new start ships it)", lambda: a.stopping)
        a.install_signal_handlers()  # stopped meanwhile: the last flush, as on any stop
        stats = a.run()
    click.echo(f"logcapture: agent stopped: {stats.records} records shipped in "
               f"{stats.flushes} flushes, {stats.failures} failed", err=True)


def _trusted_job_info(run_dir: Path) -> dict[str, Any]:
    """What Slurm said of a run's job (state, request), from the root-owned job record of a
    Slurm run (``<root>/<job id>/<run>``); {} for any other run."""
    job_id = run_dir.parent.name
    if not job_id.isdigit():
        return {}
    try:
        from ..slurm.jobrecords import read_job_record
        from ..slurm.jobs import job_insight_info

        return job_insight_info(read_job_record(str(run_dir.parent.parent), job_id))
    except Exception:  # noqa: BLE001 - no record: the diagnosis goes without Slurm's word
        return {}


def _trusted_identity(run_dir: Path) -> Any:
    from ..ownership import trusted_identity

    return trusted_identity(run_dir)


@click.group(name="db")
def db_group() -> None:
    """The store's schema."""


@db_group.command(name="init")
@store_option
@click.option("--ttl-days", type=int, default=None,
              help="Rows expire after this many days (0: never; default: the admin config's "
                   "store_ttl_days when set, else leave the TTL as it is).")
@click.option("--row-policies", is_flag=True,
              help="Create row policies: each ClickHouse user sees only rows they own; the "
                   "role logcapture_admin sees all (a server only).")
def db_init(store_dsn: str | None, ttl_days: int | None, row_policies: bool) -> None:
    """Create or migrate the store's schema (versioned; running it again changes nothing)."""
    from ..config.admin import load_admin
    from ..store import open_store, redact, resolve_dsn

    if ttl_days is None:
        ttl_days = load_admin(warn=Warner()).store_ttl_days
    with open_store(store_dsn, wait=30.0, create=False) as st:
        version = st.init_schema(ttl_days=ttl_days, row_policies=row_policies)
    click.echo(f"logcapture: schema version {version} in {redact(resolve_dsn(store_dsn))}"
               + (f", TTL {ttl_days} days" if ttl_days else "")
               + (", row policies created" if row_policies else ""), err=True)


@click.group(name="reader")
def reader_group() -> None:
    """The read service: lets users on a login node read their own runs from the store
    without its credentials. See docs/admin.md."""


@reader_group.command(name="serve")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), default=None,
              help="The Unix socket to answer on (default: the admin config's reader_socket, "
                   "else /run/logcapture/reader.sock).")
@store_option
@click.option("--admin-group", default=None, metavar="GROUP",
              help="Members of this group read every user's runs (default: the admin "
                   "config's admin_group; root always does).")
def reader_serve(socket_path: Path | None, store_dsn: str | None,
                 admin_group: str | None) -> None:
    """Answer users' reading commands on a Unix socket, as the user the kernel says
    connected, until TERM or INT. Run by the administrator, with the store's credentials."""
    import logging
    import signal

    from ..config.admin import load_admin
    from ..reader.client import DEFAULT_SOCKET
    from ..reader.server import ReadService
    from ..reader.sessions import store_sessions
    from ..recycle import start_afresh
    from ..store import engine_turns, redact, resolve_dsn

    admin = load_admin(warn=Warner())
    path = socket_path or Path(admin.reader_socket or DEFAULT_SOCKET)
    group = admin_group or admin.admin_group
    logging.basicConfig(level=logging.INFO, format="logcapture reader: %(message)s")
    sessions = store_sessions(store_dsn)
    settings = {name: value for name in ("max_clients", "max_clients_per_user",
                                       "max_follows_per_user", "request_timeout")
              if (value := getattr(admin, "reader_" + name)) is not None}
    service = ReadService(path, sessions, admin_group=group, end_when_worn=True, **settings)
    service.bind()

    def stop(signum: int, frame: object) -> None:
        service._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    limits = service.limits
    click.echo(f"logcapture: read service on {path} for {redact(resolve_dsn(store_dsn))}"
               + (f", admin group {group}" if group else "")
               + f"; at most {limits.max_total} clients, {limits.per_user} per user, "
                 f"{limits.follows_per_user} following per user; requests within "
                 f"{service.request_timeout:g}s", err=True)
    try:
        service.serve_forever()
        if service.worn and service.listener_fd is not None:
            start_afresh(f"logcapture: read service starting afresh after {engine_turns()} "
                         "turns on the embedded store (chDB leaves threads behind each turn), "
                         "on the same socket: no client is refused", service._stop.is_set,
                         listener=service.listener_fd)
    finally:
        service.stop()
        service.close_listener()
        sessions.close()
    click.echo(f"logcapture: read service stopped after {service.served} request(s)", err=True)


@reader_group.command(name="whoami")
def reader_whoami() -> None:
    """Ask the read service who you are to it (user, uid, whether you read every user's
    runs): a check that it runs and that you reach it."""
    from ..errors import ServiceUnavailable
    from ..reader.client import ServiceReader, expected_socket

    path = expected_socket()
    if path is None:
        raise ServiceUnavailable("no read service socket here (set LOGCAPTURE_READER_SOCKET "
                                 "or the admin config's reader_socket)")
    me = ServiceReader(path).whoami()
    click.echo(f"{me['user']} (uid {me['uid']}){': reads every user' if me['admin'] else ''}"
               f" via {path}")


@click.group(name="grafana")
def grafana_group() -> None:
    """Grafana: provisioning for the ClickHouse data source and logcapture's dashboards
    (job details, jobs, compare jobs), generated as code. See docs/grafana.md."""


@grafana_group.command(name="install")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--store-url", default=None,
              help="The ClickHouse server as Grafana reaches it: http(s)://[USER@]HOST[:PORT]"
                   "[/DB] or clickhouse(s)://... for the native protocol. No password here.")
@click.option("--host", default=None, help="ClickHouse host (default: localhost).")
@click.option("--port", type=int, default=None,
              help="ClickHouse port (default: 9000 native, 8123 HTTP; 9440/8443 secure).")
@click.option("--protocol", type=click.Choice(["native", "http"]), default=None,
              help="Protocol of the plugin's connection (default: native, or the URL's).")
@click.option("--secure/--insecure", default=None, help="TLS to ClickHouse.")
@click.option("--user", default=None, help="ClickHouse user of the data source "
              "(default: grafana).")
@click.option("--database", default=None, help="Database of the tables (default: logcapture).")
@click.option("--password-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Grafana reads the password from this file ($__file{PATH}); the secret is "
                   "not copied.")
@click.option("--password-env", metavar="VAR", default=None,
              help="Grafana reads the password from this environment variable ($__env{VAR}; "
                   "default LOGCAPTURE_CLICKHOUSE_PASSWORD).")
@click.option("--password", "clear_password", default=None,
              help="Write this password in clear into the data source file (mode 0600).")
@click.option("--no-password", is_flag=True, help="No password (per-user identities, see "
              "docs/grafana.md).")
@click.option("--forward-user", is_flag=True,
              help="Forward Grafana's user headers (X-Grafana-User) to ClickHouse over HTTP, "
                   "for per-user row policies behind a mapping proxy.")
@click.option("--dashboards-path", type=click.Path(path_type=Path), default=None,
              help="Where Grafana will find the dashboard JSON, if not where it is written.")
def grafana_install(directory: Path, store_url: str | None, host: str | None,
                    port: int | None, protocol: str | None, secure: bool | None,
                    user: str | None, database: str | None, password_file: Path | None,
                    password_env: str | None, clear_password: str | None, no_password: bool,
                    forward_user: bool, dashboards_path: Path | None) -> None:
    """Write Grafana provisioning under DIRECTORY: datasources/logcapture.yaml (the
    grafana-clickhouse-datasource plugin), dashboards/logcapture.yaml (a file provider) and
    the dashboards. Prints the files written."""
    try:
        from ..grafana import install, make_connection, password_reference
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "grafana_foundation_sdk":
            raise
        from ..errors import UsageError

        raise UsageError("building the dashboards needs Grafana's SDK, which is not installed: "
                         "pip install 'logcapture[grafana]'") from None

    password = password_reference(env=password_env, file=password_file, clear=clear_password,
                                  none=no_password)
    conn = make_connection(store_url, host=host, port=port, user=user, database=database,
                           protocol=protocol, secure=secure, password=password,
                           forward_user=forward_user)
    for path in install(directory, conn, dashboards_path):
        click.echo(str(path))

