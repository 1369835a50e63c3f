"""The job page of a job of several ranks in a real browser (Debian's headless Chromium, driven
by selenium): the batch script's and the tasks' lines merged, each task's labelled with its
rank in the rank's colour, the line every rank printed once with its note, the srun step as
a section that folds, and the rank and node filters (the tasks chosen: no step section). No
JavaScript error may reach the console."""

from __future__ import annotations

import os
import pwd

import pytest
from helpers import env_for
from pages import Serve, chromium, have_chromium
from test_rankview import write_job

pytestmark = pytest.mark.skipif(not have_chromium(), reason="needs Debian's chromium and "
                                "chromium-driver (.ci/run installs them)")

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROWS = ("return [...document.querySelectorAll('#log .row')].map(r => {"
        "const l = r.querySelector('.r'), f = r.querySelector('.fold');"
        "return [l ? l.textContent : null, l ? getComputedStyle(l).color : null,"
        " r.querySelector('.t').textContent, f ? f.textContent : null]})")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-ranks")
    write_job(tmp / "spool", pwd.getpwuid(os.getuid()).pw_name, "70")
    with Serve(env_for(tmp)) as s:
        yield s


def test_the_page_of_a_job_tells_ranks_apart_folds_and_filters(site, tmp_path):
    d = chromium(tmp_path / "profile")
    try:
        d.get(site.url)
        d.get(site.base + "/job/70")
        WebDriverWait(d, 20, poll_frequency=0.1).until(
            lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        rows = d.execute_script(ROWS)
        texts = [(label, text, fold) for label, _, text, fold in rows]
        me = pwd.getpwuid(os.getuid()).pw_name
        assert texts[0] == ("", "start of " + me, None)  # the batch script's: no rank
        assert ("0:", "identical line from every rank",
                "[logcapture: same line from 3 ranks (0-2)]") in texts
        assert ("3:", "rank 3 is different", None) in texts
        assert sum(1 for t in texts if t[1] == "identical line from every rank") == 1
        colours = {label: colour for label, colour, _, _ in rows if label}
        assert len(set(colours.values())) == 4, colours  # one colour per rank
        # The srun step is a section around its tasks' lines, with its duration; it folds
        # and unfolds as a CI marker's section does.
        title = "srun step 0 (4 tasks: train.py)"
        assert texts[1] == ("", f"▾ {title}  (6.5 s)", None)
        assert texts[-2:] == [("", f"[logcapture: end of section {title}, 6.5 s]", None),
                              ("", "end of job", None)]
        d.save_screenshot(str(tmp_path / "ranks-all.png"))
        d.find_element(By.CSS_SELECTOR, "#log .row.section").click()
        WebDriverWait(d, 20, poll_frequency=0.1).until(
            lambda d: len(d.execute_script(ROWS)) == 3)
        assert [r[2] for r in d.execute_script(ROWS)] == [
            "start of " + me, f"▸ {title}  (6.5 s)", "end of job"]
        d.save_screenshot(str(tmp_path / "ranks-step-folded.png"))
        d.find_element(By.CSS_SELECTOR, "#log .row.section").click()
        WebDriverWait(d, 20, poll_frequency=0.1).until(
            lambda d: len(d.execute_script(ROWS)) == len(rows))

        Select(d.find_element(By.ID, "rank-filter")).select_by_value("1")
        WebDriverWait(d, 20, poll_frequency=0.1).until(
            lambda d: {r[0] for r in d.execute_script(ROWS)} == {"1:"})
        assert [r[2] for r in d.execute_script(ROWS)] == [
            "rank 1 step 0", "identical line from every rank", "done"]
        Select(d.find_element(By.ID, "rank-filter")).select_by_value("")
        Select(d.find_element(By.ID, "node-filter")).select_by_value("n2")
        WebDriverWait(d, 20, poll_frequency=0.1).until(
            lambda d: {r[0] for r in d.execute_script(ROWS)} == {"2:", "3:"})
        assert all(r[3] is None for r in d.execute_script(ROWS))  # two ranks, nothing common
        d.save_screenshot(str(tmp_path / "ranks-n2.png"))
        assert [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        d.quit()



NUMBERED_ROWS = ("return [...document.querySelectorAll('#log .row')].map(r => {"
                 "const l = r.querySelector('.r');"
                 "return [r.querySelector('.ln').textContent, l ? l.textContent : '',"
                 " r.querySelector('.t').textContent, r.classList.contains('hl')]})")


def test_a_jobs_line_numbers_and_links_are_those_of_logs_n(tmp_path_factory, tmp_path):
    """Job 73's page numbers each line as `logcapture logs 73 -n` does (the job's merged log:
    the batch script's and every rank's lines, a folded line once, both streams); #L8 opens
    the page at that line, marked, and a link pasted into the page moves the mark; the page's
    API answers the lines around a linked line with those numbers."""
    from helpers import lc
    from test_rankview import write_job_with_stderr

    tmp = tmp_path_factory.mktemp("numbered-job")
    write_job_with_stderr(tmp / "spool", "73")
    env = env_for(tmp)
    printed = lc(["logs", "73", "-n"], env, check=True).stdout.decode().splitlines()
    want = {}
    for line in printed:
        number, _, text = line.partition("\t")
        if number.strip():
            want[number.strip()] = text
    assert sorted(map(int, want)) == list(range(1, 13))
    d = chromium(tmp_path / "profile")
    try:
        with Serve(env) as s:
            d.get(s.url)
            d.get(s.base + "/job/73#L8")
            wait = WebDriverWait(d, 20, poll_frequency=0.1)
            wait.until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
            wait.until(lambda d: any(r[3] for r in d.execute_script(NUMBERED_ROWS)))
            rows = d.execute_script(NUMBERED_ROWS)
            shown = {n: (f"{label} " if label else "") + text for n, label, text, _ in rows if n}
            assert shown == want
            assert [(n, text) for n, _, text, hl in rows if hl] == [
                ("8", "identical line from every rank")]
            assert want["8"] == "0: identical line from every rank"
            d.save_screenshot(str(tmp_path / "job-L8.png"))
            d.execute_script("location.hash = '#L2'")
            wait.until(lambda d: [(n, t) for n, _, t, hl in d.execute_script(NUMBERED_ROWS)
                                  if hl] == [("2", "warning from 73")])
            answer = d.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch('/api/runs/73/joblog?limit=3&line=7').then(r => r.json()).then(done)")
            assert [(e["line"], e["text"]) for e in answer["entries"]] == [
                (6, "rank 3 step 0"), (7, "warning from 73.0.1"),
                (8, "identical line from every rank")]
            assert answer["more"] and answer["newer"]
            assert [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"] == []
    finally:
        d.quit()
