"""The store commands end to end, run as the real command (``helpers.lc``) against the real
embedded engine: `upload` (exit codes and messages), `ls`/`logs`/`show` from the store,
`export`, `db init`, and the `agent` command as a process stopped with TERM."""

from __future__ import annotations

import json
import os
import pwd
import socket
import time
from pathlib import Path

import pytest
from helpers import LOGCAPTURE, agent_until_shipped, lc

from logcapture import store as S
from logcapture.records import End, Line, Metadata, Note, Start
from logcapture.spool.layout import create_run_dir, segments
from logcapture.spool.writer import SpoolWriter

T0 = time.time()


def make_run(root: Path, run: str, n: int = 30, extra: bytes = b"") -> Path:
    rd = create_run_dir(root, run)
    w = SpoolWriter(rd, fsync=False, segment_bytes=2048)
    w.write([Start(run=run, stream="run", seq=0, ts=T0, command=["python", "train.py"],
                   user=pwd.getpwuid(os.getuid()).pw_name, uid=os.getuid(), host="n1")])
    w.write([Line(run=run, stream="stdout", seq=i, ts=T0 + i / 1000, text=f"step {i}")
             for i in range(n)])
    w.write([Note(run=run, stream="stdout", seq=n, ts=T0 + 1, note="repeat", count=4,
                  text="4 repeats"),
             Metadata(run=run, stream="stdout", seq=n + 1, ts=T0 + 2,
                      fields={"epoch": 1, "loss": 0.5}),
             Metadata(run=run, stream="stdout", seq=n + 2, ts=T0 + 3,
                      fields={"epoch": 2, "loss": 0.25}),
             Line(run=run, stream="stderr", seq=0, ts=T0 + 4, text="warning: x")])
    w.flush()
    if extra:
        with open(segments(rd)[-1].path, "ab") as f:
            f.write(extra)
    w.write([End(run=run, stream="run", seq=1, ts=T0 + 5, exit_status=0, state="COMPLETED",
                 duration=5.0, counts={"stdout": {"lines": n}, "stderr": {"lines": 1}})])
    w.close()
    return rd


@pytest.fixture(scope="module")
def store_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb://{tmp_path_factory.mktemp('clistore') / 'store'}"


