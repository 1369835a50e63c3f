"""The resource sampler, a source beside the runner: it hands ``Sample`` records to a callback
and knows nothing of spool or store. Import each name from the module that holds it.

- ``sampler``  Sampler (the background thread), inventory, sample_interval: the entry module
- ``gpu``      GpuCollector (NVML), job_gpus_from_env: which GPUs are the job's
- ``job``      JobCollector (psutil + cgroup), find_job_cgroup, cpus_allocated_from_env
- ``node``     NodeJobCollector: a job's processes on a node, for the Slurm node sampler
- ``summary``  summarize(samples) for ``logcapture show``: the one part the readers use

See docs/sampling.md.
"""
