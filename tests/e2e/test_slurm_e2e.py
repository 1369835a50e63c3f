"""logcapture on a real Slurm 22.05 cluster.

Each test submits real batch jobs as the test users through ``sbatch`` (so they go through
job_submit.lua, the prolog, the job wrapper and the epilog) and checks what Slurm reports and
what logcapture left in the spool. Jobs of one test are submitted together and polled
together, to keep the suite short on two cores.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time

import pytest

from logcapture.views import duration

from .conftest import Cluster, Job

pytestmark = pytest.mark.slurm

U1, U2 = "lcuser1", "lcuser2"


def lines(records: list[dict], stream: str = "stdout") -> list[str]:
    return [r["text"] for r in records if r["kind"] == "line" and r["stream"] == stream]


def end_of(records: list[dict]) -> dict:
    ends = [r for r in records if r["kind"] == "end"]
    assert len(ends) == 1, records
    return ends[0]


CAPTURED = r"""#!/bin/bash
echo "hello from $SLURM_JOB_ID"
for i in 1 2 3 4 5; do printf '\rprogress %d/5' $i; sleep 0.05; done; echo
echo '{"epoch": 1, "loss": 0.5}'
echo "to stderr" >&2
srun --overlap echo "from an srun step"
[ -t 1 ] && echo "stdout is a tty" || echo "stdout is not a tty"
exit 0
"""


def test_an_opted_in_job_is_captured_rendered_and_recorded(lc: Cluster) -> None:
    lc.optin(U1, "")
    job = lc.submit(U1, CAPTURED, name="captured")
    assert lc.wait(job)[job.id] == ("COMPLETED", "0:0")

    out = job.out.read_text()
    assert "hello from" in out and "from an srun step" in out and "stdout is a tty" in out
    assert b"\rprogress 5/5" in job.out.read_bytes()  # the job's own output file keeps every byte

    records = lc.records(job)
    stdout = lines(records)
    assert f"hello from {job.id}" in stdout
    assert "progress 5/5" in stdout and not any("progress 1/5" in t for t in stdout)
    # The srun step's line is its task's (J.0.0), stored once: not again with the script.
    assert "from an srun step" not in stdout
    assert lines(lc.records(job, f"{job.id}.0.0")) == ["from an srun step"]
    # No -e: stdout and stderr share the output file, so they are one stream, in order.
    assert lines(records, "stderr") == []
    assert stdout.index('{"epoch": 1, "loss": 0.5}') < stdout.index("to stderr") \
        < stdout.index("stdout is a tty")
    assert [r["fields"] for r in records if r["kind"] == "metadata"] == [
        {"epoch": 1, "loss": 0.5}]
    start = records[0]
    assert start["kind"] == "start" and start["user"] == U1
    assert start["slurm"]["job_id"] == job.id and start["slurm"]["cluster"] == "e2e"
    assert end_of(records)["exit_status"] == 0

    # The trusted record: root's, outside the user's directory, completed by the epilog.
    rec = lc.job_record(job)
    assert rec is not None and rec["user"] == U1 and rec["job_id"] == job.id
    assert rec["exit_status"] == 0 and rec["signal"] is None
    st = (lc.spool_root / ".jobs" / f"{job.id}.json").stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
    jd = (lc.spool_root / job.id).stat()
    assert jd.st_uid == lc.home(U1).stat().st_uid and stat.S_IMODE(jd.st_mode) == 0o700

    # A Slurm job id works as a run id for the user.
    r = lc.as_user(U1, [str(lc.env["LOGCAPTURE_BIN"]) + "/logcapture", "logs", "--spool",
                        str(lc.spool_root / job.id), job.id])
    assert r.returncode == 0, r.stderr
    # The job's log: the script's lines and its task's (one rank: no label), each once.
    assert f"hello from {job.id}" in r.stdout
    assert r.stdout.splitlines().count("from an srun step") == 1
    r = lc.as_user(U1, [str(lc.env["LOGCAPTURE_BIN"]) + "/logcapture", "logs", "--spool",
                        str(lc.spool_root / job.id), job.id, "--rank", "0"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["from an srun step"]


UNTOUCHED = r"""#!/bin/bash
[ -t 1 ] && echo "tty" || echo "not a tty"
env | grep -c '^LOGCAPTURE' || true
echo "args: $*"
head -c 2 /proc/$PPID/comm >/dev/null
echo "interp: $(tr '\0' ' ' </proc/$$/cmdline)"
"""


def test_a_user_without_logoptin_gets_an_untouched_job_and_nothing_captured(
        lc: Cluster) -> None:
    job = lc.submit(U2, UNTOUCHED, "--export=NONE", name="untouched")
    assert lc.wait(job)[job.id] == ("COMPLETED", "0:0")
    out = job.out.read_text().splitlines()
    assert out[0] == "not a tty"
    assert out[1] == "0"  # no LOGCAPTURE_* variable
    # The wrapper exec'd the script's own interpreter: same argv as without logcapture.
    assert out[3].startswith("interp: /bin/bash ")
    assert "logcapture-job" not in out[3] and "python" not in out[3]
    assert not (lc.spool_root / job.id).exists()
    assert lc.job_record(job) is None


WAITS = r"""#!/bin/bash
echo "started"
while [ ! -e "$HOME/go-{tag}" ]; do sleep 0.1; done
echo "finished"
"""


def test_logoptin_created_or_deleted_while_a_job_runs_changes_nothing(lc: Cluster) -> None:
    # U1 is opted out at start and opts in while the job runs; U2 the other way round.
    lc.optin(U2, "")
    for user in (U1, U2):
        (lc.home(user) / "go-x").unlink(missing_ok=True)
    j1 = lc.submit(U1, WAITS.replace("{tag}", "x"), name="waits")
    j2 = lc.submit(U2, WAITS.replace("{tag}", "x"), name="waits")
    lc.wait_running(j1, "started")
    lc.wait_running(j2, "started")
    lc.optin(U1, "")
    lc.optin(U2, None)
    for user in (U1, U2):
        lc.write_as(user, lc.home(user) / "go-x", "")
    states = lc.wait(j1, j2)
    assert states[j1.id] == states[j2.id] == ("COMPLETED", "0:0")
    assert not (lc.spool_root / j1.id).exists()
    assert lines(lc.records(j2)) == ["started", "finished"]
    for user in (U1, U2):
        (lc.home(user) / "go-x").unlink()


MODES = r"""#!/bin/bash
echo "visible line"
echo '{"step": 1}'
echo '/LOGCOMMAND {"mode":"disabled"}'
echo "password=hunter2-secret"
echo '/LOGCOMMAND {"mode":"enabled"}'
echo "visible again"
"""


def test_modes_from_logoptin_and_from_logcommand(lc: Cluster) -> None:
    lc.optin(U1, "mode: metadata\n")
    lc.optin(U2, "")
    j1 = lc.submit(U1, MODES, name="modes")
    j2 = lc.submit(U2, MODES, name="modes")
    lc.wait(j1, j2)
    # metadata mode: only the metadata (and commands) are kept, no text.
    r1 = lc.records(j1)
    assert lines(r1) == [] or lines(r1) == ["visible again"]
    assert [r["fields"] for r in r1 if r["kind"] == "metadata"] == [{"step": 1}]
    assert b"visible line" not in lc.spool_bytes(j1)
    # enabled, then disabled by /LOGCOMMAND for the secret, then enabled again.
    r2 = lc.records(j2)
    assert "visible line" in lines(r2) and "visible again" in lines(r2)
    assert [r["kind"] for r in r2].count("command") == 2
    for job in (j1, j2):
        assert b"hunter2" not in lc.spool_bytes(job)
        assert "hunter2-secret" in job.out.read_text()  # the job's own file is untouched


OUTCOMES = {
    "exit0": "#!/bin/bash\necho ok\nexit 0\n",
    "exit3": "#!/bin/bash\necho failing\nexit 3\n",
    "killed": "#!/bin/bash\necho dying\nkill -KILL $$\n",
    "usr1": "#!/usr/bin/env python3\nimport os, signal\nprint('bye', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n",
}


def test_exit_codes_and_signals_give_the_same_slurm_outcome_with_and_without(
        lc: Cluster) -> None:
    lc.optin(U1, "")  # U1 captured, U2 not
    pairs = {name: (lc.submit(U1, script, name=name), lc.submit(U2, script, name=name))
             for name, script in OUTCOMES.items()}
    states = lc.wait(*[j for pair in pairs.values() for j in pair])
    for name, (captured, plain) in pairs.items():
        assert states[captured.id] == states[plain.id], name
    assert states[pairs["exit3"][0].id] == ("FAILED", "3:0")
    assert states[pairs["killed"][0].id] == ("FAILED", "0:9")
    ends = {name: end_of(lc.records(pair[0])) for name, pair in pairs.items()}
    assert ends["exit3"]["exit_status"] == 3
    assert ends["killed"]["signal"] == 9 and ends["usr1"]["signal"] == 10
    assert lc.job_record(pairs["killed"][0])["signal"] == 9
    for _, plain in pairs.values():
        assert not (lc.spool_root / plain.id).exists()


SLEEPER = r"""#!/bin/bash
trap 'echo "got HUP" >&2' HUP
echo "before the cancel"
sleep 60
echo "never printed"
"""


def test_scancel_ends_a_captured_job_as_cancelled_keeping_its_lines(lc: Cluster) -> None:
    lc.optin(U1, "")
    captured = lc.submit(U1, SLEEPER, name="sleeper")
    plain = lc.submit(U2, SLEEPER, name="sleeper")
    lc.wait_running(captured, "before the cancel")
    lc.wait_running(plain, "before the cancel")
    subprocess.run(["scancel", captured.id, plain.id], env=lc.env, check=True, timeout=30)
    states = lc.wait(captured, plain)
    assert states[captured.id] == states[plain.id]
    assert states[captured.id][0] == "CANCELLED"
    assert "got HUP" not in captured.out.read_text()
    records = lc.records(captured)
    assert lines(records) == ["before the cancel"]
    end = end_of(records)
    assert end["signal"] == 15  # TERM forwarded, not a hang-up
    rec = lc.job_record(captured)
    assert rec["signal"] == 15 and rec["slurm_exit_code"] == "0:0"  # what the epilog saw
    # Slurm's final state reaches the record once the epilog is over.
    deadline = time.monotonic() + 20
    while lc.job_record(captured).get("slurm_state") != "CANCELLED":
        assert time.monotonic() < deadline, lc.job_record(captured)
        time.sleep(0.2)


ARRAY = r"""#!/bin/bash
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"
"""


def test_an_array_job_captures_each_task_under_its_own_job_id(lc: Cluster) -> None:
    lc.optin(U1, "")
    first = lc.submit(U1, ARRAY, "--array=1-3", name="array")
    tasks = lc.array_tasks(first.id, 3)
    assert sorted(tasks) == ["1", "2", "3"]
    states = lc.wait(*[Job(job_id, U1, first.out) for job_id in tasks.values()])
    assert set(states.values()) == {("COMPLETED", "0:0")}
    for task, job_id in tasks.items():
        records = lc.records(job_id)
        start = records[0]
        assert start["slurm"]["array_job_id"] == first.id
        assert start["slurm"]["array_task_id"] == task
        assert lines(records) == [f"task {task} of {first.id}"]
        rec = lc.job_record(job_id)
        assert rec["array_job_id"] == first.id and rec["array_task_id"] == task


def test_two_users_jobs_are_isolated(lc: Cluster) -> None:
    lc.optin(U1, "")
    lc.optin(U2, "")
    j1 = lc.submit(U1, "#!/bin/bash\necho 'secret of user one'\n", name="iso")
    j2 = lc.submit(U2, "#!/bin/bash\necho 'secret of user two'\n", name="iso")
    lc.wait(j1, j2)
    assert lines(lc.records(j1)) == ["secret of user one"]
    assert lines(lc.records(j2)) == ["secret of user two"]
    for reader, job in ((U2, j1), (U1, j2)):
        run_dir = lc.run_dir(job)
        r = lc.as_user(reader, ["ls", str(run_dir.parent)])
        assert r.returncode != 0 and "Permission denied" in r.stderr
        seg = next(run_dir.iterdir())
        r = lc.as_user(reader, ["cat", str(seg)])
        assert r.returncode != 0
        r = lc.as_user(reader, ["cat", str(lc.spool_root / ".jobs" / f"{job.id}.json")])
        assert r.returncode != 0
    # And the public config holds no store DSN (no `store` key; `store_ttl_days` is a number).
    public = json.loads((lc.spool_root / ".config.json").read_text())
    assert "store" not in public and "chdb://" not in str(public), public


HOSTILE = r"""#!/bin/bash
run="{spool}/$SLURM_JOB_ID/$SLURM_JOB_ID"
echo "planting"
ln -s /etc/shadow "$run/seg-999999.ndjson.gz"
ln -s /etc/shadow "$run/seg-999998.ndjson"
mkfifo "$run/seg-999997.ndjson"
truncate -s 20G "$run/seg-999996.ndjson"
ln -s {other} "{spool}/$SLURM_JOB_ID/$SLURM_JOB_ID.1"
ln -s /etc "{spool}/$SLURM_JOB_ID/$SLURM_JOB_ID.2"
echo "planted"
exit 4
"""


def test_planted_symlinks_fifos_and_huge_files_gain_nothing_and_break_nothing(
        lc: Cluster) -> None:
    lc.optin(U1, "")
    lc.optin(U2, "")
    victim = lc.submit(U2, "#!/bin/bash\necho 'victim line'\n", name="victim")
    lc.wait(victim)
    other = lc.spool_root / victim.id
    assert lines(lc.records(victim)) == ["victim line"]
    hostile = lc.submit(U1, HOSTILE.replace("{spool}", str(lc.spool_root))
                        .replace("{other}", str(other)), name="hostile")
    assert lc.wait(hostile)[hostile.id] == ("FAILED", "4:0")
    assert "planted" in hostile.out.read_text()
    # The epilog found the real End record among the plants and did not follow them.
    rec = lc.job_record(hostile)
    assert rec is not None and rec["exit_status"] == 4
    with open("/etc/shadow") as f:
        shadow_line = f.readline().strip()
    assert shadow_line and shadow_line not in lc.slurm_log()
    assert os.path.exists("/etc/shadow") and os.path.isdir("/etc")
    assert lines(lc.records(victim)) == ["victim line"]  # the other user's spool is intact
    assert lc.state(hostile.id) == "FAILED"
    # The node is not drained: the next job runs.
    follow = lc.submit(U2, "#!/bin/bash\necho fine\n", name="follow")
    assert lc.wait(follow)[follow.id] == ("COMPLETED", "0:0")
    info = subprocess.run(["sinfo", "-h", "-o", "%T"], env=lc.env, capture_output=True,
                          text=True, timeout=30).stdout.split()
    assert info and all(s in ("idle", "mixed", "allocated") for s in info), info


def test_the_epilog_ships_to_the_store_with_the_trusted_identity(lc: Cluster) -> None:
    lc.set_store(True)
    lc.optin(U1, "")
    lc.optin(U2, "")
    j1 = lc.submit(U1, "#!/bin/bash\necho 'shipped line one'\n", name="ship")
    j2 = lc.submit(U2, "#!/bin/bash\necho 'shipped line two'\nexit 2\n", name="ship")
    lc.wait(j1, j2)
    out = lc.store_query(
        "runs = {r['run']: r for r in store.runs()}\n"
        "for run in sys.argv[2:]:\n"
        "    r = runs[run]\n"
        "    texts = [x['text'] for x in store.records(run) if x['kind'] == 'line']\n"
        "    print(json.dumps([r['owner'], r['job_id'], r['exit_status'], texts]))",
        j1.id, j2.id)
    rows = [json.loads(x) for x in out.splitlines()]
    assert rows == [[U1, j1.id, 0, ["shipped line one"]], [U2, j2.id, 2, ["shipped line two"]]]
    # Shipped jobs leave nothing in the spool (a job whose epilog found the store busy is left
    # to the agent instead, and says so in the log).
    for job in (j1, j2):
        assert not (lc.spool_root / job.id).exists(), lc.slurm_log()
    # A job id is a run id for `logcapture logs`, from the store.
    r = lc.root_cli("logs", j2.id)
    assert r.returncode == 0 and "shipped line two" in r.stdout, r.stderr
    # The embedded store is root's: users read neither their own nor each other's rows there.
    store_dir = lc.env["LOGCAPTURE_STORE"].removeprefix("chdb://")
    for user in (U1, U2):
        assert lc.as_user(user, ["ls", store_dir]).returncode != 0


BURN = r"""#!/bin/bash
echo "burning on $SLURMD_NODENAME"
# Burn 2 s of CPU time, not of wall time: on a loaded machine a 2 s busy loop gets less.
while :; do
    for i in {1..20000}; do :; done
    read -ra st < /proc/$$/stat
    (( st[13] + st[14] >= 2 * $(getconf CLK_TCK) )) && break
