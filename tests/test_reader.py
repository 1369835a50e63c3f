"""The read service without Slurm: run in this process on a temporary socket, over a real
embedded store, asked by clients running as the real test users (so the kernel's SO_PEERCRED
names them), by hand-made requests, and by clients that misbehave."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Ran, lc

from logcapture import store as S
from logcapture.errors import NotFound, ServiceUnavailable
from logcapture.reader.client import ServiceReader, service_socket
from logcapture.reader.server import Caller, ReadService, caller_of_uid
from logcapture.reader.sessions import EmbeddedTurns
from logcapture.records import End, Line, Metadata, Sample, Start

USERS = ("lcuser1", "lcuser2")
T0 = 1_790_000_000.25


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (clients run as the test users)"
    for user in USERS:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no user {user}: run slurm/ci-setup.sh"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def records(run: str, user: str, n: int) -> list:
    pw = pwd.getpwnam(user)
    return [Start(run=run, stream="run", seq=0, ts=T0, command=["train.py"], user=user,
                  uid=pw.pw_uid, host="n1", slurm={"job_id": run, "cluster": "c1"}),
            *[Line(run=run, stream="stdout", seq=i, ts=T0 + i / 1000,
                   text=f"{user} line {i} " + "x" * 100) for i in range(n)],
            Metadata(run=run, stream="stdout", seq=n, ts=T0 + n / 1000 + 1,
                     fields={"epoch": 1, "loss": 0.5, "owner_is": user}),
            Sample(run=run, stream="sample:n1", seq=0, ts=T0 + 2, node="n1",
                   job={"cpu_seconds_total": 3.0}),
            End(run=run, stream="run", seq=1, ts=T0 + n / 1000 + 3, exit_status=0,
                state="COMPLETED", duration=3.0, counts={"stdout": {"lines": n}})]


def ship(dsn: str, run: str, user: str, n: int) -> None:
    pw = pwd.getpwnam(user)
    with S.open_store(dsn, wait=30) as st:
        st.insert_records(records(run, user, n), S.Identity(run=run, user=user,
                                                            uid=pw.pw_uid, job_id=run))


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    # Not under pytest's basetemp (mode 0700): the test users must reach the socket.
    d = Path(tempfile.mkdtemp(prefix="logcapture-reader-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def dsn(base: Path) -> str:
    dsn = f"chdb://{base / 'store'}"
    ship(dsn, "101", "lcuser1", 50)
    ship(dsn, "202", "lcuser2", 30_000)  # enough to fill a socket's buffers
    ship(dsn, "shared", "lcuser1", 5)  # one run id, two owners: they stay apart
    ship(dsn, "shared", "lcuser2", 7)
    ship_unended(dsn, "forever", "lcuser1")
    return dsn


def ship_unended(dsn: str, run: str, user: str) -> None:
    """A run that has not ended (no End record): following it never finishes."""
    pw = pwd.getpwnam(user)
    recs = [r for r in records(run, user, 3) if not isinstance(r, End)]
    with S.open_store(dsn, wait=30) as st:
        st.insert_records(recs, S.Identity(run=run, user=user, uid=pw.pw_uid, job_id=run))


@pytest.fixture
def service(base: Path, dsn: str) -> Iterator[ReadService]:
    sessions = EmbeddedTurns(dsn)
    svc = ReadService(base / "reader.sock", sessions, request_timeout=1.0, send_timeout=1.0,
                      max_clients=4, follow_poll=0.05, beat_every=0.2)
    svc.start()
    yield svc
    svc.stop()
    sessions.close()


def as_user(user: str, code: str, sock: Path, timeout: float = 60,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Python ``code`` run as ``user`` (``sock``: the socket path, as ``SOCK``)."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "LOGCAPTURE_CONFIG": "/nonexistent", **(extra_env or {})}
    prog = f"import json, sys\nSOCK = {str(sock)!r}\n" + code
    return subprocess.run([sys.executable, "-c", prog], user=pw.pw_uid, group=pw.pw_gid,
                          extra_groups=[], env=env, cwd="/", capture_output=True, text=True,
                          timeout=timeout)


ASK = """
from logcapture.reader.client import ServiceReader
from logcapture.errors import LogcaptureError
r = ServiceReader(SOCK)
def ask(name, *args):
    try:
        return getattr(r, name)(*args)
    except LogcaptureError as e:
        return {"error": type(e).__name__, "message": e.message}
