"""Progress bars as data: what one state of a bar says (``parse_bar``), and a run's bars from
its ``Progress`` records (``bars``), as ``show``, ``show --json``, the page and the exports
report them. docs/rendering.md ("Progress as data") states the rules.

A state is the text a terminal shows of a bar that the renderer collapses: tqdm's
``desc: 45%|███▌  | 45/100 [00:03<00:04, 12.5it/s]``, rich's ``label ━━━━╸━━━ 45% 0:00:03``,
Lightning's rich bar ``Epoch 1/3 ━━━━ 313/313 0:00:01 • 0:00:00 284.63it/s train_loss: 0.6``,
pip's ``━━━━ 19.0/60.0 MB 97.0 MB/s eta 0:00:01``, Keras' ``45/100 ━━━━ 1s 12ms/step - loss:
0.3`` (and Keras 2's ``45/100 [====>...] - ETA: 1s``), wget's ``f.tar  45%[==>   ]  45.2M
12.3MB/s  eta 3s``, or a counter ``label 45/100`` redrawn with ``\\r``. Each gives a label,
the count ``n``, the ``total`` (None when the bar has none), the unit, and the rate (per
second) and elapsed time where the bar prints them. ``strong`` says the text has a bar's own
shape (the formats above but the plain counter): a plain ``n/total`` in a line is a bar only
when the line was seen redrawn.

Pure functions of text and record dicts: the capture side (``render.progress``) and every
reader use them.
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the job start path)
if TYPE_CHECKING:
    from typing import Any

#: The reserved streams of progress records: ``progress:stdout``, ``progress:stderr``.
STREAM_PREFIX = "progress:"
#: At most one point a second per bar (plus its final state).
INTERVAL = 1.0


def progress_stream(stream: str) -> str:
    return STREAM_PREFIX + stream


class BarState(namedtuple("BarState", ("label", "n", "total", "unit", "rate", "elapsed",
                                        "strong", "key"),
                           defaults=("", None, None, True, None))):
    """One state of a bar (a ``collections.namedtuple``: no ``typing`` on the start path).
    ``key``: what follows the bar from state to state when its label does not: wget scrolls a
    long file name through its label's place, so its bar is known by its shape alone."""

    __slots__ = ()
    if TYPE_CHECKING:
        label: str
        n: float
        total: float | None
        unit: str
        rate: float | None  # per second, in ``unit``
        elapsed: float | None  # seconds
        strong: bool
        key: str | None


_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"": 1.0, "K": 1024.0, "M": 1024.0 ** 2, "G": 1024.0 ** 3, "T": 1024.0 ** 4}
_NUM = r"\d+(?:\.\d+)?"


def _clock(text: str) -> float | None:
    """``1:02:03``, ``02:03`` or ``0:00:03`` as seconds; None for ``?`` or ``-:--:--``."""
    try:
        secs = 0.0
        for part in text.split(":"):
            secs = secs * 60 + float(part)
        return secs
    except ValueError:
        return None


def _scaled(number: str, prefix: str) -> float:
    return float(number) * _SCALE.get(prefix, 1.0)


# Each shape's pattern is kept as its source and compiled by ``re`` at its first use (re
# keeps what it compiled): compiling all eight cost ~2 ms at the start of every capture
# worker, and most jobs draw no bar, or bars of one shape (each parser tests a literal its
# pattern needs before it matches: most lines never reach one).
# tqdm's default format (tqdm.format_meter): "{l_bar}{bar}| {n_fmt}/{total_fmt}
# [{elapsed}<{remaining}, {rate_fmt}{postfix}]" where l_bar is "{desc}: {percentage:3.0f}%|";
# without a total "{desc}: {n_fmt}{unit} [{elapsed}, {rate_fmt}{postfix}]". rate_fmt is
# "{rate}{unit}/s", or "{1/rate}s/{unit}" below one a second, or "?{unit}/s" before the first.
_TQDM = (
    rf"^(?:(?P<label>.*?): )?\s*(?P<pct>\d+)%\|[^|]*\| ?(?P<n>{_NUM})(?P<np>[kMGTPEZY]?)/"
    rf"(?P<total>{_NUM})(?P<tp>[kMGTPEZY]?) \[(?P<elapsed>[\d:]+)<[\d:?]+, *"
    rf"(?:(?P<rate>{_NUM})(?P<rp>[kMGTPEZY]?)|\?)(?P<rest>\S*?)(?:,|\]|$)")
