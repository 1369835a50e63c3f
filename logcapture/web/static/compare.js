/* The compare page: one metadata key of several runs, by each run's own X axis and by time
   since each run started. */
"use strict";

(() => {
  const {el, api} = LC;
  const keySelect = document.getElementById("key");
  const picker = document.getElementById("picker");
  const graphs = document.getElementById("graphs");
  let chosen = (LC.params().get("runs") || "").split(",").filter(Boolean);

  // uPlot draws series over one shared, sorted X: join each run's (x, y) pairs on it.
  function joined(runs, pick) {
    const xs = [...new Set(runs.flatMap(r => r[pick].map(p => p[0])))].sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const series = runs.map(r => {
      const v = new Array(xs.length).fill(null);
      for (const [x, y] of r[pick]) v[index.get(x)] = y;
      return {label: r.job_name ? `${r.run} · ${r.job_name}` : r.run, values: v};
    });
    return {x: xs, series};
  }

  function setUrl() {
    const q = new URLSearchParams();
    if (chosen.length) q.set("runs", chosen.join(","));
    if (keySelect.value) q.set("key", keySelect.value);
    history.replaceState(null, "", "/compare?" + q.toString().replace(/%2C/g, ","));
  }

  async function draw() {
    setUrl();
    if (!chosen.length) return;
    const data = await api(`/api/compare?runs=${chosen.map(encodeURIComponent).join(",")}` +
                           `&key=${encodeURIComponent(keySelect.value)}`);
    const keys = [...new Set(data.runs.flatMap(r => r.keys))].sort();
    const want = keySelect.value || LC.params().get("key") || keys.find(k => k === "loss") || keys[0] || "";
    keySelect.replaceChildren(...keys.map(k => el("option", {value: k, text: k})));
    keySelect.value = want;
    if (want && want !== data.key) return draw();
    graphs.replaceChildren();
    if (!want) {
      graphs.append(el("div", {class: "empty", text: "These runs have no numeric metadata."}));
      return;
    }
    const axes = data.runs.map(r => `${r.run}: ${r.x_key ? r.x_key + " (" + r.because + ")" : "none"}`);
    const byX = joined(data.runs.filter(r => r.x_key), "by_x");
    LC.chart(graphs, {title: `${want} by each run's X axis`, xLabel: "X (each run's own)",
      note: "X axes: " + axes.join("; "), x: byX.x, series: byX.series});
    const byT = joined(data.runs, "by_time");
    LC.chart(graphs, {title: `${want} by time since start`, xLabel: "seconds since the run started",
      x: byT.x, series: byT.series});
    document.body.dataset.ready = "1";
  }

  async function drawPicker() {
    const runs = await api("/api/runs");
    picker.replaceChildren(...runs.slice(0, 60).map(r => {
      const box = el("input", {type: "checkbox", checked: chosen.includes(r.run)});
      box.addEventListener("change", () => {
        chosen = box.checked ? chosen.concat([r.run]) : chosen.filter(x => x !== r.run);
        draw().catch(err => LC.showError(graphs, err));
      });
      return el("label", {class: "switch"}, box, el("span", {class: "mono", text: r.job_id || r.run}),
                el("span", {class: "muted", text: (r.name || "").slice(0, 40)}));
    }));
  }

  keySelect.addEventListener("change", () => draw().catch(err => LC.showError(graphs, err)));
  drawPicker().catch(err => LC.showError(picker, err));
  draw().catch(err => LC.showError(graphs, err));
})();