"""


def test_each_user_reads_only_their_own_runs_as_the_kernel_names_them(
        service: ReadService) -> None:
    sock = service.socket_path
    code = ASK + """
out = {"whoami": ask("whoami"), "runs": sorted(d["run"] for d in ask("runs")),
       "owners": sorted({d["owner"] for d in ask("runs")})}
for run in ("101", "202", "shared"):
    out[run] = {"resolve": ask("resolve", run), "lines": ask("lines", run),
                "describe": ask("describe", run), "metadata": ask("metadata", run),
                "samples": ask("samples", run), "export": ask("export_rows", run, "lines")}
print(json.dumps(out))
"""
    for me, mine, theirs in (("lcuser1", "101", "202"), ("lcuser2", "202", "101")):
        res = as_user(me, code, sock)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        uid = pwd.getpwnam(me).pw_uid
        assert out["whoami"] == {"user": me, "uid": uid, "admin": False}
        unended = ["forever"] if me == "lcuser1" else []
        assert out["runs"] == sorted([mine, "shared", *unended]) and out["owners"] == [me]
        assert out[mine]["resolve"] == mine and out[mine]["lines"]
        assert all(me in d["text"] for d in out[mine]["lines"] if d["kind"] == "line")
        for question, answer in out[theirs].items():
            assert answer == {"error": "NotFound", "message": answer["message"]}, question
            assert "lcuser" not in answer["message"].replace(theirs, "")
        shared = out["shared"]
        n = 5 if me == "lcuser1" else 7
        assert len([d for d in shared["lines"] if d["kind"] == "line"]) == n
        assert (shared["describe"]["owner"], shared["describe"]["uid"]) == (me, uid)
        assert [d["fields"]["owner_is"] for d in shared["metadata"]] == [me]
        assert len(shared["samples"]) == 1
        # Nothing of the other user in any answer about the shared run id.
        other = "lcuser2" if me == "lcuser1" else "lcuser1"
        assert other not in json.dumps(shared)


def test_root_and_the_admin_group_read_every_owner(service: ReadService) -> None:
    r = ServiceReader(service.socket_path)
    assert r.whoami()["admin"] is True  # this test runs as root
    assert {d["owner"] for d in r.runs()} == {"lcuser1", "lcuser2"}
    assert len([d for d in r.lines("shared") if d["kind"] == "line"]) == 12
    # Group membership from the group database: lcuser1's own group makes lcuser1 an admin.
    group = grp.getgrgid(pwd.getpwnam("lcuser1").pw_gid).gr_name
    uid1, uid2 = pwd.getpwnam("lcuser1").pw_uid, pwd.getpwnam("lcuser2").pw_uid
    assert caller_of_uid(uid1, group) == Caller(uid1, "lcuser1", True)
    assert caller_of_uid(uid2, group) == Caller(uid2, "lcuser2", False)
    assert caller_of_uid(uid2, None).admin is False
    assert caller_of_uid(uid2, "no-such-group-here").admin is False


def raw(sock: Path, data: bytes, read: bool = True, timeout: float = 10) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        try:
            s.sendall(data)
        except BrokenPipeError:
            pass  # the service refused the request before its end: its answer is there
        if not read:
            return []
        buf = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            buf += chunk
    return [json.loads(x) for x in buf.splitlines()]


def test_hand_made_requests_get_a_clear_error_and_no_data(service: ReadService) -> None:
    sock = service.socket_path
    code = """
import socket
def raw(data):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(SOCK)
        s.sendall(data)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
    return [json.loads(x) for x in buf.splitlines()]
