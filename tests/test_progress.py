"""Progress bars as data (docs/rendering.md, "Progress as data"): what a bar's state says,
the series the tracker makes of real tqdm, rich, pip and Keras bytes (tests/captured/, recorded
with the real libraries by tests/capture_tool.py), the mode rule, and the bars every reader
reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logcapture.pipeline import Pipeline
from logcapture.progress import bar_text, bars, parse_bar
from logcapture.records import Progress
from logcapture.render import Renderer
from logcapture.render.progress import Point, ProgressTracker
from logcapture.spool.layout import create_run_dir
from logcapture.spool.reading import iter_run
from logcapture.spool.writer import SpoolWriter
from logcapture.store.export import export_rows

CAPTURED = Path(__file__).parent / "captured"


def _series(name: str, step: float, columns: int = 80) -> list[Point]:
    """The points of a golden input fed a redraw at a time (each ``\\r`` starts a chunk),
    ``step`` seconds apart: the rhythm the program drew them at."""
    raw = (CAPTURED / f"{name}.input").read_bytes()
    r, t = Renderer(columns=columns), ProgressTracker()
    ts, points = 1000.0, []
    for chunk in re.split(rb"(?=\r)", raw):
        ts += step
        points += t.committed([x.text for x in r.feed(chunk)], ts)
        points += t.sample(r.live(), ts, r.redrawn())
    points += t.committed([x.text for x in r.finish()], ts)
    return points + t.finish(ts)


def _at_most_one_a_second(points: list[Point]) -> None:
    by_bar: dict[int, list[Point]] = {}
    for p in points:
        by_bar.setdefault(p.bar, []).append(p)
    for pts in by_bar.values():
        live = [p.ts for p in pts if not p.done]
        assert all(b - a >= 1.0 for a, b in zip(live, live[1:], strict=False)), live


def test_tqdm_bar_becomes_a_series() -> None:
    points = _series("tqdm_slow", 0.05)
    assert {p.bar for p in points} == {0}
    assert all(p.state.label == "train" and p.state.total == 60 for p in points)
    ns = [p.state.n for p in points]
    assert ns == sorted(ns) and ns[0] < 30 and ns[-1] == 60
    assert len(points) >= 3  # about 3 s of bar: a point a second and the end
    assert points[-1].done and not any(p.done for p in points[:-1])
    assert all(p.rate is None or 5 < p.rate < 40 for p in points)  # tqdm's own it/s
    _at_most_one_a_second(points)


def test_keras_bars_one_per_epoch() -> None:
    points = _series("keras_progbar", 0.05)
    assert sorted({p.bar for p in points}) == [0, 1]
    finals = [p for p in points if p.done]
    assert [(p.state.n, p.state.total) for p in finals] == [(30, 30), (30, 30)]
    assert all(p.state.unit == "step" for p in points)
    # "2s 51ms/step": about 20 steps a second, and the epoch's own elapsed time
    assert all(15 < p.rate < 25 for p in finals if p.rate is not None)
    assert all(p.elapsed == 2.0 for p in finals)
    _at_most_one_a_second(points)


def test_rich_bars_two_at_once() -> None:
    points = _series("rich_progress", 0.02 * 3)
    labels = {p.bar: p.state.label for p in points}
    assert sorted(labels.values()) == ["model.bin", "vocab.txt"]
    finals = {labels[p.bar]: p.state.n for p in points if p.done}
    assert finals == {"model.bin": 100.0, "vocab.txt": 100.0}
    _at_most_one_a_second(points)


@pytest.mark.parametrize("name", ["pip_download", "pip_download_narrow"])
def test_pip_download_bar(name: str) -> None:
    columns = 50 if name.endswith("narrow") else 80
    points = _series(name, 0.01, columns)
    last = [p for p in points if p.done][-1]
    assert (last.state.n, last.state.total, last.state.unit) == (60.0, 60.0, "MB")
    assert last.rate is not None and last.rate > 10


def test_parse_bar_shapes() -> None:
    s = parse_bar("train: 100%|██| 1000/1000 [01:02<00:00, 1.23s/it, loss=0.1]")
    assert s is not None and (s.label, s.n, s.total, s.elapsed) == ("train", 1000, 1000, 62)
    assert s.rate == pytest.approx(1 / 1.23)
    s = parse_bar("12345it [00:03, 4012.34it/s]")
    assert s is not None and (s.n, s.total, s.rate) == (12345, None, 4012.34)
    s = parse_bar(" 45/100 [=============>................] - ETA: 1s - loss: 0.3")
    assert s is not None and (s.n, s.total) == (45, 100)
    s = parse_bar("wget.tar.gz        45%[=======>         ]  45.20M  12.3MB/s    eta 3s")
    assert s is not None and s.label == "wget.tar.gz" and s.n == 45.2 * 2**20
    s = parse_bar("processed 45/100 files")
    assert s is not None and not s.strong and (s.label, s.n, s.total) == ("processed", 45, 100)
    for text in ("date 2024/11/27", "plain text", "ratio 5/3", "1004096 bytes copied"):
        assert parse_bar(text) is None, text


def test_a_counter_is_a_bar_only_once_seen_counting() -> None:
    t = ProgressTracker()
    # a log line that mentions a fraction, committed at once: no bar
    assert t.committed(["step 3/10 done"], 1.0) == []
    r = Renderer()
    points = []
    for i, ts in ((1, 2.0), (2, 3.0), (3, 4.0)):
        r.feed(f"\rfiles {i}/3".encode())
        points += t.sample(r.live(), ts, r.redrawn())
    points += t.committed([x.text for x in r.feed(b"\n") + r.finish()], 4.5)
    # the first state was drawn on a fresh line: a counter only once drawn over
    assert [(p.state.n, p.done) for p in points] == [(2, False), (3, False), (3, True)]
    # the same counter printed a line at a time (no carriage return) is no bar
    t, r = ProgressTracker(), Renderer()
    points = []
    for i, ts in ((1, 2.0), (2, 3.0), (3, 4.0)):
        points += t.committed([x.text for x in r.feed(f"files {i}/3\n".encode())], ts)
        points += t.sample(r.live(), ts, r.redrawn())
    assert points + t.committed([x.text for x in r.finish()], 5.0) + t.finish(5.0) == []


def _run(tmp_path: Path, mode: str, data: list[bytes]) -> list[Progress]:
    spool = SpoolWriter(create_run_dir(tmp_path, "r"), fsync=False)
    p = Pipeline("r", spool, mode=mode, columns=80, rows=24)
    ts = 1000.0
    for chunk in data:
        ts += 0.5
        p.feed("stderr", chunk, ts)
        p.tick(ts)
    p.finish(exit_status=0, signal=None, state="COMPLETED", duration=0.0, bytes_read={})
    return [r for r in iter_run(tmp_path / "r") if isinstance(r, Progress)]


def _tqdm_states(label: str, n: int) -> list[bytes]:
    return [f"\r{label}: {i * 10:3d}%|{'#' * i:10}| {i}/10 [00:0{i}<00:00, 2.00it/s]".encode()
            for i in range(n)]


def test_pipeline_spools_the_points(tmp_path: Path) -> None:
    recs = _run(tmp_path, "enabled", [*_tqdm_states("epoch", 11), b"\n"])
    assert recs and {r.stream for r in recs} == {"progress:stderr"}
    assert [r.seq for r in recs] == list(range(len(recs)))
    assert recs[-1].n == 10 and recs[-1].done == 1 and recs[-1].label == "epoch"
    (bar,) = bars([r.to_dict() for r in recs])
    assert bar["label"] == "epoch" and bar["n"] == 10 and bar["total"] == 10
    assert bar["stream"] == "stderr" and bar["done"]
    assert "epoch: 10/10 it (100%)" in bar_text(bar)
    rows = export_rows("progress", [r.to_dict() for r in recs])
    assert rows[-1]["n"] == 10 and rows[-1]["done"] is True and rows[-1]["stream"] == "stderr"


@pytest.mark.parametrize("mode", ["disabled", "metadata"])
def test_a_bar_printed_in_a_mode_that_drops_text_is_no_data(tmp_path: Path, mode: str) -> None:
    assert _run(tmp_path, mode, [*_tqdm_states("secret", 11), b"\n"]) == []


def test_a_bar_after_a_command_that_disables_is_no_data(tmp_path: Path) -> None:
    data = [*_tqdm_states("public", 4), b"\n",
            b'/LOGCOMMAND {"mode": "disabled"}\n', *_tqdm_states("hidden", 11), b"\n",
            b'/LOGCOMMAND {"mode": "enabled"}\n', *_tqdm_states("again", 11), b"\n"]
    labels = {r.label for r in _run(tmp_path, "enabled", data)}
    assert labels == {"public", "again"}


def test_bar_labels_are_redacted(tmp_path: Path) -> None:
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    recs = _run(tmp_path, "enabled", [*_tqdm_states(f"push {token}", 11), b"\n"])
    assert recs and all(token not in r.label for r in recs)


def test_a_flood_of_lines_with_fractions_is_no_bar(tmp_path: Path) -> None:
    """Plain lines that mention n/total, read in chunks that end mid-line (the cursor's line
    at each sample is a partial line, a different one each time), are no bar; the carriage
    return first makes the stream one whose lines are looked at."""
    text = b"\r" + b"".join(b"step %d loss 0.%d done %d/1000 tokens\n" % (i, i % 97, i % 1000)
                             for i in range(20000))
    assert _run(tmp_path, "enabled", [text[i:i + 4093] for i in range(0, len(text), 4093)]) == []


def test_wget_bar_with_a_scrolling_name_is_one_bar() -> None:
    points = _series("wget_download", 0.2)  # wget redraws about 5 times a second
    assert {p.bar for p in points} == {0}
    last = points[-1]
    assert last.done and last.state.n == last.state.total == pytest.approx(2.86 * 2**20)
    assert last.state.unit == "B" and last.elapsed == 2.1
    assert last.rate == pytest.approx(1.38 * 2**20)
    ns = [p.state.n for p in points]
    assert ns == sorted(ns) and len(points) >= 3
    _at_most_one_a_second(points)


REPLAY = ("import re, sys, time\nraw = open(sys.argv[1], 'rb').read()\n"
          "for c in re.split(rb'(?=\\r)', raw):\n"
          "    sys.stderr.buffer.write(c); sys.stderr.flush(); time.sleep(0.05)\n")


def test_show_and_export_agree_from_spool_and_store(lc_env: dict[str, str],
                                                    tmp_path: Path) -> None:
    """Real tqdm bytes replayed at their pace under `logcapture run`: `show --json`'s
    `progress` and `export --what progress` from the spool (before upload) and from the store
    (after) are the same, and `show` prints the bar's final state and mean rate."""
    import json
    import sys

    from helpers import lc

    env = {**lc_env, "LOGCAPTURE_STORE": f"chdb://{tmp_path / 'store'}"}
    res = lc(["run", "--run-id", "bars", "--no-sample", "--", sys.executable, "-c", REPLAY,
                  str(CAPTURED / "tqdm_slow.input")], env)
    assert res.returncode == 0, res.stderr

    def read(source: str) -> tuple[list[dict], bytes, str]:
        shown = lc(["show", "bars", "--json", "--source", source], env)
        assert shown.returncode == 0, shown.stderr
        rows = lc(["export", "bars", "--what", "progress", "--format", "csv",
                       "--source", source], env)
        text = lc(["show", "bars", "--source", source], env).stdout.decode()
        return json.loads(shown.stdout)["progress"], rows.stdout, text

    spool = read("spool")
    assert lc(["upload", "bars"], env).returncode == 0
    store = read("store")
    assert spool[0] == store[0] and spool[1] == store[1]
    (bar,) = spool[0]
    assert (bar["label"], bar["n"], bar["total"], bar["unit"], bar["stream"]) == (
        "train", 60, 60, "it", "stderr")
    assert bar["done"] and bar["points"] >= 3 and 5 < bar["rate"] < 40
    assert spool[1].decode().splitlines()[0] == (
        '"ts","stream","bar","label","n","total","unit","rate","elapsed","done"')
    assert len(spool[1].decode().splitlines()) == 1 + bar["points"]
    assert "progress bars:" in spool[2] and "train: 60/60 it (100%)" in spool[2]


