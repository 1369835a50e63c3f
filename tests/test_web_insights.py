"""The job page's insights panel: what `logcapture show` lists first, from the spool and from
the store (runs captured with the real `logcapture run`, one shipped with `upload`), in the
JSON the page draws and, where Debian's chromium is installed, on the page itself."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from helpers import env_for, lc
from pages import Serve, capture, chromium, have_chromium

CRASH = ("print('epoch 1', flush=True)\n"
         "def step(batch):\n"
         "    raise RuntimeError('CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; "
         "15.90 GiB total capacity; 14.71 GiB already allocated; 19.75 MiB free; 14.86 GiB "
         "reserved in total by PyTorch)')\n"
         "step(1)\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web-insights")
    env = env_for(tmp)
    for run in ("crash", "crash-shipped"):
        lc(["run", "--run-id", run, "--", "python3", "-c", CRASH], env)
    lc(["upload", "crash-shipped"], env, check=True)
    capture(env, "fine", "print('all good')\n")
    with Serve(env) as s:
        yield s


def get(s: Serve, path: str) -> Any:
    r = httpx.get(s.base + path, params={"token": s.token}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("run", ["crash", "crash-shipped"])  # the spool's and the store's
def test_the_page_gets_the_insights_show_lists(site, run):
    got = get(site, f"/api/runs/{run}/insights")
    assert [i["kind"] for i in got["insights"]] == ["cuda-oom"]  # the exception is the OOM
    oom = got["insights"][0]
    assert oom["message"].startswith("CUDA out of memory on GPU 0: tried to allocate 20.00 MiB")
    assert oom["message"].endswith(" in step") and oom["details"]["function"] == "step"
    assert oom["evidence"][-1]["text"].startswith("RuntimeError: CUDA out of memory")


def test_a_run_that_ended_well_has_none(site):
    assert get(site, "/api/runs/fine/insights")["insights"] == []


@pytest.mark.skipif(not have_chromium(), reason="needs Debian's chromium and chromedriver")
def test_the_insights_panel_on_the_job_page(site, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    d = chromium(tmp_path / "profile")
    try:
        d.get(site.url)
        d.get(site.base + "/job/crash")
        WebDriverWait(d, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#insights .insight"))
        blocks = d.find_elements(By.CSS_SELECTOR, "#insights .insight")
        assert [b.get_attribute("data-kind") for b in blocks] == ["cuda-oom"]
        assert "tried to allocate 20.00 MiB" in blocks[0].text
        assert "Try: reduce the batch size" in blocks[0].text
        d.get(site.base + "/job/fine")
        WebDriverWait(d, 30).until(
            lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        assert not d.find_element(By.ID, "insights").is_displayed()
    finally:
        d.quit()
