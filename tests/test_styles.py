"""Colours (logcapture/sgr.py and every stage that carries a line's style): the SGR rules,
the renderer's spans against real programs' bytes and a real terminal (tmux), the records'
JSON, and a real captured run read from the spool and the store alike, written back by
``logs --color``, searched, diagnosed and turned into metadata on its plain text."""

from __future__ import annotations

import gzip
import json
import shutil
from contextlib import closing
from pathlib import Path

import pytest
from helpers import lc

from logcapture import sgr
from logcapture.classify import Classifier
from logcapture.filter import LineFilter
from logcapture.records import Line, Lines, Rendered, dumps, from_dict
from logcapture.render import Renderer

from .capture_tool import NOT_TERMINAL, TERMINAL_COLUMNS, size, terminal_styles
from .test_render import PureRenderer, render

CAPTURED = Path(__file__).parent / "captured"


def _styled() -> list[str]:
    return sorted(p.stem for p in CAPTURED.glob("*.styles"))


# -- the SGR rules -------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "params", "want"), [
    ("", "1;31", "1;31"),
    ("", "31;1", "1;31"),  # one order whatever the program wrote
    ("", "01;34", "1;34"),  # ls writes a leading zero
    ("", "38;2;255;0;0;1", "1;38;2;255;0;0"),
    ("", "38;5;208", "38;5;208"),
    ("", "48;5;17;97", "97;48;5;17"),
    ("1;31", "0", ""),
    ("1;31", "", ""),  # ESC[m
    ("1;2;31", "22", "31"),  # normal intensity: bold and dim off
    ("3;4;7;32;41", "23;24;27", "32;41"),
    ("1;31", "39;49", "1"),
    ("", "5;8;9;53", ""),  # blink, conceal, strikethrough, overline: not kept
    ("", "38;5;300;1", ""),  # a malformed colour ends the sequence, as in xterm
])
def test_apply_normalises(state: str, params: str, want: str) -> None:
    assert sgr.apply(state, params) == want


def test_spans_from_a_user_file_carry_only_sgr() -> None:
    # A spool file is the user's own: whatever it says, what is written back is SGR.
    assert sgr.spans('[[0,3,"31m\\u001b]0;owned\\u0007"],[1,2,"1"],[3,9,"01;32"]]') \
        == ((1, 2, "1"), (3, 9, "1;32"))
    assert sgr.spans("not json") == () and sgr.spans({"a": 1}) == ()
    assert sgr.spans([[2, 1, "31"], [0, 2, "31"], [1, 3, "32"], [True, 4, "1"]]) \
        == ((0, 2, "31"),)


def test_to_ansi_closes_every_span() -> None:
    assert sgr.to_ansi("ERROR: x", ((0, 5, "1;31"),)) == "\x1b[1;31mERROR\x1b[0m: x"
    assert sgr.to_ansi("ab", ((0, 9, "32"),)) == "\x1b[32mab\x1b[0m"
    assert sgr.to_ansi("plain", ()) == "plain"


def test_remap_keeps_styles_off_a_masked_secret() -> None:
    old = "token ghp_abcdefghijklmnopqrstuvwxyz0123456789 ok"
    new = "token *** ok"
    spans = ((0, 5, "1"), (6, 46, "31"), (47, 49, "32"))
    assert sgr.remap(spans, old, new) == ((0, 5, "1"), (10, 12, "32"))


def test_wants_color() -> None:
    assert sgr.wants_color("auto", True, {}) and not sgr.wants_color("auto", False, {})
    assert not sgr.wants_color("auto", True, {"NO_COLOR": "1"})
    assert sgr.wants_color("auto", True, {"NO_COLOR": ""})  # no-color.org: set and not empty
    assert sgr.wants_color("always", False, {"NO_COLOR": "1"})
    assert not sgr.wants_color("never", True, {})


# -- the renderer --------------------------------------------------------------------------