reqs = [
    {"op": "runs", "uid": 0},
    {"op": "lines", "run": "202", "user": "lcuser2"},
    {"op": "lines", "run": "202", "owner": "lcuser2"},
    {"op": "runs", "as": "root"},
    {"op": "lines", "run": "202' OR 1=1 --"},
    {"op": "lines", "run": "202\\\\' OR owner != '"},
    {"op": "lines", "run": "../../../etc/shadow"},
    {"op": "lines", "run": "/etc/passwd"},
    {"op": "resolve", "ref": "2%"},
    {"op": "resolve", "ref": "*"},
    {"op": "lines", "run": "a\\nb"},
    {"op": "lines", "run": ["202"]},
    {"op": "export", "run": "202", "what": "everything"},
    {"op": "drop table lines"},
    {"op": "lines", "run": "202", "tail": -1},
    {"op": "search", "request": {"pattern": "line", "owner": "lcuser2"}},
    {"op": "search", "request": {"pattern": "line", "limit": "all"}},
    {"op": "search", "request": "line"},
]
out = [raw((json.dumps(r) + "\\n").encode()) for r in reqs]
out.append(raw(b"not json\\n"))
out.append(raw(b"[1, 2]\\n"))
print(json.dumps(out))
"""
    res = as_user("lcuser1", code, sock)
    assert res.returncode == 0, res.stderr
    answers = json.loads(res.stdout)
    for answer in answers:
        assert len(answer) == 1 and "error" in answer[0], answer
        assert "lcuser2 line" not in json.dumps(answer)
    kinds = [a[0]["kind"] for a in answers]
    assert kinds[:4] == ["UsageError"] * 4
    assert "identity from the operating system" in answers[0][0]["error"]
    assert kinds[4:10] == ["NotFound"] * 6
    assert kinds[10:] == ["UsageError"] * 10
    assert "control character" in answers[10][0]["error"]
    assert "unknown op" in answers[13][0]["error"]
    assert "must be an object with the keys" in answers[15][0]["error"]  # no owner in it
    assert "limit must be a whole number" in answers[16][0]["error"]
    assert "not a JSON object" in answers[18][0]["error"]
    # ... and the service still answers.
    assert ServiceReader(sock).resolve("101") == "101"


def test_a_huge_request_a_silent_client_and_too_many_clients(service: ReadService) -> None:
    sock = service.socket_path
    # Longer than the limit, with no newline: refused once the limit is passed.
    [answer] = raw(sock, b'{"op": "runs", "pad": "' + b"x" * (8 << 20))
    assert answer["kind"] == "UsageError" and "longer than" in answer["error"]
    # A client that connects and says nothing is told so after request_timeout.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock))
        t0 = time.monotonic()
        answer = json.loads(s.makefile("rb").readline())
        assert "no complete request line" in answer["error"]
        assert time.monotonic() - t0 < 9
    # More clients than max_clients: the extra one is told Busy at once, the others served.
    # First the silent client's thread gives its slot back (it leaves the set of client
    # threads after that), or an idle client would be the one told Busy.
    deadline = time.monotonic() + 10
    while True:
        with service._lock:
            if not service._threads:
                break
        assert time.monotonic() < deadline, "a client thread outlived its client"
        time.sleep(0.01)
    idle = []
    for _ in range(service.max_clients):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        idle.append(s)
    try:
        time.sleep(0.2)
        [answer] = raw(sock, b'{"op": "whoami"}\n')
        assert answer["kind"] == "Busy"
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while True:  # the idle clients' threads end at their request timeout
        try:
            assert ServiceReader(sock).whoami()["admin"] is True
            break
        except AssertionError:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_client_that_never_reads_blocks_no_one(service: ReadService) -> None:
    sock = service.socket_path
    slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(str(sock))
    slow.sendall(b'{"op": "lines", "run": "202"}\n')  # ~4 MB of answer, never read
    try:
        time.sleep(0.3)
        r = ServiceReader(sock)
        for _ in range(5):  # others are answered meanwhile, store questions included
            t0 = time.monotonic()
            assert len(r.lines("101")) == 51
            assert time.monotonic() - t0 < 5
        # The slow client is dropped after send_timeout: its connection ends early.
        deadline = time.monotonic() + 15
        while service.clients:
            assert time.monotonic() < deadline, "the silent reader was never dropped"
            time.sleep(0.1)
        slow.settimeout(5)
        got = b""
        while chunk := slow.recv(1 << 20):
            got += chunk
        assert b'"end":true' not in got
    finally:
        slow.close()


def test_a_long_answer_is_sent_whole_in_pages(service: ReadService) -> None:
    lines = ServiceReader(service.socket_path).lines("202")
    texts = [d["text"] for d in lines if d["kind"] == "line"]
    assert len(texts) == 30_000 and texts[0].startswith("lcuser2 line 0 ")
    assert texts[-1].startswith("lcuser2 line 29999 ")
    assert len(lines) == 30_001  # and the metadata record


def test_an_answer_over_the_size_limit_is_an_error(base: Path, dsn: str) -> None:
    sessions = EmbeddedTurns(dsn)
    svc = ReadService(base / "small.sock", sessions, max_response_bytes=100_000)
    svc.start()
    try:
        with pytest.raises(Exception, match="larger than the service's limit"):
            ServiceReader(svc.socket_path).lines("202")
        assert ServiceReader(svc.socket_path).resolve("101") == "101"
    finally:
        svc.stop()
        sessions.close()


def test_the_service_and_a_shipper_take_turns_on_the_embedded_store(
        base: Path, service: ReadService, dsn: str) -> None:
    """The service keeps the store open between questions; another process that waits for it
    (a shipper) gets it within a moment, and a follower sees what it shipped."""
    r = ServiceReader(service.socket_path)
    assert r.resolve("101") == "101"  # the service now holds the store
    assert service.sessions.holding  # type: ignore[attr-defined]
    ship_code = (
        "import sys, time\n"
        "from logcapture import store as S\n"
        "from logcapture.records import End, Line, Start\n"
        "import chdb, clickhouse_connect  # imported before the timing: not the turn's cost\n"
        "dsn, run = sys.argv[1], sys.argv[2]\n"
        "ident = S.Identity(run=run, user='lcuser1', uid=int(sys.argv[3]))\n"
        "t0 = time.time()\n"
        "waits = []\n"
        "for i in range(6):\n"
        "    w = time.monotonic()\n"
        "    with S.open_store(dsn, wait=20) as st:\n"
        "        waits.append(time.monotonic() - w)\n"
        "        recs = [Line(run=run, stream='stdout', seq=i, ts=t0 + i, text=f'live {i}')]\n"
        "        if i == 0:\n"
        "            recs.insert(0, Start(run=run, stream='run', seq=0, ts=t0, command=['x']))\n"
        "        if i == 5:\n"
        "            recs.append(End(run=run, stream='run', seq=1, ts=t0 + 6, state='COMPLETED'))\n"
        "        st.insert_records(recs, ident)\n"
        "    time.sleep(0.3)\n"
        "print(max(waits))\n")
    shipper = subprocess.Popen([sys.executable, "-c", ship_code, dsn, "live1",
                                str(pwd.getpwnam("lcuser1").pw_uid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[str] = []
    follower_error: list[BaseException] = []

    def follow() -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                for d in r.follow("live1"):
                    if d["kind"] == "line":
                        got.append(d["text"])
                return
            except NotFound as e:  # not shipped yet
                if time.monotonic() > deadline:
                    follower_error.append(e)
                    return
                time.sleep(0.1)

    t = threading.Thread(target=follow)
    t.start()
    out, err = shipper.communicate(timeout=120)
    t.join(60)
    assert shipper.returncode == 0, err
    assert not follower_error
    assert got == [f"live {i}" for i in range(6)]
    # The longest the shipper waited for the service's turn, with the engine's start: well
    # under the 20 s it would wait for a service that never gave the store back.
    assert float(out) < 10.0


def test_the_cli_reads_through_the_service_as_the_caller(service: ReadService,
                                                          base: Path) -> None:
    env = {"LOGCAPTURE_READER_SOCKET": str(service.socket_path)}
    asked = {"ls": ["ls", "--json"], "logs": ["logs", "101"], "other": ["logs", "202"],
             "show": ["show", "101", "--json"],
             "export": ["export", "101", "--what", "metadata", "--format", "ndjson"],
             "export_other": ["export", "202", "--what", "lines"],
             "whoami": ["reader", "whoami"], "search": ["search", "line", "--json"],
             "search_theirs": ["search", "lcuser2"]}
    out = {key: lc(args, env, user="lcuser1", text=True) for key, args in asked.items()}
    ls = [json.loads(x) for x in out["ls"][1].splitlines()]
    assert {"101", "shared"} <= {d["run"] for d in ls} and "202" not in {d["run"] for d in ls}
    assert {d["owner"] for d in ls} == {"lcuser1"}
    assert out["logs"][0] == 0 and out["logs"][1].splitlines()[0].startswith("lcuser1 line 0")
    assert out["other"][0] == 1 and "no job or run '202' of yours" in out["other"][2]
    assert out["other"][1] == "" and "lcuser2 line" not in out["other"][2]
    assert json.loads(out["show"][1])["owner"] == "lcuser1"
    assert json.loads(out["export"][1])["owner_is"] == "lcuser1"
    assert out["export_other"][0] == 1 and out["export_other"][1] == ""
    assert out["whoami"][1].startswith("lcuser1 (uid")
    # search asks the service too: the caller's lines only, and none of the other user's
    assert out["search"][0] == 0, out["search"][2]
    found = json.loads(out["search"][1])
    assert found["matches"] and {g["owner"] for g in found["groups"]} == {"lcuser1"}
    assert "lcuser2" not in out["search"][1]
    assert out["search_theirs"][0] == 1 and out["search_theirs"][1] == ""


def test_the_cli_falls_back_to_its_own_store_without_a_service(tmp_path: Path) -> None:
    env = dict(os.environ, LOGCAPTURE_READER_SOCKET=str(tmp_path / "none.sock"))
    assert service_socket(env) is None
    sock = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))
    s.close()  # a socket file nobody answers on
    assert service_socket({"LOGCAPTURE_READER_SOCKET": str(sock)}) == sock
    with pytest.raises(ServiceUnavailable):
        ServiceReader(sock).whoami()
    res = subprocess.run(
        [sys.executable, "-m", "logcapture", "ls", "--spool", str(tmp_path / "spool"),
         "--store", f"chdb://{tmp_path / 'nostore'}"],
        env=dict(env, LOGCAPTURE_READER_SOCKET=str(sock)), capture_output=True, text=True,
        timeout=60)
    assert res.returncode == 0 and "no runs in" in res.stderr
    res = lc(["ls", "--spool", str(tmp_path / "spool")],
             dict(env, LOGCAPTURE_READER_SOCKET=str(sock), XDG_STATE_HOME=str(tmp_path / "state")),
             text=True)
    assert res.returncode == 0
    assert "no read service answers on" in res.stderr
    assert "reading your own spool and store" in res.stderr


def test_a_command_says_the_service_is_down_and_reads_nothing_in_its_place(
        base: Path) -> None:
    """The read service killed (its socket left behind: connection refused) or stopped (no
    socket, its directory kept): each reading command, as an ordinary user whose default
    spool is one they cannot read, says the service is not running and how to check it, and
    reads nothing else (no "cannot list spool ...: Permission denied"). Naming a spool of
    one's own still reads it, with a warning."""
    down = base / "down"
    down.mkdir(mode=0o755, exist_ok=True)
    killed = down / "killed.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(killed))
    s.close()  # a socket file nobody answers on, as a killed service leaves it
    killed.chmod(0o666)  # as the service makes it: anyone may connect
    stopped = down / "stopped.sock"  # a stopped service removes its socket
    unreadable = down / "not-yours"  # a spool root the user may not list
    unreadable.mkdir(mode=0o700, exist_ok=True)
    for sock, why in ((killed, "Connection refused"), (stopped, "No such file or directory")):
        for args in (["ls"], ["logs", "101"], ["show", "101"], ["reader", "whoami"]):
            code, out, err = lc(args, {"LOGCAPTURE_READER_SOCKET": str(sock),
                                       "LOGCAPTURE_SPOOL": str(unreadable)},
                                user="lcuser1", text=True)
            assert code != 0 and out == "", (args, err)
            assert f"no read service answers on {sock} ({why}): the read service is not " \
                   "running; `systemctl status logcapture-reader` says why" in err, (args, err)
            assert "Permission denied" not in err and "cannot list" not in err, (args, err)
            assert len(err.splitlines()) == 1, (args, err)  # one line, the error
    own = base / "own-spool"
    own.mkdir(mode=0o777, exist_ok=True)
    code, _, err = lc(["ls", "--spool", str(own)], {"LOGCAPTURE_READER_SOCKET": str(killed),
                                                   "XDG_STATE_HOME": str(own)},
                      user="lcuser1", text=True)
    assert code == 0 and "reading your own spool and store" in err, err


