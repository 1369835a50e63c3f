"""The CLI end to end: run, ls, logs (and --follow), show; help and docs for every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click
from helpers import LOGCAPTURE, lc

from logcapture.cli import cli

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _all_commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix}{name}"
        out.append((full, cmd))
        if isinstance(cmd, click.Group):
            out += _all_commands(cmd, full + " ")
    return out


def test_every_command_has_help_and_is_documented() -> None:
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    for name, cmd in _all_commands(cli):
        assert cmd.help and cmd.help.strip(), f"`logcapture {name}` has no help text"
        res = lc([*name.split(), "--help"], text=True)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith(f"Usage: logcapture {name} ")
        assert f"logcapture {name}" in docs, f"`logcapture {name}` is missing from docs/"


def test_only_the_cli_package_main_turns_errors_into_exit_codes() -> None:
    # The commands raise; cli.main alone catches LogcaptureError and says it (errors.failure).
    import ast

    import logcapture.cli

    package = Path(logcapture.cli.__file__).parent
    catching = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            caught = node.type if isinstance(node, ast.ExceptHandler) else None
            names = {n.id for n in ast.walk(caught) if isinstance(n, ast.Name)} if caught else set()
            if "LogcaptureError" in names or isinstance(node, ast.Call) and getattr(
                    node.func, "id", None) == "failure":
                catching.append(path.name)
    assert catching and set(catching) == {"__init__.py"}, catching


def test_run_then_ls_logs_show(lc_env: dict[str, str]) -> None:
    script = ("import sys\n"
              "for i in range(11): sys.stdout.write(f'\\rprogress {i*10}%'); sys.stdout.flush()\n"
              "print()\n"
              "for _ in range(4): print('same line')\n"
              "print('to stderr', file=sys.stderr)\n"
              "print('{\"epoch\": 1, \"loss\": 0.5}')\n")
    res = lc(["run", "--run-id", "demo-1", "--", sys.executable, "-c", script], lc_env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(b"\rprogress 0%\rprogress 10%")  # raw bytes, untouched

    ls = lc(["ls"], lc_env)
    assert ls.returncode == 0
    row = [ln for ln in ls.stdout.decode().splitlines() if ln.startswith("demo-1")]
    name = Path(sys.executable).name
    assert row and row[0].split()[:4] == ["demo-1", name, "COMPLETED", "0"]
    for command in ("ls", "logs", "show"):  # a job that is not there: the same error
        missing = lc([command, "99999"], lc_env)
        assert (missing.returncode, missing.stdout) == (1, b""), command
        assert missing.stderr.startswith(b"logcapture: error: no job or run '99999' of yours")

    logs = lc(["logs", "demo-1", "--stream", "stdout"], lc_env).stdout.decode()
    assert logs.splitlines() == [
        "progress 100%",
        "same line",
        "[logcapture: previous line repeated 3 more times, dropped]",
        '{"epoch": 1, "loss": 0.5}',
    ]
    err = lc(["logs", "demo-1", "--stream", "stderr"], lc_env).stdout.decode()
    assert err.splitlines() == ["to stderr"]

    show = json.loads(lc(["show", "demo-1", "--json"], lc_env).stdout)
    assert show["state"] == "COMPLETED"
    assert show["lines"] == {"stdout": 3, "stderr": 1}
    assert show["dropped_repetitions"]["stdout"] == 3
    assert show["metadata_keys"] == ["epoch", "loss"]
    assert show["uid"] == os.getuid() and show["exit_status"] == 0
    assert isinstance(show["duration"], float) and isinstance(show["start"], float)
    text = lc(["show", "demo-1"], lc_env).stdout.decode().splitlines()
    assert "lines:               3 stdout, 1 stderr" in text
    assert any(ln.startswith("duration:") and ln.endswith(" s") for ln in text)


def test_a_slurm_job_id_is_the_run_id(lc_env: dict[str, str]) -> None:
    env = dict(lc_env, SLURM_JOB_ID="4242", SLURM_CLUSTER_NAME="test")
    assert lc(["run", "--", "echo", "hello"], env).returncode == 0
    assert lc(["logs", "4242"], lc_env).stdout == b"hello\n"
    show = json.loads(lc(["show", "4242", "--json"], lc_env).stdout)
    assert show["slurm"] == {"cluster": "test", "job_id": "4242"}
    assert show["job"] == "4242"


def test_logs_follow_tails_a_live_run(lc_env: dict[str, str]) -> None:
    live = subprocess.Popen(
        [*LOGCAPTURE, "run", "--run-id", "live", "--", sys.executable, "-c",
         "import time; print('first', flush=True); time.sleep(2); print('second')"],
        env=lc_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    deadline = time.time() + 20
    # a run is a directory with a segment: the worker opens its first one a moment after the
    # wrapper made the directory
    while not any((spool / "live").glob("seg-*")) and time.time() < deadline:
        time.sleep(0.05)
    follow = subprocess.run([*LOGCAPTURE, "logs", "--follow", "live"], env=lc_env,
                            capture_output=True, timeout=60)
    live.wait(timeout=30)
    assert follow.returncode == 0
    assert follow.stdout.decode().splitlines() == ["first", "second"]


def test_errors_are_one_line_and_nonzero(lc_env: dict[str, str]) -> None:
    res = lc(["logs", "no-such-run"], lc_env)
    assert res.returncode == 1
    assert res.stderr.decode().strip().startswith("logcapture: error: no run 'no-such-run'")
    res = lc(["run", "--run-id", "../evil", "--", "true"], lc_env)
    assert res.returncode == 0  # the command still ran; capture was refused with a warning
    assert b"invalid run id" in res.stderr


def test_a_reused_run_id_still_runs_the_command(lc_env: dict[str, str]) -> None:
    assert lc(["run", "--run-id", "dup", "--", "true"], lc_env).returncode == 0
    res = lc(["run", "--run-id", "dup", "--", "sh", "-c", "echo again; exit 5"], lc_env)
    assert res.returncode == 5 and res.stdout == b"again\n"
    assert b"already exists" in res.stderr


def test_a_line_followed_by_silence_reaches_the_spool_while_the_job_waits(
        lc_env: dict[str, str]) -> None:
    # A printed line reaches the spool within 1 s when the job then stays quiet. No
    # clock is asserted: the job prints, then waits (up to 20 s) until the line is in the spool,
    # and says whether it got there before it gave up. Default flush settings.
    lc_env.pop("LOGCAPTURE_FLUSH_INTERVAL")
    spool = Path(lc_env["LOGCAPTURE_SPOOL"])
    probe = (
        "import gzip, pathlib, sys, time\n"
        f"run = pathlib.Path({str(spool)!r}) / 'quiet'\n"
        "print('hello, spool', flush=True)\n"
        "deadline = time.time() + 20\n"
        "while time.time() < deadline:\n"
        "    data = b''.join(p.read_bytes() for p in run.glob('seg-*.ndjson'))\n"
        "    if b'hello, spool' in data:\n"
        "        print('seen while waiting', file=sys.stderr); break\n"
        "    time.sleep(0.05)\n")
    res = lc(["run", "--run-id", "quiet", "--", sys.executable, "-c", probe], lc_env)
    assert res.returncode == 0
    assert b"seen while waiting" in res.stderr


def test_ls_and_logs_read_the_slurm_layout_of_the_admins_spool_root(
        lc_env: dict[str, str], tmp_path: Path) -> None:
    # Under the admin's spool root a job's runs sit one level down: ROOT/JOB/RUN.
    from logcapture.records import Line, Start
    from logcapture.spool.layout import create_run_dir
    from logcapture.spool.writer import SpoolWriter

    root = tmp_path / "slurm-spool"
    run_dir = create_run_dir(root / "77", "77")
    w = SpoolWriter(run_dir)
    w.write([Start(run="77", stream="run", seq=0, ts=1.0, command=["job.sh"],
                   slurm={"job_id": "77"}),
             Line(run="77", stream="stdout", seq=0, ts=1.0, text="from the job")])
    w.close()
    ls = lc(["ls", "--spool", str(root)], lc_env)
    assert any(ln.startswith("77 ") for ln in ls.stdout.decode().splitlines()), ls.stdout
    logs = lc(["logs", "77", "--spool", str(root), "--source", "spool"], lc_env)
    assert logs.stdout == b"from the job\n", logs.stderr


def test_logs_of_a_metadata_mode_run_shows_its_metadata_lines(lc_env: dict[str, str]) -> None:
    # In mode metadata the metadata record is the only trace of the line: logs shows it.
    res = lc(["run", "--run-id", "meta-1", "--no-sample", "--mode", "metadata", "--",
                  "sh", "-c", 'echo \'{"loss": 1}\'; echo hidden'], lc_env)
    assert res.returncode == 0, res.stderr
    logs = lc(["logs", "meta-1"], lc_env)
    assert (logs.returncode, logs.stdout) == (0, b'{"loss":1}\n'), logs.stderr


def test_logs_shows_what_the_job_page_and_grafana_show(lc_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    """``logs`` prints the log view (logview.py) the page reads: a metadata line logged once
    while the mode is enabled, the mode change once, metadata alone after it; the same from
    the spool and, once shipped, from the store."""
    from contextlib import closing

    from logcapture.query import LocalReader

    job = ('echo \'{"a": 1}\'; echo \'/LOGCOMMAND {"mode": "metadata"}\'; echo hidden; '
           'echo \'{"b": 2}\'; echo oops >&2')
    res = lc(["run", "--run-id", "view-1", "--no-sample", "--", "sh", "-c", job], lc_env)
    assert res.returncode == 0, res.stderr
    with closing(LocalReader(Path(lc_env["LOGCAPTURE_SPOOL"]), source="spool")) as reader:
        page = [e["text"] for e in reader.log("view-1", stderr=True)["entries"]]
    assert page[0] == '{"a": 1}' and page[-1] == '{"b":2}' and page.count('{"a": 1}') == 1
    assert len([t for t in page if "mode changed" in t]) == 1 and "hidden" not in page
    logs = lc(["logs", "view-1", "--source", "spool"], lc_env)
    assert logs.stdout.decode().splitlines() == page, logs.stderr
    lc_env = {**lc_env, "LOGCAPTURE_STORE": f"chdb://{tmp_path / 'store'}"}
    assert lc(["upload", "view-1"], lc_env).returncode == 0
    logs = lc(["logs", "view-1", "--source", "store"], lc_env)
    assert logs.stdout.decode().splitlines() == page, logs.stderr


def test_ls_json_of_a_start_record_without_optional_fields(tmp_path: Path) -> None:
    """A start record that leaves out its optional fields (an older or hand-made spool) gets
    their defaults, which ``ls --json`` still writes as JSON."""
    from logcapture.spool.layout import create_run_dir

    run_dir = create_run_dir(tmp_path, "bare")
    (run_dir / "seg-000000.ndjson").write_text(
        '{"kind":"start","run":"bare","stream":"run","seq":0,"ts":1.5}\n')
    run_dir = create_run_dir(tmp_path, "nulls")
    (run_dir / "seg-000000.ndjson").write_text(
        '{"kind":"start","run":"nulls","stream":"run","seq":0,"ts":2.5,"command":null,'
        '"slurm":null}\n')
    res = lc(["ls", "--spool", str(tmp_path), "--json",
              "--store", "chdb://" + str(tmp_path / "no-store")], text=True)
    assert res.returncode == 0, res.stderr
    rows = {r["run"]: r for r in map(json.loads, res.stdout.splitlines())}
    for run in ("bare", "nulls"):
        assert rows[run]["command"] == [] and rows[run]["slurm"] == {}


def test_an_unknown_option_of_run_is_an_error_not_a_command(lc_env: dict[str, str]) -> None:
    # Before `--` and before the command's name, an option word is run's own; after either,
    # it is the command's (so `run -- --bogus` runs a program named --bogus).
    res = lc(["run", "--bogus", "--", "true"], lc_env)
    assert res.returncode == 2
    # One line, as every error of the CLI (docs/cli.md), naming the help to read.
    assert res.stderr == (b"logcapture: error: No such option '--bogus'. "
                          b"(see 'logcapture run --help')\n")
    res = lc(["run", "--mdoe", "enabled", "--", "true"], lc_env)
    assert res.returncode == 2 and b"Did you mean '--mode'?" in res.stderr
    res = lc(["run", "--", "--bogus"], lc_env)
    assert res.returncode == 127 and b"--bogus" in res.stderr
    res = lc(["run", "--mode", "enabled", "--no-sample", "echo", "-x", "--bogus"], lc_env)
    assert res.returncode == 0 and res.stdout.replace(b"\r", b"") == b"-x --bogus\n"
    res = lc(["run", "--mode=enabled", "--spool", lc_env["LOGCAPTURE_SPOOL"], "--",
                  "echo", "ok"], lc_env)
    assert res.returncode == 0 and res.stdout.strip() == b"ok"


def test_usage_errors_are_one_line(lc_env: dict[str, str]) -> None:
    for args, said in [(["lss"], b"No such command 'lss'. Did you mean 'ls'?"),
                       (["logs", "--bogus"], b"No such option '--bogus'."),
                       (["run"], b"Missing argument 'COMMAND...'.")]:
        res = lc(args, lc_env)
        assert res.returncode == 2, args
        assert res.stderr.startswith(b"logcapture: error: " + said), res.stderr
        assert res.stderr.count(b"\n") == 1, res.stderr
