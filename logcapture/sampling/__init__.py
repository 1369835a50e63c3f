"""The resource sampler's parts. Import them through ``logcapture.sampler``, the entry module.

- ``gpu``      GpuCollector (NVML), job_gpus_from_env: which GPUs are the job's
- ``job``      JobCollector (psutil + cgroup), find_job_cgroup, cpus_allocated_from_env
- ``summary``  summarize(samples) for ``logcapture show``

See docs/sampling.md.
"""
