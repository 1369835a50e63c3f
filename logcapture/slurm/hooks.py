"""The prolog and epilog: run as root on every node of a job, before it starts and after it
ends (``logcapture slurm prolog|epilog``, called by the thin scripts in ``prolog/`` and
``epilog/``).

``prolog``
    Creates ``<spool root>/<job id>/`` owned by the job's user, mode 0700, and the job record
    ``<spool root>/.jobs/<job id>.json`` (root, 0600): user, uid, job and array ids, partition,
    nodes, start. That record, not anything in the user's directory, is the trusted identity
    of the job's rows. Also refreshes ``<spool root>/.config.json``, the admin config without
    its secrets, so jobs (which cannot read the root-only config) get the same spool settings.
    When the job's user has ``~/.logoptin`` (checked as root, ``optin_for_uid``), starts this
    node's resource sampler (``nodesampler``): every node of the job is sampled.

``epilog``
    Stops this node's sampler. Reads the job's exit status from the wrapper's own End record
    (Slurm's epilog sees 0 for a cancelled job), asks Slurm for the job's state, writes both
    into the job record, ships the job's runs when a store is configured (else leaves them to
    the agent), and removes what is no longer needed: a job that captured nothing leaves
    nothing behind.

Imports stay inside functions: a hook is a short process and most of its paths need little.
"""

from __future__ import annotations

import os
import sys

from .jobrecords import (
    NOTIFIED_DIR,
    PUBLIC_CONFIG,
    SAMPLES_DIR,
    _open_root,
    _read_root_file,
    _remove_job,
    _run_dirs,
    _spool_root,
    _task_run_dirs,
    _update_record,
    _write_job_record,
    _write_root_file,
    read_job_record,
)
from .jobs import JobInfo, _request, job_insight_info, run_id_for, slurm_job, slurm_state
from .nodesampler import (
    SAMPLER_STOP_WAIT,
    _remove_samples,
    _sample_runs,
    start_node_sampler,
    stop_node_sampler,
)
from .rootsafe import _is_user_dir, _list_dir, _open_user_dir, read_end

TYPE_CHECKING = False  # not typing's: importing typing costs every job ~8 ms of CPU
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

OPTIN_CHECK_TIMEOUT = 2.0  # seconds the prolog waits for ~/.logoptin (a hung NFS home)
SHIP_DEADLINE = 15.0  # seconds the epilog tries the store before leaving runs to the agent
MAX_NOTES = 10  # the shipper's warnings an epilog logs a run (a planted run may make thousands)


def optin_for_uid(uid: int, timeout: float = OPTIN_CHECK_TIMEOUT,
                  home: str | None = None) -> bool:
    """The prolog's opt-in rule (docs/admin.md): the job's user has ``~/.logoptin`` (passwd
    home) in any form, checked as root by ``config.optin.load_optin`` (lstat, no symlink followed,
    a bounded read, owned by that user or refused, which still counts as opted in, like the
    wrapper). Waits at most ``timeout`` seconds (a hung home file system or user database
    counts as not opted in); a home root cannot search (NFS root_squash) too."""
    import threading

    result: list[bool] = []

    def check() -> None:
        import pwd

        from ..config.optin import load_optin

        try:
            where = home if home is not None else pwd.getpwuid(uid).pw_dir
        except KeyError:
            return
        result.append(load_optin(os.path.join(where, ".logoptin"), uid=uid).opted_in)

    t = threading.Thread(target=check, name="logcapture-optin", daemon=True)
    t.start()
    t.join(timeout)
    return bool(result and result[0])