def test_every_attribute_and_colour_kind_on_both_paths() -> None:
    data = (b"\x1b[1mb\x1b[22;2md\x1b[0;3mi\x1b[0;4mu\x1b[0;7mr\x1b[0;31mf\x1b[0;42mg"
            b"\x1b[0;91mh\x1b[0;38;5;208mx\x1b[0;48;2;10;20;30my\x1b[0m plain\n")
    want = Rendered("bdiurfghxy plain", 0, (
        (0, 1, "1"), (1, 2, "2"), (2, 3, "3"), (3, 4, "4"), (4, 5, "7"), (5, 6, "31"),
        (6, 7, "42"), (7, 8, "91"), (8, 9, "38;5;208"), (9, 10, "48;2;10;20;30")))
    assert render(data) == render(data, PureRenderer) == [want]
    # The same after a cursor motion hands the screen to pyte mid-line.
    moved = data.replace(b" plain", b"\x1b[3C\x1b[3Dplain")
    assert render(moved) == [want._replace(text="bdiurfghxyplain")]


def test_wide_characters_and_emoji_count_as_one_code_point() -> None:
    # Offsets are into the text, in code points: a wide character is one, in two cells.
    got = render("中\x1b[31m文\x1b[0m😀\x1b[32mok\x1b[0m\n".encode())
    assert got == [Rendered("中文😀ok", 0, ((1, 2, "31"), (3, 5, "32")))]
    assert got == render("中\x1b[31m文\x1b[0m😀\x1b[32mok\x1b[0m\n".encode(), PureRenderer)


def test_a_plain_line_has_no_style_and_the_style_never_outlives_its_text() -> None:
    # Trailing spaces are stripped with their style; an erased part loses its style; a
    # colour set and never used leaves no span.
    assert render(b"\x1b[41mred bg   \x1b[0m\n\x1b[31m\x1b[0mplain\nab\x1b[32mcd\x1b[2D\x1b[K\n") \
        == [Rendered("red bg", 0, ((0, 6, "41"),)), Rendered("plain"), Rendered("ab")]
    assert render(b"\x1b[31m" + b"x" * 30 + b"\n", line_limit=10) \
        == [Rendered("x" * 10, 20, ((0, 10, "31"),))]


@pytest.mark.parametrize("name", _styled())
def test_golden_styles(name: str) -> None:
    raw = (CAPTURED / f"{name}.input").read_bytes()
    expected = json.loads((CAPTURED / f"{name}.styles").read_text(encoding="utf-8"))
    columns, rows = size(name)
    for cls in (Renderer, PureRenderer):
        got = [[list(s) for s in line.style]
               for line in render(raw, cls, columns=columns, rows=rows)]
        assert got == expected, cls.__name__


def test_golden_styles_present() -> None:
    assert {"pytest_color", "ls_color", "grep_color", "git_diff_color", "rich_progress",
            "rich_console_log", "colour_logging"} <= set(_styled())


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux, the reference terminal")
@pytest.mark.parametrize("name", [n for n in _styled() if n not in NOT_TERMINAL])
def test_golden_styles_are_what_a_real_terminal_shows(name: str) -> None:
    # tmux plays the same bytes and writes back each cell's colours and attributes
    # (capture-pane -e): each line's spans must be the expected ones.
    raw = (CAPTURED / f"{name}.input").read_bytes()
    expected = json.loads((CAPTURED / f"{name}.styles").read_text(encoding="utf-8"))
    columns, rows = size(name)
    assert terminal_styles(raw, TERMINAL_COLUMNS.get(name, columns), rows) == expected