_TQDM_NO_TOTAL = (
    rf"^(?:(?P<label>.*?): )?(?P<n>{_NUM})(?P<np>[kMGTPEZY]?)(?P<unit>[A-Za-z]*) "
    rf"\[(?P<elapsed>[\d:]+), *(?:(?P<rate>{_NUM})(?P<rp>[kMGTPEZY]?)|\?)(?P<rest>\S*?)"
    r"(?:,|\]|$)")
# rich's default columns: "{description} {bar} {percentage:>3.0f}% {time_remaining}"; the bar
# is drawn with U+2501/U+2578/U+257A (and U+2500 on a terminal without Unicode it still is).
_RICH = r"^(?P<label>.*?)\s*[━╸╺─]{3,}\s+(?P<pct>\d+)%\s+(?:-:--:--|[\d:]+)\s*$"
# pip (rich, DownloadColumn, TransferSpeedColumn): "━━━ 19.0/60.0 MB 97.0 MB/s eta 0:00:01",
# the last state "60.0/60.0 MB 97.3 MB/s  0:00:00" (elapsed).
_PIP = (
    rf"^(?P<label>.*?)\s*[━╸╺─]{{3,}}\s+(?P<n>{_NUM})/(?P<total>{_NUM}) (?P<unit>[kMGT]?B)"
    rf"(?: (?:(?P<rate>{_NUM}) (?P<rp>[kMGT]?)B/s|\?))?(?:\s+(?P<eta>eta)?\s*"
    r"(?P<clock>-:--:--|[\d:]+))?\s*$")
# Lightning's RichProgressBar: "Epoch 1/1  ━━━━━━ 313/313 0:00:01 • 0:00:00 284.63it/s
# train_loss: 0.657" (count, elapsed • remaining, rate, metrics).
_LIGHTNING = (
    rf"^(?P<label>.*?)\s*[━╸╺─]{{3,}}\s+(?P<n>\d+)/(?P<total>\d+|\?)\s+(?P<elapsed>[\d:]+)\s+"
    rf"•\s+(?:-:--:--|[\d:]+)(?:\s+(?P<rate>{_NUM})(?P<unit>[A-Za-z]*)/s)?")
# Keras 3 (keras.utils.Progbar): "45/100 ━━━━━━ 1s 12ms/step - loss: 0.3"; the time is the
# remaining time while it runs and the elapsed time at the end. Keras 2: "45/100 [====>....]
# - ETA: 1s - loss: 0.3", at the end "100/100 [====] - 2s 15ms/step - loss: 0.2".
_KERAS = (
    rf"^(?P<label>.*?)\s*(?P<n>\d+)/(?P<total>\d+) (?:[━─]+|\[[=>.]*\])"
    rf"(?:\s+-)?\s+(?:(?P<eta>ETA: )?(?P<time>(?:\d+:)*{_NUM}(?:s|ms|us)?))?"
    rf"(?:\s+(?P<per>{_NUM})(?P<pu>s|ms|us)/(?P<what>step|sample))?(?P<rest>.*)$")
# wget's bar: "name   45%[=====>      ]  45.20M  12.3MB/s    eta 3s" (binary prefixes; the last
# state "in 2.1s", the time it took); a name longer than its place scrolls through it.
_WGET = (
    rf"^(?P<label>.*?)\s+(?P<pct>\d+)%\[[=> ]*\]\s+(?P<n>{_NUM})(?P<np>[KMGT]?)\s+"
    rf"(?:(?P<rate>{_NUM})(?P<rp>[KMGT]?)B/s|--\.-KB/s)(?:\s+(?:eta|in) (?P<t>[\dhms. ]+))?\s*$")
# A counter with a total anywhere in a line: "label 45/100" (the first n/total with n <= total).
_COUNTER = r"(?<![\w./])(?P<n>\d+)\s*/\s*(?P<total>\d+)(?![\w/]|\.\d)"
_A_DIGIT = re.compile(r"\d")
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def _hms(text: str | None) -> float | None:
    """wget's ``3s``, ``1m 2s``, ``1h 2m``, ``0.5s`` as seconds."""
    if not text:
        return None
    total = 0.0
    found = False
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)([hms])", text):
        total += float(number) * {"h": 3600.0, "m": 60.0, "s": 1.0}[unit]
        found = True
    return total if found else None


