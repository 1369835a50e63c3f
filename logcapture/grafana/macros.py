"""Grafana's side of a panel query, done in Python so tests can run the exact SQL Grafana
would send: template variables (``$run``, ``${run}``, ``${run:sqlstring}``, multi-value
``${runs:singlequote}``, ``${pattern:percentencode}``) and the ClickHouse plugin's macros
(pkg/macros/macros.go upstream:
``$__timeFilter(col)``, ``$__fromTime``, ``$__toTime``, the ``_ms`` forms, ``$__interval_s``,
``$__timeInterval(col)``).

Only the forms the generated dashboards use are supported; anything left over raises, so a
dashboard cannot ship a macro the tests did not expand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from urllib.parse import quote

Value = str | int | float | Sequence[str]

_VAR = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)")
_MACRO = re.compile(r"\$__(\w+)(?:\(([^()]*)\))?")


def _sqlstring(s: str) -> str:
    # Grafana's sqlstring/singlequote formats: each value quoted, single quotes doubled.
    # Backslashes are left alone, as Grafana does; run ids and user names never hold one.
    return "'" + s.replace("'", "''") + "'"


def _format(value: Value, fmt: str | None) -> str:
    values = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    if fmt in ("sqlstring", "singlequote"):
        return ",".join(_sqlstring(v) for v in values)
    if fmt == "percentencode":
        # encodeURIComponentStrict: everything but letters, digits and -_.~ as %XX of UTF-8
        return quote("{" + ",".join(values) + "}" if isinstance(value, (list, tuple))
                     else values[0], safe="")
    if fmt in (None, "raw", "text"):
        return ",".join(values)
    raise ValueError(f"variable format {fmt!r} not supported")


def interpolate(sql: str, variables: Mapping[str, Value], time_from: datetime,
                time_to: datetime, interval_seconds: int = 60) -> str:
    """The SQL the ClickHouse plugin would run for ``sql`` with these variable values and
    this dashboard time range."""
    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name.startswith("__"):
            return m.group(0)  # a macro, expanded below
        if name not in variables:
            raise KeyError(f"no value for dashboard variable ${name}")
        return _format(variables[name], m.group(2))

    frm, to = int(time_from.timestamp()), int(time_to.timestamp())
    frm_ms, to_ms = int(time_from.timestamp() * 1000), int(time_to.timestamp() * 1000)

    def macro(m: re.Match[str]) -> str:
        name, arg = m.group(1), (m.group(2) or "").strip()
        if name == "timeFilter":
            return f"{arg} >= toDateTime({frm}) AND {arg} <= toDateTime({to})"
        if name == "timeFilter_ms":
            return (f"{arg} >= fromUnixTimestamp64Milli({frm_ms}) AND "
                    f"{arg} <= fromUnixTimestamp64Milli({to_ms})")
        if name == "fromTime":
            return f"toDateTime({frm})"
        if name == "toTime":
            return f"toDateTime({to})"
        if name == "fromTime_ms":
            return f"fromUnixTimestamp64Milli({frm_ms})"
        if name == "toTime_ms":
            return f"fromUnixTimestamp64Milli({to_ms})"
        if name == "interval_s":
            return str(max(interval_seconds, 1))
        if name == "timeInterval":
            return (f"toStartOfInterval(toDateTime({arg}), "
                    f"INTERVAL {max(interval_seconds, 1)} second)")
        raise ValueError(f"macro $__{name} not supported")

    out = _VAR.sub(var, sql)
    return _MACRO.sub(macro, out)