done
echo burnt
"""


def test_the_prologs_node_sampler_records_the_jobs_cpu_and_ships_it_with_the_job(
        lc: Cluster) -> None:
    """Samples come from the node sampler the prolog starts on each
    node of an opted-in job (the wrapper does not sample a second time), in root's spool, and
    the epilog stops it and ships its samples with the job's identity."""
    lc.set_sample_interval(0.25)
    lc.optin(U1, "")
    # Left in the spool (no store): the samples are root's, apart from the user's run.
    j1 = lc.submit(U1, BURN, name="burn")
    assert lc.wait(j1)[j1.id] == ("COMPLETED", "0:0")
    records = lc.records(j1)
    assert lines(records) == [f"burning on {socket.gethostname().split('.')[0]}", "burnt"]
    assert not [r for r in records if r["kind"] == "sample"]  # not sampled twice
    assert records[0]["inventory"]["cpus"]  # the inventory is still the wrapper's
    from logcapture.spool.reading import iter_run

    samples = [r.to_dict() for r in iter_run(lc.samples_dir(j1))]
    node = samples[0]["node"]
    assert {s["kind"] for s in samples} == {"sample"}
    assert {s["stream"] for s in samples} == {f"sample:{node}"}
    cpu = max(s["job"]["cpu_seconds_total"] for s in samples)
    assert 1.5 <= cpu <= 30, samples  # 2 s of busy-loop CPU (plus the wrapper's own share)
    st = lc.samples_dir(j1).stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
    assert not (lc.spool_root / ".samplers" / f"{j1.id}.pid").exists()  # stopped
    assert "node sampler started" in lc.slurm_log()

    # With a store: shipped with the job's lines under the job's identity, spool cleaned.
    lc.set_store(True)
    j2 = lc.submit(U1, BURN, name="burn")
    assert lc.wait(j2)[j2.id] == ("COMPLETED", "0:0")
    assert not (lc.spool_root / ".samples" / j2.id).exists(), lc.slurm_log()
    r = lc.root_cli("export", j2.id, "--what", "samples", "--format", "ndjson")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows and {row["node"] for row in rows} == {node}
    assert max(row["job.cpu_seconds_total"] for row in rows) >= 1.5
    owner = lc.store_query("print(json.dumps({r['run']: r['owner'] for r in store.runs()}"
                           "[sys.argv[2]]))", j2.id)
    assert json.loads(owner) == U1