def _label(text: str | None) -> str:
    return (text or "").strip()


def parse_bar(text: str) -> BarState | None:
    """What one state of a progress bar says, or None when ``text`` is none of the shapes in
    the module docstring."""
    if len(text) > 4096 or _A_DIGIT.search(text) is None:
        return None
    for parse in _PARSERS:
        state = parse(text)
        if state is not None:
            return state
    return None


def _tqdm(text: str) -> BarState | None:
    if "%|" not in text:  # in every match: a miss costs no scan of the pattern
        return None
    m = re.match(_TQDM, text)
    if m is None:
        return None
    rate = None
    per = m["rest"]
    if m["rate"] is not None:
        value = _scaled(m["rate"], m["rp"])
        if per.startswith("s/"):  # "{1/rate}s/{unit}": seconds per item
            rate = 1.0 / value if value else None
            per = per[2:] + "/s"
        else:
            rate = value
    unit = per[:-2] if per.endswith("/s") else per
    return BarState(_label(m["label"]), _scaled(m["n"], m["np"]),
                    _scaled(m["total"], m["tp"]), unit or "it", rate, _clock(m["elapsed"]))


def _tqdm_no_total(text: str) -> BarState | None:
    if " [" not in text:  # in every match
        return None
    m = re.match(_TQDM_NO_TOTAL, text)
    if m is None:
        return None
    rate = _scaled(m["rate"], m["rp"]) if m["rate"] is not None else None
    return BarState(_label(m["label"]), _scaled(m["n"], m["np"]), None, m["unit"] or "it",
                    rate, _clock(m["elapsed"]))


def _rich(text: str) -> BarState | None:
    if "\u2501" not in text and "\u2500" not in text and "\u2578" not in text:
        return None
    m = re.match(_LIGHTNING, text)
    if m:
        total = float(m["total"]) if m["total"] != "?" else None
        rate = float(m["rate"]) if m["rate"] is not None else None
        return BarState(_label(m["label"]), float(m["n"]), total, m["unit"] or "it", rate,
                        _clock(m["elapsed"]))
    m = re.match(_PIP, text)
    if m:
        scale = _SCALE.get(m["unit"][:-1], 1.0)
        rate = (float(m["rate"]) * _SCALE.get(m["rp"], 1.0) / scale
                if m["rate"] is not None else None)
        elapsed = _clock(m["clock"]) if m["clock"] and not m["eta"] else None
        return BarState(_label(m["label"]), float(m["n"]), float(m["total"]), m["unit"],
                        rate, elapsed)
    m = re.match(_RICH, text)
    return BarState(_label(m["label"]), float(m["pct"]), 100.0, "%") if m else None


def _keras(text: str) -> BarState | None:
    if "/" not in text:  # in every match (n/total)
        return None
    m = re.match(_KERAS, text)
    if m is None or int(m["n"]) > int(m["total"]):
        return None
    rate = elapsed = None
    if m["per"] is not None and float(m["per"]):
        rate = 1.0 / (float(m["per"]) * _TIME_UNITS[m["pu"]])  # steps (or samples) a second
    n, total = float(m["n"]), float(m["total"])
    if m["time"] and not m["eta"] and n >= total:
        elapsed = _keras_time(m["time"])
    return BarState(_label(m["label"]), n, total, m["what"] or "step", rate, elapsed)


def _wget(text: str) -> BarState | None:
    if "%[" not in text:  # in every match
        return None
    m = re.match(_WGET, text)
    if m is None:
        return None
    pct = int(m["pct"])
    n = float(m["n"]) * _BIN.get(m["np"], 1.0)
    rate = float(m["rate"]) * _BIN.get(m["rp"], 1.0) if m["rate"] else None
    total = n * 100 / pct if pct else None  # wget prints the share, not the size
    elapsed = _hms(m["t"]) if " in " in text else None
    return BarState(_label(m["label"]), n, total, "B", rate, elapsed, key="wget")


def _counter(text: str) -> BarState | None:
    if "/" not in text:  # in every match
        return None
    for m in re.finditer(_COUNTER, text):
        n, total = int(m["n"]), int(m["total"])
        if 0 <= n <= total and total > 0:
            label = text[:m.start()].strip(" :[(-")
            return BarState(label, float(n), float(total), "", None, None, strong=False)
    return None


