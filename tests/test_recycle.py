"""A long-lived process that takes turns on an embedded store starts afresh in place when the
engine has worn it (``store.engine_worn``, ``recycle.start_afresh``): the agent between
batches, the read service between clients on the socket it listens on. Each turn of chDB's
engine leaves threads and descriptors behind; without this, a busy agent would grow by them
every batch until the engine aborted it at the descriptor limit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logcapture import store as S
from logcapture.store import engine_turns, engine_worn

from .helpers import LOGCAPTURE
from .test_ship import make_run


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_each_turn_on_an_embedded_store_is_counted_and_wears_the_process(
        tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'store'}"
    before = engine_turns()
    for _ in range(3):
        with S.open_store(dsn) as st, S.open_store(dsn):  # a second client shares the turn
            st.runs()
    assert engine_turns() - before == 3
    assert engine_worn(since=before, turns=3)
    assert not engine_worn(since=before, turns=4)
    assert not engine_worn(since=engine_turns(), turns=1)  # no turn since: not worn


def _shipped(run_dir: Path) -> bool:
    cursor = run_dir / ".logcapture-cursor.json"
    return cursor.exists() and bool(json.loads(cursor.read_text()).get("shipped_at"))


def test_the_agent_starts_afresh_in_place_and_ships_everything(tmp_path: Path) -> None:
    """An agent worn after 2 turns ships 8 runs one after another (a turn or more each): it
    starts afresh several times, as the same process, whose threads stay bounded, and every
    line of every run is in the store once."""
    root, dsn = tmp_path / "spool", f"chdb://{tmp_path / 'store'}"
    root.mkdir()
    env = {**os.environ, "LOGCAPTURE_CONFIG": "/nonexistent", "LOGCAPTURE_ENGINE_TURNS": "2"}
    log = tmp_path / "agent.log"
    with log.open("w") as stderr:
        agent = subprocess.Popen([*LOGCAPTURE, "agent", "--spool", str(root), "--store", dsn,
                                  "--interval", "0.1", "--keep"], env=env, stderr=stderr)
    threads = []
    try:
        for i in range(8):
            rd = make_run(root, f"r{i}", 300)
            deadline = time.monotonic() + 60
            while not _shipped(rd):
                assert time.monotonic() < deadline and agent.poll() is None, log.read_text()
                time.sleep(0.05)
            time.sleep(0.5)  # a fresh start, if one comes after this batch, is under way
            threads.append(_threads(agent.pid))
        assert agent.poll() is None  # the same process throughout
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    err = log.read_text()
    assert agent.returncode == 0, err
    assert err.count("agent starting afresh after 2 turns on the embedded store") >= 3, err
    assert err.count("agent shipping") == err.count("agent starting afresh") + 1
    # Each turn leaves 5-7 threads: without a fresh start the agent grows batch after batch
    # (20 threads after the first batch, 73 after the eighth, measured with chDB 26.5).
    assert max(threads) <= threads[0] + 15, threads
    with S.open_store(dsn) as st:
        rows = st._query("SELECT run, count() FROM lines GROUP BY run ORDER BY run")
    assert rows == [(f"r{i}", 300) for i in range(8)]


def _ask(sock: Path, request: dict) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(sock))
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while chunk := s.recv(1 << 16):
            buf += chunk
    return [json.loads(x) for x in buf.splitlines()]


@pytest.mark.skipif(os.geteuid() != 0, reason="the read service answers as the peer's uid")
def test_the_read_service_starts_afresh_on_the_socket_it_listens_on(tmp_path: Path) -> None:
    """A read service worn after 2 turns: each question after another process took the store
    is a new turn; it starts afresh between clients, as the same process on the same socket
    (the listening socket handed over), and no question is refused or lost."""
    dsn, sock = f"chdb://{tmp_path / 'store'}", tmp_path / "reader.sock"
    with S.open_store(dsn):  # the schema
        pass
    env = {**os.environ, "LOGCAPTURE_CONFIG": "/nonexistent", "LOGCAPTURE_ENGINE_TURNS": "2"}
    proc = subprocess.Popen([*LOGCAPTURE, "reader", "serve", "--socket", str(sock),
                             "--store", dsn], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        inode = os.stat(sock).st_ino
        for _ in range(8):
            answer = _ask(sock, {"op": "runs"})
            assert answer and all("error" not in a for a in answer), answer
            with S.open_store(dsn, wait=30):  # another process's turn: the service lets go
                pass
            time.sleep(0.5)  # the service notices no client and starts afresh
        assert proc.poll() is None and os.stat(sock).st_ino == inode  # same process, socket
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert err.count("read service starting afresh after 2 turns") >= 2, err
    assert "read service stopped" in err


def test_the_page_server_keeps_the_store_between_clicks_and_lets_it_go_when_wanted(
        tmp_path: Path) -> None:
    """``logcapture serve`` on an embedded store: a pause between two questions does not
    close the store (each opening is a turn that wears the process); another process that
    waits for the store gets it within the releaser's next look."""
    from logcapture.query import LocalReader
    from logcapture.web.reads import IDLE_RELEASE, Pages

    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn):  # the schema
        pass
    now = [0.0]
    reader = LocalReader(tmp_path / "spool", dsn, source="store")
    pages = Pages(reader, clock=lambda: now[0])
    try:
        before = engine_turns()
        for _ in range(3):
            pages.runs()
            now[0] += 5.0  # a user reading the page
            pages.release_idle()
        assert engine_turns() - before == 1  # one turn for the three questions
        waiter = subprocess.Popen(
            [sys.executable, "-c", "import sys; from logcapture import store as S\n"
             f"with S.open_store({dsn!r}, wait=30): print('got it')"],
            stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while waiter.poll() is None:
            assert time.monotonic() < deadline
            pages.release_idle()  # as the server's releaser does every second
            time.sleep(0.2)
        assert waiter.communicate()[0] == "got it\n"
        now[0] += IDLE_RELEASE + 1  # a long pause lets it go too
        pages.runs()
        pages.release_idle()
        assert engine_turns() - before == 2
        now[0] += IDLE_RELEASE + 1
        pages.release_idle()
        assert not reader.held._store
    finally:
        pages.close()


def test_the_page_server_starts_afresh_on_the_same_address_and_token(tmp_path: Path) -> None:
    """``logcapture serve`` worn after 2 turns (each page read after another process took the
    store is one): it starts afresh when no connection is open, as the same process, on the
    same port with the same token, and every request is answered."""
    import httpx

    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn):  # the schema
        pass
    env = {**os.environ, "LOGCAPTURE_CONFIG": "/nonexistent", "LOGCAPTURE_ENGINE_TURNS": "2",
           "XDG_STATE_HOME": str(tmp_path / "state")}
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen([*LOGCAPTURE, "serve", "--spool", str(tmp_path / "spool"),
                                 "--store", dsn, "--port", "0", "--no-browser"], env=env,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        base, token = url.split("/?token=")
        for _ in range(6):
            answer = httpx.get(base + "/api/runs", params={"token": token}, timeout=30)
            assert answer.status_code == 200, (answer.text, log.read_text())
            with S.open_store(dsn, wait=30):  # another process's turn: the page lets go
                pass
            time.sleep(1.5)  # no connection open: a worn server starts afresh
        assert proc.poll() is None  # the same process throughout
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        more = proc.stdout.read() if proc.stdout is not None else ""
        if proc.stdout is not None:
            proc.stdout.close()
    err = log.read_text()
    assert err.count("logcapture serve: starting afresh after 2 turns") >= 2, err
    assert more == ""  # the URL was given once


@pytest.mark.skipif(os.geteuid() != 0, reason="the read service answers as the peer's uid")
def test_a_follow_through_the_read_service_goes_on_across_its_fresh_starts(
        tmp_path: Path) -> None:
    """``logs -f`` of a running run through a read service worn after 2 turns: the service
    starts afresh while the follower is connected (only followers are), the follow resumes
    from its last record, and every line is printed once, in order."""
    from logcapture.records import End, Line, Start

    dsn, sock = f"chdb://{tmp_path / 'store'}", tmp_path / "reader.sock"
    me = S.Identity(run="live", user="root", uid=0, job_id="")
    t0 = time.time() - 60

    def ship(recs: list) -> None:
        with S.open_store(dsn, wait=30) as st:  # a turn of this process: the service lets go
            st.insert_records(recs, me)

    ship([Start(run="live", stream="run", seq=0, ts=t0, command=["train.py"], user="root",
                uid=0, host="n1")])
    env = {**os.environ, "LOGCAPTURE_CONFIG": "/nonexistent", "LOGCAPTURE_ENGINE_TURNS": "2"}
    log = tmp_path / "reader.log"
    with log.open("w") as stderr:
        service = subprocess.Popen([*LOGCAPTURE, "reader", "serve", "--socket", str(sock),
                                    "--store", dsn], env=env, stderr=stderr)
    follow = None
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and service.poll() is None
            time.sleep(0.05)
        follow = subprocess.Popen([*LOGCAPTURE, "logs", "-f", "live"],
                                  env={**env, "LOGCAPTURE_READER_SOCKET": str(sock)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for batch in range(6):
            ship([Line(run="live", stream="stdout", seq=i, ts=t0 + i, text=f"line {i}")
                  for i in range(batch * 10, batch * 10 + 10)])
            time.sleep(1.5)
        ship([End(run="live", stream="run", seq=1, ts=t0 + 61, exit_status=0,
                  state="COMPLETED", duration=61.0, counts={"stdout": {"lines": 60}})])
        out, err = follow.communicate(timeout=90)
        assert service.poll() is None  # the same process throughout
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.communicate()
        service.terminate()
        service.wait(timeout=60)
    assert follow.returncode == 0, err
    assert out.splitlines() == [f"line {i}" for i in range(60)], err
    assert log.read_text().count("read service starting afresh after 2 turns") >= 2


def test_a_follower_takes_its_turns_on_an_embedded_store_in_a_helper_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``HeldStore.take_turns`` on an embedded store: each read is a turn in a helper process
    (``store.turns``), started afresh once the engine has worn it; this process starts the
    engine no more, and what the helper raises is raised here as itself."""
    from logcapture.errors import NotFound
    from logcapture.query.held_store import HeldStore, Reopened
    from logcapture.records import Line, Start

    dsn = f"chdb://{tmp_path / 'store'}"
    me = S.Identity(run="r1", user="root", uid=0, job_id="")
    with S.open_store(dsn) as st:
        st.insert_records([Start(run="r1", stream="run", seq=0, ts=1e9, command=["x"],
                                 user="root", uid=0, host="n1")], me)
    monkeypatch.setenv("LOGCAPTURE_ENGINE_TURNS", "2")
    held = HeldStore(dsn)
    held.take_turns()
    session = Reopened(held)
    before = engine_turns()
    try:
        for i in range(6):
            with S.open_store(dsn, wait=30) as st:  # the shipper's turn in between
                st.insert_records([Line(run="r1", stream="stdout", seq=i, ts=1e9 + i,
                                        text=f"line {i}")], me)
            with session() as st:
                assert [d["text"] for d in st.lines("r1")] == [f"line {n}" for n in range(i + 1)]
        with pytest.raises(NotFound), session() as st:
            st.resolve_run("nothing-like-it")
        assert engine_turns() - before == 6  # the shipper's here, none of the reads
        assert held._far is not None and held._far.helpers >= 3  # worn after 2 turns each
    finally:
        held.close()
    assert held._far._proc is None


def test_logs_follow_straight_from_an_embedded_store_does_not_grow_by_its_turns(
        tmp_path: Path) -> None:
    """``logs -f`` of a running run read straight from an embedded store (no read service):
    every line once, in order, while its threads stay bounded (each turn in its own process
    would leave 5-7 behind: its helper takes them, and starts afresh when worn)."""
    from logcapture.records import End, Line, Start

    dsn = f"chdb://{tmp_path / 'store'}"
    me = S.Identity(run="live", user="root", uid=0, job_id="")
    t0 = time.time() - 60

    def ship(recs: list) -> None:
        with S.open_store(dsn, wait=30) as st:
            st.insert_records(recs, me)

    ship([Start(run="live", stream="run", seq=0, ts=t0, command=["train.py"], user="root",
                uid=0, host="n1")])
    env = {**os.environ, "LOGCAPTURE_CONFIG": "/nonexistent", "LOGCAPTURE_ENGINE_TURNS": "2"}
    follow = subprocess.Popen([*LOGCAPTURE, "logs", "-f", "live", "--store", dsn],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    threads = []
    try:
        for batch in range(6):
            ship([Line(run="live", stream="stdout", seq=i, ts=t0 + i, text=f"line {i}")
                  for i in range(batch * 10, batch * 10 + 10)])
            time.sleep(1.5)
            threads.append(_threads(follow.pid))
        ship([End(run="live", stream="run", seq=1, ts=t0 + 61, exit_status=0,
                  state="COMPLETED", duration=61.0, counts={"stdout": {"lines": 60}})])
        out, err = follow.communicate(timeout=90)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert follow.returncode == 0, err
    assert out.splitlines() == [f"line {i}" for i in range(60)], err
    assert max(threads) <= threads[0] + 3, threads


def test_a_follower_whose_helper_dies_is_told_and_its_next_turn_starts_another(
        tmp_path: Path) -> None:
    """A helper killed between two questions: the question raises StoreUnavailable (not a
    broken pipe, which the CLI takes for a reader that left and ends quietly), the store it
    had open is gone with it, and the next turn is answered by a new helper."""
    from logcapture.errors import StoreUnavailable
    from logcapture.query.held_store import HeldStore

    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn) as st:
        st.runs()
    held = HeldStore(dsn)
    held.take_turns()
    try:
        with held() as st:
            assert st.runs() == [] and st.dsn == dsn
            with pytest.raises(AttributeError):
                st.client  # noqa: B018 - only the Store's methods are answered there
        assert held._far is not None and held._far._proc is not None
        held._far._proc.kill()
        held._far._proc.wait()
        with pytest.raises(StoreUnavailable, match="helper process ended"), held() as st:
            st.runs()
        held.release()  # the follower's next round: the old helper's store is let go
        with held() as st:
            assert st.runs() == []
        assert held._far.helpers == 2
    finally:
        held.close()