@pytest.fixture
def env(tmp_path: Path, store_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOGCAPTURE_STORE", store_dsn)
    monkeypatch.setenv("LOGCAPTURE_CONFIG", str(tmp_path / "no-config.yaml"))
    root = tmp_path / "spool"
    root.mkdir()
    # The commands' default spool is this one, never the invoking user's own (whose runs
    # would be read as this test's: `latest` is the newest run of the spool and the store).
    monkeypatch.setenv("LOGCAPTURE_SPOOL", str(root))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return root


def test_upload_then_logs_show_from_store_equal_spool(env: Path) -> None:
    make_run(env, "cli1")
    code, _, err = lc(["upload", "--spool", str(env), "--keep"], text=True)
    assert code == 0, err
    assert "shipped 36 records" in err and "of 1 run(s)" in err
    for args in (["logs", "cli1"], ["logs", "cli1", "--stream", "stdout"]):
        spool = lc([*args, "--spool", str(env), "--source", "spool"], text=True)
        store = lc([*args, "--spool", str(env), "--source", "store"], text=True)
        auto = lc([*args, "--spool", str(env)], text=True)
        assert spool[0] == store[0] == 0
        assert spool[1] == store[1] == auto[1]
        assert "step 29" in store[1]
    s_spool = json.loads(lc(["show", "cli1", "--json", "--spool", str(env),
                            "--source", "spool"], text=True)[1])
    s_store = json.loads(lc(["show", "cli1", "--json", "--spool", str(env),
                            "--source", "store"], text=True)[1])
    assert s_store.pop("stored_in").startswith("chdb://") and s_spool.pop("stored_in") is None
    assert s_spool == s_store


def test_upload_exit_codes_and_messages(env: Path,
                                        store_dsn: str) -> None:
    make_run(env, "cli2")
    assert lc(["upload", "cli2", "--spool", str(env), "--keep"], text=True)[0] == 0
    code, _, err = lc(["upload", "--run", "cli2", "--spool", str(env)], text=True)
    assert code == 2
    assert "logcapture: error: run cli2 was already uploaded on" in err
    assert "Pass --force to re-upload." in err
    code, _, err = lc(["upload", "--all", "--spool", str(env)], text=True)
    assert code == 0 and "1 already shipped" in err
    code, _, err = lc(["upload", "--run", "cli2", "--force", "--spool", str(env)], text=True)
    assert code == 0 and "shipped 36 records" in err
    code, _, err = lc(["upload", "--run", "cli2", "--all", "--spool", str(env)], text=True)
    assert code == 2 and "mutually exclusive" in err
    code, _, err = lc(["upload", "--run", "nope", "--spool", str(env)], text=True)
    assert code == 2 and "no run 'nope'" in err
    assert "shipped" not in err  # a failure that shipped nothing says only what failed
    # corrupt lines: skipped, counted, reported; exit 1
    make_run(env, "cli3", extra=b"not json at all\n")
    code, _, err = lc(["upload", "cli3", "--spool", str(env)], text=True)
    assert code == 1
    assert "corrupt line skipped" in err and "1 corrupt line(s) skipped" in err
    # unreachable server: exit 2, spool kept, a later upload ships it
    make_run(env, "cli4")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = lc(["upload", "cli4", "--spool", str(env), "--timeout", "0.5",
                      "--store", f"http://u:pw@127.0.0.1:{port}/logcapture"], text=True)
    assert code == 2 and "gave up after" in err and "pw" not in err
    assert segments(env / "cli4")
    assert lc(["upload", "cli4", "--spool", str(env)], text=True)[0] == 0


def test_ls_and_logs_after_the_spool_is_gone(env: Path) -> None:
    make_run(env, "gone1")
    code, _, err = lc(["upload", "gone1", "--spool", str(env), "--retention-days", "0"], text=True)
    assert code == 0 and not segments(env / "gone1")
    code, out, _ = lc(["ls", "--spool", str(env)], text=True)
    row = [ln for ln in out.splitlines() if ln.startswith("gone1")]
    assert row and row[0].split()[1:3] == ["python", "COMPLETED"]
    code, out, _ = lc(["logs", "gone1", "--spool", str(env)], text=True)
    assert code == 0 and out.splitlines()[0] == "step 0"
    code, out, _ = lc(["ls", "--json", "--spool", str(env)], text=True)
    assert any(json.loads(x)["run"] == "gone1" for x in out.splitlines())


def test_export_formats(env: Path, tmp_path: Path) -> None:
    make_run(env, "exp1")
    assert lc(["upload", "exp1", "--spool", str(env), "--keep"], text=True)[0] == 0
    code, out, err = lc(["export", "exp1", "--what", "metadata", "--format", "csv"], text=True)
    assert code == 0, err
    assert out.splitlines()[0] == '"ts","seq","epoch","loss"' and len(out.splitlines()) == 3
    dest = tmp_path / "m.parquet"
    code, _, err = lc(["export", "exp1", "--format", "parquet", "-o", str(dest)], text=True)
    assert code == 0 and "2 metadata row(s)" in err
    with S.open_store() as st:  # the engine reads the file back
        assert st.client.query("SELECT loss FROM file({p:String}, 'Parquet')",
                               parameters={"p": str(dest)}).result_columns == [[0.5, 0.25]]
    dest = tmp_path / "l.ndjson"
    assert lc(["export", "exp1", "--what", "lines", "--format", "ndjson", "-o",
              str(dest)], text=True)[0] == 0
    rows = [json.loads(x) for x in dest.read_text().splitlines()]
    assert [r["text"] for r in rows[:2]] == ["step 0", "step 1"]
    code, _, err = lc(["export", "nope", "--what", "lines"], text=True)
    assert code == 1 and "not in the store" in err
    missing = tmp_path / "no-such-dir" / "f.csv"
    code, _, err = lc(["export", "exp1", "-o", str(missing)], text=True)
    assert code == 2 and f"-o {missing}: No such file or directory" in err
    assert ".tmp" not in err


def test_export_of_an_unshipped_run_without_a_store(env: Path, tmp_path: Path) -> None:
    """No store at all: the run is read from the spool and an in-memory engine writes the
    file, with the same columns and types as from the store."""
    make_run(env, "exp-spool")
    nowhere = f"chdb://{tmp_path / 'never-made'}"
    dest = tmp_path / "s.parquet"
    code, _, err = lc(["export", "exp-spool", "--spool", str(env), "--store", nowhere,
                      "--format", "parquet", "-o", str(dest)], text=True)
    assert code == 0 and "2 metadata row(s)" in err, err
    assert not (tmp_path / "never-made").exists()
    with S.open_store() as st:
        described = st.client.query("DESCRIBE file({p:String}, 'Parquet')",
                                    parameters={"p": str(dest)}).result_rows
        assert [(r[0], r[1]) for r in described] == [
            ("ts", "Nullable(Float64)"), ("seq", "Nullable(Int64)"),
            ("epoch", "Nullable(Int64)"), ("loss", "Nullable(Float64)")]
        assert st.client.query("SELECT epoch, loss FROM file({p:String}, 'Parquet')",
                               parameters={"p": str(dest)}).result_rows == [(1, 0.5), (2, 0.25)]
    code, out, err = lc(["export", "exp-spool", "--spool", str(env), "--store", nowhere,
                        "--what", "lines", "--format", "ndjson"], text=True)
    assert code == 0, err
    rows = [json.loads(x) for x in out.splitlines()]
    assert rows[0] == {"line": 1, "ts": T0, "stream": "stdout", "seq": 0, "kind": "line",
                       "text": "step 0"}


def test_export_latest_and_slurm_job_id(env: Path,
                                        tmp_path: Path) -> None:
    """RUN is what the other commands take: `latest` and a Slurm job id too."""
    rd = create_run_dir(env, "exp-newest")
    w = SpoolWriter(rd, fsync=False)
    late = T0 + 10_000_000  # the newest run of this store
    w.write([Start(run="exp-newest", stream="run", seq=0, ts=late, command=["x"],
                   slurm={"job_id": "424242", "cluster": "c1"}),
             Line(run="exp-newest", stream="stdout", seq=0, ts=late + 1, text="newest line"),
             End(run="exp-newest", stream="run", seq=1, ts=late + 2, state="COMPLETED")])
    w.close()
    assert lc(["upload", "exp-newest", "--spool", str(env), "--keep"], text=True)[0] == 0
    for ref in ("latest", "424242", "exp-newest"):
        code, out, err = lc(["export", ref, "--what", "lines", "--format", "ndjson"], text=True)
        assert code == 0, (ref, err)
        assert [json.loads(x)["text"] for x in out.splitlines()] == ["newest line"], ref
        assert "run exp-newest" in err


def test_db_init(env: Path) -> None:
    code, _, err = lc(["db", "init", "--ttl-days", "3650"], text=True)
    assert code == 0 and f"schema version {S.SCHEMA_VERSION}" in err and "TTL 3650 days" in err
    code, _, err = lc(["db", "init", "--ttl-days", "0"], text=True)
    assert code == 0
    code, _, err = lc(["db", "init", "--row-policies"], text=True)
    assert code == 2 and "row policies need a ClickHouse server" in err


def test_db_init_takes_the_ttl_from_the_admin_config(env: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("LOGCAPTURE_CONFIG", str(config))
    try:
        config.write_text("store_ttl_days: 3650\n")
        code, _, err = lc(["db", "init"], text=True)
        assert code == 0 and "TTL 3650 days" in err, err
        config.write_text("retention_days: 3651\n")  # its old name, still read
        code, _, err = lc(["db", "init"], text=True)
        assert code == 0 and "TTL 3651 days" in err, err
        config.write_text("cluster: c\n")  # none: the TTL is left as it is
        code, _, err = lc(["db", "init"], text=True)
        assert code == 0 and "TTL" not in err, err
    finally:
        assert lc(["db", "init", "--ttl-days", "0"])[0] == 0  # the module's store


def test_agent_command_ships_and_exits_on_term(env: Path, store_dsn: str) -> None:
    rd = make_run(env, "agent1", n=500)
    code, first, err = agent_until_shipped(
        [*LOGCAPTURE, "agent", "--spool", str(env), "--interval", "0.1", "--keep"],
        {**os.environ, "LOGCAPTURE_STORE": store_dsn, "LOGCAPTURE_CONFIG": "/nonexistent"}, rd)
    assert "agent shipping" in first and code == 0, err
    assert "agent stopped: 506 records shipped" in err
    code, out, _ = lc(["logs", "agent1", "--spool", str(env), "--source", "store"], text=True)
    # the lines, the note, the two metadata records (no printed line of theirs), stderr
    assert code == 0 and len(out.splitlines()) == 500 + 4
    assert segments(rd)  # --keep: the spool segments stay