@pytest.mark.parametrize("name", ["lightning_tqdm", "lightning_rich"])
def test_lightning_bars_on_a_gpu(name: str) -> None:
    """PyTorch Lightning's two progress bars (tqdm and rich), recorded on an H100 node: the
    epochs' bars and the validation bars between them, each ending at its total."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from capture_tool import size

    points = _series(name, 0.01, size(name)[0])
    labels = {p.bar: p.state.label for p in points}
    epochs = [p for p in points if p.done and labels[p.bar].startswith("Epoch")]
    assert epochs and all(p.state.n == p.state.total == 313 for p in epochs)
    assert any(v.startswith("Validation") for v in labels.values())
    assert all(p.rate is None or p.rate > 10 for p in points)
    _at_most_one_a_second(points)


# The final states the Lightning bytes drew: each epoch's bar at 313/313, drawn over by the next
# epoch's 0/313 after the validation bar (leave=False) was erased; rich refreshes at 10 Hz, so
# its validation bar was last drawn at 74/79 and 78/79, tqdm's at 79/79.
LIGHTNING_FINALS = {
    "lightning_rich": [("Epoch 0/1", 313), ("Validation", 74), ("Epoch 1/1", 313),
                       ("Validation", 78), ("Epoch 1/1", 313)],
    "lightning_tqdm": [("Epoch 0", 313), ("Validation DataLoader 0", 79), ("Epoch 1", 313),
                       ("Epoch 1", 313), ("Validation DataLoader 0", 79)],
}


@pytest.mark.parametrize("name", sorted(LIGHTNING_FINALS))
@pytest.mark.parametrize("step", [0.005, 0.008, 0.012, 0.015, 0.02, 0.04])
def test_a_bar_drawn_over_by_a_reset_keeps_its_final_state(name: str, step: float) -> None:
    """On a GPU an epoch and its validation take about a second: at the pace of a redraw each
    ``step`` seconds, the next epoch's 0/313 draws over the bar within one second of its last
    sample. Each bar still ends with the last state the program drew (not the one the last
    sample happened to see: 'Epoch 0/1 254/313'), and no bar is split or lost."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from capture_tool import size

    points = _series(name, step, size(name)[0])
    # (Lightning's sanity check, two batches before any bar is live, is seen or not depending
    # on where a look falls: a stream with no bar live is looked at every LOOK_EVERY.)
    finals = [p for p in points if p.done and not p.state.label.startswith("Sanity")]
    assert sorted((p.state.label, p.state.n) for p in finals) == sorted(LIGHTNING_FINALS[name])
    assert len({p.bar for p in points if not p.state.label.startswith("Sanity")}) == len(
        finals)  # one final point per bar
    _at_most_one_a_second(points)


