"""The defaults of the administrator's settings and their names: one list of keys and their
defaults, from which ``admin.AdminConfig`` takes its fields (docs/admin.md lists them), and the
named defaults that other modules use where no config is read (the spool writer, the shipper,
the CLI's options), so that each has one value.
"""

from __future__ import annotations

# The spool writer's flushing and rotation (spool.writer.SpoolWriter's defaults).
FLUSH_INTERVAL = 0.5  # seconds between spool flushes (a quiet line lands within 1 s)
FLUSH_RECORDS = 1000  # flush after this many buffered records
SEGMENT_BYTES = 8 * 1024 * 1024  # rotate spool segments at this size
# Days a closed spool segment is kept after the store accepted all its lines (the shipper's
# ``--retention-days``; 0: at once). Not the store's TTL (``store_ttl_days``).
SPOOL_RETENTION_DAYS = 7.0
# Admin keys renamed, old -> new: the old name is still read, with a warning naming the new
# one. ``retention_days`` was the store's TTL, which read as the spool's retention.
RENAMED_KEYS = {"retention_days": "store_ttl_days"}


ADMIN_DEFAULTS = {
    "store": None,
    "spool_root": None,
    "sample_interval": 10.0,  # seconds between resource samples
    # Days the store keeps rows: the TTL ``logcapture db init`` sets when run without
    # --ttl-days (None: it leaves the TTL as it is).
    "store_ttl_days": None,
    "cluster": "",  # the cluster's name in records; "" = Slurm's ClusterName when known
    "flush_interval": FLUSH_INTERVAL,
    "flush_records": FLUSH_RECORDS,
    "segment_bytes": SEGMENT_BYTES,
    # Free space the spool leaves on its filesystem (bytes, 512M, or 5%): below it no more
    # lines are stored, with a note (journald's SystemKeepFree=).
    "spool_keep_free": "0",
    # The bound on what one run stores (logcapture.limit): characters of output text, the
    # lines kept at the end past it, metadata rows.
    "job_output_limit": 2 * 1024 ** 3,
    "job_output_tail": 1000,
    "job_metadata_limit": 1_000_000,
    # Bytes of output lines one user's runs may add to the store in a UTC day (0: no bound),
    # enforced by the shipper where it writes the store; the lines stay in the spool.
    "user_daily_bytes": 0,
    # Efficiency notes (logcapture.insights.efficiency): when a run's figures earn one.
    "insight_gpu_idle_percent": 10.0,  # GPUs whose mean utilisation is under this are idle
    "insight_gpu_memory_used_fraction": 0.25,  # peak GPU memory under this share: unused
    "insight_cpu_efficiency_low": 0.25,  # CPU time / (cores x wall time) under this: low
    "insight_memory_overrequest_factor": 4.0,  # memory requested over this x the peak used
    "insight_time_limit_overrequest_factor": 4.0,  # time limit over this x the run time
    "insight_min_seconds": 600.0,  # shorter runs get no efficiency notes
    # While a job runs (the agent): no new output for this long while it runs is a stall.
    "stall_seconds": 1800.0,
    # Messages users ask for in .logoptin: Slurm's MailProg convention (-s SUBJECT ADDRESS,
    # body on stdin) and a webhook every message is also posted to (none by default).
    "mail_prog": "/usr/bin/mail",
    "notify_webhook": None,
    "reader_socket": None,  # the read service's socket (None: /run/logcapture/reader.sock)
    "admin_group": None,  # members read every user's runs through the read service
    # The read service's limits (None: its defaults, logcapture.reader.server's constants).
    "reader_max_clients": None,  # connections answered at once, in all
    "reader_max_clients_per_user": None,  # ... from one uid
    "reader_max_follows_per_user": None,  # ... from one uid following a run (logs -f)
    "reader_request_timeout": None,  # seconds a connection may take to send its request
    # Secrets (logcapture.redact): variable names (globs) whose values are redacted, beyond
    # redact.DEFAULT_VARIABLES, and literals or /REGEX/ redacted in every job's output.
    "redact_variables": (),
    "redact_patterns": (),
}
