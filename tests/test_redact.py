"""The redact stage (logcapture/redact.py): secrets out, everything else as printed.

- Every form of secret the stage knows is replaced by *** and the rest of its line kept.
- The false-positive corpus (the rendering corpus of real programs, and ordinary log lines:
  hashes, UUIDs, checksums, losses, paths, base64 images) comes out unchanged, as the very
  objects given.
- Through the pipeline: a secret rewritten by \\r, cut by a chunk boundary, in a line longer
  than the line limit, in metadata JSON, masked at run time on the other stream; and the start
  record's command line.
- Configuration: a bad pattern is a problem naming file, line, column and key, never quoting it.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logcapture.classify import Classifier
from logcapture.config.admin import load_admin
from logcapture.config.optin import load_optin
from logcapture.errors import ConfigError
from logcapture.pipeline import LINE_LIMIT, Pipeline
from logcapture.records import Command, Line, Metadata, Note, Rendered, Start
from logcapture.redact import REDACTED, Redactor, pattern_of, secret_values, variants
from logcapture.spool.layout import create_run_dir
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

CAPTURED = Path(__file__).parent / "captured"

HF = "hf_" + "Ab1" * 11  # 33 characters after the prefix
GITHUB = "ghp_" + "x7Yz" * 9
ENV = {"HF_TOKEN": HF, "DB_PASSWORD": "p@ss w0rd/é!", "WANDB_API_KEY": "0123456789abcdef" * 2,
       "MY_SECRET": "short", "HOME": "/home/alice-the-long-name", "PATH": "/usr/bin:/bin"}

# (printed, what is stored, the kind counted)
TOKENS = [
    (f"token {HF} end", "token *** end", "environment"),
    (f"url-encoded {quote('p@ss w0rd/é!', safe='')}.", "url-encoded ***.", "environment"),
    (f"b64 {base64.b64encode('p@ss w0rd/é!'.encode()).decode()}", "b64 ***", "environment"),
    (f"json {json.dumps({'k': 'p@ss w0rd/é!'})}", 'json {"k": "***"}', "environment"),
    (f"gh {GITHUB} and github_pat_{'A1b2' * 10}", "gh *** and ***", "github"),
    ("aws AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws *** ***", "aws"),
    ("slack xoxb-1234567890-0987654321-abcdefABCDEF", "slack ***", "slack"),
    ("hook https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX",
     "hook https://hooks.slack.com/services/***", "slack"),
    (f"hf {'hf_' + 'Q' * 34}", "hf ***", "huggingface"),
    ("client(api='sk-proj-abcdefghijklmnopqrstuvwxyz012345')", "client(api='***')", "openai"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0",
     "jwt ***", "jwt"),
    ("> Authorization: Bearer abcdef0123456789.ghij", "> Authorization: Bearer ***", "bearer"),
    ("curl -H 'authorization: Basic dXNlcjpwYXNzd29yZA=='", "curl -H 'authorization: Basic ***'",
     "bearer"),
    ("connect postgres://bob:hunter2hunter@db:5432/x ok", "connect postgres://bob:***@db:5432/x ok",
     "url-password"),
    ('{"api_key": "zq8f7e6d5c4b3a21", "loss": 0.5}', '{"api_key": "***", "loss": 0.5}', "option"),
    ("--password=CorrectHorse99 --lr 3e-4", "--password=*** --lr 3e-4", "option"),
]

ORDINARY = [
    "commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)",
    "run id 123e4567-e89b-12d3-a456-426614174000 started",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  model.bin",
    "md5 d41d8cd98f00b204e9800998ecf8427e",
    "epoch 3 step 1200 loss 0.41236 lr 3.0e-04 grad_norm 1.234 tokens/s 51234.5",
    "saving checkpoint to /scratch/alice/runs/exp-42/ckpt_000123.pt",
    "pad_token='<|endoftext|>' eos_token: </s> max_new_tokens: 512",
    "secret_file: /home/alice/.config/secret.txt",
    "password: ${DB_PASSWORD}",
    "<img src=\"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==\">",
    "Downloading https://files.pythonhosted.org/packages/ab/cd/torch-2.3.0.whl (779.1 MB)",
    "git clone git@github.com:org/repo.git",
    "task-7f3a2b1c9d8e7f6a5b4c3d2e1f done; disk-0123456789abcdefghij ok",
    "Bearer tokens are described in RFC 6750",
    "NCCL INFO Channel 00/02 : 0[0] -> 1[1] via P2P/IPC",
    "Traceback (most recent call last):",
    "  File \"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py\", line 1511",
]


def _lines(*texts: str) -> list[Rendered]:
    return [Rendered(t) for t in texts]


@pytest.mark.parametrize(("printed", "stored", "kind"), TOKENS, ids=[t[2] for t in TOKENS])
def test_each_form_of_secret_is_replaced_and_the_rest_kept(printed: str, stored: str,
                                                           kind: str) -> None:
    r = Redactor(ENV)
    assert [x.text for x in r.lines("stdout", _lines(printed))] == [stored]
    assert r.counts[kind] >= 1
    assert sum(r.counts.values()) == printed.count("***") + stored.count("***") \
        - printed.count("***")


def test_only_secret_named_variables_long_enough_count() -> None:
    found = secret_values(ENV)
    assert found == {HF, "p@ss w0rd/é!", "0123456789abcdef" * 2}  # not MY_SECRET: too short
    assert secret_values({"TEAM_CREDENTIALS": "x" * 12, "SITE_THING": "y" * 12},
                         ["SITE_*"]) == {"y" * 12}
    assert "p%40ss%20w0rd%2F%C3%A9%21" in variants("p@ss w0rd/é!")
    r = Redactor(ENV)
    assert r.lines("stdout", _lines("home /home/alice-the-long-name short")) \
        [0].text == "home /home/alice-the-long-name short"


def test_ordinary_output_is_passed_through_as_the_very_objects() -> None:
    r = Redactor(ENV)
    corpus = _lines(*ORDINARY)
    out = r.lines("stdout", corpus)
    assert [x.text for x in out] == ORDINARY
    assert all(a is b for a, b in zip(out, corpus, strict=True))
    assert not r.counts
    plain = _lines("epoch 1 loss 0.5", "epoch 2 loss 0.4")
    assert r.lines("stdout", plain) is plain  # no candidate: the very list


def test_the_rendering_corpus_of_real_programs_is_unchanged() -> None:
    r = Redactor(ENV)
    outputs = sorted(CAPTURED.glob("*.output"))
    assert outputs
    total = 0
    for path in outputs:
        texts = [t for t in json.loads(path.read_text()) if isinstance(t, str)]
        total += len(texts)
        assert [x.text for x in r.lines("stdout", _lines(*texts))] == texts, path.name
    assert total > 50 and not r.counts


def test_a_private_key_block_is_redacted_whole_its_frame_kept() -> None:
    r = Redactor()
    block = ["-----BEGIN OPENSSH PRIVATE KEY-----",
             "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
             "QyNTUxOQAAACDx", "-----END OPENSSH PRIVATE KEY-----", "after the key"]
    out = [x.text for x in r.lines("stderr", _lines(*block))]
    assert out == [block[0], REDACTED, REDACTED, block[3], "after the key"]
    one = "key='-----BEGIN RSA PRIVATE KEY-----\\nMIIEow\\n-----END RSA PRIVATE KEY-----'"
    assert r.text(one) == "key='-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----'"
    assert r.counts["private-key"] == 2
    # the block's state is per stream: stdout is not inside stderr's block
    r.lines("stderr", _lines("-----BEGIN PRIVATE KEY-----"))
    assert r.lines("stdout", _lines("plain"))[0].text == "plain"
    assert r.lines("stderr", _lines("MIIEvQIBADANBg"))[0].text == REDACTED


def test_configured_literals_and_regexes() -> None:
    r = Redactor(user=[pattern_of("project-zeta-key"), pattern_of(r"/acct-\d{6}/")],
                 site=[pattern_of(r"/INTERNAL-[A-Z]{4}/")])
    out = r.lines("stdout", _lines("use project-zeta-key for acct-123456 and INTERNAL-ABCD"))
    assert out[0].text == "use *** for *** and ***"
    assert r.counts == {"user": 2, "site": 1}
    for bad, fragment in (("/a(b/", "not a valid regular expression"),
                          ("/x*/", "matches an empty string"), ("ab", "at least 4")):
        with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
            pattern_of(bad)


def _pipeline(tmp_path: Path, **kw: object) -> tuple[Pipeline, Path]:
    root = tmp_path / "spool"
    p = Pipeline("r", SpoolWriter(create_run_dir(root, "r"), fsync=False), mode="enabled",
                 columns=80, rows=24, **kw)  # type: ignore[arg-type]
    return p, root / "r"


def _finish(p: Pipeline, run_dir: Path) -> tuple[list[object], str]:
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0, bytes_read={})
    records = list(iter_run(run_dir))
    raw = "".join(gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz"
                  else path.read_text() for path in sorted(run_dir.glob("seg-*")))
    assert raw
    return records, raw


def test_through_the_pipeline_every_shape_of_output(tmp_path: Path) -> None:
    p, run_dir = _pipeline(tmp_path, redactor=Redactor(ENV))
    p.start(command=["train.py", "--token", "abcdefgh12", f"--hf={HF}"], cwd="/w")
    short = (f"bar {HF} 10%\rbar {HF} 100%\n"  # a \r-rewritten line
             + json.dumps({"step": 1, "key": HF}) + "\n"  # metadata JSON
             + f"split across chunks {HF} here\n").encode()
    for i in range(len(short)):  # one byte at a time: chunk boundaries everywhere
        p.feed("stdout", short[i:i + 1], 1.0)
    long = ("x" * (LINE_LIMIT - 50) + f" {GITHUB} tail" + "y" * 100 + "\n").encode()
    for i in range(0, len(long), 4093):  # longer than the limit: cut after the token
        p.feed("stdout", long[i:i + 4093], 1.0)
    p.feed("stderr", f"on stderr {GITHUB}\n".encode(), 1.0)
    records, raw = _finish(p, run_dir)
    assert HF not in raw and GITHUB not in raw and "abcdefgh12" not in raw
    start = records[0]
    assert isinstance(start, Start) and start.command == ["train.py", "--token", "***",
                                                          "--hf=***"]
    texts = [r.text for r in records if isinstance(r, Line)]
    assert texts[:3] == ["bar *** 100%", json.dumps({"step": 1, "key": REDACTED}),
                         "split across chunks *** here"]
    assert " *** tail" in texts[3] and len(texts[3]) <= LINE_LIMIT
    assert "on stderr ***" in texts
    meta = [r for r in records if isinstance(r, Metadata)]
    assert meta and meta[0].fields == {"step": 1, "key": REDACTED}
    assert p.redactor.counts["environment"] >= 4


def test_a_mask_on_one_stream_applies_to_both_from_that_line_on(tmp_path: Path) -> None:
    p, run_dir = _pipeline(tmp_path)
    secret = "run-time-Secret-42"
    p.feed("stdout", f"before {secret}\n".encode(), 1.0)
    p.feed("stderr", b'/LOGCOMMAND {"mask": "run-time-Secret-42"}\n', 2.0)
    p.feed("stdout", f"after {secret} and {secret}\n".encode(), 3.0)
    p.feed("stderr", f"stderr {secret}\n".encode(), 3.0)
    records, raw = _finish(p, run_dir)
    texts = [r.text for r in records if isinstance(r, Line)]
    assert f"before {secret}" in texts  # printed before the mask: kept as it was
    assert "after *** and ***" in texts and "stderr ***" in texts
    assert raw.count(secret) == 1
    commands = [r for r in records if isinstance(r, Command)]
    assert [c.text for c in commands] == ['/LOGCOMMAND {"mask": "***"}']
    assert not [r for r in records if isinstance(r, Note) and r.note == "warning"]


def test_a_mask_in_disabled_mode_and_a_malformed_mask_still_hide_the_value(
        tmp_path: Path) -> None:
    root = tmp_path / "spool"
    p = Pipeline("r", SpoolWriter(create_run_dir(root, "r"), fsync=False), mode="disabled",
                 columns=80, rows=24)
    p.feed("stdout", b'/LOGCOMMAND {"mask": "QuietValue-77"}\n', 1.0)
    p.feed("stdout", b'/LOGCOMMAND {"mode": "enabled"}\n', 2.0)
    p.feed("stdout", b"QuietValue-77 then\n", 3.0)
    p.feed("stdout", b"/LOGCOMMAND {\"mask\": \"Other-Value-88\", \"mdoe\": 1}\n", 4.0)
    p.feed("stdout", b"Other-Value-88 later\n", 5.0)
    _, raw = _finish(p, root / "r")
    assert "QuietValue-77" not in raw and "Other-Value-88" not in raw
    assert "*** later" in raw


def test_the_classifier_takes_a_mask_only_as_the_stage_leaves_it() -> None:
    c = Classifier("r")
    ok = c.feed("stdout", Rendered('/LOGCOMMAND {"mask": "***"}'), 1.0)
    assert [type(r) for r in ok] == [Command]
    bad = c.feed("stdout", Rendered('/LOGCOMMAND {"mask": "ab"}'), 1.0)
    assert any(isinstance(r, Note) and "at least 4 characters" in r.text for r in bad)
    bad = c.feed("stdout", Rendered('/LOGCOMMAND {"mask": 5}'), 1.0)
    assert any(isinstance(r, Note) and "'mask' must be a string" in r.text for r in bad)


def test_optin_redact_is_read_and_a_bad_pattern_is_located(tmp_path: Path) -> None:
    path = tmp_path / ".logoptin"
    path.write_text("mode: enabled\nredact:\n  - project-zeta-key\n  - /acct-[0-9]{6}/\n")
    res = load_optin(path)
    assert res.ok and res.config.redact == ("project-zeta-key", "/acct-[0-9]{6}/")
    # A bad entry is said (located, never quoted) and ignored: the default redaction applies
    # and the user's logging stays as the file says.
    path.write_text("mode: metadata\nredact:\n  - fine-literal\n  - /Sekr(et/\n")
    res = load_optin(path)
    assert res.ok and not res.problems and res.config.mode == "metadata"
    assert res.config.redact == ()
    assert res.warnings[0].startswith(f"{path}:4:5: key 'redact': item 2: not a valid regular")
    assert res.warnings[0].endswith("the default redaction applies")
    assert "Sekr" not in res.warnings[0]
    # any other problem still turns the file down, the redact one listed with it
    path.write_text("mode: loud\nredact:\n  - /Sekr(et/\n")
    res = load_optin(path)
    assert not res.ok and res.config.mode == "disabled" and len(res.problems) == 2


def test_admin_redact_settings_and_a_bad_pattern(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("redact_variables: [SITE_*, '*_PASS']\nredact_patterns:\n  - /x-\\d+-y/\n")
    admin = load_admin(path, env={})
    assert admin.redact_variables == ("SITE_*", "*_PASS")
    assert admin.redact_patterns == ("/x-\\d+-y/",)
    path.write_text("cluster: a\nredact_patterns:\n  - ok-literal\n  - '/Sekr[et/'\n")
    with pytest.raises(ConfigError) as info:
        load_admin(path, env={})
    e = info.value
    assert (e.line, e.column, e.key) == (4, 5, "redact_patterns")
    assert "not a valid regular expression" in e.message and "Sekr" not in e.message
    with pytest.raises(ConfigError) as info:
        load_admin(tmp_path / "none", env={"LOGCAPTURE_REDACT_PATTERNS": "/(/"})
    assert info.value.key == "redact_patterns"


# Lines a batch may hold: every form of secret, ordinary lines, a key block's lines, masks
# (two with a newline in the value, which the joined batch holds across two lines, one of
# them ending inside a token on the next line) and a user's literal and regular expression.
_MIXED = [p for p, _, _ in TOKENS] + ORDINARY + [
    "-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA", "-----END RSA PRIVATE KEY-----",
    '/LOGCOMMAND {"mask": "run-7731-secret"}', "again run-7731-secret here",
    '/LOGCOMMAND {"mask": "left\\nright"}', "x left", "right y", "left",
    '/LOGCOMMAND {"mask": "prev\\nsk-proj"}', "x prev", "sk-proj-abcdefghijklmnopqrstuvwx0",
    "acct-654321 billed", "project-zeta-key", "", "ghp ghp_ short", "plain text"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_MIXED), max_size=30), st.integers(0, 30), st.booleans())
def test_batches_are_redacted_as_their_lines_one_by_one(texts: list[str], cut: int,
                                                        regex: bool) -> None:
    """The batch path (one matcher pass, then only the lines found) gives what redacting
    every line in order gives (``_line``, the stage's work on one line), counts included;
    in two batches, so that a mask or key block of the first is in force in the second."""
    user = [pattern_of("project-zeta-key")] + ([pattern_of(r"/acct-\d{6}/")] if regex else [])
    batch, one_by_one = Redactor(ENV, user=user), Redactor(ENV, user=user)
    for part in (texts[:cut], texts[cut:]):
        lines = _lines(*part)
        out = batch.lines("stdout", lines)
        assert [x.text for x in out] == [one_by_one._line("stdout", t) for t in part]
        assert all(a is b for a, b in zip(out, lines, strict=True) if a.text == b.text)
    assert batch.counts == one_by_one.counts


def test_a_match_across_two_lines_hides_no_token_on_the_second() -> None:
    """A masked value with a newline matches across the joined batch's lines; a token that
    starts inside that match is still found."""
    r = Redactor()
    r.lines("stdout", _lines('/LOGCOMMAND {"mask": "prev\\nsk-proj"}'))
    out = r.lines("stdout", _lines("x prev", "sk-proj-abcdefghijklmnopqrstuvwx0", "plain"))
    assert [x.text for x in out] == ["x prev", REDACTED, "plain"]
    assert r.counts == {"mask": 1, "openai": 1}


ORDINARY_LOGS = Path(__file__).parent / "ordinary"


def test_ordinary_logs_come_through_unchanged() -> None:
    """The false-positive corpus (tests/ordinary): distributed PyTorch output from an H100
    node (torchrun, NCCL and rendezvous failures), a git log with commit hashes, sha256 and
    md5 checksums, dpkg's log, pip freeze, and training output with UUIDs, losses, paths,
    a notebook's base64 image and secret-sounding words: not one line changed."""
    env = {"HOME": "/home/alice", "PATH": "/usr/bin:/bin", "USER": "alice",
           "SLURM_JOB_ID": "1234", "CUDA_VISIBLE_DEVICES": "0,1", "MASTER_ADDR": "node042"}
    total = 0
    for path in sorted(ORDINARY_LOGS.glob("*.log")):
        texts = path.read_text(errors="replace").splitlines()
        r = Redactor(env)
        assert [x.text for x in r.lines("stdout", _lines(*texts))] == texts, path.name
        assert not r.counts, path.name
        total += len(texts)
    assert total > 2500