def test_lightning_epochs_end_at_their_total_in_show_and_export(lc_env: dict[str, str]) -> None:
    """Lightning's rich bars replayed under `logcapture run` on the 120x30 screen they were
    drawn for, a redraw each 15 ms: the epoch's end and its validation take 0.6 s, so the
    next epoch draws over the bar within a second of its last sample. `show`, `show --json`
    and `export --what progress` end each epoch at 313/313."""
    import csv
    import io
    import json
    import sys

    from helpers import lc

    env = {**lc_env, "LOGCAPTURE_COLUMNS": "120", "LOGCAPTURE_LINES": "30"}
    replay = REPLAY.replace("0.05", "0.015")
    res = lc(["run", "--run-id", "gpu", "--no-sample", "--", sys.executable, "-c", replay,
              str(CAPTURED / "lightning_rich.input")], env)
    assert res.returncode == 0, res.stderr
    shown = json.loads(lc(["show", "gpu", "--json"], env, check=True).stdout)["progress"]
    epochs = [b for b in shown if b["label"].startswith("Epoch")]
    assert [b["label"] for b in epochs][:2] == ["Epoch 0/1", "Epoch 1/1"]
    assert all((b["n"], b["total"], b["done"]) == (313, 313, True) for b in epochs)
    assert all(b["rate"] > 10 for b in epochs)
    text = lc(["show", "gpu"], env, check=True).stdout.decode()
    assert "Epoch 0/1: 313/313 it (100%)" in text
    rows = list(csv.DictReader(io.StringIO(lc(
        ["export", "gpu", "--what", "progress", "--format", "csv"], env, check=True
    ).stdout.decode())))
    finals = {r["bar"]: r for r in rows if r["done"] == "true"}
    first = [r for r in rows if r["label"] == "Epoch 0/1"]
    assert first and {r["bar"] for r in first} == {first[0]["bar"]}  # one bar, not two
    assert finals[first[0]["bar"]]["n"] == "313"