def test_golden_facts_seen_by_eye() -> None:
    # What the recorded programs are known to print (and a person sees on the terminal).
    def line(name: str, text: str) -> list:
        out = json.loads((CAPTURED / f"{name}.output").read_text(encoding="utf-8"))
        styles = json.loads((CAPTURED / f"{name}.styles").read_text(encoding="utf-8"))
        return styles[next(i for i, t in enumerate(out) if t.startswith(text))]

    assert line("grep_color", "2:step 2 ERROR")[-1] == [9, 14, "1;31"]  # the match
    assert line("ls_color", "data") == [[0, 4, "1;34"]]  # a directory
    assert line("git_diff_color", "-lr") == [[0, 9, "31"]]
    assert line("git_diff_color", "+lr") == [[0, 10, "32"]]
    assert line("pytest_color", "FAILED")[0] == [0, 6, "31"]


# -- records -------------------------------------------------------------------------------


def test_line_json_has_style_only_when_styled_and_kind_last() -> None:
    plain = Line(run="r", stream="stdout", seq=1, ts=2.5, text="x")
    assert plain.to_json() == dumps(plain.to_dict()) and '"style"' not in plain.to_json()
    styled = plain._replace(style=((0, 1, "31"),))
    assert styled.to_json() == dumps(styled.to_dict())
    assert styled.to_json().endswith(',"style":[[0,1,"31"]],"kind":"line"}')
    assert from_dict(json.loads(styled.to_json())).to_dict() == json.loads(styled.to_json())
    lines = Lines(run="r", stream="stdout", seq=3, ts=1.0, texts=("a", "b", "c"),
                  styles=((), ((0, 1, "1"),), ()))
    assert lines.to_json() == "\n".join(x.to_json() for x in lines.lines())
    assert [x.style for x in lines.lines()] == [(), ((0, 1, "1"),), ()]


def test_classifier_keeps_styles_and_reads_plain_text() -> None:
    r = Renderer()
    rendered = r.feed(b'\x1b[32m{"loss": 0.5}\x1b[0m\nplain\n\x1b[31mERROR\x1b[0m x\n') \
        + r.finish()
    f = LineFilter()
    items = f.feed(rendered) + f.finish()
    recs = Classifier("r").feed_many("stdout", items, 1.0)
    lines = [x for rec in recs for x in (rec.lines() if isinstance(rec, Lines) else [rec])]
    assert [(x.kind, getattr(x, "style", None)) for x in lines] == [
        ("line", ((0, 13, "32"),)), ("metadata", None), ("line", ()),
        ("line", ((0, 5, "31"),))]
    assert lines[1].fields == {"loss": 0.5}


def test_the_filter_keeps_a_line_that_differs_only_in_colour() -> None:
    a, b = Rendered("same", 0, ((0, 4, "31"),)), Rendered("same", 0, ((0, 4, "32"),))
    f = LineFilter()
    out = f.feed([a, b, b]) + f.finish()
    assert out[:2] == [a, b] and out[2].count == 1


# -- a real run, end to end ----------------------------------------------------------------

JOB = r"""
printf '\033[1;31mERROR\033[0m: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n'
printf 'plain line\n'
printf '\033[32m{"loss": 1.5, "step": 3}\033[0m\n'
printf '\360\237\230\200 \033[38;5;208mwarm\033[0m \033[38;2;255;0;0mtrue\033[0m\n'
printf '/LOGCOMMAND {"mode": "metadata"}\n'
printf '\033[35mSECRET-%s\033[0m\n' DROPPED
exit 1
"""


