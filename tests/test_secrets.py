"""Text dropped by a mode is never written anywhere by logcapture (docs/user.md, "Modes"), so
no search finds it.

A real job prints secrets while logging is `disabled` (from .logoptin) or `metadata`, in every
shape the pipeline handles differently: plain lines, progress-bar redraws, repeated lines,
blank runs, an over-long line, stderr, a malformed /LOGCOMMAND, a printed Python dict. Then
everything logcapture wrote (the spool, compressed segments included, the embedded store
and the temporary folder it was given) is searched for the secrets, and the store is queried.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from helpers import lc

SECRETS = [f"S3CR3T-{i}-7f9c2d" for i in range(9)]

JOB = f"""
import sys
s = {SECRETS!r}
print(s[0])                                       # a plain line
for i in range(20):                               # a progress bar redrawn in place
    sys.stdout.write(f"\\r{{s[1]}} {{i}}/20"); sys.stdout.flush()
print()
for _ in range(5): print(s[2])                    # repeats -> would be a repeat note
print("\\n\\n\\n")                                # a blank run -> would be a blank note
print(s[3] + "x" * 70000)                         # longer than the line limit -> a cut note
print(s[4], file=sys.stderr)                      # stderr
print('/LOGCOMMAND {{"mode": "' + s[5] + '"}}')     # a malformed command naming a secret
print("{{'token': '" + s[6] + "'}}")              # a Python dict: not metadata
print('{{"visible_metric": 1.5}}')                # metadata: kept in metadata mode
print("/LOGCOMMAND {{bad json " + s[7])           # malformed JSON after the prefix
sys.stdout.write(s[8])                            # an unterminated last line
"""


def _walk_bytes(folder: Path) -> list[tuple[Path, bytes]]:
    out = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if path.suffix == ".gz":
                data += gzip.decompress(data)
            out.append((path, data))
    return out


@pytest.mark.parametrize("mode", ["disabled", "metadata"])
def test_secrets_never_reach_spool_store_temp_files_or_messages(
        lc_env: dict[str, str], tmp_path: Path, mode: str) -> None:
    optin = tmp_path / "logoptin"
    optin.write_text(f"mode: {mode}\n")
    optin.chmod(0o600)
    store_dir = tmp_path / "store"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(lc_env, LOGCAPTURE_OPTIN=str(optin), TMPDIR=str(tmpdir),
               LOGCAPTURE_STORE=f"chdb://{store_dir}")
    job = tmp_path / "job.py"  # a file: the command line is recorded, the output is not
    job.write_text(JOB)
    res = lc(["run", "--run-id", "secret-run", "--", sys.executable, str(job)], env)
    assert res.returncode == 0, res.stderr
    assert SECRETS[0].encode() in res.stdout  # the job's own output is untouched
    # logcapture's own messages on stderr: only the job's stderr line may hold a secret.
    own = [ln for ln in res.stderr.decode().splitlines() if ln.startswith("logcapture")]
    assert not [ln for ln in own if any(s in ln for s in SECRETS)]

    # never found by a search: neither in the spool (before the upload) nor in the store
    searches = [["search", "7f9c2d"], ["search", "--regex", "S3CR3T"],
                ["search", '"' + SECRETS[0] + '"', "-C", "5"]]
    for cmd in searches:
        found = lc(cmd, env)
        assert found.returncode == 1, (cmd, found.stdout, found.stderr)
        assert not [s for s in SECRETS if s.encode() in found.stdout + found.stderr]
    up = lc(["upload", "--run", "secret-run"], env)
    assert up.returncode == 0, up.stderr
    for cmd in searches:
        found = lc([*cmd, "--source", "store"], env)
        assert found.returncode == 1, (cmd, found.stdout, found.stderr)
    for cmd in (["logs", "secret-run"], ["show", "secret-run"], *searches,
                ["export", "secret-run", "--what", "lines", "--format", "ndjson"],
                ["export", "secret-run", "--what", "metadata", "--format", "ndjson"]):
        out = lc(cmd, env)
        text = (out.stdout + out.stderr).decode(errors="replace")
        assert not [s for s in SECRETS if s in text], (cmd, text)

    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    job.unlink()
    for folder in (spool, tmpdir, store_dir, tmp_path):
        for path, data in _walk_bytes(folder):
            leaked = [s for s in SECRETS if s.encode() in data]
            assert not leaked, f"{leaked} found in {path}"

    # The store's own view of every text column.
    import clickhouse_connect
    client = clickhouse_connect.get_client(dsn=f"chdb://{store_dir}")
    try:
        tables = [r[0] for r in client.query(
            "SELECT name FROM system.tables WHERE database = 'logcapture' "
            "AND engine LIKE '%MergeTree%'").result_rows]
        assert tables
        for table in tables:
            rows = client.query(f"SELECT * FROM logcapture.`{table}`").result_rows
            dump = repr(rows)
            assert not [s for s in SECRETS if s in dump], table
        if mode == "metadata":
            kept = client.query("SELECT count() FROM logcapture.metadata").result_rows
            assert kept[0][0] >= 1  # the metadata line itself is kept
    finally:
        client.close()
    assert not os.environ.get("LOGCAPTURE_STORE")  # nothing leaked into the test process


CROSS = """
import sys, time
secret = "CR0SS-" + "STREAM-51ab0e"  # split: the job file itself is not searched
print('/LOGCOMMAND {"mode": "disabled"}', flush=True)
time.sleep(0.3)
sys.stderr.write("in a bar: " + secret + "\\n"); sys.stderr.write("\\rbar 0"); sys.stderr.flush()
print('/LOGCOMMAND {"mode": "enabled"}', flush=True)  # right after: one read apart, or none
for k in range(1, 8):                                 # stderr never quiet for long
    sys.stderr.write(f"\\rbar {k}"); sys.stderr.flush(); time.sleep(0.1)
