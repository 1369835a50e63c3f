/* logcapture serve: helpers shared by the pages, and the chart with the guide's legend
   (a click shows only that series, Ctrl+click turns one series on or off). */
"use strict";

const LC = (() => {
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2",
                   "#edc948", "#ff9da7", "#9c755f", "#8cd17d", "#bab0ac", "#499894"];

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  async function api(path) {
    const r = await fetch(path, {credentials: "same-origin"});
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { msg = (await r.json()).error || msg; } catch (_) { /* not JSON */ }
      throw new Error(msg);
    }
    return r.json();
  }

  const pad = n => String(n).padStart(2, "0");
  function time(ts) {
    if (ts === null || ts === undefined) return "-";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
           `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  /* The labels of a time axis's ticks (epoch seconds), in local time, for any run length
     (a tenth of a second to months): the clock as precise as the ticks' step needs, so no two
     ticks read the same, and the date as a second line on the first tick and wherever the day
     changes; ticks a day or more apart are dates alone. */
  function timeTicks(vals) {
    const step = vals.length > 1 ? Math.abs(vals[1] - vals[0]) : 1;
    const digits = step >= 1 ? 0 : step >= 0.1 - 1e-9 ? 1 : step >= 0.01 - 1e-9 ? 2 : 3;
    let lastDay = null, lastYear = null;
    return vals.map(v => {
      if (v === null || v === undefined) return "";
      const d = new Date(Math.round(v * 1000));
      const year = d.getFullYear(), day = `${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
      const date = year !== lastYear ? `${year}-${day}` : day;
      const newDay = `${year}-${day}` !== lastDay;
      lastDay = `${year}-${day}`;
      lastYear = year;
      if (step >= 86400 - 1) return date;
      let clock = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
      if (step < 60 - 1e-9) clock += `:${pad(d.getSeconds())}`;
      if (digits) clock += "." + String(d.getMilliseconds()).padStart(3, "0").slice(0, digits);
      return newDay ? clock + "\n" + date : clock;
    });
  }
  /* A time axis at least a tenth of a second wide around its data: uPlot gives a time scale
     whose points share one time 1000 days (its 86400 × 1000 units of a millisecond), and a
     short run's points then sit in one pixel under ticks of years. */
  function widenShort(u) {
    const x = u.data[0];
    if (!x || !x.length) return;
    let min = Infinity, max = -Infinity;
    for (const v of x) { if (v < min) min = v; if (v > max) max = v; }
    if (!(max - min < 0.1)) return;
    const mid = (min + max) / 2;
    u.setScale("x", {min: mid - 0.05, max: mid + 0.05});
  }
  /* Sizes and durations as logcapture's Python writes them (views.size, views.duration):
     the same text on the page as in `ls` and `show` (tests/format_cases.json holds both). */
  const finite = v => typeof v === "number" && Number.isFinite(v);
  /* Python's format(x, ".Nf"): the exact binary value rounded to N decimals, a tie to the
     even digit (toFixed takes a tie away from zero). */
  function fixed(x, digits) {
    const text = x.toFixed(digits);
    const exact = Math.abs(x).toFixed(100).split(".");
    if (!/^50*$/.test(exact[1].slice(digits))) return text;
    const kept = exact[0] + (digits ? "." + exact[1].slice(0, digits) : "");
    if (Number(kept.slice(-1)) % 2) return text;
    return (x < 0 ? "-" : "") + kept;
  }
  function duration(seconds) {
    if (!finite(seconds)) return "-";
    if (seconds < 1) return fixed(Math.max(seconds, 0), 2) + " s";
    if (seconds < 10) return fixed(Math.max(seconds, 0), 1) + " s";
    let s = Number(fixed(seconds, 0));
    if (s < 60) return `${s} s`;
    let m = Math.floor(s / 60); s %= 60;
    if (m < 60) return `${m} min ${pad(s)} s`;
    let h = Math.floor(m / 60); m %= 60;
    if (h < 24) return `${h} h ${pad(m)} min`;
    const d = Math.floor(h / 24); h %= 24;
    return `${d} d ${pad(h)} h`;
  }
  function bytes(n) {
    if (!finite(n)) return "-";
    for (const unit of ["B", "KiB", "MiB", "GiB", "TiB"]) {
      if (Math.abs(n) < 1024 || unit === "TiB") {
        if (unit === "B") return `${Math.trunc(n)} B`;
        return fixed(n, Math.abs(n) < 10 ? 1 : 0) + " " + unit;
      }
      n /= 1024;
    }
  }
  function value(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") {
      if (Number.isInteger(v)) return String(v);
      const a = Math.abs(v);
      return (a !== 0 && (a < 1e-3 || a >= 1e6)) ? v.toExponential(4) : String(+v.toPrecision(6));
    }
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function stateBadge(state) {
    return el("span", {class: "state " + state, text: state});
  }
  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function showError(where, err) {
    where.replaceChildren(el("div", {class: "error", text: String(err.message || err)}));
  }

  /* One uPlot chart with its own legend.
     spec: {title, note, xLabel, yLabel, time (x is epoch seconds), x: [...],
            series: [{label, values}], yFormat, height} */
  function chart(container, spec) {
    const box = el("div", {class: "chart", "data-title": spec.title});
    box.append(el("div", {class: "chart-title", text: spec.title}));
    if (spec.note) box.append(el("div", {class: "axis-note", text: spec.note}));
    const plot = el("div", {class: "plot"});
    const legend = el("div", {class: "legend"});
    box.append(plot, legend);
    container.append(box);
    const muted = cssVar("--muted"), grid = cssVar("--line");
    const axis = (label, fmt) => {
      const a = {stroke: muted, grid: {stroke: grid, width: 1}, ticks: {stroke: grid},
                 label: label || undefined, labelSize: label ? 20 : 0};
      if (fmt) a.values = (u, vals) => vals.map(fmt);
      return a;
    };
    const yAxis = axis(spec.yLabel, spec.yFormat);
    yAxis.size = 84;
    const xAxis = axis(spec.time ? "" : spec.xLabel);
    if (spec.time) {
      xAxis.values = (u, vals) => timeTicks(vals);
      xAxis.space = 100;  // px between ticks: room for "12:00:00.25"
      xAxis.size = 56;  // two lines where the date is shown
    }
    const yScale = spec.yRange ? {range: spec.yRange} : {};
    const opts = {
      width: Math.max(300, plot.clientWidth || container.clientWidth || 600),
      height: spec.height || 240,
      scales: {x: {time: !!spec.time}, y: yScale},
      hooks: spec.time ? {ready: [widenShort], setData: [widenShort]} : {},
      legend: {show: false},
      cursor: {drag: {x: true, y: false}},
      series: [{label: spec.xLabel || "x"}].concat(spec.series.map((s, i) => ({
        label: s.label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true,
      }))),
      axes: [xAxis, yAxis],
    };
    const data = [spec.x].concat(spec.series.map(s => s.values));
    const u = new uPlot(opts, data, plot);
    const items = spec.series.map((s, i) => {
      const item = el("span", {class: "item", "data-series": s.label, role: "button",
                               title: "click: only this series; Ctrl+click: on or off"},
        el("span", {class: "swatch"}), s.label);
      item.firstChild.style.background = PALETTE[i % PALETTE.length];
      item.addEventListener("click", ev => legendClick(u, i + 1, ev));
      legend.append(item);
      return item;
    });
    function sync() {
      items.forEach((item, i) => item.classList.toggle("off", !u.series[i + 1].show));
    }
    function legendClick(u, i, ev) {
      ev.preventDefault();
      if (ev.ctrlKey || ev.metaKey) {
        u.setSeries(i, {show: !u.series[i].show});
      } else {
        // A click shows only this series; on the one series already alone, all again.
        const alone = u.series.every((s, j) => j === 0 || (j === i) === s.show);
        u.batch(() => {
          for (let j = 1; j < u.series.length; j++) u.setSeries(j, {show: alone || j === i});
        });
      }
      sync();
    }
    new ResizeObserver(() => {
      const w = plot.clientWidth;
      if (w && Math.abs(w - u.width) > 2) u.setSize({width: w, height: u.height});
    }).observe(plot);
    return u;
  }

  function params() { return new URLSearchParams(location.search); }

  return {el, api, time, timeTicks, duration, bytes, value, stateBadge, chart, showError, params,
          PALETTE};
})();