def prolog(env: dict[str, str] | os._Environ[str], *, now: float | None = None,
           optin: Callable[[int], bool] | None = None) -> list[str]:
    """Prepare this node for the job: its spool directory (owned by the user, 0700) and its
    trusted record. Returns messages for the log (paths and numbers only)."""
    import stat
    import time

    from ..config.admin import load_admin, public_config

    job = JobInfo(env)
    admin = load_admin(env=env)
    root = _spool_root(admin)
    messages: list[str] = []
    root_fd = _open_root(root, create=True)
    try:
        public = public_config(admin)
        if _read_root_file(root_fd, PUBLIC_CONFIG, mode=0o644) != public:
            _write_root_file(root_fd, PUBLIC_CONFIG, public, 0o644)
        # The job's directory. The root is root's, so what is there was made by a prolog: an
        # earlier run of this job id (requeue) keeps its content; anything but a directory
        # is replaced.
        name = job.job_id
        try:
            os.mkdir(name, 0o700, dir_fd=root_fd)
        except FileExistsError:
            st = os.lstat(name, dir_fd=root_fd)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=root_fd)
                os.mkdir(name, 0o700, dir_fd=root_fd)
            else:
                messages.append(f"job directory {root}/{name} already existed (requeue?): kept")
        dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                      dir_fd=root_fd)
        try:
            os.fchown(dfd, job.uid, job.gid)
            os.fchmod(dfd, 0o700)
        finally:
            os.close(dfd)
        record = job.record()
        record["start"] = time.time() if now is None else now
        record["restart_count"] = job.restart_count
        _write_job_record(root_fd, job.job_id, record)
        # The resource sampler of this node (every node of the job: the wrapper's opt-in
        # decision is taken on the batch node only, later), for users with ~/.logoptin now.
        if (optin or optin_for_uid)(job.uid):
            try:
                messages.append(start_node_sampler(root_fd, job, env, record))
            except Exception as e:  # noqa: BLE001 - the job's capture does not depend on it
                why = e.strerror if isinstance(e, OSError) else type(e).__name__
                messages.append(f"node sampler not started ({why}): the wrapper samples "
                                "the batch node itself")
    finally:
        os.close(root_fd)
    return messages


def _record_final_state_later(root: str, job_id: str, timeout: float = 120.0,
                              record: dict[str, object] | None = None) -> None:
    """Slurm reports a job as COMPLETING until its epilogs have ended, so its final state
    (COMPLETED, FAILED, CANCELLED, TIMEOUT...) can only be read after the epilog: a detached
    process (its own session, no inherited descriptors, so neither slurmd nor the epilog
    script waits for it) polls for it and writes it into the job record."""
    import time

    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 1 << 16)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)
            state = slurm_state(job_id)
            if state and state != "COMPLETING":
                _update_record(root, job_id, {"slurm_state": state})
                # the record as the epilog wrote it: a job it shipped has none any more
                _rediagnose({**(record or {}), "slurm_state": state}, job_id)
                break
    except BaseException:  # noqa: BLE001 - a detached helper never reports anywhere
        pass
    os._exit(0)


def _rediagnose(record: dict[str, object], job_id: str) -> None:
    """Once Slurm's final state is known (after the epilog), diagnose the job's run in the
    store again with it (TIMEOUT, CANCELLED... where the epilog saw only COMPLETING), and send
    the message its user asked for (insights.notify: once per job and event). ``record``: the
    job's trusted record as the epilog completed it, with the final ``slurm_state`` (the
    epilog removes the record of a job it shipped)."""
    from pathlib import Path

    from ..config.admin import load_admin
    from ..insights.notify import Notifier
    from ..ship import UploadResult, diagnose_run
    from ..store import Identity, open_store

    admin = load_admin()
    root = _spool_root(admin)
    run_id = record.get("run_id") if record else None
    if not admin.store or not record or not isinstance(run_id, str):
        return
    uid, user = record.get("uid"), record.get("user")
    if not isinstance(uid, int) or not isinstance(user, str):
        return
    identity = Identity(run=run_id, user=user, uid=uid,
                        cluster=str(record.get("cluster", "")), job_id=job_id)
    notifier = Notifier(Path(root) / NOTIFIED_DIR, mail_prog=admin.mail_prog,
                        webhook=admin.notify_webhook)
    with open_store(admin.store, wait=60.0, must_exist=True) as store:
        if store.has_run(identity.run, user):
            diagnose_run(store, identity, job_insight_info(record), UploadResult(), notifier)