# A deterministic job writing to both streams: alternating lines from bash and from Python, a
# \r progress line with warnings on stderr, a traceback after stdout lines, and long lines on
# both streams. Nothing in it depends on the job id, the user or whether it runs under a pty.
ORDERED = r"""#!/bin/bash
for i in 1 2 3 4 5; do echo "out $i"; echo "err $i" >&2; done
python3 -u -c '
import sys
for i in range(40):
    sys.stdout.write(f"\rtraining {i:2d}/39"); sys.stdout.flush()
    if i % 8 == 3:
        print(f"UserWarning: step {i} is slow", file=sys.stderr)
print()
for epoch in range(3):
    print(f"epoch {epoch} done")
    print({"epoch": epoch}, file=sys.stderr)
for i in range(200):
    sys.stdout.write("o" * (i * 37 % 3000) + "\n"); sys.stdout.flush()
    sys.stderr.write("e" * (i * 53 % 2000) + "\n"); sys.stderr.flush()
1 / 0
'
echo "python said $?"
exit 0
"""


def test_an_opted_in_jobs_output_files_are_byte_identical_to_an_uncaptured_jobs(
        lc: Cluster) -> None:
    lc.optin(U1, "")  # U1 captured, U2 not
    lc.optin(U2, None)
    merged = (lc.submit(U1, ORDERED, name="ordered"), lc.submit(U2, ORDERED, name="ordered"))
    apart = [lc.submit(user, ORDERED, f"--error={lc.home(user)}/apart-%j.err", name="apart")
             for user in (U1, U2)]
    states = lc.wait(*merged, *apart)
    assert set(states.values()) == {("COMPLETED", "0:0")}
    # Without -e: stdout and stderr share slurm-N.out, which gets the same bytes, in order.
    want = merged[1].out.read_bytes()
    assert b"out 1\nerr 1\nout 2\n" in want and b"ZeroDivisionError" in want
    assert merged[0].out.read_bytes() == want
    start = next(r for r in lc.records(merged[0]) if r["kind"] == "start")
    assert start["config"]["streams"] == "merged"
    assert "err 1" in lines(lc.records(merged[0]))  # one stream, stdout
    # With -e each file gets the same bytes.
    captured, plain = apart
    assert captured.out.read_bytes() == plain.out.read_bytes()
    errs = [lc.home(j.user) / f"apart-{j.id}.err" for j in apart]
    assert errs[0].read_bytes() == errs[1].read_bytes()
    assert b"ZeroDivisionError" in errs[1].read_bytes()
    records = lc.records(captured)
    assert next(r for r in records if r["kind"] == "start")["config"]["streams"] == "separate"
    assert "err 1" in lines(records, "stderr") and "out 1" in lines(records)
    assert not (lc.spool_root / merged[1].id).exists()