def test_where_a_read_service_is_expected(tmp_path: Path) -> None:
    """A socket set for it, or the default's directory (the unit keeps it while stopped):
    expected, answering or not; nothing of the kind: no service (a laptop)."""
    from logcapture.reader.client import expected_socket

    none = {"LOGCAPTURE_CONFIG": "/nonexistent"}
    default = tmp_path / "run" / "reader.sock"
    assert expected_socket(none, str(default)) is None
    default.parent.mkdir()
    assert expected_socket(none, str(default)) == default  # stopped: no socket, its folder
    assert expected_socket({**none, "LOGCAPTURE_READER_SOCKET": "/x.sock"},
                           str(default)) == Path("/x.sock")
    assert expected_socket({**none, "LOGCAPTURE_READER_SOCKET": ""}, str(default)) is None
    assert service_socket({"LOGCAPTURE_READER_SOCKET": "/x.sock"}) is None  # none there


def test_a_page_of_the_log_through_the_service_is_the_stores(service: ReadService,
                                                              dsn: str) -> None:
    from logcapture.query import StoreReader

    r = ServiceReader(service.socket_path)
    direct = StoreReader(service.sessions, "lcuser2")
    service.identify = lambda conn: Caller(pwd.getpwnam("lcuser2").pw_uid, "lcuser2", False)
    first = r.log("202", limit=50)
    assert first == direct.log("202", limit=50)
    assert r.summary("202") == direct.summary("202")
    assert len(first["entries"]) == 50 and first["more"] and first["ended"]
    older = r.log("202", before=first["entries"][0]["cursor"], limit=50)
    assert older == direct.log("202", before=first["entries"][0]["cursor"], limit=50)
    assert older["entries"] and older["entries"][-1] != first["entries"][0]
    with pytest.raises(NotFound):
        r.log("101")  # lcuser1's
    [answer] = raw(service.socket_path, b'{"op": "log", "run": "202", "before": "x:y"}\n')
    assert answer["kind"] == "UsageError" and "bad cursor" in answer["error"]


