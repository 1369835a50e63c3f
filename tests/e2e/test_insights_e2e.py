"""Answers for real Slurm jobs: a cancelled job, a job over its time limit and a Python crash
are diagnosed in the store from Slurm's final state, and their user, who asked for it in
.logoptin, gets one mail each through the cluster's mail command (a MailProg that delivers
to a local mbox).

Over the memory limit: the dev cluster's cgroup.conf constrains nothing (ConstrainRAMSpace=no,
cgroup v1 inside this machine), so Slurm never OOM-kills a job here; OUT_OF_MEMORY is tested
from Slurm's state in tests/test_insights.py.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.slurm
U1 = "lcuser1"

CRASH = r"""#!/bin/bash
echo "training"
python3 - <<'PY'
def step(batch):
    raise ValueError(f"bad batch {batch}")
step(7)
PY
"""
SLEEPER = "#!/bin/bash\necho 'before the cancel'\nsleep 120\n"
LATE = "#!/bin/bash\necho 'started'\nsleep 600\n"


def _mailprog(lc: Cluster) -> tuple[Path, Path]:
    mbox = lc.dir / "mbox"
    prog = lc.dir / "fakemail"
    prog.write_text(f"""#!{sys.executable}
import sys
assert sys.argv[1] == "-s", sys.argv
body = sys.stdin.read()
with open({str(mbox)!r}, "a") as f:
    f.write(f"To: {{sys.argv[3]}}\\nSubject: {{sys.argv[2]}}\\n\\n{{body}}\\n")
""")
    prog.chmod(0o755)
    mbox.unlink(missing_ok=True)
    return prog, mbox


def _set(lc: Cluster, key: str, value: str | None) -> None:
    path = lc.dir / "etc" / "config.yaml"
    kept = [ln for ln in path.read_text().splitlines() if not ln.startswith(f"{key}:")]
    if value is not None:
        kept.append(f"{key}: {value}")
    path.write_text("\n".join(kept) + "\n")


def _insights(lc: Cluster, job_id: str) -> dict[str, dict]:
    out = lc.store_query("print(json.dumps(store.insights(sys.argv[2])))", job_id)
    return {i["kind"]: i for i in json.loads(out)}


def test_cancelled_time_limit_and_crash_are_diagnosed_and_mailed(lc: Cluster) -> None:
    prog, mbox = _mailprog(lc)
    _set(lc, "mail_prog", str(prog))
    lc.set_store(True)
    lc.optin(U1, "notify: [failed]\n")
    try:
        crash = lc.submit(U1, CRASH, name="crash")
        late = lc.submit(U1, LATE, "--time=1", name="late")
        cancel = lc.submit(U1, SLEEPER, name="cancel")
        lc.wait_running(cancel, "before the cancel", timeout=60)
        subprocess.run(["scancel", cancel.id], env=lc.env, check=True, timeout=30)
        states = lc.wait(crash, cancel, late, timeout=240)
        assert states[cancel.id][0] == "CANCELLED" and states[late.id][0] == "TIMEOUT"
        assert states[crash.id][0] == "FAILED"
        want = {crash.id: "python-exception", cancel.id: "cancelled", late.id: "time-limit"}
        deadline = time.monotonic() + 90
        found: dict[str, dict[str, dict]] = {}
        while time.monotonic() < deadline:
            found = {j: _insights(lc, j) for j in want}
            if all(kind in found[j] for j, kind in want.items()):
                break
            time.sleep(1)
        for job_id, kind in want.items():
            assert kind in found[job_id], (job_id, found[job_id], lc.slurm_log())
        exc = found[crash.id]["python-exception"]
        assert exc["message"] == "ValueError: bad batch 7 at <stdin>:2 in step"
        assert [e["text"] for e in exc["evidence"]][-1] == "ValueError: bad batch 7"
        assert "Slurm stopped the job at its time limit" in found[late.id]["time-limit"]["message"]
        assert found[cancel.id]["cancelled"]["details"]["slurm_state"].startswith("CANCELLED")
        # one mail per job, to the user's own mailbox
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = mbox.read_text() if mbox.exists() else ""
            if all(f"job {j} failed" in text for j in want):
                break
            time.sleep(0.5)
        text = mbox.read_text()
        for job_id in want:
            assert text.count(f"Subject: logcapture: job {job_id} failed") == 1, text
        assert text.count(f"To: {U1}\n") == 3
        assert "ValueError: bad batch 7 at <stdin>:2 in step" in text
        # show, for the user, from the store's insights (the epilog shipped the runs)
        r = lc.root_cli("show", "--json", late.id)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["insights"][0]["kind"] == "time-limit"
    finally:
        _set(lc, "mail_prog", None)
        mode = stat.S_IMODE(prog.stat().st_mode)
        assert mode == 0o755
