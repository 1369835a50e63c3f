"""An array job at a glance (logcapture/arrays.py): its tasks counted by state and first
insight, the same in `ls JOB` (from the spool and from the store) and on the runs page's API,
from spool runs written as the job wrapper writes them, insights found in their lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import lc

from logcapture.arrays import array_summary, summary_text
from logcapture.records import End, Line, Start
from logcapture.spool.layout import create_run_dir
from logcapture.spool.writer import SpoolWriter

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
       "total capacity of 79.11 GiB of which 1.5 GiB is free.")
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5")
# task -> (state, exit status, last line)
TASKS = {t: ("COMPLETED", 0, "done") for t in range(1, 8)}
TASKS.update({8: ("FAILED", 1, OOM), 9: ("FAILED", 1, OOM), 10: ("FAILED", 1, NCCL),
              11: ("FAILED", 2, "bad argument"), 12: ("TIMEOUT", None, "step 10")})


def write_array(spool: Path, array: str = "500", tasks: dict = TASKS) -> None:
    for task, (state, status, last) in tasks.items():
        run = f"{int(array) + task}"
        w = SpoolWriter(create_run_dir(spool, run), fsync=False)
        t0 = 1_790_000_000.0 + 60 * task
        w.write([Start(run=run, stream="run", seq=0, ts=t0, command=["train.py"],
                       slurm={"job_id": run, "array_job_id": array,
                              "array_task_id": str(task), "job_name": "sweep"}),
                 Line(run=run, stream="stdout", seq=0, ts=t0 + 1, text="training"),
                 Line(run=run, stream="stderr", seq=0, ts=t0 + 2, text=last),
                 End(run=run, stream="run", seq=1, ts=t0 + 30, exit_status=status,
                     state=state, duration=30.0)])
        w.close()


def test_summary_counts_tasks_by_state_and_first_insight() -> None:
    runs = [{"run": "1", "state": "COMPLETED", "insights": ["gpu-idle"],
             "slurm": {"job_id": "1", "array_job_id": "9", "array_task_id": "1"}},
            {"run": "2", "state": "FAILED", "insights": ["cuda-oom", "python-exception"],
             "slurm": {"job_id": "2", "array_job_id": "9", "array_task_id": "2"}},
            {"run": "3", "state": "FAILED", "insights": ["cuda-oom"],
             "slurm": {"job_id": "3", "array_job_id": "9", "array_task_id": "3"}},
            # task 4 requeued: only its latest run counts
            {"run": "4", "state": "FAILED", "insights": ["node-fail"],
             "slurm": {"job_id": "4", "array_job_id": "9", "array_task_id": "4"}},
            {"run": "4.1", "state": "COMPLETED", "insights": [],
             "slurm": {"job_id": "4", "array_job_id": "9", "array_task_id": "4",
                       "restart_count": "1"}}]
    s = array_summary(runs)
    assert s is not None
    assert summary_text(s) == "4 tasks: 2 COMPLETED, 2 FAILED (cuda-oom 2)"
    assert array_summary([{"run": "x", "state": "COMPLETED", "slurm": {}}]) is None


@pytest.mark.parametrize("source", ["spool", "store"])
def test_ls_of_an_array_job_ends_with_its_summary(lc_env: dict[str, str], tmp_path: Path,
                                                  source: str) -> None:
    write_array(Path(lc_env["LOGCAPTURE_SPOOL"]))
    env = {**lc_env, "LOGCAPTURE_STORE": f"chdb://{tmp_path / 'store'}"}
    if source == "store":
        assert lc(["upload", "--all"], env).returncode == 0
    ls = lc(["ls", "500", "--source", source], env)
    assert ls.returncode == 0, ls.stderr
    lines = ls.stdout.decode().splitlines()
    assert len(lines) == 1 + 12 + 1
    # the first insight of each task, as its ls row flags it (`failed`: no more specific kind)
    assert lines[-1] == ("12 tasks: 7 COMPLETED, 4 FAILED (cuda-oom 2, failed 1, "
                         "nccl-error 1), 1 TIMEOUT (failed 1)"), lines
    flags = {ln.split()[0]: ln.split()[-1] for ln in lines[1:-1]}
    assert flags["500_8"] == "!cuda-oom" and flags["500_10"] == "!nccl-error"
    # one task: no summary line
    one = lc(["ls", "500_8", "--source", source], env).stdout.decode().splitlines()
    assert len(one) == 2 and "tasks:" not in one[-1]
    # --json stays one object per run
    js = lc(["ls", "500", "--json", "--source", source], env).stdout.decode().splitlines()
    assert len(js) == 12 and all("run" in json.loads(x) for x in js)
