"""Tests of the filter stage: repeats and blank runs become notes with exact counts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logcapture.filter import LineFilter
from logcapture.records import NOTE_BLANK, NOTE_REPEAT, Dropped, Rendered


def run(texts: list[str], chunk: int = 0) -> tuple[list[Rendered | Dropped], dict[str, int]]:
    f = LineFilter()
    lines = [Rendered(t) for t in texts]
    out: list[Rendered | Dropped] = []
    if chunk:
        for i in range(0, len(lines), chunk):
            out += f.feed(lines[i:i + chunk])
    else:
        out += f.feed(lines)
    out += f.finish()
    return out, f.counts


def test_repeats_keep_first_and_note_count() -> None:
    out, counts = run(["a", "a", "a", "b"])
    assert out == [Rendered("a"), Dropped(NOTE_REPEAT, 2), Rendered("b")]
    assert counts == {"lines_in": 4, "lines_out": 2, "repeats_dropped": 2, "blanks_dropped": 0}


def test_repeat_run_at_end_noted_at_finish() -> None:
    f = LineFilter()
    assert f.feed([Rendered("x")] * 3) == [Rendered("x")]
    assert f.finish() == [Dropped(NOTE_REPEAT, 2)]


def test_blank_runs_become_one() -> None:
    out, counts = run(["a", "", "  ", "", "b", ""])
    assert out == [Rendered("a"), Rendered(""), Dropped(NOTE_BLANK, 2), Rendered("b"),
                   Rendered("")]
    assert counts["blanks_dropped"] == 2


def test_non_consecutive_repeats_kept() -> None:
    out, _ = run(["a", "b", "a", "b"])
    assert out == [Rendered(t) for t in ["a", "b", "a", "b"]]


def test_cut_lines_differ_from_whole_ones() -> None:
    f = LineFilter()
    out = f.feed([Rendered("x", 3), Rendered("x", 3), Rendered("x")]) + f.finish()
    assert out == [Rendered("x", 3), Dropped(NOTE_REPEAT, 1), Rendered("x")]


def test_each_filter_is_one_stream() -> None:
    a, b = LineFilter(), LineFilter()
    assert a.feed([Rendered("x")]) == [Rendered("x")]
    assert b.feed([Rendered("x")]) == [Rendered("x")]


@given(st.lists(st.sampled_from(["a", "b", "", " "]), max_size=60), st.integers(0, 7))
def test_counts_add_up_and_chunking_does_not_matter(texts: list[str], chunk: int) -> None:
    out, counts = run(texts, chunk)
    assert (out, counts) == run(texts)
    kept = [x for x in out if isinstance(x, Rendered)]
    notes = [x for x in out if isinstance(x, Dropped)]
    assert counts["lines_in"] == len(texts)
    assert counts["lines_out"] == len(kept)
    assert sum(n.count for n in notes) == len(texts) - len(kept)
    assert counts["repeats_dropped"] + counts["blanks_dropped"] == len(texts) - len(kept)
    # Expanding the notes gives back the input (blank runs up to whitespace).
    expanded: list[str] = []
    for x in out:
        if isinstance(x, Rendered):
            expanded.append(x.text)
        else:
            expanded += [expanded[-1]] * x.count
    assert [t.strip() for t in expanded] == [t.strip() for t in texts]
    # No two consecutive kept lines are equal or both blank.
    for p, q in zip(kept, kept[1:], strict=False):
        assert p != q and (p.text.strip() or q.text.strip())