# --- job ids, states and views, as the job's user reads them -------------------------------
TIMED_OUT = "#!/bin/bash\necho 'until the time limit'\nexec sleep 600\n"
REQUEUED = r"""#!/bin/bash
echo "run ${SLURM_RESTART_COUNT:-0} of $SLURM_JOB_NAME"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 120; fi
"""
CANCELLED = "#!/bin/bash\necho 'until scancel'\nsleep 120\n"


def _as_reader(lc: Cluster, user: str, *args: str) -> subprocess.CompletedProcess:
    """``logcapture ARGS`` as ``user``, reading their own runs in the cluster's spool."""
    return lc.as_user(user, [lc.env["LOGCAPTURE_BIN"] + "/logcapture", *args])


def test_job_ids_states_and_views_as_the_user_reads_them(lc: Cluster) -> None:
    """An array job's tasks as J_T, a requeued job's runs, scancel -> CANCELLED and a time
    limit -> TIMEOUT as sacct would say, read back by the job's user with ls, logs and show.
    Jobs of one test so that the minute the time limit takes covers the others."""
    lc.optin(U1, "")
    timed = lc.submit(U1, TIMED_OUT, "--time=1", "--job-name=limit", name="limit")
    cancelled = lc.submit(U1, CANCELLED, "--job-name=cancelme", name="cancel")
    requeued = lc.submit(U1, REQUEUED, "--job-name=again", "--requeue", name="again")
    array = lc.submit(U1, ARRAY, "--array=1-3", "--job-name=sweep", name="sweep")
    spool = ["--spool", str(lc.spool_root), "--source", "spool"]
    # logs -f right after sbatch: it waits for the job to start, then follows it to its end.
    quick = lc.submit(U1, "#!/bin/bash\nsleep 1\necho 'after the wait'\n", name="quick")
    r = _as_reader(lc, U1, "logs", "-f", quick.id, *spool)
    assert r.returncode == 0 and r.stdout == "after the wait\n", r.stderr
    tasks = lc.array_tasks(array.id, 3)

    lc.wait_running(cancelled, "until scancel")
    r = lc.as_user(U1, ["scancel", cancelled.id])  # the user cancels their own job
    assert r.returncode == 0, r.stderr
    lc.wait_running(requeued, "run 0")
    subprocess.run(["scontrol", "requeue", requeued.id], env=lc.env, check=True, timeout=30)
    # A requeued job waits for its BeginTime (two minutes on); start it now.
    deadline = time.monotonic() + 30
    while lc.state(requeued.id) != "PENDING":
        assert time.monotonic() < deadline, lc.show(requeued.id)
        time.sleep(0.2)
    # slurmd refuses to launch a job whose credential was made in (or before) the second in
    # which it revoked the job's last one, as it did when it killed run 0 (slurm_cred_revoked
    # compares whole seconds), and Slurm then ends the job FAILED: the requeue's BeginTime
    # is there to avoid that. Start run 1 in a later second.
    time.sleep(1.05 - time.time() % 1)
    subprocess.run(["scontrol", "update", f"JobId={requeued.id}", "StartTime=now"],
                   env=lc.env, check=True, timeout=30)
    states = lc.wait(cancelled, requeued, *[Job(j, U1, array.out) for j in tasks.values()],
                     timeout=90)
    assert states[cancelled.id][0] == "CANCELLED"
    assert states[requeued.id][0] == "COMPLETED"
    assert lc.show(requeued.id).get("Restarts") == "1"
    assert lc.wait(timed, timeout=180)[timed.id][0] == "TIMEOUT"

    r = _as_reader(lc, U1, "ls", "--json", *spool)
    assert r.returncode == 0, r.stderr
    runs = {d["job"] + (f".{d['restart']}" if d["restart"] else ""): d
            for d in map(json.loads, r.stdout.splitlines())}
    t = array.id
    assert {f"{t}_1", f"{t}_2", f"{t}_3", timed.id, cancelled.id, requeued.id,
            f"{requeued.id}.1"} <= set(runs)
    assert runs[f"{t}_2"]["run"] == tasks["2"] and runs[f"{t}_2"]["job_name"] == "sweep"
    assert runs[f"{t}_2"]["state"] == "COMPLETED" and runs[f"{t}_2"]["exit_status"] == 0
    assert runs[cancelled.id]["state"] == "CANCELLED"  # not SIGNALED / signal 15
    assert runs[cancelled.id]["job_name"] == "cancelme"
    assert runs[timed.id]["state"] == "TIMEOUT"
    assert runs[requeued.id]["state"] == "REQUEUED"  # the run the requeue ended
    assert runs[f"{requeued.id}.1"]["state"] == "COMPLETED"
    assert all(d["owner"] == U1 and d["nodes"] for d in runs.values())
    starts = [d["start"] for d in map(json.loads, r.stdout.splitlines())]
    assert starts == sorted(starts, reverse=True)  # newest first

    table = _as_reader(lc, U1, "ls", *spool).stdout.splitlines()
    assert table[0].split()[:4] == ["JOBID", "NAME", "STATE", "EXIT"]
    rows = {ln.split()[0]: ln.split() for ln in table[1:]}
    assert rows[f"{t}_3"][1:4] == ["sweep", "COMPLETED", "0"]
    assert rows[cancelled.id][2] == "CANCELLED"
    assert rows[requeued.id][2] == "COMPLETED" and rows[f"{requeued.id}.0"][2] == "REQUEUED"
    listed = _as_reader(lc, U1, "ls", t, *spool).stdout.splitlines()
    assert sorted(ln.split()[0] for ln in listed[1:-1]) == [f"{t}_1", f"{t}_2", f"{t}_3"]
    assert listed[-1] == "3 tasks: 3 COMPLETED"  # the array at a glance (arrays.py)

    # Job ids as Slurm users write them, each naming its own run.
    for task in ("1", "2", "3"):
        r = _as_reader(lc, U1, "logs", f"{t}_{task}", *spool)
        assert r.returncode == 0 and r.stdout == f"task {task} of {t}\n", r.stderr
    r = _as_reader(lc, U1, "logs", t, *spool)  # the array: which task?
    assert r.returncode != 0 and f"{t} is an array job of 3 tasks" in r.stderr
    assert _as_reader(lc, U1, "logs", requeued.id, *spool).stdout == "run 1 of again\n"
    assert _as_reader(lc, U1, "logs", f"{requeued.id}.0", *spool).stdout == "run 0 of again\n"

    # show: units for people, numbers for programs.
    info = json.loads(_as_reader(lc, U1, "show", "--json", f"{t}_1", *spool).stdout)
    assert info["job"] == f"{t}_1" and info["state"] == "COMPLETED"
    assert isinstance(info["duration"], float) and isinstance(info["exit_status"], int)
    assert all(" " not in k for k in info)
    cancel_info = json.loads(_as_reader(lc, U1, "show", "--json", cancelled.id, *spool).stdout)
    assert cancel_info["state"] == "CANCELLED" and cancel_info["signal"] == 15
    timed_info = json.loads(_as_reader(lc, U1, "show", "--json", timed.id, *spool).stdout)
    assert timed_info["state"] == "TIMEOUT", timed_info
    # Slurm ends it a minute or more after it started (its time-limit check runs every ~30
    # s); the wrapper's own clock starts a moment after Slurm's.
    assert timed_info["duration"] > 50, timed_info
    text = _as_reader(lc, U1, "show", timed.id, *spool).stdout
    assert "TIMEOUT" in text and duration(timed_info["duration"]) in text, text
    # The other user finds none of it.
    r = _as_reader(lc, U2, "logs", f"{t}_1", *spool)
    assert r.returncode != 0 and "task 1" not in r.stdout + r.stderr