sys.stderr.write("\\n")
print("kept after the command", flush=True)
"""


def test_a_secret_on_one_stream_just_before_a_command_on_the_other_is_not_kept(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    # Two ptys, read a burst at a time: which of two lines on different streams came first
    # is not known to the reader. A line printed in disabled mode on stderr just before an
    # enabling command on stdout must still never be kept (classify.HOLD, and the other
    # stream's waiting lines committed before the command). An end-to-end guard: the orders
    # that used to leak are reproduced deterministically in test_pipeline and test_classify.
    secret = "CR0SS-STREAM-51ab0e"
    job = tmp_path / "cross.py"
    job.write_text(CROSS)
    res = lc(["run", "--run-id", "cross", "--", sys.executable, str(job)], lc_env)
    assert res.returncode == 0, res.stderr
    assert secret.encode() in res.stderr  # the job's own output is untouched
    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    found = [path for path, data in _walk_bytes(spool) if secret.encode() in data]
    assert not found
    logs = lc(["logs", "cross", "--stream", "all"], lc_env).stdout.decode()
    assert "kept after the command" in logs and secret not in logs


UNDER_LOAD = """
import os, subprocess, sys
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
try:
    for i in range(300):
        a, b = (1, 2) if i % 2 else (2, 1)   # the command on stdout, then on stderr
        os.write(a, b'/LOGCOMMAND {"mode": "disabled"}\\n')
        os.write(b, b"T0K" + b"EN-%d-c4f1\\n" % i)  # at once after it, on the other stream
        os.write(b, b'/LOGCOMMAND {"mode": "enabled"}\\n')  # its own stream: after the token
        os.write(1, (b"stdout filler %d\\n" % i) * (i % 7 * 30))
        os.write(2, (b"stderr filler %d\\n" % i) * (i % 5 * 30))
finally:
    for h in hogs:
        h.kill()
