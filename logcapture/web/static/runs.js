/* The runs page: newest first, filter by state and name, pick runs to compare. With ?job=J
   (an array job): its tasks by state and first insight, each group a link that lists its
   runs (?job=J&state=S[&insight=K]). */
"use strict";

(() => {
  const {el, api, time, duration, stateBadge} = LC;
  const box = document.getElementById("runs");
  const nameFilter = document.getElementById("name-filter");
  const stateFilter = document.getElementById("state-filter");
  const compareBtn = document.getElementById("compare");
  const picked = new Set();
  let runs = [];

  const q = LC.params();
  nameFilter.value = q.get("name") || "";
  let only = null;  // the runs of the array job group the URL names

  function matches(r) {
    if (only && !only.has(r.run)) return false;
    const state = stateFilter.value;
    const text = nameFilter.value.trim().toLowerCase();
    if (state && r.state !== state) return false;
    if (!text) return true;
    return [r.name, r.job_id, r.run].some(v => (v || "").toLowerCase().includes(text));
  }

  function render() {
    const shown = runs.filter(matches);
    document.getElementById("count").textContent =
      shown.length === runs.length ? `${runs.length} runs` : `${shown.length} of ${runs.length} runs`;
    if (!shown.length) {
      box.replaceChildren(el("div", {class: "empty",
        text: runs.length ? "No run matches the filter." :
          "No runs yet. Capture one with: logcapture run -- python train.py"}));
      return;
    }
    const head = el("tr", {}, el("th", {}), ...["Job", "Name", "State", "Exit", "Start",
      "Duration", "Nodes"].map(h => el("th", {text: h,
        class: h === "Exit" || h === "Duration" ? "num" : ""})));
    const body = el("tbody");
    for (const r of shown) {
      const box = el("input", {type: "checkbox", "aria-label": "compare " + r.run,
                               checked: picked.has(r.run)});
      box.addEventListener("change", () => {
        box.checked ? picked.add(r.run) : picked.delete(r.run);
        compareBtn.disabled = picked.size < 2;
      });
      const href = "/job/" + encodeURIComponent(r.run);
      body.append(el("tr", {"data-run": r.run},
        el("td", {}, box),
        el("td", {class: "mono"}, el("a", {href, class: "run-link", text: r.job_id || r.run})),
        el("td", {class: "name", title: r.name}, el("a", {href, text: r.name || "-"})),
        el("td", {}, stateBadge(r.state)),
        el("td", {class: "num", text: r.exit}),
        el("td", {class: "mono", text: time(r.start)}),
        el("td", {class: "num", text: duration(r.duration)}),
        el("td", {text: r.nodes})));
    }
    box.replaceChildren(el("table", {class: "grid", id: "runs-table"},
      el("thead", {}, head), body));
  }

  nameFilter.addEventListener("input", render);
  stateFilter.addEventListener("change", render);
  compareBtn.addEventListener("click", () => {
    location.href = "/compare?runs=" + [...picked].map(encodeURIComponent).join(",");
  });

  async function loadArray(job) {
    const a = await api("/api/arrays/" + encodeURIComponent(job));
    const link = (text, params, title) => el("a", {href: "/?" + new URLSearchParams(params),
                                                   text, title: title || ""});
    const state = q.get("state"), insight = q.get("insight");
    const groups = [];
    for (const g of a.states) {
      const why = g.insights.map(i => [link(`${i.kind} ${i.count}`,
        {job, state: g.state, insight: i.kind}, `${g.state} with ${i.kind} first`), ", "]).flat();
      groups.push(link(`${g.count} ${g.state}`, {job, state: g.state}));
      if (why.length) groups.push(" (", ...why.slice(0, -1), ")");
      groups.push(", ");
      if (g.state === state) {
        const picked = insight ? g.insights.find(i => i.kind === insight) : null;
        only = new Set(picked ? picked.runs : g.runs);
      }
    }
    if (!state) only = new Set(a.states.flatMap(g => g.runs));
    document.getElementById("array-summary").replaceChildren(
      el("span", {class: "muted", text: "Array job "}), link(job, {job}),
      el("span", {text: `: ${a.tasks} task${a.tasks === 1 ? "" : "s"}: `}),
      ...groups.slice(0, -1));
    document.getElementById("array-summary").hidden = false;
    document.getElementById("array-summary").dataset.text = a.text;
  }

  const arrayJob = q.get("job");
  (arrayJob ? loadArray(arrayJob) : Promise.resolve()).then(() => api("/api/runs")).then(data => {
    runs = data;
    const states = [...new Set(runs.map(r => r.state))].sort();
    for (const s of states) stateFilter.append(el("option", {value: s, text: s}));
    if (q.get("state")) stateFilter.value = q.get("state");
    render();
  }).catch(err => LC.showError(box, err));
})();