_PARSERS = (_tqdm, _tqdm_no_total, _rich, _keras, _wget, _counter)


def _keras_time(text: str) -> float | None:
    """Keras' ``2s``, ``150ms``, ``1:02`` as seconds."""
    for unit in ("ms", "us", "s"):
        if text.endswith(unit):
            try:
                return float(text[:-len(unit)]) * _TIME_UNITS[unit]
            except ValueError:
                return None
    return _clock(text)


# --- a run's bars, as every reader reports them ----------------------------------------------

def _ts(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


# Bars print their elapsed time in whole seconds (tqdm's 00:03, Keras' 2s): from 10 s on it is
# within 10 % and covers the bar's start, which its first point may have missed; below that the
# points' own read times measure the rate better.
_OWN_CLOCK = 10.0


def bars(records: Iterable[dict[str, Any]], series: bool = False) -> list[dict[str, Any]]:
    """A run's bars from its progress record dicts (any order), in the order they began: per
    bar its ``label``, ``stream``, final ``n``, ``total``, ``unit``, ``rate`` (its mean rate
    per second: its count over its own elapsed time when it printed one of 10 s or more, else
    the count it made from its first point to its last over that time when it made one, else
    the last rate it printed), ``elapsed`` (seconds, the bar's own
    when it printed it, else from its first point to its last), ``start`` and ``end`` (epoch
    seconds), ``done`` (its last point was its final state), ``points``; with ``series``, the
    points as ``[ts, n, rate, elapsed]`` lists in time order."""
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for d in records:
        stream = str(d.get("stream", "")).removeprefix(STREAM_PREFIX)
        grouped.setdefault((stream, int(d.get("bar") or 0)), []).append(d)
    out = []
    for (stream, _), points in grouped.items():
        points.sort(key=lambda d: (_ts(d.get("ts")), int(d.get("seq") or 0)))
        first, last = points[0], points[-1]
        t0, t1 = _ts(first.get("ts")), _ts(last.get("ts"))
        n0, n1 = float(first.get("n") or 0.0), float(last.get("n") or 0.0)
        own = last.get("elapsed")
        rate: float | None
        elapsed: float | None = float(own) if own is not None else (
            t1 - t0 + float(first.get("elapsed") or 0.0) if t1 > t0 else None)
        if own is not None and float(own) >= _OWN_CLOCK:
            rate = n1 / float(own)  # the whole run of the bar, on its own clock
        elif t1 > t0 and n1 > n0:
            rate = (n1 - n0) / (t1 - t0)  # over the points' read times
        else:  # one moment, or no count made between its points: what the bar printed
            rate = last.get("rate")
        bar: dict[str, Any] = {
            "label": last.get("label", ""), "stream": stream, "n": n1,
            "total": last.get("total"), "unit": last.get("unit", ""),
            "rate": rate, "elapsed": elapsed,
            "start": t0, "end": t1, "done": bool(last.get("done")), "points": len(points)}
        if series:
            bar["series"] = [[_ts(d.get("ts")), d.get("n"), d.get("rate"), d.get("elapsed")]
                             for d in points]
        out.append(bar)
    out.sort(key=lambda b: (b["start"], b["stream"]))
    return out


def completion(bar: dict[str, Any]) -> float | None:
    """The share of its total a bar reached (0..1), None without a total."""
    total = bar.get("total")
    return min(1.0, float(bar["n"]) / float(total)) if total else None


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def bar_text(bar: dict[str, Any]) -> str:
    """One bar's final state and mean rate, as ``show`` prints it:
    ``train: 200/200 it (100%), 446.6 it/s mean, 0.4 s, stderr``."""
    unit = bar.get("unit") or ""
    total = bar.get("total")
    count = _number(bar["n"]) + (f"/{_number(total)}" if total else "")
    share = completion(bar)
    parts = [f"{count} {unit}".rstrip() + (f" ({share:.0%})" if share is not None
                                           and unit != "%" else "")]
    if bar.get("rate") is not None:
        parts.append(f"{bar['rate']:.4g} {unit or 'items'}/s mean")
    if bar.get("elapsed") is not None:
        parts.append(f"{bar['elapsed']:.3g} s")
    parts.append(str(bar.get("stream", "")))
    return f"{bar.get('label') or '(no label)'}: " + ", ".join(p for p in parts if p)