print("done", flush=True)
"""


def test_a_disabling_command_protects_the_other_streams_next_line_under_load(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    # Two ptys (stdout and stderr go to two pipes). 300 times: a disabling command on one
    # stream, then at once a token on the other, while two busy loops compete for the CPUs
    # and both streams carry bursts of filler. The token is read in the command's round or a
    # later one (the reader reads every pty until a pass finds output only on its first), and
    # the worker hands lines to the classifier in read order, the stricter command first in
    # its round: no token may be kept.
    store_dir = tmp_path / "store"
    env = dict(lc_env, LOGCAPTURE_STORE=f"chdb://{store_dir}")
    job = tmp_path / "load.py"
    job.write_text(UNDER_LOAD)
    res = lc(["run", "--run-id", "load", "--", sys.executable, str(job)], env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.endswith(b"done\n") and b"T0KEN-299-c4f1" in res.stdout + res.stderr
    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    job.unlink()
    found = [path for path, data in _walk_bytes(spool) if b"T0KEN-" in data]
    assert not found
    up = lc(["upload", "--run", "load", "--keep"], env)
    assert up.returncode == 0, up.stderr
    logs = lc(["logs", "load"], env).stdout.decode()
    assert "T0KEN-" not in logs
    assert logs.count(" filler ") > 100  # enabled again after each token (repeats noted)
    assert logs.count('/LOGCOMMAND {"mode": "disabled"}') == 300
    for path, data in _walk_bytes(store_dir):
        assert b"T0KEN-" not in data, path


# Printed by a job in mode enabled: each must be redacted everywhere logcapture keeps text.
HF_VALUE = "hf_" + "Zq9" * 11
DB_VALUE = "db-Pa55word-4c1e"
PRINTED = [HF_VALUE, DB_VALUE, "ghp_" + "Tk7m" * 9, "AKIAIOSFODNN7ZZQWERT", "Masked-At-Run-Time-9"]
REDACT_JOB = f"""
import base64, sys, urllib.parse
hf, db, gh, aws, masked = {PRINTED!r}
print("hf", hf); print("db", urllib.parse.quote(db), base64.b64encode(db.encode()).decode())
print("gh", gh, file=sys.stderr)
sys.stdout.write("bar " + aws + "\\r"); sys.stdout.write("bar " + aws + " done\\n")
print('{{"step": 1, "token": "' + hf + '"}}')
print('/LOGCOMMAND {{"mask": "' + masked + '"}}', file=sys.stderr)
print("now", masked)
print("-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAAB\\n"
      "-----END OPENSSH PRIVATE KEY-----")
"""


def test_secrets_a_job_prints_are_redacted_everywhere_and_counted(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    env = dict(lc_env, HF_TOKEN=HF_VALUE, DB_PASSWORD=DB_VALUE,
               LOGCAPTURE_STORE=f"chdb://{store_dir}")
    job = tmp_path / "job.py"
    job.write_text(REDACT_JOB)
    res = lc(["run", "--run-id", "redact-run", "--", sys.executable, str(job),
                  "--api-key", "sk-proj-" + "a" * 24], env)
    assert res.returncode == 0, res.stderr
    assert HF_VALUE.encode() in res.stdout and PRINTED[2].encode() in res.stderr  # untouched
    secrets = [*PRINTED, "b3BlbnNzaC1rZXktdjEAAAAAB", "a" * 24]
    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    job.unlink()
    for path, data in _walk_bytes(spool):
        assert not [s for s in secrets if s.encode() in data], path
    show = lc(["show", "redact-run", "--json"], env)
    info = json.loads(show.stdout)
    assert info["redactions"] >= 8, info["redactions_by_kind"]
    assert {"environment", "github", "aws", "mask", "private-key"} <= set(
        info["redactions_by_kind"])
    up = lc(["upload", "--run", "redact-run"], env)
    assert up.returncode == 0, up.stderr
    for cmd in (["logs", "redact-run", "--stream", "all"], ["show", "redact-run", "--json"],
                ["export", "redact-run", "--what", "lines", "--format", "ndjson"],
                ["export", "redact-run", "--what", "metadata", "--format", "ndjson"],
                ["search", "hf_"], ["ls", "--json"]):
        out = lc(cmd, env)
        text = (out.stdout + out.stderr).decode(errors="replace")
        assert not [s for s in secrets if s in text], (cmd, text)
    logs = lc(["logs", "redact-run", "--stream", "all"], env).stdout.decode()
    assert "hf ***" in logs and "now ***" in logs and "bar *** done" in logs
    for path, data in _walk_bytes(store_dir):
        assert not [s for s in secrets if s.encode() in data], path
