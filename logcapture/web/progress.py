"""The job page's progress panel: a run's bars (``progress.bars``) and their graphs of rate and
completion over time, from the points ``export --what progress`` writes (every reader answers
``export_rows``, the read service included)."""

from __future__ import annotations

from typing import Any

from ..progress import bars, completion


def series_name(bar: dict[str, Any]) -> str:
    """A graph's series: the bars of one label and stream, one after another (Keras' bar of
    each epoch, a tqdm bar made anew for each epoch) are one line."""
    label = bar["label"] or "(no label)"
    return label if bar["stream"] == "stdout" else f"{label} ({bar['stream']})"


def progress_graphs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"bars": [...], "x": [...], "rate": {name: values}, "completion": {name: values},
    "units": {name: unit}}``: each bar's summary (as ``show --json``'s ``progress``, without
    its points), and per series its rate (per second) and completion (percent of its total;
    null without one) at each time of ``x`` (epoch seconds, every point's), null where the
    series has no point."""
    found = bars(rows, series=True)
    x = sorted({point[0] for bar in found for point in bar["series"]})
    at = {t: i for i, t in enumerate(x)}
    rate: dict[str, list[float | None]] = {}
    done: dict[str, list[float | None]] = {}
    units: dict[str, str] = {}
    for bar in found:
        name = series_name(bar)
        units.setdefault(name, bar["unit"])
        r = rate.setdefault(name, [None] * len(x))
        c = done.setdefault(name, [None] * len(x))
        total = bar["total"]
        for ts, n, point_rate, _ in bar.pop("series"):
            r[at[ts]] = point_rate
            c[at[ts]] = 100.0 * float(n) / float(total) if total else None
        bar["completion"] = completion(bar)
    return {"bars": found, "x": x, "rate": rate, "units": units,
            "completion": {k: v for k, v in done.items() if any(c is not None for c in v)}}
