"""Search (logcapture/search.py, Store.search, the readers' search, `logcapture search`) on
the real embedded engine: words, phrases and regexes matched alike by the store's SQL and by
Python; context at a run's start and end; time, stream, state and job filters; each user's
own lines only; a pattern that looks like SQL; exit statuses as grep's."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import lc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcapture import query as Q
from logcapture import store as S
from logcapture.errors import UsageError
from logcapture.records import Command, End, Line, Metadata, Note, Start
from logcapture.search import Pattern, Request, answer, parse_when, tokens

T0 = 1_790_000_000.0
DAY = 86400.0

TRAIN = [
    "starting run on 8 GPUs",                                 # 1: the run's first line
    "epoch 1 step 10 loss=0.5123 lr=0.001",
    "[rank3] NCCL WARN Watchdog caught collective operation timeout",
    "epoch 1 step 20 loss=0.4987 lr=0.001",
    "RuntimeError: CUDA out of  memory. Tried to allocate 2.00 GiB",
    "CUDA_ERROR_OUT_OF_MEMORY at engine.py:88",
    "x'; DROP TABLE lines; --",
    "saving to /scratch/ckpt_ outofmemory",
    "done: exit NCCL",                                        # 9: the run's last line
]


def training_run(run: str, who: str, uid: int, t0: float, state: str = "FAILED",
                 texts: list[str] | None = None, job: str | None = None) -> list:
    texts = TRAIN if texts is None else texts
    recs: list = [Start(run=run, stream="run", seq=0, ts=t0, command=["python", "train.py"],
                        user=who, uid=uid, slurm={"job_id": job or run, "job_name": "resnet"})]
    seq = 1
    for i, text in enumerate(texts):
        if i == 3:  # a note and a metadata record take sequence numbers between lines
            recs.append(Note(run=run, stream="stdout", seq=seq, ts=t0 + i, note="repeat",
                             count=2, text="x"))
            recs.append(Metadata(run=run, stream="stdout", seq=seq + 1, ts=t0 + i,
                                 fields={"loss": 0.5}))
            seq += 2
        recs.append(Line(run=run, stream="stdout", seq=seq, ts=t0 + i + 0.5, text=text))
        seq += 1
    recs.append(Command(run=run, stream="stdout", seq=seq, ts=t0 + 20,
                        text='/LOGCOMMAND {"mode": "enabled"}', options={"mode": "enabled"}))
    recs.append(Line(run=run, stream="stderr", seq=0, ts=t0 + 21,
                     text="UserWarning: NCCL timeout is 600 s"))
    recs.append(End(run=run, stream="run", seq=1, ts=t0 + 30, exit_status=1, state=state))
    return recs


@pytest.fixture(scope="module")
def dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Runs of alice (two days apart, one FAILED, one COMPLETED), bob's run with the same id
    as one of alice's, and one of alice's runs shipped twice (the copies count once)."""
    dsn = f"chdb://{tmp_path_factory.mktemp('search') / 'store'}"
    with S.open_store(dsn) as st:
        for run, who, uid, t0, state in (("a-old", "alice", 1001, T0, "FAILED"),
                                         ("a-new", "alice", 1001, T0 + 2 * DAY, "COMPLETED"),
                                         ("a-new", "bob", 1002, T0 + 3 * DAY, "FAILED")):
            recs = training_run(run, who, uid, t0, state, job=f"{run}-job")
            ident = S.Identity(run=run, user=who, uid=uid, job_id=f"{run}-job")
            st.insert_records(recs, ident)
            if run == "a-old":
                st.insert_records(recs, ident)
    yield dsn


@contextmanager
def held(dsn: str) -> Iterator[S.Store]:
    with S.open_store(dsn, must_exist=True) as st:
        yield st


def ask(dsn: str, owner: str | None, pattern: str, **kw: object) -> dict:
    return Q.StoreReader(lambda: held(dsn), owner).search(
        Request(pattern, **kw).to_dict())  # type: ignore[arg-type]


