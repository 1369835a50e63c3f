"""A coloured run on the job page of `logcapture serve`, in a real browser (Debian's headless
Chromium, as tests/test_browser.py): a red ERROR is drawn red (the computed style, in the
light scheme a headless browser uses), 256 and true colours inline, bold as bold, a word after
an emoji keeps its own colour (code points in the record, UTF-16 in the page), plain lines
have no spans, and no JavaScript error reaches the console.

Screenshots go to $LOGCAPTURE_SCREENSHOTS (default: this test's tmp folder)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import env_for
from pages import Serve, capture, chromium, have_chromium

pytestmark = pytest.mark.skipif(not have_chromium(), reason="needs Debian's chromium and "
                                "chromium-driver (.ci/run installs them)")

from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

COLOURED = r"""
import sys
print("\x1b[1;31mERROR\x1b[0m: loss is nan at step 120")
print("plain line")
print("\x1b[38;5;208mwarm\x1b[0m and \x1b[38;2;10;200;30mtrue green\x1b[0m")
print("\U0001F600 \x1b[32mok\x1b[0m \x1b[4;33munder\x1b[0m")
print("\x1b[7minverse\x1b[0m", file=sys.stderr)
"""


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("LOGCAPTURE_SCREENSHOTS") or tmp_path_factory.mktemp("screens"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def test_a_red_error_is_red_on_the_page(tmp_path: Path, shots: Path) -> None:
    env = env_for(tmp_path)
    capture(env, "colours", COLOURED)
    d = chromium(tmp_path / "profile")
    try:
        with Serve(env) as s:
            d.get(s.url)  # the token, as a person opens the URL serve printed
            d.get(s.base + "/job/colours")
            WebDriverWait(d, 20, poll_frequency=0.1).until(
                lambda d: d.execute_script("return document.body.dataset.ready") == "1")
            spans = d.execute_script("""
                return [...document.querySelectorAll('#log .row .t')].map(t => [t.textContent,
                  [...t.querySelectorAll('span')].map(s => {
                    const c = getComputedStyle(s);
                    return [s.textContent, c.color, c.backgroundColor, c.fontWeight,
                            c.textDecorationLine];
                  })]);""")
            d.save_screenshot(str(shots / "job-colours.png"))
            errors = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        d.quit()
    by_text = {text: styled for text, styled in spans}
    error = by_text["ERROR: loss is nan at step 120"]
    assert [x[0] for x in error] == ["ERROR"]
    assert error[0][1] == "rgb(198, 40, 40)" and int(error[0][3]) >= 700  # red (app.css), bold
    assert by_text["plain line"] == []
    warm = by_text["warm and true green"]
    assert [(x[0], x[1]) for x in warm] == [("warm", "rgb(255, 135, 0)"),  # 256-colour 208
                                            ("true green", "rgb(10, 200, 30)")]
    emoji = by_text["\U0001F600 ok under"]
    assert [x[0] for x in emoji] == ["ok", "under"]  # after a character beyond the BMP
    assert emoji[0][1] == "rgb(46, 125, 50)" and emoji[1][4] == "underline"
    inverse = by_text["inverse"][0]
    assert inverse[0] == "inverse" and inverse[2] != "rgba(0, 0, 0, 0)"  # a background now
    assert not errors, errors
