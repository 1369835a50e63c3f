"""`logcapture serve` over HTTP: the token, read-only, the JSON the pages draw, paging a log,
downloads, and the same answers from the spool and from the store (runs captured with the
real `logcapture run` and shipped with the real `logcapture upload`)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import env_for, lc
from pages import TRAIN, Serve, capture, write_gpu_run

from logcapture.xaxis import choose_x_axis

BIG = ("import json, sys\nfor i in range(3000):\n    print(f'line {i}')\n"
       "    if i % 100 == 0: print(f'err {i}', file=sys.stderr)\n"
       "    if i % 250 == 0: print(json.dumps({'step': i}))\n")


# Two workers sharing one terminal without labels, each saying its rank (torchrun's
# workers without --tee): one run, one series per worker.
WORKERS = ("import json\nfor step in range(5):\n    for rank in (0, 1):\n"
           "        print(json.dumps({'step': step, 'loss': 4 - step + rank / 2, "
           "'rank': rank}))\n")

# Real `torchrun --tee 3` output of two workers (an H100): each line behind its worker's label.
DDP_TEE = Path(__file__).parent / "captured" / "torch-2.11-h100" / "ddp_tee.out"
TEE = f"import sys\nsys.stdout.write(open({str(DDP_TEE)!r}).read())\n"

# Two labelled workers in mode metadata (their lines not kept): the log shows each record
# with its label.
QUIET = ("import json\nprint('/LOGCOMMAND {\"mode\": \"metadata\"}')\nfor s in range(3):\n"
         "    for w in (0, 1):\n"
         "        print(f'[default{w}]:' + json.dumps({'step': s, 'loss': 1.5 - s / 4 + w}))\n")

# srun --label's forwarded lines where only ranks 3 and 5 print metadata (logging from the
# last ranks): no rank 0 to open on.
LAST_RANKS = ("import json\nfor s in range(2):\n    for r in (3, 5):\n"
              "        print(f'{r}: ' + json.dumps({'step': s, 'loss': r - s}))\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web")
    env = env_for(tmp)
    capture(env, "train")
    # Small spool segments: pages are found across many of them (closed, gzip, and open).
    capture({**env, "LOGCAPTURE_SEGMENT_BYTES": "16384"}, "big", BIG)
    capture(env, "shipped")
    lc(["upload", "shipped"], env, check=True)
    capture(env, "workers", WORKERS)
    lc(["upload", "workers"], env, check=True)
    capture(env, "tee", TEE)
    lc(["upload", "tee"], env, check=True)
    capture(env, "last-ranks", LAST_RANKS)
    capture(env, "quiet", QUIET)
    capture(env, "quiet-shipped", QUIET)
    lc(["upload", "quiet-shipped"], env, check=True)
    write_gpu_run(tmp / "spool")
    with Serve(env) as s:
        yield s, env, tmp


def get(site, path: str, **kw: Any) -> httpx.Response:
    s = site[0]
    return httpx.get(s.base + path, params={"token": s.token, **kw}, timeout=30)


def test_first_line_is_the_url_with_a_token_on_loopback(site):
    s = site[0]
    assert s.url.startswith("http://127.0.0.1:") and "/?token=" in s.url
    assert len(s.token) >= 24


@pytest.mark.parametrize(("path", "title", "here"), [("/", "Runs", "/"),
                                                  ("/job/train", "Job", None),
                                                  ("/compare", "Compare", "/compare")])
def test_each_page_is_the_one_layout_around_its_own_main(site, path, title, here):
    html = get(site, path).text
    assert html.startswith("<!doctype html>") and html.count("<head>") == 1
    assert f"<title>{title} · logcapture</title>" in html
    assert html.count("<main>") == 1 and html.rstrip().endswith("</html>")
    marked = [a for a in html.split("<a ") if 'class="here"' in a.split(">")[0]]
    assert [a.split('"')[1] for a in marked] == ([here] if here else [])
    assert ("uPlot.min.css" in html) == (path != "/")  # the chart styles where charts are


@pytest.mark.parametrize("path", ["/", "/job/train", "/api/runs", "/api/runs/train/log",
                                  "/api/search?q=epoch", "/static/app.css"])
def test_no_token_no_page(site, path):
    s = site[0]
    assert httpx.get(s.base + path).status_code == 403
    assert httpx.get(s.base + path, params={"token": "wrong"}).status_code == 403
    assert httpx.get(s.base + path, params={"token": s.token[:-1]}).status_code == 403


def test_the_token_sets_a_cookie_and_a_wrong_token_beats_it(site):
    s = site[0]
    with httpx.Client() as c:
        r = c.get(s.url)
        assert r.status_code == 200 and "HttpOnly" in r.headers["set-cookie"]
        assert c.get(s.base + "/api/runs").status_code == 200
        assert c.get(s.base + "/api/runs", params={"token": "wrong"}).status_code == 403


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_nothing_changes_data(site, method):
    s = site[0]
    r = httpx.request(method, s.base + "/api/runs/train", params={"token": s.token})
    assert r.status_code == 405


def test_runs_newest_first(site):
    runs = get(site, "/api/runs").json()
    by_id = {r["run"]: r for r in runs}
    assert set(by_id) == {"train", "big", "shipped", "workers", "tee", "last-ranks",
                          "quiet", "quiet-shipped", "gpu"}
    starts = [r["start"] for r in runs]
    assert starts == sorted(starts, reverse=True)
    assert by_id["gpu"]["job_id"] == "4242" and by_id["gpu"]["name"] == "train_gpt"
    assert by_id["train"]["state"] == "COMPLETED" and by_id["train"]["exit"] == "0"
    assert by_id["train"]["source"] == "spool"


def test_header(site):
    h = get(site, "/api/runs/4242").json()  # by Slurm job id
    assert h["run"] == "gpu" and h["nodes"] == "node1, node2" and h["gpus"] == 4
    assert h["state"] == "COMPLETED" and h["duration"] == 300.0 and not h["running"]
    assert h["redactions"] == 3  # the end record's count, all kinds (`show`'s `redactions`)
    h = get(site, "/api/runs/shipped").json()  # read from the store
    assert h["source"] == "store" and h["state"] == "COMPLETED" and h["exit"] == "0"
    # its name as ls says it (summary_row: the command's name), the whole command beside it
    assert h["name"] == Path(sys.executable).name and h["command"].endswith(TRAIN)
    assert h["nodes"]
    assert h["redactions"] == 0
    assert get(site, "/api/runs/train").json()["redactions"] == 0  # from the spool



def entries_of(site, run: str, **kw: Any) -> list[list[Any]]:
    r = get(site, f"/api/runs/{run}/log", **kw)
    assert "entries" in r.json(), (run, kw, r.status_code, r.text[:500])
    return r.json()["entries"]


@pytest.mark.parametrize("run", ["train", "shipped"])  # the spool's and the store's
def test_log_shows_lines_notes_and_stderr_on_the_switch(site, run):
    texts = [e["text"] for e in entries_of(site, run)]
    assert texts[0] == "loading data" and texts[-1] == "done"
    assert "[logcapture: previous line repeated 2 more times, dropped]" in texts
    assert texts.count('{"epoch": 1, "loss": 1.997002, "acc": 0.283469, "lr": 0.1}') == 1
    assert not any("checkpoint" in t for t in texts)
    with_err = entries_of(site, run, stderr=1)
    errs = [e for e in with_err if e["stream"] == "stderr"]
    assert [e["text"] for e in errs] == [f"warning: checkpoint {e} slow" for e in (4, 8, 12)]
    kinds = {e["text"]: e["kind"] for e in with_err}
    assert kinds["[logcapture: previous line repeated 2 more times, dropped]"] == "note"


def test_the_spool_and_the_store_show_the_same_log(site):
    def strip(es: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
        return [(e["stream"], e["kind"], e["text"]) for e in es]
    assert strip(entries_of(site, "train", stderr=1)) == strip(entries_of(site, "shipped",
                                                                          stderr=1))


def test_labelled_rows_without_a_rank_0_open_on_the_lowest_rank(site):
    first = get(site, "/api/runs/last-ranks/metadata").json()
    assert (first["ranks"], first["rank"]) == ([3, 5], "3")
    assert [r["label"] for r in first["rows"]] == ["rank 3", "rank 3"]
    five = get(site, "/api/runs/last-ranks/metadata", rank="5").json()
    assert [r["fields"]["loss"] for r in five["rows"]] == [4, 5]


def test_in_mode_metadata_each_record_shows_after_its_label(site):
    def strip(es: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
        return [(e["stream"], e["kind"], e["text"]) for e in es]
    spool, store = strip(entries_of(site, "quiet")), strip(entries_of(site, "quiet-shipped"))
    assert spool == store
    assert [t for _, kind, t in spool if kind == "metadata"][:2] == [
        '[local rank 0] {"step":0,"loss":1.5}', '[local rank 1] {"step":0,"loss":2.5}']
    cli = lc(["logs", "quiet-shipped"], site[1], text=True).stdout.splitlines()
    assert cli == [t for _, _, t in store]


def test_a_run_shipped_twice_shows_once(site):
    # The page reads the store without FINAL (fast right after an upload) and drops a record
    # shipped twice and not yet merged.
    before = entries_of(site, "shipped", stderr=1)
    # (it waits for the page to let the store go)
    lc(["upload", "--force", "shipped"], site[1], check=True)
    assert entries_of(site, "shipped", stderr=1) == before
    assert entries_of(site, "shipped", stderr=1, limit=3)[-1] == before[-1]


def test_a_long_log_opens_at_its_newest_lines_and_pages_back(site):
    page = get(site, "/api/runs/big/log", limit=500).json()
    assert page["more"] and len(page["entries"]) == 500
    assert page["entries"][-1]["text"] == "line 2999"
    seen = [e["text"] for e in page["entries"]]
    before = page["entries"][0]["cursor"]
    while True:
        page = get(site, "/api/runs/big/log", limit=700, before=before).json()
        seen = [e["text"] for e in page["entries"]] + seen
        if not page["more"]:
            break
        before = page["entries"][0]["cursor"]
    assert [t for t in seen if not t.startswith("{")] == [f"line {i}" for i in range(3000)]
    assert [t for t in seen if t.startswith("{")] == [
        json.dumps({"step": i}) for i in range(0, 3000, 250)]  # once each
    after = get(site, "/api/runs/big/log", limit=5, stderr=1).json()["entries"]
    newer = get(site, "/api/runs/big/log", limit=5, stderr=1, after=after[1]["cursor"]).json()
    assert [e["text"] for e in newer["entries"]] == [e["text"] for e in after[2:]]


def test_pages_of_a_spool_run_are_its_whole_log_in_order(site):
    # Forward from the start and backward from the end, in pages smaller and larger than a
    # segment: the same entries as the log view of every record, in the store's order.
    from logcapture.logview import entries, sort_key
    from logcapture.spool.layout import segments
    from logcapture.spool.reading import iter_run

    run_dir = site[2] / "spool" / "big"
    assert len(segments(run_dir)) > 5
    want = [e.text for e in sorted(entries(iter_run(run_dir), stderr=True), key=sort_key)]
    for limit in (7, 400):
        back, before = [], None
        while True:
            page = get(site, "/api/runs/big/log", limit=limit, stderr=1,
                       **({"before": before} if before else {})).json()
            back = [e["text"] for e in page["entries"]] + back
            before = page["entries"][0]["cursor"]
            if not page["more"]:
                break
        assert back == want
        first = get(site, "/api/runs/big/log", limit=1, stderr=1, before=before).json()
        assert first["entries"] == [] and not first["more"]
        fwd, after = back[:0], "0:stdout:0"
        while True:
            page = get(site, "/api/runs/big/log", limit=limit, stderr=1, after=after).json()
            fwd += [e["text"] for e in page["entries"]]
            if not page["more"]:
                break
            after = page["entries"][-1]["cursor"]
        assert fwd == want


def test_metadata_newest_first_and_graphs_by_the_rule(site):
    m = get(site, "/api/runs/train/metadata").json()
    assert [r["fields"]["epoch"] for r in m["rows"]] == list(range(12, 0, -1))
    assert m["keys"] == ["acc", "epoch", "loss", "lr"]
    assert m["by_x"]["key"] == "epoch" == choose_x_axis([r["fields"] for r in m["rows"][::-1]])
    assert m["by_x"]["because"] == "epoch"
    assert m["by_x"]["x"] == list(range(1, 13)) and set(m["by_x"]["series"]) == {"acc", "loss",
                                                                                "lr"}
    assert len(m["by_time"]["x"]) == 12
    g = get(site, "/api/runs/gpu/metadata").json()
    assert g["by_x"]["key"] == "step" and g["by_x"]["because"] == (
        "monotonically increasing integers")


def test_workers_that_say_their_rank_are_one_series_each(site):
    w = get(site, "/api/runs/workers/metadata").json()
    assert w["by_x"]["key"] == "step" and w["total"] == 10
    assert w["keys"] == ["loss (rank 0)", "loss (rank 1)", "rank (rank 0)", "rank (rank 1)",
                         "step (rank 0)", "step (rank 1)"]
    assert set(w["by_x"]["series"]) == {"loss (rank 0)", "loss (rank 1)", "rank (rank 0)",
                                        "rank (rank 1)"}
    loss1 = [(x, v) for x, v in zip(w["by_x"]["x"], w["by_x"]["series"]["loss (rank 1)"],
                                    strict=True) if v is not None]
    assert loss1 == [(s, 4 - s + 0.5) for s in range(5)]
    assert w["by_time"]["series"]["loss (rank 0)"][:4] == [4, None, 3, None]
    assert "rank" not in w["rows"][0]  # a run of no task: the table shows the fields alone


def test_workers_behind_their_launchers_labels_are_one_series_each(site):
    # local rank 0 by default, as a job's rank 0; another or all on request
    first = get(site, "/api/runs/tee/metadata").json()
    assert (first["ranks"], first["rank"], first["total"]) == ([0, 1], "0", 4)
    assert {r["label"] for r in first["rows"]} == {"local rank 0"}
    assert set(first["by_x"]["series"]) == {"loss (local rank 0)", "rank (local rank 0)"}
    one = get(site, "/api/runs/tee/metadata", rank="1").json()
    assert {r["label"] for r in one["rows"]} == {"local rank 1"} and one["rank"] == "1"
    t = get(site, "/api/runs/tee/metadata", rank="all").json()
    assert t["by_x"]["key"] == "step" and t["total"] == 8
    assert [r["label"] for r in t["rows"]] == ["local rank 1", "local rank 0"] * 4
    assert set(t["by_x"]["series"]) == {f"{k} (local rank {n})" for k in ("loss", "rank")
                                        for n in (0, 1)}
    loss1 = [(x, v) for x, v in zip(t["by_x"]["x"],
                                    t["by_x"]["series"]["loss (local rank 1)"], strict=True)
             if v is not None]
    assert loss1 == [(0, 2.0), (1, 1.5), (2, 1.3333), (3, 1.25)]


def test_resources_per_node(site):
    r = get(site, "/api/runs/gpu/resources").json()["nodes"]
    assert sorted(r) == ["node1", "node2"]
    n = r["node2"]
    assert sorted(n["gpus"]) == ["GPU 0 H100", "GPU 1 H100"]
    assert len(n["gpus"]["GPU 1 H100"]["power_watts"]) == len(n["t"]) == 30
    assert n["gpus"]["GPU 1 H100"]["power_watts"][:2] == [350, 351]
    assert n["job"]["cpu_percent"][0] == 95.0


def test_downloads_are_what_export_writes(site):
    env = site[1]
    for what in ("lines", "metadata", "samples"):
        for fmt in ("csv", "ndjson"):
            r = get(site, "/api/runs/shipped/export", what=what, format=fmt)
            assert r.status_code == 200, r.text
            assert f'filename="shipped-{what}.{fmt}"' in r.headers["content-disposition"]
            cli = lc(["export", "shipped", "--what", what, "--format", fmt], env,
                     check=True).stdout
            assert r.content == cli, (what, fmt)
    r = get(site, "/api/runs/train/export", what="metadata", format="csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [int(x["epoch"]) for x in rows] == list(range(1, 13))
    r = get(site, "/api/runs/train/export", what="metadata", format="parquet")
    assert r.content[:4] == b"PAR1"


@pytest.mark.parametrize("path,status", [
    ("/api/runs/nope", 404), ("/api/runs/..%2F..%2Fetc/log", 404),
    ("/api/runs/a%20b", 400), ("/api/runs/train/log?before=x", 400),
    ("/api/runs/train/log?limit=many", 400), ("/api/runs/train/export?what=secrets", 400),
])
def test_bad_requests_get_clear_errors(site, path, status):
    s = site[0]
    sep = "&" if "?" in path else "?"
    r = httpx.get(f"{s.base}{path}{sep}token={s.token}")
    assert r.status_code == status
    if path.startswith("/api/runs/") and status == 400:
        assert r.json()["error"]
    assert get(site, "/api/runs").status_code == 200  # still serving


def test_compare(site):
    c = get(site, "/api/compare", runs="train,gpu", key="loss").json()
    by = {r["run"]: r for r in c["runs"]}
    assert by["train"]["x_key"] == "epoch" and by["gpu"]["x_key"] == "step"
    assert [p[0] for p in by["gpu"]["by_x"]][:3] == [0, 100, 200]
    assert by["gpu"]["by_time"][1][0] == pytest.approx(10.0)


GRAFANA = textwrap.dedent("""
    import json, sys
    from datetime import datetime, timezone
    from logcapture.grafana.dashboards import all_dashboards
    from logcapture.grafana.macros import interpolate
    from logcapture.store import open_store
    dash = all_dashboards()["job-details"]
    panels = [p for q in dash["panels"] for p in [q, *q.get("panels", [])]]
    out = {}
    with open_store(None, wait=30, must_exist=True) as st:
        for p in panels:
            for t in p.get("targets", []):
                for stderr in ("0", "1"):
                    sql = interpolate(t["rawSql"], {"run": sys.argv[1], "stderr": stderr,
                                                    "node": sys.argv[2], "x_axis": "",
                                                    "rank": ["0"]},
                                      datetime(2000, 1, 1, tzinfo=timezone.utc),
                                      datetime(2100, 1, 1, tzinfo=timezone.utc))
                    res = st.client.query(sql)
                    out[p["title"] + "/" + stderr] = [
                        dict(zip(res.column_names, r)) for r in res.result_rows]
    print(json.dumps(out, default=str))