def matched(found: dict) -> list[tuple[str, str, int, str]]:
    return [(g["run"], d["stream"], d["seq"], d["text"]) for g in found["groups"]
            for d in g["lines"] if d["match"]]


# --- the pattern ------------------------------------------------------------------------
def test_tokens_are_runs_of_letters_digits_and_non_ascii() -> None:
    assert tokens("CUDA_ERROR lr=0.001 héllo-wörld gpu17:") == [
        "CUDA", "ERROR", "lr", "0", "001", "héllo", "wörld", "gpu17"]


def test_words_phrases_and_substrings() -> None:
    p = Pattern.parse('NCCL "out of memory" lr=0.001 ==>')
    assert [t.kind for t in p.terms] == ["token", "phrase", "phrase", "substring"]
    assert p.matches("NCCL: out of   memory lr=0.001 ==> x")
    assert not p.matches("NCCLX: out of memory lr=0.001 ==>")  # whole tokens only
    assert not p.matches("NCCL: out of memoryless lr=0.001 ==>")
    assert not p.matches("NCCL: out of memory lr=0.0011 ==>")
    with pytest.raises(UsageError, match="never closed"):
        Pattern.parse('NCCL "timeout')
    with pytest.raises(UsageError, match="empty"):
        Pattern.parse("   ")
    with pytest.raises(UsageError, match="no words"):
        Pattern.parse('"" ""')
    with pytest.raises(UsageError, match="--regex"):
        Pattern.parse("(unclosed", regex=True)


def test_the_pattern_is_a_parameter_never_sql() -> None:
    sql, params = Pattern.parse("x'; DROP TABLE lines; -- \"a ' b\"").sql()
    assert "DROP" not in sql and "'" not in sql.replace("'re2'", "")
    assert "x" in params.values() and "DROP" in params.values()


_ALPHABET = st.sampled_from(list("ab AB_.-=:'\"%\\é1") + ["ab", "NCCL", " ", "\t"])
_TEXT = st.lists(_ALPHABET, max_size=12).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=_TEXT.filter(lambda s: s.strip() and s.count('"') % 2 == 0),
       texts=st.lists(_TEXT, min_size=1, max_size=8), regex=st.booleans())
def test_the_store_and_python_match_alike(tmp_path_factory: pytest.TempPathFactory,
                                          pattern: str, texts: list[str], regex: bool) -> None:
    # The spool's runs are searched in Python, the store's in SQL: one meaning for both.
    if regex:
        pattern = pattern.replace("\\", "").replace("(", "").replace("[", "")
        pattern = "".join(c for c in pattern if c not in "*+?{|)]")
    if not pattern.strip() or not regex and not pattern.replace('"', "").strip():
        pattern = "a"
    p = Pattern.parse(pattern, regex=regex)
    cond, params = p.sql("text")
    with S.open_store(f"chdb://{_engine_dir(tmp_path_factory)}") as store:
        rows = store._query(
            "SELECT i, " + cond + " FROM (SELECT arrayJoin(arrayEnumerate({texts:Array("
            "String)})) AS i, {texts:Array(String)}[i] AS text) ORDER BY i",
            {**params, "texts": texts})
    assert [bool(r[1]) for r in rows] == [p.matches(t) for t in texts], (pattern, texts)


_ENGINE: list[Path] = []


def _engine_dir(factory: pytest.TempPathFactory) -> Path:
    if not _ENGINE:
        _ENGINE.append(factory.mktemp("engine") / "store")
    return _ENGINE[0]


def test_when_takes_ages_and_local_dates() -> None:
    now = 1_800_000_000.0
    assert parse_when("30d", "--since", now) == now - 30 * DAY
    assert parse_when("12h", "--since", now) == now - 12 * 3600
    assert parse_when("now", "--until", now) == now
    assert parse_when("2026-11-01", "--since", now) > 1.7e9
    with pytest.raises(UsageError, match="--since 'yesterday'"):
        parse_when("yesterday", "--since", now)