# --- fair shares: one user's connections cannot take the service from another

@pytest.fixture
def fair(base: Path, dsn: str) -> Iterator[ReadService]:
    """A service with small limits: 8 clients, 3 of them per user, 1 following per user."""
    sessions = EmbeddedTurns(dsn)
    svc = ReadService(base / "fair.sock", sessions, max_clients=8, max_clients_per_user=3,
                      max_follows_per_user=1, request_timeout=1.0, send_timeout=1.0,
                      follow_poll=0.05, beat_every=0.2)
    svc.start()
    yield svc
    svc.stop()
    sessions.close()


# Holds up to WANT idle connections (more than its share), reopening each one the service
# closes, like an attacker renewing them, until a line arrives on stdin and the service has
# closed some of them for saying nothing; then prints what it was told: the refusals and the
# idle closes (the service's lines).
HOG = """
import selectors, socket, time
WANT = int(sys.argv[1])
sel = selectors.DefaultSelector()
sel.register(sys.stdin, selectors.EVENT_READ, "stop")
held, refused, closed, tries, stop = set(), [], [], 0, None
def line(s):
    s.settimeout(10)
    text = s.makefile("rb").readline()
    return json.loads(text) if text else None
while tries < 2000 and not (stop and (closed or time.monotonic() > stop)):
    while len(held) < WANT and tries < 2000:
        tries += 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(SOCK)
        held.add(s)
        sel.register(s, selectors.EVENT_READ, "held")
    for key, _ in sel.select(5):
        if key.data == "stop":
            sel.unregister(sys.stdin)
            stop = time.monotonic() + 30
            continue
        s = key.fileobj
        sel.unregister(s)
        held.discard(s)
        answer = line(s)
        s.close()
        if answer is not None and answer.get("kind") == "Busy":
            refused.append(answer["error"])
        elif answer is not None:
            closed.append(answer["error"])
    time.sleep(0.02)
print(json.dumps({"refused": refused, "closed": closed, "tries": tries}))
"""