""")


def test_grafana_panels_show_what_the_page_shows(site):
    s, env, tmp = site
    lc(["upload", "gpu"], env, check=True)  # the GPU run in the store too, for the resource panels
    page = {run: {"log": {st: entries_of(site, run, stderr=st, limit=5000) for st in (0, 1)},
                  "header": get(site, f"/api/runs/{run}").json(),
                  "meta": get(site, f"/api/runs/{run}/metadata").json(),
                  "res": get(site, f"/api/runs/{run}/resources").json()}
            for run in ("shipped", "workers", "tee", "quiet-shipped", "gpu")}
    for run, node in (("shipped", "vm"), ("workers", "vm"), ("tee", "vm"),
                      ("quiet-shipped", "vm"), ("gpu", "node2")):
        want = page[run]
        if run != "gpu":
            node = want["header"]["nodes"]
        panel = json.loads(grafana_rows(env, run, node))
        for st in ("0", "1"):
            grafana_log = [r["body"] for r in panel["Output/" + st]][::-1]
            assert grafana_log == [e["text"] for e in want["log"][int(st)]], (run, st)
        [hdr] = panel["Job/0"]
        assert (hdr["user"], hdr["state"], hdr["exit_status"], hdr["nodes"], hdr["gpus"]) == (
            want["header"]["user"], want["header"]["state"], want["header"]["exit"],
            want["header"]["nodes"], want["header"]["gpus"])
        table = [json.loads(r["fields"]) for r in panel["Metadata (newest first)/0"]]
        assert table == [r["fields"] for r in want["meta"]["rows"]]
        by_time = {}
        for r in panel["Metadata by time/0"]:
            by_time.setdefault(r["key"], []).append(r["value"])
        assert by_time == {k: [v for v in vals if v is not None]
                           for k, vals in want["meta"]["by_time"]["series"].items()}
        x_panels = [k for k in panel if k.startswith("Metadata by $x_axis/0")]
        by_x: dict[str, list[tuple[float, float]]] = {}
        for r in panel[x_panels[0]]:
            by_x.setdefault(r["key"], []).append((r["x"], r["value"]))
        bx = want["meta"]["by_x"]
        assert by_x == {k: sorted((x, v) for x, v in zip(bx["x"], vals, strict=True)
                                  if v is not None) for k, vals in bx["series"].items()}
        [axis] = panel["X axis/0"]
        assert (axis["x_axis"], axis["chosen_because"]) == (bx["key"], bx["because"])
        # A run shorter than the sampler's first look at the job may have no sample
        # (sampler.sample_once: none while the job has no process): then neither has rows.
        res = want["res"]["nodes"].get(node) or {"t": [], "gpus": {}, "job": {"cpu_percent": []}}
        util = [(r["gpu"], r["value"]) for r in panel["GPU utilisation/0"]]
        assert util == sorted((g, v) for g, s in res["gpus"].items()
                              for v in s["utilization_gpu_percent"] if v is not None) or (
            util == [(g, v) for i in range(len(res["t"])) for g in sorted(res["gpus"])
                     for v in [res["gpus"][g]["utilization_gpu_percent"][i]]])
        cpu = [r["value"] for r in panel["CPU (100% = one core)/0"]]
        assert cpu == [v for v in res["job"]["cpu_percent"] if v is not None]


def grafana_rows(env: dict[str, str], run: str, node: str) -> str:
    """Every Job details panel's rows for RUN as Grafana would fetch them, from the store,
    in another process (an embedded store is one process's at a time)."""
    r = subprocess.run([sys.executable, "-c", GRAFANA, run, node], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_serve_refuses_a_busy_port(tmp_path: Path):
    import socket

    env = env_for(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = lc(["serve", "--no-browser", "--port", str(port)], env, timeout=30)
    assert r.returncode != 0 and f"127.0.0.1:{port}" in r.stderr.decode()


def test_search_finds_lines_in_spool_and_store_runs_and_links_to_them(site):
    r = get(site, "/api/search", q='"epoch 12: training"', context="1")
    assert r.status_code == 200, r.text
    found = r.json()
    groups = {g["run"]: g for g in found["groups"]}
    assert {"train", "shipped"} <= set(groups)
    assert groups["train"]["source"] == "spool" and groups["shipped"]["source"] == "store"
    for run in ("train", "shipped"):
        lines = groups[run]["lines"]
        [hit] = [d for d in lines if d["match"]]
        assert hit["text"] == "epoch 12: training"
        assert len(lines) == 3  # one line of context either side
        # The link's cursor opens the job's log at that very line.
        ns, stream, seq = hit["cursor"].split(":")
        page = get(site, f"/api/runs/{run}/log", after=f"{int(ns) - 1}:{stream}:{seq}",
                   limit="100")
        assert page.status_code == 200, page.text
        # a burst: one stamp
        at = [e for e in page.json()["entries"] if e["cursor"] == hit["cursor"]]
        assert [e["text"] for e in at] == [hit["text"]]


def test_search_errors_are_400_and_sql_is_only_text(site):
    for params, msg in (({"q": ""}, "empty"), ({"q": "(x", "regex": "1"}, "--regex"),
                        ({"q": "x", "context": "many"}, "context"),
                        ({"q": "x", "since": "soon"}, "since"),
                        ({"q": "x", "state": "DONE"}, "state")):
        r = get(site, "/api/search", **params)
        assert r.status_code == 400 and msg in r.json()["error"], (params, r.text)
    r = get(site, "/api/search", q="x'; DROP TABLE lines; --")
    assert r.status_code == 200 and r.json()["matches"] == 0
    assert get(site, "/api/search", q="epoch").json()["matches"] > 0  # all still there


# --- connections: what another local user can take from the page without the token

# serve() with test limits: RLIMIT_NOFILE (0: unchanged), header timeout, idle timeout, and
# the bound on open connections.
LIMITED = """
import os, resource, sys
from pathlib import Path
from logcapture.query import LocalReader
from logcapture.web import serve
nofile, header, idle, most = sys.argv[1:5]
if int(nofile):
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (int(nofile), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    serve(LocalReader(Path(os.environ["LOGCAPTURE_SPOOL"]), None), port=0,
          open_browser=False, header_timeout=float(header), idle_timeout=int(idle),
          max_connections=int(most))
except KeyboardInterrupt:  # the tests stop it with SIGINT
    pass
"""


def limited(env: dict[str, str], nofile: int = 0, header: float = 30, idle: int = 30,
            most: int = 100, stderr: Path | None = None) -> Serve:
    return Serve(env, command=[sys.executable, "-c", LIMITED, str(nofile), str(header),
                               str(idle), str(most)], stderr=stderr)


def connect(port: int, send: bytes = b"", timeout: float = 20) -> Any:
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if send:
        s.sendall(send)
    return s


def closed_within(s: Any, seconds: float) -> bool:
    """The server closed ``s`` (EOF or a reset) within ``seconds``."""
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    env = env_for(tmp)
    capture(env, "train")
    return env, tmp


def test_a_connection_that_sends_no_request_head_is_closed(served):
    env, _ = served
    with limited(env, header=1, idle=1) as s:
        silent = connect(s.port)
        trickle = connect(s.port, b"GET / HTTP/1.1\r\nHost: x\r\n")
        for _ in range(5):  # a byte now and then: the deadline is for the whole head
            trickle.sendall(b"X")
            time.sleep(0.1)
        assert closed_within(silent, 20) and closed_within(trickle, 20)
        # An idle keep-alive connection is closed after its response too.
        kept = connect(s.port, f"GET /api/runs?token={s.token} HTTP/1.1\r\n"
                               "Host: x\r\n\r\n".encode())
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_within(kept, 20)
        # A slow response is not cut by the head's deadline: a follow outlasts it.
        with httpx.stream("GET", s.base + "/api/runs/train/follow",
                          params={"token": s.token}, timeout=20) as r:
            assert r.status_code == 200
            assert "event: entries" in next(r.iter_text())
        for c in (silent, trickle, kept):
            c.close()


def test_half_open_connections_past_the_bound_leave_the_owner_served(served):
    env, _ = served
    with limited(env, most=20) as s:
        hogs = [connect(s.port, b"GET / HTTP/1.1\r\n" if i % 2 else b"", timeout=5)
                for i in range(200)]
        try:
            r = httpx.get(s.base + "/api/runs", params={"token": s.token}, timeout=20)
            assert r.status_code == 200 and [d["run"] for d in r.json()] == ["train"]
            # Past the bound the oldest waiting ones were closed at once, not queued: no
            # more than the bound stays open.
            still_open = [h for h in hogs if not closed_within(h, 0.05)]
            assert len(still_open) <= 20
        finally:
            for h in hogs:
                h.close()


def test_connections_that_cannot_be_accepted_are_one_line_now_and_then(served):
    env, tmp = served
    err = tmp / "emfile.err"
    # Few descriptors and a bound above them: accept() fails with EMFILE.
    with limited(env, nofile=64, most=1000, stderr=err) as s:
        hogs = []
        for _ in range(300):
            try:
                hogs.append(connect(s.port, timeout=0.5))
            except OSError:
                pass  # the listen queue is full: the server is not accepting
        time.sleep(3)
        for h in hogs:
            h.close()
        # Once descriptors are free again it serves (accepting again within a second).
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(s.base + "/api/runs", params={"token": s.token}, timeout=5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert r.status_code == 200
    lines = err.read_text().splitlines()
    assert lines and "Traceback" not in err.read_text()
    assert all("accepting a connection failed" in x and "Too many open files" in x
               for x in lines), lines
    assert len(lines) <= 3, lines


def test_two_pages_on_one_host_keep_their_own_cookies(served):
    env, _ = served
    with Serve(env) as a, Serve(env) as b, httpx.Client() as c:
        assert a.port != b.port
        for s in (a, b):
            r = c.get(s.url)
            assert r.headers["set-cookie"].startswith(f"logcapture_token_{s.port}={s.token};")
        for s in (a, b):  # each page still has its own token from the cookie jar
            assert c.get(s.base + "/api/runs").status_code == 200
        # A cookie of the other page's name, holding that page's token, opens nothing here.
        c.cookies.clear()
        c.cookies.set(f"logcapture_token_{b.port}", b.token)
        assert c.get(a.base + "/api/runs").status_code == 403
