"""logcapture on a Slurm cluster, one module per who runs it and when.

``wrapper``      the job's user, at job start on the batch node: ``logcapture-job``
``hooks``        root, every node of the job: the prolog before it starts, the epilog after
``nodesampler``  root, every node of a job that opted in: resource samples, from prolog to epilog
``jobs``         a job's identity (from slurmd's environment) and its state (from slurmctld)
``jobrecords``   root's files in the spool root: the trusted job records, the public config
``rootsafe``     root reading a user's files (the wrapper's End record) without trusting them

Every module here imports only ``os`` and ``sys`` at module level (the rest inside functions):
the wrapper is on every job's start-up path, opted in or not.

Spool layout on a Slurm node::

    <spool root>/                 root, 0755 (admin: ``spool_root``, default /var/spool/logcapture)
      .config.json                root, 0644: the admin config minus secrets, for jobs
      .jobs/<job id>.json         root, 0600: the trusted job record
      <job id>/                   the job's user, 0700 (made by the prolog)
        <run id>/seg-*.ndjson*    the wrapper's run (run id = job id; ``<job id>.<n>`` after
                                  the n-th requeue)
      .samplers/<job id>.pid      root, 0644: "<pid> <start time>" of this node's sampler
      .samples/                   root, 0700: the node samplers' spool (a spool root itself)
        .jobs/<job id>.json       copy of the trusted record, for the agent (it tails .samples)
        <job id>/<run id>/seg-*   this node's Sample records (stream ``sample:<node>``)
"""