def test_a_bad_request_names_what_is_wrong() -> None:
    for req, msg in ((Request("x", stream="both"), "--stream"),
                     (Request("x", states=("DONE",)), "--state 'DONE'"),
                     (Request("x", context=-1), "-C"), (Request("x", limit=0), "--limit"),
                     (Request("x", since=2.0, until=1.0), "--since is later")):
        with pytest.raises(UsageError, match=msg):
            req.checked()
    with pytest.raises(UsageError, match="keys"):
        Request.from_dict({"pattern": "x", "owner": "bob"})  # no key chooses the owner
    with pytest.raises(UsageError, match="limit"):
        Request.from_dict({"pattern": "x", "limit": "9; DROP"})


# --- the store ------------------------------------------------------------------------------
def test_words_must_all_occur_as_whole_tokens(dsn: str) -> None:
    found = ask(dsn, "alice", "NCCL timeout")
    watchdog = "[rank3] NCCL WARN Watchdog caught collective operation timeout"
    warning = "UserWarning: NCCL timeout is 600 s"
    assert matched(found) == [  # runs newest first, each run's lines in log order
        ("a-new", "stdout", 3, watchdog), ("a-new", "stderr", 0, warning),
        ("a-old", "stdout", 3, watchdog), ("a-old", "stderr", 0, warning)]
    assert found["matches"] == 4 and not found["truncated"]
    g = found["groups"][0]
    assert (g["run"], g["owner"], g["job_id"], g["name"], g["state"], g["source"]) == (
        "a-new", "alice", "a-new-job", "resnet", "COMPLETED", "store")
    assert g["start"] == T0 + 2 * DAY
    assert ask(dsn, "alice", "outofmemory memory")["matches"] == 0  # not a token of line 8
    assert ask(dsn, "alice", "NCC")["matches"] == 0  # a part of a token is not a token


def test_phrases_keep_their_order_and_whole_tokens(dsn: str) -> None:
    found = ask(dsn, "alice", '"CUDA out of memory"')
    assert [m[3] for m in matched(found)] == [TRAIN[4]] * 2  # two spaces in the line: a gap
    assert ask(dsn, "alice", '"memory of out"')["matches"] == 0
    # a word with separators is a phrase: its tokens in that order, whole
    assert [m[3] for m in matched(ask(dsn, "alice", "CUDA_ERROR_OUT_OF_MEMORY"))] == [
        TRAIN[5]] * 2
    assert ask(dsn, "alice", "ERROR_OUT_OF")["matches"] == 2
    assert ask(dsn, "alice", "RROR_OUT")["matches"] == 0
    assert ask(dsn, "alice", "lr=0.001", stream="stdout")["matches"] == 4


def test_a_regex(dsn: str) -> None:
    found = ask(dsn, "alice", r"loss=0\.4\d+", regex=True)
    assert [m[3] for m in matched(found)] == [TRAIN[3]] * 2
    assert ask(dsn, "alice", "^done: ", regex=True)["matches"] == 2
    with pytest.raises(Exception, match="regex|regular expression|RE2|compile"):
        ask(dsn, "alice", "(?<=look)behind", regex=True)  # RE2 has no look-behind


def test_a_pattern_that_looks_like_sql_is_only_text(dsn: str) -> None:
    for pattern in ("x'; DROP TABLE lines; --", "' OR 1=1 --", "{s0:String}", "\\'; --"):
        found = ask(dsn, "alice", f'"{pattern}"')
        assert matched(found) == ([("a-new", "stdout", 9, TRAIN[6]),
                                   ("a-old", "stdout", 9, TRAIN[6])]
                                  if pattern == "x'; DROP TABLE lines; --" else [])
    assert ask(dsn, "alice", "' OR 1=1 --", regex=True)["matches"] == 0
    with held(dsn) as st:  # still all there
        assert st._query("SELECT count() FROM lines WHERE owner = 'alice'")[0][0] > 20