@pytest.fixture
def coloured_run(lc_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    res = lc(["run", "--run-id", "col-1", "--no-sample", "--", "sh", "-c", JOB], lc_env)
    assert res.returncode == 1, res.stderr  # a failed run: show diagnoses it
    # The program's own bytes reach its output unchanged, colours included.
    assert b"\x1b[1;31mERROR\x1b[0m" in res.stdout
    env = {**lc_env, "LOGCAPTURE_STORE": f"chdb://{tmp_path / 'store'}"}
    assert lc(["upload", "col-1"], env).returncode == 0
    return env


WANT_STYLES = [((0, 5, "1;31"),), (), ((0, 24, "32"),),
               ((2, 6, "38;5;208"), (7, 11, "38;2;255;0;0"))]


def test_spool_and_store_give_the_same_styles(coloured_run: dict[str, str]) -> None:
    from logcapture.query import LocalReader

    spool = Path(coloured_run["LOGCAPTURE_SPOOL"])
    raw = b"".join(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
                   for p in sorted((spool / "col-1").glob("seg-*")))
    assert b"SECRET-DROPPED" not in raw  # the mode dropped it: no text, no style
    assert raw.count(b'"style"') == 3
    got = {}
    for source in ("spool", "store"):
        with closing(LocalReader(spool, coloured_run["LOGCAPTURE_STORE"],
                                 source=source)) as reader:
            lines = [d for d in reader.lines("col-1") if d["kind"] == "line"]
            got[source] = [(d["text"], sgr.spans(d.get("style"))) for d in lines]
            page = reader.log("col-1", stderr=True)["entries"]
            got[source + " page"] = [(e["text"], e.get("style")) for e in page
                                     if e["kind"] == "line"]
    assert [s for _, s in got["spool"]] == WANT_STYLES
    assert got["spool"] == got["store"]
    assert got["spool page"] == got["store page"]
    assert [s for _, s in got["store page"]] == [
        [list(x) for x in s] if s else None for s in WANT_STYLES]


def test_logs_color(coloured_run: dict[str, str]) -> None:
    outs = {}
    for source in ("spool", "store"):
        for color in ("always", "never", "auto"):
            res = lc(["logs", "col-1", "--source", source, "--color", color],
                         coloured_run)
            assert res.returncode == 0, res.stderr
            outs[source, color] = res.stdout.decode()
    always = outs["spool", "always"]
    assert always.splitlines()[0] == ("\x1b[1;31mERROR\x1b[0m: RuntimeError: CUDA out of "
                                      "memory. Tried to allocate 2.00 GiB")
    assert "😀 \x1b[38;5;208mwarm\x1b[0m \x1b[38;2;255;0;0mtrue\x1b[0m" in always
    assert "\x1b" not in outs["spool", "never"] and "\x1b" not in outs["spool", "auto"]
    assert outs["spool", "never"] == outs["spool", "auto"]  # a pipe is not a terminal
    for color in ("always", "never", "auto"):
        assert outs["spool", color] == outs["store", color]


def test_search_insights_metadata_and_export_see_plain_text(coloured_run: dict[str, str],
                                                           tmp_path: Path) -> None:
    for source in ("spool", "store"):
        where = ["--source", source] if source == "store" else []
        found = lc(["search", "ERROR", *where], coloured_run)
        assert found.returncode == 0, found.stderr
        assert "ERROR: RuntimeError" in found.stdout.decode() and b"\x1b" not in found.stdout
        shown = lc(["show", "col-1", "--json", "--source", source], coloured_run)
        info = json.loads(shown.stdout)
        assert "cuda-oom" in [i["kind"] for i in info["insights"]], (source, info["insights"])
    out = tmp_path / "meta.csv"
    res = lc(["export", "col-1", "--what", "metadata", "--format", "csv", "-o", str(out)],
                 coloured_run)
    assert res.returncode == 0, res.stderr
    assert "1.5" in out.read_text()
    out = tmp_path / "lines.csv"
    res = lc(["export", "col-1", "--what", "lines", "--format", "csv", "-o", str(out)],
                 coloured_run)
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert "ERROR: RuntimeError" in text and "\x1b" not in text and "style" not in text


def test_a_masked_secret_keeps_no_style_and_the_rest_keeps_theirs() -> None:
    from logcapture.redact import Redactor

    secret = "s3cr3t-Value-0123456789"
    r = Renderer()
    got = r.feed(f"\x1b[1mkey\x1b[0m=\x1b[31m{secret}\x1b[0m \x1b[32mok\x1b[0m\n".encode()) \
        + r.finish()
    [line] = Redactor({"API_TOKEN": secret}).lines("stdout", got)
    assert line.text == "key=*** ok"
    assert line.style == ((0, 3, "1"), (8, 10, "32"))
