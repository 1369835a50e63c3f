/* The job page's progress panel: each progress bar's final state and mean rate, and graphs of
   rate and completion over time (one line per bar label; bars drawn again under the same
   label, such as one per epoch, continue the line). Hidden when the run drew no bar. Its own
   file and endpoint (/api/runs/REF/progress), beside the rest of the page. */
"use strict";

(() => {
  const {el, api, duration} = LC;
  const ref = decodeURIComponent(location.pathname.split("/").pop());
  const url = "/api/runs/" + encodeURIComponent(ref) + "/progress";
  const panel = document.getElementById("progress-panel");
  const graphs = document.getElementById("progress-graphs");
  const charts = {};  // title -> {u, names}

  function num(v) {
    if (v === null || v === undefined) return "–";
    return Number.isInteger(v) ? v.toLocaleString() : v.toPrecision(4);
  }

  function drawBars(bars) {
    const head = el("tr", {}, ...["bar", "stream", "final state", "done", "mean rate",
                                  "elapsed"].map(t => el("th", {text: t})));
    const body = el("tbody");
    for (const b of bars) {
      const share = b.completion === null ? "" : ` (${Math.round(100 * b.completion)} %)`;
      body.append(el("tr", {"data-label": b.label},
        el("td", {text: b.label || "(no label)"}), el("td", {text: b.stream}),
        el("td", {class: "num", text: `${num(b.n)}${b.total ? " / " + num(b.total) : ""} ${b.unit}${share}`}),
        el("td", {text: b.done ? "yes" : "no"}),
        el("td", {class: "num", text: b.rate === null ? "–" : `${num(b.rate)} ${b.unit || "items"}/s`}),
        el("td", {class: "num", text: b.elapsed === null ? "–" : duration(b.elapsed)})));
    }
    document.getElementById("progress-bars").replaceChildren(
      el("table", {class: "grid", id: "progress-table"}, el("thead", {}, head), body));
  }

  function draw(title, x, bySeries, yFormat, yRange) {
    const names = Object.keys(bySeries);
    const old = charts[title];
    if (old && old.names === JSON.stringify(names)) {
      old.u.setData([x].concat(names.map(n => bySeries[n])));
      return;
    }
    if (old) old.box.remove();
    const u = LC.chart(graphs, {title, time: true, yFormat, yRange, height: 220, x,
                                series: names.map(n => ({label: n, values: bySeries[n]}))});
    charts[title] = {u, names: JSON.stringify(names), box: graphs.lastElementChild};
  }

  async function load() {
    const p = await api(url);
    if (!p.bars.length) { panel.hidden = true; return; }
    panel.hidden = false;
    drawBars(p.bars);
    draw("Progress rate (per second)", p.x, p.rate, v => num(v) + "/s");
    if (Object.keys(p.completion).length) {
      draw("Progress completion", p.x, p.completion, v => v + " %", [0, 100]);
    }
    panel.dataset.ready = "1";
  }

  load().catch(err => LC.showError(graphs, err));
  setInterval(() => { if (!document.hidden && panel.dataset.ready !== "final") load().catch(() => {}); },
              5000);
})();