def test_context_at_the_start_and_end_of_a_run(dsn: str) -> None:
    first = ask(dsn, "alice", "starting", context=2, jobs=("a-old",))
    lines = first["groups"][0]["lines"]
    assert [(d["seq"], d["match"], d["gap"]) for d in lines] == [
        (1, True, False), (2, False, False), (3, False, False)]  # nothing before the first
    last = ask(dsn, "alice", "enabled", context=3, jobs=("a-old",))  # stdout's last line
    lines = last["groups"][0]["lines"]
    assert [d["text"] for d in lines] == [*TRAIN[6:9], '/LOGCOMMAND {"mode": "enabled"}']
    assert [d["seq"] for d in lines] == [9, 10, 11, 12] and lines[-1]["match"]
    around = ask(dsn, "alice", '"step 20"', context=2, jobs=("a-old",))["groups"][0]["lines"]
    assert [d["seq"] for d in around] == [2, 3, 6, 7, 8]  # 4 and 5 are not lines


def test_context_blocks_merge_and_gaps_are_marked(dsn: str) -> None:
    found = ask(dsn, "alice", "epoch", context=1, jobs=("a-old",))
    lines = found["groups"][0]["lines"]
    assert [(d["seq"], d["match"]) for d in lines] == [
        (1, False), (2, True), (3, False), (6, True), (7, False)]
    assert [d["gap"] for d in lines] == [False, False, False, False, False]
    found = ask(dsn, "alice", "starting NCCL", regex=False, context=0, jobs=("a-old",))
    assert found["matches"] == 0
    both = ask(dsn, "alice", "loss", jobs=("a-old",))["groups"][0]["lines"]
    assert [d["gap"] for d in both] == [False, True]  # lines 2 and 6: not next to each other


def test_every_state_a_run_can_end_in_can_be_searched_for() -> None:
    from logcapture.records import LOST
    from logcapture.search import STATES
    from logcapture.slurm.jobs import END_STATES

    assert set(STATES) == {"RUNNING", "SIGNALED", LOST, *END_STATES}


def test_since_until_stream_state_and_job(dsn: str) -> None:
    assert {g["run"] for g in ask(dsn, "alice", "NCCL", since=T0 + DAY)["groups"]} == {
        "a-new"}
    assert {g["run"] for g in ask(dsn, "alice", "NCCL", until=T0 + DAY)["groups"]} == {
        "a-old"}
    assert ask(dsn, "alice", "NCCL", since=T0 + 2.5 * DAY)["matches"] == 0
    assert {m[1] for m in matched(ask(dsn, "alice", "NCCL", stream="stderr"))} == {"stderr"}
    assert {g["run"] for g in ask(dsn, "alice", "NCCL", states=("FAILED",))["groups"]} == {
        "a-old"}
    assert {g["run"] for g in ask(dsn, "alice", "NCCL", jobs=("a-new-job",))["groups"]} == {
        "a-new"}
    assert ask(dsn, "alice", "NCCL", jobs=("nope",))["matches"] == 0


def test_newest_first_limit_and_copies_counted_once(dsn: str) -> None:
    found = ask(dsn, "alice", "NCCL", limit=4)
    assert found["matches"] == 4 and found["truncated"]
    keys = [(g["run"], d["ts"]) for g in found["groups"] for d in g["lines"]]
    assert [g["run"] for g in found["groups"]] == ["a-new", "a-old"]
    assert keys[0][0] == "a-new"
    every = ask(dsn, "alice", "NCCL", limit=100)
    assert every["matches"] == 6 and not every["truncated"]  # a-old shipped twice: once


def test_each_user_finds_only_their_own_lines(dsn: str) -> None:
    alice = ask(dsn, "alice", "NCCL")
    bob = ask(dsn, "bob", "NCCL")
    assert {g["owner"] for g in alice["groups"]} == {"alice"}
    assert {(g["run"], g["owner"]) for g in bob["groups"]} == {("a-new", "bob")}
    assert bob["groups"][0]["state"] == "FAILED"  # bob's own run of that id, not alice's
    assert ask(dsn, "mallory", "NCCL")["matches"] == 0
    admin = ask(dsn, None, "NCCL")
    assert {g["owner"] for g in admin["groups"]} == {"alice", "bob"}
    # a job filter cannot reach into another user's run of that name either
    assert ask(dsn, "bob", "NCCL", jobs=("a-old",))["matches"] == 0


