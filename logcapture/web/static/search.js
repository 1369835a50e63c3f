/* The runs page's search: `logcapture search` over the user's own runs (/api/search). Matching
   lines are grouped by run, newest first, with the lines around them; each line links to the
   job page opened at that line (/job/RUN?at=CURSOR). */
"use strict";

(() => {
  const {el, api, time, stateBadge} = LC;
  const slot = document.getElementById("search-slot");
  const q = LC.params();

  const input = el("input", {type: "search", id: "search-q", size: 40,
    placeholder: 'Search your logs: NCCL timeout, "out of memory"',
    "aria-label": "search pattern", value: q.get("q") || ""});
  const regex = el("input", {type: "checkbox", id: "search-regex", checked: q.get("regex") === "1"});
  const context = el("select", {id: "search-context", "aria-label": "lines of context"},
    ...[0, 2, 5, 10].map(n => el("option", {value: String(n), text: n ? `±${n} lines` : "no context"})));
  context.value = q.get("context") || "2";
  const since = el("select", {id: "search-since", "aria-label": "since"},
    ...[["", "all time"], ["1d", "last day"], ["7d", "last 7 days"], ["30d", "last 30 days"]]
      .map(([v, t]) => el("option", {value: v, text: t})));
  since.value = q.get("since") || "";
  const results = el("div", {id: "search-results"});
  const status = el("span", {class: "muted", id: "search-status"});
  const form = el("form", {class: "filters", id: "search-form"}, input,
    el("label", {class: "switch"}, regex, " regex"), context, since,
    el("button", {type: "submit", text: "Search"}));
  slot.replaceChildren(el("section", {class: "panel", id: "search-panel"},
    el("div", {class: "panel-head"}, el("h2", {text: "Search"}), status,
       el("span", {class: "spacer"}), form), results));

  function group(g) {
    const rows = [];
    for (const d of g.lines) {
      if (d.gap) rows.push(el("div", {class: "gap", text: "…"}));
      const href = "/job/" + encodeURIComponent(g.run) + "?at=" + encodeURIComponent(d.cursor);
      rows.push(el("a", {class: "hit" + (d.match ? " match" : "") + (d.stream === "stderr" ? " stderr" : ""),
                         href, "data-cursor": d.cursor},
        el("span", {class: "n", text: `${d.stream}:${d.seq}`}), el("span", {class: "t", text: d.text})));
    }
    const head = el("div", {class: "hit-head"},
      el("a", {href: "/job/" + encodeURIComponent(g.run), class: "mono run-link", text: g.job_id || g.run}),
      el("span", {class: "name", text: g.name || ""}), stateBadge(g.state),
      el("span", {class: "muted mono", text: time(g.start)}),
      g.source === "spool" ? el("span", {class: "muted", text: "not yet shipped"}) : "");
    return el("div", {class: "hit-group", "data-run": g.run}, head, el("div", {class: "hits"}, ...rows));
  }

  async function run() {
    const pattern = input.value.trim();
    if (!pattern) { results.replaceChildren(); status.textContent = ""; return; }
    const args = new URLSearchParams({q: pattern, context: context.value, limit: "100"});
    if (regex.checked) args.set("regex", "1");
    if (since.value) args.set("since", since.value);
    history.replaceState(null, "", "?" + args.toString());
    status.textContent = "searching…";
    try {
      const found = await api("/api/search?" + args.toString());
      status.textContent = found.matches ?
        `${found.matches} matching line${found.matches === 1 ? "" : "s"}` +
        (found.truncated ? " (the newest; narrow the search for older ones)" : "") : "";
      results.replaceChildren(...(found.groups.length ? found.groups.map(group) :
        [el("div", {class: "empty", text: "No line matches."})]));
    } catch (err) {
      status.textContent = "";
      LC.showError(results, err);
    }
  }

  form.addEventListener("submit", ev => { ev.preventDefault(); run(); });
  if (input.value) run();
})();
