"""Who owns a run: the privacy rule the shipper applies to the rows it stores and the read
layer to the spool runs it shows (a module below both, so that neither imports the other).

Identity: the owner and run id of shipped rows come from ``identify(run_dir)``,
a trusted source chosen by the caller. The default, ``identity_from_spool``, takes the owner from
the run directory's owner (which a user cannot forge: ``chown`` to another user needs root) and
the run id from the directory name; the Start record only adds cluster and job id as
information. The Slurm epilog/agent passes the root-owned prolog record instead.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from .errors import LogcaptureError
from .records import Start, from_dict
from .spool.layout import check_run_id, segments
from .spool.reading import first_line
from .store import Identity


def identity_from_spool(run_dir: Path) -> Identity:
    """The default trusted identity of a run directory: owner = the directory's owner (uid and
    its user name), run = the directory's name. Cluster and job id come from the Start record
    (informational: never part of the row key or of the owner)."""
    st = os.stat(run_dir, follow_symlinks=False)
    uid = st.st_uid
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    cluster = job_id = ""
    try:
        segs = segments(run_dir)
        if segs:
            first = first_line(segs[0])
            if first:
                rec = from_dict(json.loads(first))
                if isinstance(rec, Start) and rec.slurm:  # null in a hand-made record
                    cluster = str(rec.slurm.get("cluster", ""))
                    job_id = str(rec.slurm.get("job_id", ""))
    except (LogcaptureError, ValueError, OSError):
        pass
    return Identity(run=check_run_id(run_dir.name), user=user, uid=uid, cluster=cluster,
                    job_id=job_id)


def trusted_identity(run_dir: Path, job_record: Mapping[str, object] | None = None
                     ) -> Identity:
    """Who owns a run's rows: the one rule every shipper and reader applies. A Slurm run
    (``<spool root>/<job id>/<run>``, or the node sampler's ``<spool root>/.samples/<job id>/
    <run>``) belongs to the user of the job's root-owned prolog record (``job_record``, else
    read beside the run); any other run, or one without such a record, to its directory's
    owner (``identity_from_spool``). Nothing a job writes into its spool can change it."""
    job_id = run_dir.parent.name
    if job_record is None and job_id.isdigit():
        try:
            from .slurm.jobrecords import read_job_record

            job_record = read_job_record(str(run_dir.parent.parent), job_id)
        except (OSError, LogcaptureError):
            job_record = None
    if job_record:
        uid, user = job_record.get("uid"), job_record.get("user")
        # a heterogeneous job's later component: its runs are its first component's job's
        het = job_record.get("het_job_id")
        if isinstance(het, str) and het.isdigit():
            job_id = het
        if isinstance(uid, int) and isinstance(user, str):
            return Identity(run=check_run_id(run_dir.name), user=user, uid=uid,
                            cluster=str(job_record.get("cluster", "")), job_id=job_id)
    return identity_from_spool(run_dir)