def test_many_days_are_searched_window_by_window(tmp_path: Path) -> None:
    # 40 days of runs, one a day: the newest matches come from the newest windows, and an
    # old rare line is still found through every window.
    dsn = f"chdb://{tmp_path / 'store'}"
    with S.open_store(dsn) as st:
        for d in range(40):
            texts = [f"day {d} loss {k}" for k in range(5)] + (["rare Xid 79"] if d == 2 else [])
            st.insert_records(training_run(f"r{d}", "alice", 1001, T0 + d * DAY, "COMPLETED",
                                           texts), S.Identity(f"r{d}", "alice", 1001))
    found = ask(dsn, "alice", "loss", limit=7)
    assert [g["run"] for g in found["groups"]] == ["r39", "r38"]
    assert found["truncated"]
    assert [g["run"] for g in ask(dsn, "alice", "Xid")["groups"]] == ["r2"]
    assert ask(dsn, "alice", "Xid", since=T0 + 3 * DAY)["matches"] == 0


# --- the spool and the command ---------------------------------------------------------------
def test_spool_runs_are_searched_until_shipped(lc_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(lc_env, LOGCAPTURE_STORE=f"chdb://{tmp_path / 'store'}")
    script = ("import sys\n"
              "print('starting')\nprint('NCCL WARN timeout on rank 3')\nprint('done')\n"
              "print('NCCL error', file=sys.stderr)\n")
    res = lc(["run", "--run-id", "sp-1", "--", sys.executable, "-c", script], env)
    assert res.returncode == 0, res.stderr

    before = lc(["search", "NCCL", "-C", "1"], env)
    assert before.returncode == 0, before.stderr
    out = before.stdout.decode()
    assert "sp-1" in out and "[not yet shipped]" in out
    # STREAM:N: with the line number (both streams counted), as logs -n gives it
    assert "stdout:2:NCCL WARN timeout on rank 3" in out and "stdout:1-starting" in out
    assert "stdout:3-done" in out and "stderr:4:NCCL error" in out

    assert lc(["upload", "--run", "sp-1"], env).returncode == 0
    after = json.loads(lc(["search", "NCCL", "--json", "-C", "1"], env).stdout)
    assert [g["source"] for g in after["groups"]] == ["store"]
    assert sorted(d["text"] for d in after["groups"][0]["lines"] if d["match"]) == [
        "NCCL WARN timeout on rank 3", "NCCL error"]
    spool_only = json.loads(lc(["search", "NCCL", "--json", "--source", "spool"],
                                   env).stdout)
    assert [g["source"] for g in spool_only["groups"]] == ["spool"]
    assert spool_only["matches"] == after["matches"]


def test_exit_status_is_greps(lc_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(lc_env, LOGCAPTURE_STORE=f"chdb://{tmp_path / 'store'}")
    assert lc(["run", "--run-id", "ex-1", "--", "echo", "hello world"], env).returncode == 0
    assert lc(["search", "hello"], env).returncode == 0
    none = lc(["search", "goodbye"], env)
    assert none.returncode == 1 and none.stdout == b""
    for args, msg in ((["search", "--regex", "(x"], "--regex"),
                      (["search", "x", "--job", "nope"], "nope"),
                      (["search", "x", "--since", "last week"], "--since"),
                      (["search", "x", "--state", "DONE"], "--state"),
                      (["search", '"x'], "never closed")):
        bad = lc(args, env)
        assert bad.returncode == 2, (args, bad.stderr)
        assert msg in bad.stderr.decode(), (args, bad.stderr)


def test_answer_of_nothing() -> None:
    from logcapture.search import Found
    assert answer(Found([], {}, False)) == {"matches": 0, "truncated": False, "groups": []}
