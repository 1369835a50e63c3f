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