def _ship(root: str, job_id: str, runs: list[str], admin: object, record: dict[str, object],
          deadline: float = SHIP_DEADLINE, samples: list[str] | None = None,
          notes: list[str] | None = None, tasks: list[str] | None = None
          ) -> tuple[bool, str]:
    """Ship the job's runs now when a store is configured, with the trusted identity of the
    job record, and say how it went. False leaves them to the agent: no store configured,
    the store unreachable or busy past ``deadline`` (an embedded chDB store is held by the
    agent while it runs), or anything not accepted. ``notes`` gets the shipper's warnings
    (segments set aside, files refused: paths and reasons only), ``MAX_NOTES`` a run."""
    store = getattr(admin, "store", None)
    if not store:
        return False, "no store configured"
    try:
        from pathlib import Path

        from ..ownership import trusted_identity
        from ..ship import upload
        from ..store import Identity
    except Exception as e:  # noqa: BLE001 - shipping is optional here
        return False, f"shipping unavailable ({type(e).__name__})"
    uid, user = record.get("uid"), record.get("user")
    if not isinstance(uid, int) or not isinstance(user, str):
        return False, "job record without user"

    def identify(run_dir: Path) -> Identity:
        return trusted_identity(run_dir, record)

    ok = True
    why = ""
    # The wrapper's runs, then the node sampler's (root's spool; same run ids, so the samples
    # join the job's run in the store under the same trusted identity).
    # The samples first: when the wrapper's run is complete in the store, the shipper
    # diagnoses it, and its efficiency notes need every sample.
    # The job's tasks last, and without messages: the job's run says how the job ended.
    todo = [(Path(root) / SAMPLES_DIR / job_id, run, True) for run in samples or []]
    todo += [(Path(root) / job_id, run, True) for run in runs]
    todo += [(Path(root) / job_id, run, False) for run in tasks or []]
    info = job_insight_info(record)
    from ..insights.notify import Notifier

    # While Slurm says only COMPLETING, the "failed" message waits for the final state
    # (_rediagnose): a cancelled job's End says SIGTERM, its state says who and why.
    notifier = Notifier(Path(root) / NOTIFIED_DIR, mail_prog=getattr(admin, "mail_prog", None),
                        webhook=getattr(admin, "notify_webhook", None)) \
        if info.get("slurm_state") else None
    for spool_dir, run, tell in todo:
        try:
            # shipped_ok: the agent may have shipped the run already (it tails the spool
            # root); then the job's spool is done all the same and is removed below
            result = upload(spool_dir, run=run, dsn=store, deadline=deadline,
                            retention_days=0, identify=identify, shipped_ok=True,
                            job_info=lambda _run_dir: info,
                            notifier=notifier if tell else None)
        except Exception as e:  # noqa: BLE001
            ok, why = False, f"upload failed ({type(e).__name__})"
            continue
        if result.exit_code != 0:
            ok, why = False, f"upload exit {result.exit_code}"
        if notes is not None:
            said = [f"run {r}: segment {seg} set aside: {w}" for r, seg, w in result.set_aside]
            notes += (said + result.warnings)[:MAX_NOTES]
    return ok, why


