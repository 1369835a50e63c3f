"""The pages of `logcapture serve` in a real browser (Debian's headless Chromium, driven by
selenium), used as a person would: open the URL serve printed, click a run, read the log,
switch stderr on, read the metadata table, use the graphs' legend, watch a running job's
new lines arrive, read sizes and durations as the terminal writes them. The token's rules
(403 without it, a page's own cookie) are the server's, tested over HTTP in test_web.py. No
JavaScript error may reach the console.

Screenshots of each page go to $LOGCAPTURE_SCREENSHOTS (default: this test's tmp folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import LOGCAPTURE, env_for
from pages import Serve, capture, chromium, have_chromium, write_gpu_run
from test_arrays import write_array

pytestmark = pytest.mark.skipif(not have_chromium(), reason="needs Debian's chromium and "
                                "chromium-driver (.ci/run installs them)")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TICKER = ("import time\nprint('ticker started', flush=True)\n"
          "for i in range(60):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)\n")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("LOGCAPTURE_SCREENSHOTS") or tmp_path_factory.mktemp("screens"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    env = env_for(tmp)
    capture(env, "train")
    write_gpu_run(tmp / "spool")
    with Serve(env) as s:
        yield s, env


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    d = chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield d
    d.quit()


def console_errors(d) -> list[str]:
    return [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]


def wait(d, timeout: float = 20):
    return WebDriverWait(d, timeout, poll_frequency=0.1)


def legend(d, chart: str) -> dict[str, bool]:
    """Series label -> shown, from the legend of the chart titled ``chart``."""
    box = d.find_element(By.CSS_SELECTOR, f'.chart[data-title="{chart}"]')
    return {i.get_attribute("data-series"): "off" not in i.get_attribute("class").split()
            for i in box.find_elements(By.CSS_SELECTOR, ".legend .item")}


def legend_item(d, chart: str, series: str):
    return d.find_element(By.CSS_SELECTOR,
                          f'.chart[data-title="{chart}"] .legend .item[data-series="{series}"]')


def log_texts(d, rows: str = "#log .row") -> list[str]:
    """The log lines on screen (read in one go: the page redraws rows as lines arrive)."""
    return d.execute_script(
        f"return [...document.querySelectorAll('{rows} .t')].map(e => e.textContent)")


def test_a_person_reads_a_run(site, browser, shots):
    s, _ = site
    d = browser
    d.get(s.url)
    wait(d).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#runs-table tr[data-run]")))
    rows = d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")
    assert [r.get_attribute("data-run") for r in rows] == ["train", "gpu"]  # newest first
    d.save_screenshot(str(shots / "runs.png"))

    # Filter by name, then by state.
    d.find_element(By.ID, "name-filter").send_keys("gpt")
    assert [r.get_attribute("data-run") for r in
            d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")] == ["gpu"]
    d.find_element(By.ID, "name-filter").clear()
    d.find_element(By.ID, "name-filter").send_keys(" ")
    d.find_element(By.ID, "name-filter").send_keys(Keys.BACKSPACE)

    d.find_element(By.CSS_SELECTOR, 'tr[data-run="train"] a.run-link').click()
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    assert "/job/train" in d.current_url

    texts = log_texts(d)
    assert "done" in texts and "epoch 12: training" in texts
    # both streams by default, in the order read (the log's, as the API pages it), stderr
    # marked
    order = d.execute_script(
        "return fetch(location.pathname.replace('/job/', '/api/runs/') + '/log?stderr=1')"
        ".then(r => r.json()).then(p => p.entries.map(e => e.text))")
    assert texts == order
    assert log_texts(d, "#log .row.stderr") == [f"warning: checkpoint {e} slow"
                                                for e in (4, 8, 12)]
    assert log_texts(d, "#log .row.note") == [
        "[logcapture: previous line repeated 2 more times, dropped]"]

    d.find_element(By.ID, "stderr-switch").click()  # stderr off
    wait(d).until(lambda d: not any("checkpoint" in t for t in log_texts(d)))
    d.find_element(By.ID, "stderr-switch").click()
    wait(d).until(lambda d: any("checkpoint 12" in t for t in log_texts(d)))

    first = d.find_elements(By.CSS_SELECTOR, "#metadata-table tbody tr")[0]
    cells = [c.text for c in first.find_elements(By.TAG_NAME, "td")]
    head = [c.text.lower() for c in d.find_elements(By.CSS_SELECTOR, "#metadata-table th")]
    row = dict(zip(head, cells, strict=True))
    assert row["epoch"] == "12" and row["loss"] == "0.174468"  # the newest row first

    chart = "Metadata by epoch"
    note = d.find_element(By.CSS_SELECTOR, f'.chart[data-title="{chart}"] .axis-note').text
    assert "epoch" in note and "chosen because" in note
    assert legend(d, chart) == {"acc": True, "loss": True, "lr": True}
    legend_item(d, chart, "loss").click()
    assert legend(d, chart) == {"acc": False, "loss": True, "lr": False}
    ActionChains(d).key_down(Keys.CONTROL).click(legend_item(d, chart, "acc")) \
        .key_up(Keys.CONTROL).perform()
    assert legend(d, chart) == {"acc": True, "loss": True, "lr": False}
    ActionChains(d).key_down(Keys.CONTROL).click(legend_item(d, chart, "loss")) \
        .key_up(Keys.CONTROL).perform()
    assert legend(d, chart) == {"acc": True, "loss": False, "lr": False}
    d.save_screenshot(str(shots / "job.png"))
    d.set_window_size(1400, 2600)
    d.save_screenshot(str(shots / "job-full.png"))
    d.set_window_size(1400, 1000)
    assert console_errors(d) == []


def test_resources_per_node_and_downloads(site, browser, shots):
    s, _ = site
    d = browser
    d.get(s.base + "/job/4242")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    titles = [c.get_attribute("data-title") for c in
              d.find_elements(By.CSS_SELECTOR, "#resources .chart")]
    for node in ("node1", "node2"):
        for t in ("GPU utilisation", "GPU memory used", "GPU power", "GPU temperature",
                  "CPU (100 % = one core)", "Memory (RSS)"):
            assert f"{t} · {node}" in titles
    assert legend(d, "GPU power · node2") == {"GPU 0 H100": True, "GPU 1 H100": True}
    # the header's facts: the secrets the end record counts as redacted
    [fact] = wait(d).until(lambda d: d.find_elements(By.ID, "redactions"))
    assert fact.text.split() == ["REDACTIONS", "3"]
    links = [a.get_attribute("href") for a in
             d.find_elements(By.CSS_SELECTOR, "#downloads a")]
    assert len(links) == 12 and any("what=metadata&format=parquet" in h for h in links)
    assert any("what=progress&format=csv" in h for h in links)
    d.execute_script("document.getElementById('resources-panel').scrollIntoView()")
    d.save_screenshot(str(shots / "resources.png"))
    assert console_errors(d) == []


def test_compare_page(site, browser, shots):
    s, _ = site
    d = browser
    d.get(s.base + "/compare?runs=train,gpu&key=loss")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    charts = [c.get_attribute("data-title") for c in d.find_elements(By.CSS_SELECTOR,
                                                                      ".chart")]
    assert charts == ["loss by each run's X axis", "loss by time since start"]
    assert set(legend(d, "loss by time since start")) == {"train", "gpu · train_gpt"}
    note = d.find_element(By.CSS_SELECTOR, ".axis-note").text
    assert "train: epoch" in note and "gpu: step" in note
    d.save_screenshot(str(shots / "compare.png"))
    assert console_errors(d) == []


def test_new_lines_arrive_without_reloading(site, browser, shots):
    s, env = site
    d = browser
    job = subprocess.Popen([*LOGCAPTURE, "run", "--run-id", "ticker", "--", sys.executable,
                            "-c", TICKER], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        # A run is a directory with a segment: the worker opens its first one a moment after
        # the wrapper made the directory, and the page asks for the run at once.
        while not any((Path(env["LOGCAPTURE_SPOOL"]) / "ticker").glob("seg-*")):
            assert time.monotonic() < deadline, "the ticker run never started"
            time.sleep(0.1)
        d.get(s.base + "/job/ticker")
        wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        d.execute_script("window.notReloaded = true")
        wait(d).until(lambda d: "live" in d.find_element(By.ID, "live").text)
        first = max(int(t.split()[1]) for t in log_texts(d) if t.startswith("tick ")) \
            if any(t.startswith("tick ") for t in log_texts(d)) else -1
        wait(d, 30).until(lambda d: f"tick {first + 3}" in log_texts(d))
        assert d.execute_script("return window.notReloaded") is True
        d.save_screenshot(str(shots / "live.png"))
    finally:
        job.terminate()
        job.wait(30)
    wait(d, 30).until(lambda d: "ended" in d.find_element(By.ID, "live").text)
    assert console_errors(d) == []


def test_sizes_and_durations_read_as_in_the_terminal(site, browser, shots):
    # The page's common.js writes what views.size and views.duration write (`ls`, `show`):
    # the cases of tests/format_cases.json, which tests/test_summary_row.py runs in Python.
    import json

    from logcapture import views

    s, _ = site
    d = browser
    d.get(s.url)
    wait(d).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#runs-table tr[data-run]")))
    cases = json.loads((Path(__file__).resolve().parent / "format_cases.json").read_text())
    got = d.execute_script(
        "const c = arguments[0];"
        "return {size: c.size.map(([v]) => [v, LC.bytes(v)]),"
        "        duration: c.duration.map(([v]) => [v, LC.duration(v)])};", cases)
    assert got == cases
    # The runs table: each run's duration as `ls` writes the row's (summary_row).
    runs = d.execute_script("return fetch('/api/runs').then(r => r.json())")
    cells = {r.get_attribute("data-run"): r.find_elements(By.TAG_NAME, "td")[6].text
             for r in d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")}
    assert cells == {r["run"]: views.duration(r["duration"]) for r in runs}
    assert console_errors(d) == []


def test_dark_mode(site, browser, shots):
    s, _ = site
    d = browser
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        d.get(s.url)  # the token's cookie again (a test before may have cleared it)
        console_errors(d)  # and its console messages (a 403 on purpose) read and dropped
        d.get(s.base + "/job/4242")
        wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        bg = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        rgb = [int(x) for x in bg[bg.index("(") + 1:bg.index(")")].split(",")[:3]]
        assert sum(rgb) < 150, bg  # a dark background, light text
        d.save_screenshot(str(shots / "job-dark.png"))
        assert console_errors(d) == []
    finally:
        d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
def test_search_from_the_runs_page_opens_the_line(site, browser, shots):
    s, _ = site
    d = browser
    console_errors(d)  # read, so that only this test's count below (the 403 test's are kept)
    d.get(s.url)
    box = wait(d).until(ec.presence_of_element_located((By.ID, "search-q")))
    box.send_keys('"epoch 7: training"', Keys.ENTER)  # not the JSON line of epoch 7
    wait(d).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results .hit.match"))
    texts = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#search-results .hit .t")]
    hits = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#search-results .hit.match .t")]
    assert hits == ["epoch 7: training"]
    assert "epoch 6: training" in texts  # two lines of context by default
    assert "?q=%22epoch+7" in d.current_url  # the search is in the address, to share
    d.save_screenshot(str(shots / "search.png"))

    d.find_element(By.CSS_SELECTOR, "#search-results .hit.match").click()
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    assert "/job/train?at=" in d.current_url
    assert log_texts(d, "#log .row.at") == ["epoch 7: training"]
    inside = d.execute_script(
        "const r = document.querySelector('#log .row.at').getBoundingClientRect();"
        "const b = document.getElementById('log').getBoundingClientRect();"
        "return r.top >= b.top && r.bottom <= b.bottom")
    assert inside  # scrolled to it
    d.save_screenshot(str(shots / "search-line.png"))

    # A stderr line opens with stderr shown.
    d.get(s.base + "/?q=checkpoint+8")
    wait(d).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results .hit.match"))
    d.find_element(By.CSS_SELECTOR, "#search-results .hit.match").click()
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    assert d.find_element(By.ID, "stderr-switch").is_selected()
    assert log_texts(d, "#log .row.at") == ["warning: checkpoint 8 slow"]
    d.find_element(By.ID, "to-end").click()  # back to the newest lines
    wait(d).until(lambda d: log_texts(d, "#log .row.at") == [])
    assert "done" in log_texts(d)
    assert console_errors(d) == []


def test_time_axis_labels_read_well_for_any_run_length(site, browser, shots):
    """The labels of a time axis (the page's own function, in the browser's local time): no
    two ticks of an axis read the same, from a tenth of a second to a month, and the date is
    on the first tick and wherever the day changes."""
    s, _ = site
    d = browser
    d.get(s.url)  # the token, as a cookie
    d.get(s.base + "/job/train")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    ticks = d.execute_script("""
        const t0 = new Date(2026, 0, 31, 23, 0, 0).getTime() / 1000;  // local time
        const axis = (start, step, n) => LC.timeTicks(
            Array.from({length: n}, (_, i) => start + i * step));
        return {
          tenth: axis(t0 + 3599.9, 0.02, 6), seconds: axis(t0, 2, 6),
          hour: axis(t0, 600, 7), night: axis(t0, 3600 * 2, 6),
          month: axis(t0 + 3600, 86400 * 5, 7)};""")
    for name, labels in ticks.items():
        assert len(set(labels)) == len(labels), (name, labels)
    assert ticks["tenth"][0] == "23:59:59.90\n2026-01-31"
    assert ticks["tenth"][1:] == ["23:59:59.92", "23:59:59.94", "23:59:59.96", "23:59:59.98",
                                  "00:00:00.00\n02-01"]
    assert ticks["seconds"][:2] == ["23:00:00\n2026-01-31", "23:00:02"]
    assert ticks["hour"][:2] == ["23:00\n2026-01-31", "23:10"]
    assert ticks["night"][:2] == ["23:00\n2026-01-31", "01:00\n02-01"]
    assert ticks["month"][:3] == ["2026-02-01", "02-06", "02-11"]
    # a run whose points share one time (a burst of lines read at once): an axis of a tenth
    # of a second around them, not uPlot's 1000 days
    width = d.execute_script("""
        const div = document.createElement("div");
        document.body.append(div);
        const u = LC.chart(div, {title: "burst", time: true, x: [1.8e9, 1.8e9, 1.8e9],
                                 series: [{label: "loss", values: [1, 2, 3]}]});
        await new Promise(r => setTimeout(r, 200));  // uPlot sets its scales after a tick
        const w = u.scales.x.max - u.scales.x.min;
        div.remove();
        return w;""")
    assert abs(width - 0.1) < 1e-6
    # and on a page: the graphs of the short run "train"
    d.execute_script("document.getElementById('graphs-panel').scrollIntoView()")
    d.save_screenshot(str(shots / "time-axes.png"))
    assert console_errors(d) == []


def test_both_streams_merged_each_switchable_times_three_ways(site, browser, shots):
    """The log shows stdout and stderr merged in read order by default, stderr rows marked;
    each stream switches off and on; times as the clock, since the start, or hidden."""
    s, _ = site
    d = browser
    d.get(s.url)
    d.get(s.base + "/job/train")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    assert d.find_element(By.ID, "stdout-switch").is_selected()
    assert d.find_element(By.ID, "stderr-switch").is_selected()
    marks = d.execute_script("return [...document.querySelectorAll('#log .row')].map("
                             "r => [r.querySelector('.s').textContent, "
                             "r.querySelector('.t').textContent])")
    assert ["err", "warning: checkpoint 4 slow"] in marks
    assert ["", "epoch 4: training"] in marks
    clock = d.find_element(By.CSS_SELECTOR, "#log .row .n").text
    assert clock.count(":") == 2 and len(clock) == 8  # HH:MM:SS
    d.save_screenshot(str(shots / "log-both.png"))

    d.find_element(By.ID, "stdout-switch").click()  # stderr alone
    wait(d).until(lambda d: "epoch 4: training" not in log_texts(d))
    only = [t for t in log_texts(d) if not t.startswith("[logcapture")]
    assert only == [f"warning: checkpoint {e} slow" for e in (4, 8, 12)]
    d.save_screenshot(str(shots / "log-stderr.png"))
    d.find_element(By.ID, "stdout-switch").click()
    wait(d).until(lambda d: "epoch 4: training" in log_texts(d))

    select = d.find_element(By.ID, "ts-mode")
    select.find_element(By.CSS_SELECTOR, "option[value=since]").click()
    since = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#log .row .n")]
    assert all(t.startswith("+0:") for t in since), since  # a run of seconds
    d.save_screenshot(str(shots / "log-since.png"))
    select.find_element(By.CSS_SELECTOR, "option[value=none]").click()
    assert not d.find_element(By.CSS_SELECTOR, "#log .row .n").is_displayed()
    d.save_screenshot(str(shots / "log-no-time.png"))
    select.find_element(By.CSS_SELECTOR, "option[value=clock]").click()
    assert console_errors(d) == []


LONG = ("import sys, time\nfor i in range(1, 2001):\n    print(f'out {i}', flush=True)\n"
        "    if i % 10 == 0:\n        print(f'err {i}', file=sys.stderr, flush=True)\n"
        "        time.sleep(0.003)\n")  # read in turns, so the two streams interleave


def numbers_on_screen(d) -> list[tuple[str, str]]:
    """(line number, text) of the log rows drawn, '' for a row without a number."""
    return d.execute_script(
        "return [...document.querySelectorAll('#log .row')].map(r => "
        "[r.querySelector('.ln').textContent, r.querySelector('.t').textContent])")


def test_line_links_open_mark_and_share_the_numbers_logs_gives(site, browser, shots):
    """#L123 scrolls to line 123 and marks it, #L120-L130 a range, however far from the
    newest lines; clicking a number sets the link and shift-click extends it; every number
    on the page is the one `logcapture logs -n` prints."""
    s, env = site
    d = browser
    capture(env, "long", LONG)
    printed = subprocess.run([*LOGCAPTURE, "logs", "-n", "long"], env=env, check=True,
                             capture_output=True, text=True).stdout
    number = {t: n.strip() for n, _, t in (r.partition("\t") for r in printed.splitlines())}
    target = int(number["err 120"])  # far above the first page (the newest lines)
    assert target < 1800

    d.get(s.url)
    d.get(f"{s.base}/job/long#L{target}-L{target + 2}")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    wait(d).until(lambda d: log_texts(d, "#log .row.hl"))
    by_number = {n: t for t, n in number.items() if n}
    assert log_texts(d, "#log .row.hl") == [by_number[str(n)] for n in range(target,
                                                                          target + 3)]
    assert log_texts(d, "#log .row.hl")[0] == "err 120"
    inside = d.execute_script(
        "const r = document.querySelector('#log .row.hl').getBoundingClientRect();"
        "const b = document.getElementById('log').getBoundingClientRect();"
        "return r.top >= b.top && r.bottom <= b.bottom")
    assert inside  # scrolled to it
    shown = numbers_on_screen(d)
    assert len(shown) > 20
    assert all(number[t] == n for n, t in shown), shown  # the numbers logs -n prints
    d.save_screenshot(str(shots / "line-link.png"))

    # Click a number: the link is that line; shift-click another: the range between.
    a, b = target + 5, target + 9

    def click_number(n: int, shift: bool = False) -> None:
        # The rows are redrawn as the log scrolls: find the number right before the click.
        for _ in range(5):
            try:
                link = d.find_element(By.CSS_SELECTOR, f'#log a.ln[data-line="{n}"]')
                chain = ActionChains(d)
                if shift:
                    chain = chain.key_down(Keys.SHIFT)
                chain = chain.click(link)
                if shift:
                    chain = chain.key_up(Keys.SHIFT)
                chain.perform()
                return
            except StaleElementReferenceException:
                time.sleep(0.2)
        raise AssertionError(f"line {n} could not be clicked")

    click_number(a)
    assert d.current_url.endswith(f"/job/long#L{a}")
    assert log_texts(d, "#log .row.hl") == [by_number[str(a)]]
    click_number(b, shift=True)
    assert d.current_url.endswith(f"/job/long#L{a}-L{b}")
    assert log_texts(d, "#log .row.hl") == [by_number[str(n)] for n in range(a, b + 1)]

    # A link pasted into the same page goes there too.
    d.execute_script("location.hash = '#L5'")
    wait(d).until(lambda d: log_texts(d, "#log .row.hl") == [by_number["5"]])
    assert console_errors(d) == []


CI = ("printf '::group::Install\\n'; echo pip; echo wheel; sleep 0.3; printf '::endgroup::\\n';"
      "printf '\\033[0Ksection_start:1764250000:tests[collapsed=true]\\r\\033[0K"
      "Running tests\\n'; echo ok; printf -- '--- Lint\\n'; echo lint-error;"
      "printf '^^^ +++\\n'; printf -- '+++ Report\\n'; echo done")


def test_sections_fold_and_unfold_with_their_durations(site, browser, shots):
    """The markers of GitHub, GitLab and Buildkite printed by a real job: each section's start
    row says its title and duration, folded as the job asked (Buildkite's `--- Lint` then
    `^^^ +++`: expanded); a click unfolds and folds it; a #L link to a line inside a folded
    section opens it."""
    s, env = site
    d = browser
    subprocess.run([*LOGCAPTURE, "run", "--run-id", "ci", "--", "bash", "-c", CI], env=env,
                   check=True, capture_output=True)
    d.get(s.url)
    d.get(s.base + "/job/ci")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    texts = log_texts(d)
    starts = log_texts(d, "#log .row.section")
    assert [t.split("  (")[0] for t in starts] == [
        "▸ Install", "▸ Running tests", "▾ Lint", "▾ Report"]
    assert all(t.endswith(")") for t in starts)  # each with its duration
    assert "pip" not in texts and "ok" not in texts and "done" in texts  # folded, open
    assert "lint-error" in texts and "[logcapture: section Lint expanded]" in texts
    assert not any("section_start" in t or "::group" in t for t in texts)
    d.save_screenshot(str(shots / "sections.png"))
    d.find_element(By.CSS_SELECTOR, "#log .row.section").click()
    wait(d).until(lambda d: "pip" in log_texts(d))
    assert log_texts(d, "#log .row.section")[0].startswith("▾ Install")
    assert any(t.startswith("[logcapture: end of section Install, ") for t in log_texts(d))
    d.save_screenshot(str(shots / "sections-open.png"))
    d.find_element(By.CSS_SELECTOR, "#log .row.section").click()
    wait(d).until(lambda d: "pip" not in log_texts(d))
    # line 3 is "ok" (pip 1, wheel 2), inside the folded "Running tests"
    d.get(s.base + "/job/ci#L3")
    wait(d).until(lambda d: log_texts(d, "#log .row.hl") == ["ok"])


def test_a_job_of_several_ranks_shows_rank_0_then_every_rank(tmp_path_factory, browser,
                                                              shots):
    """Job 77's two tasks captured as `logcapture slurm task` captures them (test_jobview):
    the job page graphs rank 0's metadata, and every rank's, one series each, on request."""
    from test_jobview import JOB, RANK, _capture

    tmp = tmp_path_factory.mktemp("ranks")
    env = env_for(tmp)
    (tmp / "rank.py").write_text(RANK)
    _capture(env, JOB, f"job_id={JOB},nodelist=n[1-3]", "sh", "-c", "echo batch; exit 1")
    for rank, node in ((0, "n1"), (1, "n3")):
        _capture(env, f"{JOB}.0.{rank}", f"job_id={JOB},step=0,rank={rank},local_rank=0,"
                 f"node={node}", sys.executable, str(tmp / "rank.py"), str(rank))
    d = browser
    with Serve(env) as s:
        d.get(s.url)
        wait(d).until(ec.presence_of_element_located((By.CSS_SELECTOR, "#runs-table tr")))
        d.get(s.base + f"/job/{JOB}")
        wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        chart = "Metadata by step"
        wait(d).until(ec.presence_of_element_located(
            (By.CSS_SELECTOR, f'.chart[data-title="{chart}"]')))
        # the job's insights across its ranks, as `show 77` lists them
        wait(d).until(lambda d: "ValueError on rank 1 (node n3)" in d.find_element(
            By.TAG_NAME, "body").text)
        assert legend(d, chart) == {"loss (rank 0)": True, "rank (rank 0)": True}
        head = [c.text.lower() for c in d.find_elements(By.CSS_SELECTOR, "#metadata-table th")]
        assert head[:2] == ["time", "rank"]
        pick = d.find_element(By.ID, "metadata-rank")
        assert [o.get_attribute("value") for o in pick.find_elements(By.TAG_NAME, "option")] \
            == ["all", "0", "1"]
        pick.find_element(By.CSS_SELECTOR, 'option[value="all"]').click()
        # the chart is drawn anew for the new series: an entry read as it goes is let pass
        WebDriverWait(d, 20, poll_frequency=0.1, ignored_exceptions=(
            StaleElementReferenceException,)).until(lambda d: len(legend(d, chart)) == 4)
        assert set(legend(d, chart)) == {"loss (rank 0)", "rank (rank 0)", "loss (rank 1)",
                                         "rank (rank 1)"}
        ranks = {r.find_elements(By.TAG_NAME, "td")[1].text
                 for r in d.find_elements(By.CSS_SELECTOR, "#metadata-table tbody tr")}
        assert ranks == {"0", "1"}
        d.save_screenshot(str(shots / "job-ranks.png"))
        assert console_errors(d) == []
        d.get("about:blank")  # before this page's server stops: no request of it fails later


# Real tqdm and Keras bars (tests/captured/, recorded with the libraries by capture_tool.py)
# written again at the pace they were drawn, a redraw every 0.05 s, under `logcapture run`.
REPLAY = ("import re, sys, time\nraw = open(sys.argv[1], 'rb').read()\n"
          "for c in re.split(rb'(?=\\r)', raw):\n"
          "    sys.stderr.buffer.write(c); sys.stderr.flush(); time.sleep(0.05)\n")


@pytest.fixture(scope="module")
def progress_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("progress")
    env = env_for(tmp)
    captured = Path(__file__).parent / "captured"
    for name in ("tqdm_slow", "keras_progbar"):
        subprocess.run([*LOGCAPTURE, "run", "--run-id", name, "--", sys.executable, "-c",
                        REPLAY, str(captured / f"{name}.input")], env=env, check=True,
                       capture_output=True, timeout=120)
    write_array(Path(env["LOGCAPTURE_SPOOL"]))
    with Serve(env) as s:
        yield s


def test_progress_bars_are_graphed(progress_site, browser, shots):
    s = progress_site
    d = browser
    d.get(s.url)
    d.get(s.base + "/job/keras_progbar")
    wait(d).until(lambda d: d.execute_script(
        "return document.getElementById('progress-panel').dataset.ready") == "1")
    panel = d.find_element(By.ID, "progress-panel")
    assert panel.is_displayed()
    rows = d.find_elements(By.CSS_SELECTOR, "#progress-table tbody tr")
    assert len(rows) == 2  # one bar per epoch
    assert all("30 / 30 step (100 %)" in r.text for r in rows)
    titles = [c.get_attribute("data-title") for c in
              d.find_elements(By.CSS_SELECTOR, "#progress-graphs .chart")]
    assert titles == ["Progress rate (per second)", "Progress completion"]
    # the two epochs' bars (no label, on stderr) are one line of the graph
    assert legend(d, "Progress completion") == {"(no label) (stderr)": True}
    completion = d.execute_script(
        "return fetch(location.pathname.replace('/job/', '/api/runs/') + '/progress')"
        ".then(r => r.json()).then(p => p.completion['(no label) (stderr)'])")
    values = [v for v in completion if v is not None]
    assert values[-1] == 100 and min(values) < 100
    panel_y = d.execute_script("document.getElementById('progress-panel').scrollIntoView();"
                               "return window.scrollY")
    assert panel_y >= 0
    d.save_screenshot(str(shots / "progress.png"))

    d.get(s.base + "/job/tqdm_slow")
    wait(d).until(lambda d: d.execute_script(
        "return document.getElementById('progress-panel').dataset.ready") == "1")
    assert "train" in d.find_element(By.ID, "progress-table").text
    assert legend(d, "Progress rate (per second)") == {"train (stderr)": True}
    assert console_errors(d) == []


def test_a_run_without_bars_has_no_progress_panel(site, browser):
    s, _ = site
    d = browser
    d.get(s.url)
    d.get(s.base + "/job/train")
    wait(d).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    wait(d).until(lambda d: d.execute_script(
        "return fetch(location.pathname.replace('/job/', '/api/runs/') + '/progress')"
        ".then(r => r.json()).then(p => p.bars.length)") == 0)
    assert not d.find_element(By.ID, "progress-panel").is_displayed()


def test_an_array_job_at_a_glance_links_each_group(progress_site, browser, shots):
    s = progress_site
    d = browser
    d.get(s.url)
    d.get(s.base + "/?job=500")
    summary = wait(d).until(lambda d: d.find_element(By.ID, "array-summary")
                            if d.find_element(By.ID, "array-summary").is_displayed() else None)
    # the same words as `ls 500` ends with (tests/test_arrays.py)
    assert summary.text == ("Array job 500: 12 tasks: 7 COMPLETED, 4 FAILED (cuda-oom 2, "
                            "failed 1, nccl-error 1), 1 TIMEOUT (failed 1)")
    wait(d).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")) == 12)
    d.save_screenshot(str(shots / "array.png"))
    summary.find_element(By.LINK_TEXT, "cuda-oom 2").click()
    wait(d).until(lambda d: "insight=cuda-oom" in d.current_url)
    wait(d).until(lambda d: sorted(r.get_attribute("data-run") for r in d.find_elements(
        By.CSS_SELECTOR, "#runs-table tbody tr")) == ["508", "509"])
    d.find_element(By.ID, "array-summary").find_element(By.LINK_TEXT, "7 COMPLETED").click()
    wait(d).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")) == 7)
    # a task's own page: the array at a glance, linked the same way
    d.get(s.base + "/job/508")
    panel = wait(d).until(lambda d: d.find_element(By.ID, "array-panel")
                          if d.find_element(By.ID, "array-panel").is_displayed() else None)
    assert panel.text == ("Task 8 of array job 500: 12 tasks: 7 COMPLETED, 4 FAILED (cuda-oom "
                          "2, failed 1, nccl-error 1), 1 TIMEOUT (failed 1)")
    panel.find_element(By.LINK_TEXT, "nccl-error 1").click()
    wait(d).until(lambda d: [r.get_attribute("data-run") for r in d.find_elements(
        By.CSS_SELECTOR, "#runs-table tbody tr")] == ["510"])
    assert console_errors(d) == []
