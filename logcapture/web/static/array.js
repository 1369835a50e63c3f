/* The job page of one task of an array job: the array's tasks at a glance (as `ls J` ends
   with), each state and insight a link to the runs page showing those tasks. Its own file,
   beside the rest of the page. */
"use strict";

(() => {
  const {el, api} = LC;
  const ref = decodeURIComponent(location.pathname.split("/").pop());
  const panel = document.getElementById("array-panel");

  function link(text, params) {
    return el("a", {href: "/?" + new URLSearchParams(params), text});
  }

  async function load() {
    const run = await api("/api/runs/" + encodeURIComponent(ref));
    const job = run.array_job_id;
    if (!job) return;
    const a = await api("/api/arrays/" + encodeURIComponent(job));
    const parts = [];
    for (const g of a.states) {
      parts.push(link(`${g.count} ${g.state}`, {job, state: g.state}));
      if (g.insights.length) {
        parts.push(" (");
        g.insights.forEach((i, n) => {
          if (n) parts.push(", ");
          parts.push(link(`${i.kind} ${i.count}`, {job, state: g.state, insight: i.kind}));
        });
        parts.push(")");
      }
      parts.push(", ");
    }
    panel.replaceChildren(el("span", {class: "muted", text: `Task ${run.array_task_id} of array job `}),
      link(job, {job}), el("span", {text: `: ${a.tasks} task${a.tasks === 1 ? "" : "s"}: `}),
      ...parts.slice(0, -1));
    panel.dataset.text = a.text;
    panel.hidden = false;
  }

  load().catch(err => LC.showError(panel, err));
})();