def epilog(env: dict[str, str] | os._Environ[str], *, now: float | None = None,
           state_of: object = None, sampler_wait: float = SAMPLER_STOP_WAIT) -> list[str]:
    """Record the job's end, ship or leave to the agent, clean up. Returns log messages."""
    import time

    from ..config.admin import load_admin

    job = JobInfo(env)
    admin = load_admin(env=env)
    root = _spool_root(admin)
    messages: list[str] = []
    try:
        root_fd = _open_root(root, create=False)
    except FileNotFoundError:
        return [f"spool root {root} does not exist: nothing to do"]
    try:
        # First the node sampler: its last sample must be in its spool before shipping.
        messages += stop_node_sampler(root_fd, job.job_id, wait=sampler_wait)
        samples = _sample_runs(root_fd, job.job_id, job.het_job_id)
        job_fd = _open_user_dir(job.job_id, root_fd, job.uid)
        runs: list[str] = []
        tasks: list[str] = []  # the runs of the job's srun tasks on this node
        if job_fd is not None:
            try:
                names = _list_dir(job_fd)
                runs = [run for run in _run_dirs(names, job.job_id)
                        if _is_user_dir(run, job_fd, job.uid)]
                tasks = [run for run in _task_run_dirs(names, job.job_id, job.het_job_id)
                         if _is_user_dir(run, job_fd, job.uid)]
                ends = {run: read_end(job_fd, run, job.uid) for run in runs}
            finally:
                os.close(job_fd)
        if not runs and not tasks and not samples:
            # Not opted in (or capture never started): leave nothing behind.
            _remove_job(root_fd, job.job_id)
            _remove_samples(root_fd, job.job_id)
            return messages
        record = read_job_record(root, job.job_id) or job.record()
        if not runs:
            # A node without the wrapper's run (not the batch node, or the wrapper decided
            # against capture): only this node's samples, under the prolog's record.
            shipped, why = _ship(root, job.job_id, [], admin, record, samples=samples,
                                 notes=messages, tasks=tasks)
            if shipped or not tasks:
                _remove_job(root_fd, job.job_id)
            if shipped:
                _remove_samples(root_fd, job.job_id)
                messages.append(f"shipped this node's samples ({', '.join(samples)})"
                                + (f" and task run(s) {', '.join(tasks)}" if tasks else ""))
            else:
                messages.append(f"samples left in {root}/{SAMPLES_DIR}/{job.job_id}"
                                + (f" and task run(s) in {root}/{job.job_id}" if tasks else "")
                                + f" for the agent ({why})")
            return messages
        current = run_id_for({"SLURM_JOB_ID": job.job_id,
                              "SLURM_RESTART_COUNT": job.restart_count})
        run = current if current in runs else runs[-1]
        end = ends.get(run)
        info = state_of(job.job_id) if callable(state_of) else slurm_job(job.job_id)
        # The prolog's environment has no array ids; slurmctld knows them.
        if not record.get("array_job_id") and info.get("ArrayJobId", "").isdigit():
            record["array_job_id"] = info["ArrayJobId"]
            record["array_task_id"] = info.get("ArrayTaskId", "")
        record.update({
            "end": time.time() if now is None else now,
            "run_id": run,
            "runs": runs,
            "exit_status": end["exit_status"] if end else None,
            "signal": end["signal"] if end else None,
            "wrapper_state": end["state"] if end else "",
            "duration": end["duration"] if end else None,
            "slurm_state": info.get("JobState", ""),
            "slurm_reason": info.get("Reason", ""),
            "request": _request(info),
            "slurm_exit_code": env.get("SLURM_JOB_EXIT_CODE2", ""),
        })
        if end is None:
            messages.append(f"run {run}: no readable End record (the wrapper was killed, or "
                            "its spool is not as the wrapper left it)")
        _write_job_record(root_fd, job.job_id, record)
        if info and record["slurm_state"] in ("", "COMPLETING") and not callable(state_of):
            _record_final_state_later(root, job.job_id, record=dict(record))
        shipped, why = _ship(root, job.job_id, runs, admin, record, samples=samples,
                             notes=messages, tasks=tasks)
        if shipped:
            _remove_job(root_fd, job.job_id)
            _remove_samples(root_fd, job.job_id)
            messages.append(f"shipped run(s) {', '.join(runs)}"
                            + (" with this node's samples" if samples else "")
                            + " and removed the job's spool")
        else:
            messages.append(f"run(s) {', '.join(runs)} left in {root}/{job.job_id} for the "
                            f"agent ({why})")
    finally:
        os.close(root_fd)
    return messages


def _hook_main(which: str, env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """``logcapture slurm prolog|epilog``: messages on stderr (the thin scripts send them to
    syslog with the job id); 0 when all went well, 1 otherwise. Never raises."""
    from ..errors import LogcaptureError, failure

    env = os.environ if env is None else env
    try:
        messages = prolog(env) if which == "prolog" else epilog(env)
        code = 0
    except (LogcaptureError, OSError) as e:  # said as every command says it, exit 1 (a hook's)
        said = failure(e)
        messages, code = [said[0].removeprefix("logcapture: ") if said else str(e)], 1
    except Exception as e:  # noqa: BLE001 - the job must go on whatever happens here
        messages, code = [f"internal error: {type(e).__name__}"], 1
    for m in messages:
        sys.stderr.write(f"logcapture slurm {which}: {m}\n")
    return code


def prolog_main() -> int:
    return _hook_main("prolog")


def epilog_main() -> int:
    return _hook_main("epilog")
