"""Sections (sections.py): the fold markers of GitHub Actions, GitLab CI and Buildkite, from the
bytes each system's tools print, become section notes through the real pipeline (render,
filter, classify, spool) under any chunking; `logs` marks where each begins and ends with its
duration, the same from the spool and the store (and in SQL as in Python)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers import env_for, lc

from logcapture.logview import LogView, note_text
from logcapture.pipeline import Pipeline
from logcapture.records import NOTE_SECTION, NOTE_SECTION_END, NOTE_SECTION_EXPAND, Line, Note
from logcapture.sections import (
    MarkerBytes,
    Sections,
    duration_text,
    marker,
    may_hold_marker,
)
from logcapture.spool.layout import create_run_dir
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter

# As the tools print them:
# - GitHub Actions' toolkit (@actions/core startGroup/endGroup) writes "::group::NAME" and
#   "::endgroup::", each with the platform's newline.
GITHUB = (b"::group::Install dependencies\n"
          b"Collecting torch\n"
          b"::group::Build wheels\n"
          b"building wheel\n"
          b"::endgroup::\n"
          b"Successfully installed torch\n"
          b"::endgroup::\n"
          b"training\n")
# - GitLab's runner and the documented custom sections: ESC[0K, section_start:UNIX_TS:NAME,
#   optional [collapsed=true], CR, ESC[0K, then the header (coloured, as the runner prints
#   its own); section_end:UNIX_TS:NAME CR ESC[0K.
GITLAB = (b"\x1b[0Ksection_start:1764250000:prepare_executor\r\x1b[0K"
          b"\x1b[0K\x1b[36;1mPreparing the \"docker\" executor\x1b[0;m\n"
          b"Using Docker executor\n"
          b"\x1b[0Ksection_start:1764250001:pull[collapsed=true]\r\x1b[0KPulling image\n"
          b"pulling\n"
          b"\x1b[0Ksection_end:1764250002:pull\r\x1b[0K\n"
          b"\x1b[0Ksection_end:1764250003:prepare_executor\r\x1b[0K\n"
          b"$ python train.py\n")
# - Buildkite: "--- ", "~~~ ", "+++ " at the start of a line (echo), flat.
BUILDKITE = (b"--- :package: Build\n"
             b"make\n"
             b"~~~ Setup cache\n"
             b"cache hit\n"
             b"+++ :pytest: Tests\n"
             b"1 failed\n")
# - Buildkite's "^^^ +++" (a script prints it when a command fails): it expands the group the
#   job is in, and starts and ends none; with no group open, or with more text after it, it
#   is no marker of a group to expand.
BUILDKITE_EXPAND = (b"^^^ +++\n"
                    b"--- :hammer: Build\n"
                    b"make: *** [all] Error 2\n"
                    b"^^^ +++\n"
                    b"~~~ :broom: Cleanup\n"
                    b"rm -rf build\n"
                    b"^^^ +++ not alone\n")


def _run(tmp: Path, data: bytes, cuts: list[int], stream: str = "stdout",
         mode: str = "enabled") -> list[object]:
    name = f"r{random.getrandbits(32)}"
    p = Pipeline(name, SpoolWriter(create_run_dir(tmp, name), fsync=False), mode=mode,
                 columns=80, rows=24)
    prev, t = 0, 1000.0
    for c in [*cuts, len(data)]:
        if c > prev:
            p.feed(stream, data[prev:c], t, t)
            t += 0.25
        prev = c
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=1.0, bytes_read={})
    return [r for r in iter_run(tmp / name) if r.stream in ("stdout", "stderr")]


def _shape(records: list[object]) -> list[tuple[str, str, int | None]]:
    out: list[tuple[str, str, int | None]] = []
    for r in records:
        if isinstance(r, Line):
            out.append(("line", r.text, None))
        elif isinstance(r, Note) and r.note == NOTE_SECTION:
            out.append(("start", r.text, r.count))
        elif isinstance(r, Note) and r.note == NOTE_SECTION_END:
            out.append(("end", r.text, None))
        elif isinstance(r, Note) and r.note == NOTE_SECTION_EXPAND:
            out.append(("expand", r.text, None))
    return out


WANT = {
    "github": [("start", "Install dependencies", 1), ("line", "Collecting torch", None),
               ("start", "Build wheels", 1), ("line", "building wheel", None),
               ("end", "Build wheels", None), ("line", "Successfully installed torch", None),
               ("end", "Install dependencies", None), ("line", "training", None)],
    "gitlab": [("start", 'Preparing the "docker" executor', 0),
               ("line", "Using Docker executor", None), ("start", "Pulling image", 1),
               ("line", "pulling", None), ("end", "Pulling image", None),
               ("end", 'Preparing the "docker" executor', None),
               ("line", "$ python train.py", None)],
    "buildkite": [("start", ":package: Build", 1), ("line", "make", None),
                  ("end", ":package: Build", None), ("start", "Setup cache", 1),
                  ("line", "cache hit", None), ("end", "Setup cache", None),
                  ("start", ":pytest: Tests", 0), ("line", "1 failed", None),
                  ("end", ":pytest: Tests", None)],  # never closed: ends with the run
    "buildkite_expand": [("start", ":hammer: Build", 1), ("line", "make: *** [all] Error 2", None),
                         ("expand", ":hammer: Build", None), ("end", ":hammer: Build", None),
                         ("start", ":broom: Cleanup", 1), ("line", "rm -rf build", None),
                         ("line", "^^^ +++ not alone", None), ("end", ":broom: Cleanup", None)],
}
BYTES = {"github": GITHUB, "gitlab": GITLAB, "buildkite": BUILDKITE,
         "buildkite_expand": BUILDKITE_EXPAND}


@pytest.mark.parametrize("ci", sorted(BYTES))
def test_each_cis_markers_become_sections_under_any_chunking(tmp_path, ci):
    data = BYTES[ci]
    assert _shape(_run(tmp_path, data, [])) == WANT[ci]
    rng = random.Random(ci)
    for _ in range(15):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
        assert _shape(_run(tmp_path, data, cuts)) == WANT[ci], cuts
    one = list(range(1, len(data)))  # a byte at a time
    assert _shape(_run(tmp_path, data, one)) == WANT[ci]


def test_durations_nesting_and_the_logs_marks(tmp_path):
    recs = _run(tmp_path, GITHUB, [GITHUB.index(b"::endgroup::")])  # the end a read later
    ends = [r for r in recs if isinstance(r, Note) and r.note == NOTE_SECTION_END]
    assert [r.count for r in ends] == [250, 250]  # ms, by the read times
    texts = [e.text for e in LogView(stderr=True).feed(recs)]
    assert texts[:2] == ["[logcapture: section Install dependencies (folded)]",
                         "Collecting torch"]
    assert "[logcapture: end of section Build wheels, 250 ms]" in texts
    # A section's marker line is no line: it has no number, and the lines keep theirs.
    assert [e.line for e in LogView(stderr=True).feed(recs) if e.line] == [1, 2, 3, 4]


def test_a_repeated_end_marker_ends_two_sections(tmp_path):
    # The filter drops a repeated line; a repeated marker is that marker again.
    data = b"::group::a\n::group::b\nx\n::endgroup::\n::endgroup::\ny\n"
    assert _shape(_run(tmp_path, data, [])) == [
        ("start", "a", 1), ("start", "b", 1), ("line", "x", None), ("end", "b", None),
        ("end", "a", None), ("line", "y", None)]


@pytest.mark.parametrize("mode", ["metadata", "disabled"])
def test_text_a_mode_drops_never_becomes_a_section(tmp_path, mode):
    recs = _run(tmp_path, GITHUB + GITLAB + BUILDKITE, [], mode=mode)
    assert not any(isinstance(r, Note) and r.note in (NOTE_SECTION, NOTE_SECTION_END)
                   for r in recs)
    assert not any("Install" in str(getattr(r, "text", "")) for r in recs)


def test_marker_rules():
    assert marker("::group::") is not None and marker("::groupx") is None
    assert marker("section_start:1:a b") is not None  # the header after the space
    assert marker("section_end:1:a trailing") is None  # an end has no header
    assert marker("--- ") is None and marker("---- x") is None and marker("-- x") is None
    s = Sections()
    s.apply(marker("section_start:1:outer Outer"), 0.0)
    s.apply(marker("::group::inner"), 1.0)
    # GitLab's end names its section: it ends what was opened inside it too
    assert s.apply(marker("section_end:2:outer"), 3.0) == [("inner", 2000), ("Outer", 3000)]
    assert s.close(4.0) == []
    assert [duration_text(ms) for ms in (5, 999, 1000, 12345, 61000, 3_723_000)] == [
        "5 ms", "999 ms", "1.0 s", "12.3 s", "1 min 01 s", "1 h 02 min"]
    assert note_text(NOTE_SECTION_END, 61000, "t") == "[logcapture: end of section t, 1 min 01 s]"
    # Buildkite: ~~~ opens collapsed like ---; ^^^ +++ expands the innermost, ends nothing
    assert marker("~~~ Setup") == marker("--- Setup")
    assert marker("^^^ +++").what == "expand" and marker("^^^ +++  ").what == "expand"
    assert marker("^^^ ++") is None and marker("^^^ +++x") is None
    s.apply(marker("--- a"), 0.0)
    assert s.apply(marker("^^^ +++"), 1.0) == [] and s.innermost() == "a"
    assert note_text(NOTE_SECTION_EXPAND, 0, "a") == "[logcapture: section a expanded]"
    # the batch test looks at the starts of lines only: a marker's text inside a line is none
    for batch in ("--- a", "x\n::group::a", "x\n::endgroup::", "x\nsection_end:1:a",
                  "x\n~~~ a", "x\n+++ a", "x\n^^^ +++"):
        assert may_hold_marker(batch), batch
    for batch in ("epoch 1 --- loss 0.3", "x\nrun ::group::a", "x\nmy_section_end", "-- a",
                  "x\n:: group"):
        assert not may_hold_marker(batch), batch


def test_marker_bytes_keep_the_output_files_bytes_and_hold_only_a_cut_marker():
    m = MarkerBytes()
    assert m.feed(b"plain text\n") == b"plain text\n"
    assert m.feed(b"a section_start:12:x") == b"a "  # cut: held
    assert m.feed(b"\r\x1b[0KHead\n") == b"section_start:12:x \x1b[0KHead\n"
    assert m.feed(b"ends with s") == b"ends with "
    assert m.finish() == b"s"


def test_logs_marks_sections_the_same_from_the_spool_and_the_store(tmp_path):
    """A real run under `logcapture run`: bash's printf writes the markers as the CIs print
    them; `logs` from the spool, from the store (the SQL note text: the page and Grafana),
    and the page's entries agree."""
    env = env_for(tmp_path)
    script = ("printf '::group::Install\\n'; echo pip; sleep 0.3; printf '::endgroup::\\n';"
              "printf '\\033[0Ksection_start:1764250000:tests[collapsed=true]\\r\\033[0K"
              "Running tests\\n'; echo ok; printf '^^^ +++\\n'; printf '+++ Report\\n';"
              "echo done")
    lc(["run", "--run-id", "s", "--", "bash", "-c", script], env, check=True)
    spool = lc(["logs", "-n", "--source", "spool", "s"], env,
               check=True).stdout.decode().splitlines()
    assert spool[0] == "      \t[logcapture: section Install (folded)]"
    assert spool[1] == "     1\tpip"
    assert spool[2].startswith("      \t[logcapture: end of section Install, ")
    assert spool[3] == "      \t[logcapture: section Running tests (folded)]"
    assert spool[5] == "      \t[logcapture: section Running tests expanded]"
    assert spool[-1].startswith("      \t[logcapture: end of section Report, ")
    assert "section_start" not in "\n".join(spool)
    lc(["upload", "s"], env, check=True)
    stored = lc(["logs", "-n", "--source", "store", "s"], env, check=True).stdout.decode()
    assert stored.splitlines() == spool
    from logcapture.query import StoreReader
    from logcapture.store import open_store

    st = open_store(f"chdb://{tmp_path / 'state' / 'logcapture' / 'store'}")
    try:
        page = StoreReader(lambda: _Borrow(st), None).log("s", True, limit=100)
    finally:
        st.close()
    assert [e["text"] for e in page["entries"]] == [r.partition("\t")[2] for r in spool]


class _Borrow:
    def __init__(self, st: object) -> None:
        self.st = st

    def __enter__(self) -> object:
        return self.st

    def __exit__(self, *exc: object) -> None:
        pass