def test_a_line_read_in_the_middle_of_its_redraw_is_no_state() -> None:
    """A read that ends in the middle of a redraw leaves the new state's start and the old
    state's end on the line ('| 3' over '| 299/313'): no state until the redraw is done."""
    frame = "\rEpoch 1: {:3d}%|{:<10}| {}/313 [00:01<00:00, 290.00it/s]"
    r = Renderer(columns=120)
    r.feed(frame.format(95, "#" * 9, 299).encode())
    assert [s.n for s in map(parse_bar, r.live()) if s] == [299]
    new = frame.format(96, "#" * 9, 300).encode()
    r.feed(new[:25])  # "\rEpoch 1:  96%|#########| 3" over the old line
    assert r.live() == []
    r.feed(new[25:])
    assert [s.n for s in map(parse_bar, r.live()) if s] == [300]
    # a counter that rests its cursor at the start of its line (print(..., end="\r"))
    r = Renderer()
    r.feed(b"files 1/3\rfiles 2/3\r")
    assert r.live() == ["files 2/3"]


def test_a_committed_bar_drawn_again_is_the_same_bar() -> None:
    """A live display's row committed while the program still redraws it (the renderer's busy
    commit) is the bar's final state; drawn again unchanged, it is not a new bar."""
    t = ProgressTracker()
    done = "Epoch 0/1  ━━━━━━━━━━ 313/313 0:00:01 • 0:00:00 281.02it/s"
    points = t.sample(["Epoch 0/1  ━━━━━━━━━━ 200/313 0:00:01 • 0:00:01 280.00it/s"], 1.0)
    points += t.committed([done], 1.4)
    for ts in (1.5, 1.7, 2.6, 3.7):
        points += t.sample([done], ts)
    points += t.sample(["Epoch 1/1  ━━━━━━━━━━ 20/313 0:00:00 • 0:00:01 280.00it/s"], 4.0)
    points += t.finish(4.5)
    assert [(p.bar, p.state.label, p.state.n, p.done) for p in points] == [
        (0, "Epoch 0/1", 200, False), (0, "Epoch 0/1", 313, True),
        (1, "Epoch 1/1", 20, False), (1, "Epoch 1/1", 20, True)]


# The literal each parser tests before its pattern (progress.py): it must be in every text the
# pattern matches, or the test would drop a bar the pattern finds.
_LITERALS = [("_TQDM", "%|"), ("_TQDM_NO_TOTAL", " ["), ("_KERAS", "/"), ("_WGET", "%["),
             ("_COUNTER", "/")]


@pytest.mark.parametrize(("pattern", "literal"), _LITERALS)
def test_each_parsers_literal_is_in_every_match(pattern: str, literal: str) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from logcapture import progress

    compiled = re.compile(getattr(progress, pattern))  # kept as source (progress.py)
    alphabet = st.sampled_from(list("0123456789 :%|[]/<>,.?=-sitkMB/abc\u2501"))

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(st.from_regex(compiled), st.text(alphabet, max_size=60)))
    def check(text: str) -> None:
        if compiled.search(text) is not None:
            assert literal in text, text

    check()
