/* The job page: header, live log (paged, drawn row by row as it scrolls), metadata graphs and
   table, resource graphs per node, downloads. */
"use strict";

(() => {
  const {el, api, time, duration, bytes, value, stateBadge} = LC;
  const ref = decodeURIComponent(location.pathname.split("/").pop());
  const base = "/api/runs/" + encodeURIComponent(ref);
  const done = {log: false, graphs: false};
  let running = false, headerHasStart = false;

  function ready(part) {
    done[part] = true;
    performance.mark("lc-" + part);
    if (done.log && done.graphs) document.body.dataset.ready = "1";
  }

  // ------------------------------------------------------------------ header
  function fact(k, v, cls) {
    return el("div", {class: "fact"}, el("div", {class: "k", text: k}),
              el("div", {class: "v " + (cls || "")}, v));
  }
  async function loadHeader() {
    const h = await api(base);
    running = h.running;
    headerHasStart = h.start !== null && h.start !== undefined;
    if (headerHasStart) runStart = h.start;
    document.title = (h.name || h.run) + " · logcapture";
    document.getElementById("job-name").textContent = h.name || h.run;
    document.getElementById("job-name").title = h.name || "";
    document.getElementById("job-ids").textContent =
      (h.job_id ? "job " + h.job_id + " · " : "") + "run " + h.run;
    document.getElementById("job-command").textContent =
      h.command && h.command !== h.name ? h.command : "";
    document.getElementById("facts").replaceChildren(
      fact("State", stateBadge(h.state)),
      fact("Exit", h.exit || "-"),
      fact("Started", time(h.start)),
      fact("Duration", duration(h.duration)),
      fact("Nodes", h.nodes || "-"),
      fact("GPUs", String(h.gpus)),
      fact("User", h.user || "-"),
      ...(typeof h.redactions === "number" ? [redactions(h.redactions)] : []));
    return h;
  }
  // Secrets replaced by *** before anything was stored (docs/user.md, "Secrets"), as `show`
  // counts them: known once the run has ended (its end record counts them).
  function redactions(n) {
    const f = fact("Redactions", String(n));
    f.id = "redactions";
    f.title = "secrets replaced by *** before anything was stored";
    return f;
  }

  // ------------------------------------------------------------------ insights
  // Why the run failed, what it held and did not use, what was found while it ran: the
  // answers `logcapture show` lists first (docs/insights.md), each with the lines it rests on.
  async function loadInsights() {
    const box = document.getElementById("insights");
    const {insights} = await api(base + "/insights");
    if (!insights.length) { box.replaceChildren(); return; }
    box.replaceChildren(
      el("div", {class: "panel-head"}, el("h2", {text: "Insights"})),
      ...insights.map(i => el("div", {class: "insight " + i.category, "data-kind": i.kind},
        el("div", {}, el("span", {class: "kind mono", text: i.kind}), " ",
           el("span", {class: "message", text: i.message})),
        ...(i.evidence || []).filter(e => e.text !== null && e.text !== undefined)
          .slice(-3).map(e => el("div", {class: "evidence mono muted",
                                         text: e.stream + " " + e.seq + ": " + e.text})),
        i.hint ? el("div", {class: "hint muted", text: "Try: " + i.hint}) : null)));
  }

  // ------------------------------------------------------------------ the log
  // Both streams, merged in read order as the store sorts them (docs/architecture.md), each
  // switchable on the page: the entries hold both, the switches choose which rows are drawn.
  // The first page fills a screen and some scrolling; older pages come larger as one scrolls.
  const ROW = 20, FIRST = 300, PAGE = 1000, OVERSCAN = 30, FILL_PAGES = 10, PAGE_MAX = 5000;
  const logBox = document.getElementById("log");
  const rowsBox = document.getElementById("log-rows");
  const stdoutSwitch = document.getElementById("stdout-switch");
  const stderrSwitch = document.getElementById("stderr-switch");
  const tsMode = document.getElementById("ts-mode");
  const live = document.getElementById("live");
  let entries = [];  // {cursor, stream, kind, text, ts, line, style?}, oldest first, both streams
  let view = [];  // the entries the switches show
  let runStart = null;  // the run's start (header), for times since start
  // ?at=CURSOR (a search result's link): open the log at that line, marked, instead of at
  // the newest lines; "Newest" goes back to the live end.
  let at = LC.params().get("at");
  let older = false, loadingOlder = false, generation = 0, source = null;

  const streamShown = e => e.stream === "stdout" ? stdoutSwitch.checked
                         : e.stream === "stderr" ? stderrSwitch.checked : true;
  const shown = e => streamShown(e) && !folding.hidden.has(e);
  function refreshView() {
    folding = foldSections(entries);
    view = entries.filter(shown);
  }
  function stamp(ts) {
    if (tsMode.value === "since") {
      const t0 = runStart !== null ? runStart : (entries.length ? entries[0].ts : ts);
      const s = Math.max(0, ts - t0), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
      const sec = (s % 60).toFixed(3).padStart(6, "0");
      return "+" + (h ? `${h}:${String(m).padStart(2, "0")}` : String(m)) + ":" + sec;
    }
    return time(ts).slice(11);
  }

  // ------------------------------------------------------------------ sections
  // A CI's fold markers (GitHub ::group::, GitLab section_start, Buildkite ---/~~~/+++) are
  // sections (docs/rendering.md): the start row folds and unfolds what lies between it and
  // its end, and says how long the section took. A section opens as the job asked ("(folded)"
  // in its start's text: GitHub's groups, GitLab's [collapsed=true], Buildkite's --- and ~~~,
  // unless the job asked to expand it later: Buildkite's ^^^ +++, a section_expand entry
  // inside it) until the reader clicks it; one not yet ended (the job is in it) stays open.
  const toggled = new Set();  // cursors of the section starts the reader clicked
  let folding = {hidden: new Set(), ends: new Map(), around: new Map(), expanded: new Set()};
  const SECTION_START = /^\[logcapture: section (.*?)( \(folded\))?\]$/;
  const SECTION_END = /, ([^,]*)\]$/;
  function isFolded(start, f) {
    if (!f.ends.has(start.cursor)) return false;
    const asked = SECTION_START.test(start.text) && !!SECTION_START.exec(start.text)[2] &&
                  !f.expanded.has(start.cursor);
    return toggled.has(start.cursor) ? !asked : asked;
  }
  // One pass over the loaded entries: each start's end and whether the job expanded it, then
  // the entries a folded section hides (its end too: its start row says the duration), and
  // the folded starts around each.
  function foldSections(list) {
    const ends = new Map(), expanded = new Set(), hidden = new Set(), around = new Map();
    const stack = [];
    for (const e of list) {
      if (e.kind === "section_end") { const s = stack.pop(); if (s) ends.set(s.cursor, e); }
      else if (e.kind === "section") stack.push(e);
      else if (e.kind === "section_expand" && stack.length) expanded.add(stack[stack.length - 1].cursor);
    }
    const f = {ends, expanded};
    stack.length = 0;
    for (const e of list) {
      const closing = e.kind === "section_end" && stack.length ? stack[stack.length - 1] : null;
      const folded = stack.filter(s => isFolded(s, f));
      if (folded.length) { hidden.add(e); around.set(e, folded); }
      if (e.kind === "section_end") stack.pop();
      else if (e.kind === "section") stack.push(e);
      if (closing && !hidden.has(e) && isFolded(closing, f)) hidden.add(e);
    }
    return {hidden, ends, around, expanded};
  }
  function sectionText(e) {
    const m = SECTION_START.exec(e.text);
    if (!m) return e.text;
    const end = folding.ends.get(e.cursor);
    const took = end ? (SECTION_END.exec(end.text) || [])[1] : null;
    return (isFolded(e, folding) ? "▸ " : "▾ ") + m[1] + (took ? `  (${took})` : end ? "" : "  (running)");
  }
  rowsBox.addEventListener("click", ev => {
    const row = ev.target.closest(".row.section");
    if (!row || ev.target.closest("a")) return;
    const c = row.dataset.cursor;
    if (toggled.has(c)) toggled.delete(c); else toggled.add(c);
    refreshView();
    drawRows();
  });
  // A line to show (a #L link, a search result) inside folded sections opens them.
  function reveal(e) {
    for (const s of folding.around.get(e) || []) {
      if (toggled.has(s.cursor)) toggled.delete(s.cursor); else toggled.add(s.cursor);
    }
    refreshView();
  }

  function drawRows() {
    const n = view.length;
    const top = older ? ROW : 0;
    logBox.classList.toggle("no-ts", tsMode.value === "none");
    logBox.classList.toggle("since", tsMode.value === "since");
    rowsBox.style.height = (n * ROW + top) + "px";
    const first = Math.max(0, Math.floor((logBox.scrollTop - top) / ROW) - OVERSCAN);
    const last = Math.min(n, Math.ceil((logBox.scrollTop - top + logBox.clientHeight) / ROW) + OVERSCAN);
    const out = [];
    if (older) out.push(el("div", {class: "more", text: loadingOlder ? "loading older lines…" : "scroll up for older lines"}));
    for (let i = first; i < last; i++) {
      const {cursor, stream, kind, text, ts, style} = view[i];
      const err = stream === "stderr";
      const cls = "row " + (kind === "line" ? stream : kind) + (err ? " stderr" : "") +
                  (cursor === at ? " at" : "") + (isMarked(view[i]) ? " hl" : "");
      const row = el("div", {class: cls, "data-cursor": cursor, "data-stream": stream},
        lineCell(view[i]),
        el("span", {class: "n", text: stamp(ts), title: time(ts)}),
        el("span", {class: "s", text: err ? "err" : "", title: err ? "stderr" : null}),
        ...rankParts(view[i], kind === "section"
          ? el("span", {class: "t", text: sectionText(view[i])})
          : el("span", {class: "t"}, ...LC_SGR.nodes(text, style))));
      row.style.top = (top + i * ROW) + "px";
      out.push(row);
    }
    rowsBox.replaceChildren(...out);
    const hidden = entries.length - n;
    document.getElementById("log-count").textContent =
      entries.length ? `${n.toLocaleString()} lines loaded` +
        (hidden ? `, ${hidden.toLocaleString()} hidden` : "") +
        (older ? " (older on scroll)" : "") : "";
  }
  const atBottom = () => logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 2 * ROW;
  function toBottom() { logBox.scrollTop = logBox.scrollHeight; }

  async function loadOlder() {
    if (!older || loadingOlder || !entries.length) return;
    loadingOlder = true;
    const gen = generation;
    try {
      const page = await api(`${base}/log?stderr=1&before=${encodeURIComponent(entries[0].cursor)}` +
                             `&limit=${PAGE}`);
      if (gen !== generation) return;
      const before = view.length;
      entries = page.entries.concat(entries);
      refreshView();
      const added = view.length - before;
      older = page.more;
      logBox.scrollTop += added * ROW - (older ? 0 : ROW);
    } finally {
      loadingOlder = false;
      drawRows();
    }
  }

  // With one stream switched off, a page may hold few rows to show: read older pages until
  // the box is full (a few at most; scrolling up reads on).
  async function fill() {
    for (let i = 0; i < FILL_PAGES && older && view.length * ROW < 2 * logBox.clientHeight; i++) {
      const stick = atBottom();
      await loadOlder();
      if (stick) { toBottom(); drawRows(); }
    }
  }

  function restream() {
    // keep the row at the top of the box in place (the nearest one shown), or the newest end
    const stick = atBottom();
    const topRow = view[Math.floor(Math.max(0, logBox.scrollTop - (older ? ROW : 0)) / ROW)];
    refreshView();
    drawRows();
    if (stick || !topRow) toBottom();
    else {  // the rows now shown before it
      const i = entries.slice(0, entries.indexOf(topRow)).filter(shown).length;
      logBox.scrollTop = (older ? ROW : 0) + i * ROW;
    }
    drawRows();
    fill().catch(err => LC.showError(rowsBox, err));
  }

  // ------------------------------------------------------------------ line links
  // Every line has one number, the one `logcapture logs -n`, search and show give (notes and
  // metadata have none). #L123 opens the log at line 123, marked; #L120-L130 marks a range,
  // so a link can be pasted to a colleague. Clicking a number sets the link, shift-click
  // extends it from the line clicked before (as GitHub does).
  let marked = null;  // {from, to}: the lines the link marks
  let anchorLine = null;  // the line a shift-click extends from
  function parseMark(hash) {
    const m = /^#L(\d+)(?:-L?(\d+))?$/.exec(hash);
    if (!m) return null;
    const a = Number(m[1]), b = m[2] ? Number(m[2]) : a;
    return {from: Math.min(a, b), to: Math.max(a, b)};
  }
  const isMarked = e => marked !== null && e.line != null && e.line >= marked.from &&
                        e.line <= marked.to;
  function lineCell(e) {
    return e.line != null
      ? el("a", {class: "ln", href: `#L${e.line}`, text: String(e.line), "data-line": e.line})
      : el("span", {class: "ln"});
  }
  function setMark(from, to) {
    marked = {from: Math.min(from, to), to: Math.max(from, to)};
    const hash = marked.from === marked.to ? `#L${marked.from}` : `#L${marked.from}-L${marked.to}`;
    history.replaceState(null, "", location.pathname + location.search + hash);
    drawRows();
  }
  rowsBox.addEventListener("click", ev => {
    const a = ev.target.closest("a.ln");
    if (!a) return;
    ev.preventDefault();
    const line = Number(a.dataset.line);
    if (ev.shiftKey && anchorLine !== null) setMark(anchorLine, line);
    else { anchorLine = line; setMark(line, line); }
  });
  // Scroll to the first marked line: at once when it is loaded, else by asking for the page
  // that begins with it (and the one before it, as a search result's link does).
  async function showMark(gen) {
    const first = marked.from;
    let e = entries.find(x => x.line === first);
    if (!e) {
      const page = await api(`${base}/log?stderr=1&limit=${PAGE}&line=${first}`);
      if (gen !== generation) return;
      e = page.entries.find(x => x.line === first);
      if (!e) return;
      at = e.cursor;
      return loadAt(gen, "at a linked line");
    }
    if (e.stream === "stderr") stderrSwitch.checked = true;
    if (e.stream === "stdout") stdoutSwitch.checked = true;
    reveal(e);
    const i = view.indexOf(e);
    logBox.scrollTop = (older ? ROW : 0) + Math.max(0, i * ROW - logBox.clientHeight / 2);
    drawRows();
  }
  window.addEventListener("hashchange", () => {
    marked = parseMark(location.hash);
    if (marked === null) { drawRows(); return; }
    anchorLine = marked.from;
    if (tasks.length) {  // a job's log: its entries around the line, from the server
      if (!showJobMark()) refilter();
      return;
    }
    showMark(generation).catch(err => LC.showError(rowsBox, err));
  });

  async function loadAt(gen, why) {
    const [ns, stream, seq] = at.split(":");
    if (stream === "stderr") stderrSwitch.checked = true;
    if (stream === "stdout") stdoutSwitch.checked = true;
    const q = `${base}/log?stderr=1&limit=${PAGE}`;
    const from = `${BigInt(ns) - 1n}:${stream}:${seq}`;  // just before the line: it comes first
    const after = await api(`${q}&after=${encodeURIComponent(from)}`);
    const first = after.entries.length ? after.entries[0].cursor : at;
    const before = await api(`${q}&before=${encodeURIComponent(first)}`);
    if (gen !== generation) return;
    entries = before.entries.concat(after.entries);
    refreshView();
    const target = entries.find(e => e.cursor === at);
    if (target) reveal(target);
    older = before.more;
    const i = Math.max(0, view.findIndex(e => e.cursor === at));
    drawRows();
    logBox.scrollTop = (older ? ROW : 0) + Math.max(0, i * ROW - logBox.clientHeight / 2);
    drawRows();
    setLive(false, after.more ? why || "at a search result" : "");
  }

  async function loadLog() {
    const gen = ++generation;
    if (source) { source.close(); source = null; }
    marked = parseMark(location.hash);
    if (marked !== null) anchorLine = marked.from;
    if (tasks.length) return loadJobLog(gen);
    if (at) return loadAt(gen);
    if (marked !== null) { anchorLine = marked.from; return showMark(gen); }
    const page = await api(`${base}/log?stderr=1&limit=${FIRST}`);
    if (gen !== generation) return;
    entries = page.entries;
    refreshView();
    older = page.more;
    drawRows();
    toBottom();
    drawRows();
    if (!page.ended) follow(gen);
    else setLive(false, "");
    await fill();
  }

  function setLive(on, text) {
    live.classList.toggle("on", on);
    document.getElementById("live-text").textContent = text;
  }

  function follow(gen) {
    const after = entries.length ? "&after=" + encodeURIComponent(entries[entries.length - 1].cursor) : "";
    const es = new EventSource(`${base}/follow?stderr=1${after}`);
    source = es;
    setLive(true, "live");
    es.addEventListener("entries", ev => {
      if (gen !== generation) return;
      const stick = atBottom();
      const fresh = JSON.parse(ev.data).entries;
      entries.push(...fresh);
      refreshView();
      if (!headerHasStart) loadHeader().catch(() => {});
      drawRows();
      if (stick) { toBottom(); drawRows(); }
    });
    es.addEventListener("end", () => {
      es.close();
      if (gen !== generation) return;
      source = null;
      setLive(false, "ended");
      refreshAll();
    });
    es.onerror = () => {
      // The server went away or restarted: try again from the newest line we have.
      es.close();
      if (gen !== generation) return;
      setLive(false, "reconnecting…");
      setTimeout(() => { if (gen === generation) follow(gen); }, 2000);
    };
  }

  // ------------------------------------------------------------------ ranks
  // A job whose srun steps' tasks were captured (each a run: `logcapture ls JOB`): its log is
  // the batch script's and its tasks' merged in read order, each task's entry labelled with
  // its rank in the rank's colour, the same line of several ranks once with a note
  // (rankview.py, as `logcapture logs JOB`); the rank and node filters pick tasks. The newest
  // entries come at once (no older pages) and are read again while the job runs.
  let tasks = [];  // {run, step, rank, node, state}
  const rankFilter = document.getElementById("rank-filter");
  const nodeFilter = document.getElementById("node-filter");

  async function loadTasks() {
    tasks = (await api(base + "/tasks")).tasks;
    if (!tasks.length) return;
    const option = v => el("option", {value: String(v), text: String(v)});
    rankFilter.append(...[...new Set(tasks.map(t => t.rank))].sort((a, b) => a - b).map(option));
    nodeFilter.append(...[...new Set(tasks.map(t => t.node))].sort().map(option));
    document.getElementById("rank-filters").hidden = false;
  }

  // Each line's number is its number in the job's log (rankview.numbered, as `logcapture logs
  // JOB -n` prints it; the server numbers, the page does not count): a #L link asks for the
  // entries around that line when it is not among those loaded, and is then not refreshed.
  async function loadJobLog(gen) {
    const q = `rank=${encodeURIComponent(rankFilter.value)}&node=${encodeURIComponent(nodeFilter.value)}`;
    const around = marked !== null && !entries.some(e => e.line === marked.from)
      ? `&line=${marked.from}` : "";
    const page = await api(`${base}/joblog?${q}&limit=${PAGE_MAX}${around}`);
    if (gen !== generation) return;
    const stick = !around && (!entries.length || atBottom());
    entries = page.entries;
    refreshView();
    older = false;
    drawRows();
    if (marked !== null && showJobMark()) { /* scrolled to the linked line */ }
    else if (stick) { toBottom(); drawRows(); }
    const live = !page.ended && !page.newer;
    setLive(live, page.newer ? "at a linked line" : live ? "live" : "");
    if (page.more) document.getElementById("log-count").textContent +=
      page.newer ? " (around the linked line; `logcapture logs` prints all)"
                 : " (the newest; `logcapture logs` prints all)";
    if (live) setTimeout(() => {
      if (gen === generation) loadJobLog(gen).catch(err => LC.showError(rowsBox, err));
    }, 5000);
  }
  function showJobMark() {
    const e = entries.find(x => x.line === marked.from);
    if (!e) return false;
    if (e.stream === "stderr") stderrSwitch.checked = true;
    if (e.stream === "stdout") stdoutSwitch.checked = true;
    reveal(e);
    const i = view.indexOf(e);
    logBox.scrollTop = Math.max(0, i * ROW - logBox.clientHeight / 2);
    drawRows();
    return true;
  }

  // A distinct, stable colour per rank: hues a golden angle apart.
  function rankColour(rank) {
    return `hsl(${(rank * 137.508) % 360}, 70%, 42%)`;
  }

  // The rank label before a task's text and the note after a folded line.
  function rankParts(e, textSpan) {
    if (e.rank === undefined || e.rank === null) {  // the batch script's own, or no tasks
      return tasks.length ? [el("span", {class: "r"}), textSpan] : [textSpan];
    }
    const label = el("span", {class: "r", text: e.rank + ":", "data-rank": String(e.rank),
                              title: `rank ${e.rank} on ${e.node}`});
    label.style.color = rankColour(e.rank);
    const parts = [label, textSpan];
    if (e.note) parts.push(el("span", {class: "fold", text: e.note}));
    return parts;
  }

  function refilter() {
    generation++;
    entries = [];
    loadJobLog(generation).catch(err => LC.showError(rowsBox, err));
  }
  // Another choice of ranks or nodes is another log, numbered on its own: a #L mark of the
  // one before does not carry over.
  function rechoose() {
    if (marked !== null) {
      marked = null;
      history.replaceState(null, "", location.pathname + location.search);
    }
    refilter();
  }
  rankFilter.addEventListener("change", rechoose);
  nodeFilter.addEventListener("change", rechoose);

  logBox.addEventListener("scroll", () => {
    drawRows();
    if (older && logBox.scrollTop < 40 * ROW) loadOlder();
  });
  stdoutSwitch.addEventListener("change", restream);
  stderrSwitch.addEventListener("change", restream);
  tsMode.addEventListener("change", drawRows);
  document.getElementById("to-end").addEventListener("click", () => {
    if (at) { at = null; loadLog().catch(err => LC.showError(rowsBox, err)); return; }
    toBottom(); drawRows();
  });

  // ------------------------------------------------------------------ metadata
  const charts = {};  // title -> {u, signature}
  function drawChart(container, spec) {
    const signature = JSON.stringify([spec.note, spec.series.map(s => s.label)]);
    const old = charts[spec.title];
    if (old && old.signature === signature && old.container === container) {
      old.u.setData([spec.x].concat(spec.series.map(s => s.values)));
      return;
    }
    if (old) old.box.remove();
    const u = LC.chart(container, spec);
    charts[spec.title] = {u, signature, container, box: container.lastElementChild};
  }

  let tableRows = 200;
  // A job whose srun tasks were captured: whose metadata (rank 0 by default, one or all).
  let rank = "";  // the server's default until one is picked (rank 0, or the lowest there is)
  function drawRankPicker(m) {
    const pick = document.getElementById("rank-pick");
    pick.hidden = !m.ranks;
    if (!m.ranks) return;
    rank = m.rank;
    const select = document.getElementById("metadata-rank");
    const options = ["all", ...m.ranks.map(String)];
    if (select.options.length !== options.length) {
      select.replaceChildren(...options.map(r => el("option", {value: r, text: r === "all" ? "all ranks" : r})));
      select.onchange = () => { rank = select.value; loadMetadata(); };
    }
    select.value = rank;
  }
  async function loadMetadata() {
    const m = await api(base + "/metadata?rank=" + encodeURIComponent(rank));
    drawRankPicker(m);
    const graphs = document.getElementById("graphs");
    if (!m.keys.length) {
      graphs.replaceChildren(el("div", {class: "empty",
        text: "No numeric metadata. Print one JSON object per line, e.g. " +
              '{"epoch": 1, "loss": 0.25}, and it is graphed here.'}));
    } else {
      graphs.querySelector(".empty")?.remove();
      if (m.by_x) {
        drawChart(graphs, {
          title: "Metadata by " + m.by_x.key, xLabel: m.by_x.key,
          note: `X axis: ${m.by_x.key}, chosen because it is ${m.by_x.because === m.by_x.key ?
                 "the value " + m.by_x.key : m.by_x.because} (the first of: progress, epoch, ` +
                "increasing integers, increasing numbers, integers, numbers, any numbers)",
          x: m.by_x.x, series: Object.entries(m.by_x.series).map(([k, v]) => ({label: k, values: v}))});
      }
      drawChart(graphs, {
        title: "Metadata by time", time: true,
        note: m.by_x ? "" : "No key qualifies as X axis: graphs by time only.",
        x: m.by_time.x, series: Object.entries(m.by_time.series).map(([k, v]) => ({label: k, values: v}))});
    }
    drawTable(m);
  }

  function drawTable(m) {
    const box = document.getElementById("metadata");
    document.getElementById("metadata-count").textContent =
      m.total ? `${m.total.toLocaleString()} rows` + (m.total > m.rows.length ? `, newest ${m.rows.length} here (all in the download)` : "") : "";
    if (!m.rows.length) {
      box.replaceChildren(el("div", {class: "empty", text: "No metadata lines in this run."}));
      return;
    }
    const numeric = new Set(m.columns.filter(c => m.rows.slice(0, 50).some(r => typeof r.fields[c] === "number")));
    const ranked = m.rows[0].rank !== undefined;
    const labelled = m.rows[0].label !== undefined;  // whose, by a launcher's label
    const head = el("tr", {}, el("th", {text: "time"}), ...(ranked ? [el("th", {text: "rank", class: "num"})] : []),
                    ...(labelled ? [el("th", {text: "label"})] : []),
                    ...m.columns.map(c => el("th", {text: c, class: numeric.has(c) ? "num" : ""})));
    const body = el("tbody");
    for (const r of m.rows.slice(0, tableRows)) {
      body.append(el("tr", {}, el("td", {class: "mono", text: time(r.ts)}),
        ...(ranked ? [el("td", {class: "num", text: value(r.rank)})] : []),
        ...(labelled ? [el("td", {text: r.label})] : []),
        ...m.columns.map(c => el("td", {class: typeof r.fields[c] === "number" ? "num" : "",
                                        text: value(r.fields[c])}))));
    }
    const parts = [el("table", {class: "grid", id: "metadata-table"}, el("thead", {}, head), body)];
    if (m.rows.length > tableRows) {
      parts.push(el("button", {text: `Show ${Math.min(200, m.rows.length - tableRows)} more`,
        onclick: () => { tableRows += 200; drawTable(m); }}));
    }
    box.replaceChildren(...parts);
  }

  // ------------------------------------------------------------------ resources
  const GPU = [["utilization_gpu_percent", "GPU utilisation", [0, 100], v => v + " %"],
               ["memory_used_bytes", "GPU memory used", null, bytes],
               ["power_watts", "GPU power", null, v => v + " W"],
               ["temperature_celsius", "GPU temperature", null, v => v + " °C"]];
  const JOB = [["cpu_percent", "CPU (100 % = one core)", v => v + " %"],
               ["memory_rss_bytes", "Memory (RSS)", bytes]];
  async function loadResources() {
    const r = await api(base + "/resources");
    const box = document.getElementById("resources");
    const nodes = Object.keys(r.nodes).sort();
    if (!nodes.length) {
      box.replaceChildren(el("div", {class: "empty", text: "No resource samples in this run."}));
      return;
    }
    box.querySelector(".empty")?.remove();
    for (const node of nodes) {
      const n = r.nodes[node];
      let grid = box.querySelector(`.charts[data-node="${CSS.escape(node)}"]`);
      if (!grid) {
        box.append(el("div", {class: "node-title", text: "Node " + node}));
        grid = el("div", {class: "charts", "data-node": node});
        box.append(grid);
      }
      const gpus = Object.keys(n.gpus).sort();
      for (const [metric, title, yRange, fmt] of GPU) {
        if (!gpus.length) break;
        drawChart(grid, {title: `${title} · ${node}`, time: true, yFormat: fmt, yRange,
          height: 200, x: n.t, series: gpus.map(g => ({label: g, values: n.gpus[g][metric]}))});
      }
      for (const [metric, title, fmt] of JOB) {
        drawChart(grid, {title: `${title} · ${node}`, time: true, yFormat: fmt,
          height: 200, x: n.t, series: [{label: metric, values: n.job[metric]}]});
      }
    }
  }

  // ------------------------------------------------------------------ downloads
  function drawDownloads() {
    const box = document.getElementById("downloads");
    for (const what of ["lines", "metadata", "samples", "progress"]) {
      const group = el("span", {class: "group"}, el("span", {class: "muted", text: what}));
      for (const fmt of ["csv", "ndjson", "parquet"]) {
        group.append(el("a", {class: "button", download: "", text: fmt.toUpperCase(),
          href: `${base}/export?what=${what}&format=${fmt}`}));
      }
      box.append(group);
    }
  }

  // ------------------------------------------------------------------ wiring
  function refreshAll() {
    return Promise.all([loadHeader(), loadMetadata(), loadResources()]);
  }
  drawDownloads();
  loadHeader().catch(err => LC.showError(document.getElementById("facts"), err));
  loadInsights().catch(err => LC.showError(document.getElementById("insights"), err));
  loadTasks().catch(() => {}).then(loadLog).then(() => ready("log"))
    .catch(err => LC.showError(rowsBox, err));
  Promise.all([loadMetadata(), loadResources()]).then(() => ready("graphs"))
    .catch(err => LC.showError(document.getElementById("graphs"), err));
  setInterval(() => {
    if (running && !document.hidden) {
      Promise.all([loadHeader(), loadMetadata(), loadResources(), loadInsights()])
        .catch(() => {});
    }
  }, 5000);
})();