def hog(user: str, sock: Path, want: int) -> subprocess.Popen:
    pw = pwd.getpwnam(user)
    prog = f"import json, sys\nSOCK = {str(sock)!r}\n" + HOG
    return subprocess.Popen([sys.executable, "-c", prog, str(want)], user=pw.pw_uid,
                            group=pw.pw_gid, extra_groups=[], cwd="/", text=True,
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def lc_as(user: str, sock: Path, *args: str) -> Ran:
    """The logcapture command ``args`` run as ``user``, reading through the service."""
    return lc(list(args), {"LOGCAPTURE_READER_SOCKET": str(sock)}, user=user, text=True)


def test_one_users_idle_connections_leave_the_others_served(fair: ReadService) -> None:
    sock = fair.socket_path
    attacker = hog("lcuser1", sock, want=fair.max_clients)  # all of them, if it could
    try:
        # Its share is taken at once: its next connection is refused.
        deadline = time.monotonic() + 30
        while fair.clients < 3:
            assert time.monotonic() < deadline and attacker.poll() is None
            time.sleep(0.05)
        for _ in range(2):  # meanwhile another user reads, and reads again
            ls = lc_as("lcuser2", sock, "ls", "--json")
            assert ls.returncode == 0, ls.stderr
            assert {json.loads(x)["run"] for x in ls.stdout.splitlines()} == {"202", "shared"}
            assert fair.clients <= 3 + 1  # the attacker's share and this client
        out, err = attacker.communicate("stop\n", timeout=60)
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait()
    assert attacker.returncode == 0, err
    told = json.loads(out)
    assert told["refused"], told
    assert all("the most it allows one user (reader_max_clients_per_user)" in m
               and "3 connections" in m for m in told["refused"])
    # Its idle connections were closed after the request timeout, and it had to renew them.
    assert told["closed"] and all("no complete request line within 1s" in m
                                  for m in told["closed"])
    deadline = time.monotonic() + 10
    while fair.clients:
        assert time.monotonic() < deadline, "a connection outlived its client"
        time.sleep(0.05)


def test_the_cli_prints_the_per_user_limit(fair: ReadService) -> None:
    sock = fair.socket_path
    attacker = hog("lcuser1", sock, want=3)
    try:
        deadline = time.monotonic() + 30
        while fair.clients < 3:
            assert time.monotonic() < deadline and attacker.poll() is None
            time.sleep(0.05)
        mine = lc_as("lcuser1", sock, "ls")
        theirs = lc_as("lcuser2", sock, "ls")
    finally:
        attacker.communicate("stop\n", timeout=60)
    # The attacker renews its connections as the service closes them: the command may slip
    # into the moment one is gone; if it did not, it failed with the limit in its message.
    if mine.returncode != 0:
        assert mine.stderr.startswith("logcapture: error: read service: you already have 3 "
                                      "connections to the read service"), mine.stderr
        assert "reader_max_clients_per_user" in mine.stderr and mine.stdout == ""
    assert theirs.returncode == 0 and "202" in theirs.stdout, theirs.stderr


def test_follows_of_runs_that_never_end_are_limited_per_user(fair: ReadService) -> None:
    sock = fair.socket_path
    code = """
import socket, subprocess
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(SOCK)
s.sendall(b'{"op": "follow", "run": "forever"}\\n')
f = s.makefile("rb")
first = []  # read until its lines came: it is following
while not any(d["kind"] == "line" for d in first):
    first += json.loads(f.readline()).get("items", [])
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)
s.close()
print(json.dumps({"first": first, "second": [r.returncode, r.stdout, r.stderr]}))
"""
    lc = [sys.executable, "-m", "logcapture", "logs", "-f", "forever"]
    pw = pwd.getpwnam("lcuser1")
    res = subprocess.run([sys.executable, "-c", f"import json, sys\nSOCK = {str(sock)!r}\n"
                          + code, *lc], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                         cwd="/", capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                              "LOGCAPTURE_CONFIG": "/nonexistent",
                              "LOGCAPTURE_READER_SOCKET": str(sock)})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    texts = [d["text"] for d in out["first"] if d["kind"] == "line"]
    assert texts and texts[0].startswith("lcuser1 line 0")
    code_, stdout, stderr = out["second"]
    assert code_ != 0 and stdout == ""
    assert stderr.startswith("logcapture: error: read service: you already follow 1 run(s) "
                             "through the read service"), stderr
    assert "reader_max_follows_per_user" in stderr
    # Another user follows meanwhile, and the first user's follow slot comes back.
    follow = lc_as("lcuser2", sock, "logs", "-f", "202")
    assert follow.returncode == 0 and follow.stdout.startswith("lcuser2 line 0"), follow.stderr
    again = lc_as("lcuser1", sock, "logs", "-f", "101")
    assert again.returncode == 0 and again.stdout.startswith("lcuser1 line 0"), again.stderr


def test_the_limits_come_from_the_admin_config(base: Path, dsn: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("reader_max_clients_per_user: 1\nreader_request_timeout: 30\n")
    sock = base / "configured.sock"
    env = dict(os.environ, LOGCAPTURE_CONFIG=str(config))
    proc = subprocess.Popen([sys.executable, "-m", "logcapture", "reader", "serve",
                             "--socket", str(sock), "--store", dsn], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as idle:
            idle.connect(str(sock))
            [answer] = raw(sock, b'{"op": "whoami"}\n')
            assert answer["kind"] == "Busy" and "1 connections" in answer["error"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