def test_search_finds_each_users_own_lines_only(lc: Cluster) -> None:
    lc.set_store(False)  # the runs stay in the spool first
    lc.optin(U1, "")
    lc.optin(U2, "")
    script = "#!/bin/bash\necho 'needle of {who}'\necho 'rank 3: NCCL WARN timeout'\n"
    j1 = lc.submit(U1, script.format(who="lcuserone"), name="srch")
    j2 = lc.submit(U2, script.format(who="lcusertwo"), name="srch")
    lc.wait(j1, j2)
    bin_ = lc.env["LOGCAPTURE_BIN"] + "/logcapture"
    # Each job's folder of the cluster's spool (the whole root also holds what other tests
    # planted there, e.g. a 20 GB sparse segment in a run of lcuser1's).
    for user, mine, other, theirs in ((U1, j1, j2, "lcusertwo"), (U2, j2, j1, "lcuserone")):
        own = ["--spool", str(lc.spool_root / mine.id)]
        r = lc.as_user(user, [bin_, "search", *own, "--json", "NCCL timeout"])
        assert r.returncode == 0, r.stderr
        found = json.loads(r.stdout)
        assert [(g["run"], g["owner"], g["source"]) for g in found["groups"]] == [
            (mine.id, user, "spool")]
        r = lc.as_user(user, [bin_, "search", *own, theirs])
        assert r.returncode == 1 and theirs not in r.stdout + r.stderr, r
        r = lc.as_user(user, [bin_, "search", "--spool", str(lc.spool_root / other.id),
                              theirs])  # the other user's job folder: not even listed
        # refused before anything is read: click's check of --spool, or the listing
        assert r.returncode == 2 and ("Permission denied" in r.stderr
                                      or "is not readable" in r.stderr), r
        assert theirs not in r.stdout + r.stderr
        r = lc.as_user(user, [bin_, "search", *own, "needle", "--job", other.id])
        assert r.returncode == 2 and "needle" not in r.stdout  # not one of theirs
    # Shipped to the store (root's): an administrator finds both, each owner's reader only
    # their own, and the users cannot open the store at all.
    for job in (j1, j2):
        up = subprocess.run([bin_, "upload", "--run", job.id, "--spool", str(lc.spool_root),
                             "--store", lc.env["LOGCAPTURE_STORE"]],
                            env=lc.env, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0 and "of 1 run(s)" in up.stderr, up.stderr
    out = lc.store_query(
        "from contextlib import nullcontext\n"
        "from logcapture.query import StoreReader\n"
        "from logcapture.search import Request\n"
        "for owner in (None, sys.argv[2], sys.argv[3]):\n"
        "    found = StoreReader(lambda: nullcontext(store), owner).search(\n"
        "        Request('NCCL timeout', jobs=tuple(sys.argv[4:])).to_dict())\n"
        "    print(json.dumps(sorted((g['run'], g['owner']) for g in found['groups'])))",
        U1, U2, j1.id, j2.id)
    everyone, one, two = (json.loads(x) for x in out.splitlines())
    assert everyone == sorted([[j1.id, U1], [j2.id, U2]])
    assert one == [[j1.id, U1]] and two == [[j2.id, U2]]
    r = lc.as_user(U1, [bin_, "search", "--store", lc.env["LOGCAPTURE_STORE"], "--source",
                        "store", "lcusertwo"])
    assert r.returncode in (1, 2) and "lcusertwo" not in r.stdout
