"""The HTML report of stowage inspect: small, self-contained (no scripts, nothing fetched), and
drawn in headless Chromium within 3 seconds without console errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SHARED_TRACES, stowage

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
TRACES = sorted(SHARED_TRACES.glob("gpu_*.pickle")) or sorted((REPO / "bench" / "traces").glob("*.pickle.gz"))


HOSTILE_NAMES = ("\x1b]0;pwned\x07", "\ud800lone", "nul\x00", "\u202eevil")
RECORD = """
import pickle, sys, torch, stowage
stowage.enable(device="cpu", capacity="1GiB")
torch.manual_seed(0)
model = torch.nn.Sequential()
for name in {names!r}:
    model.add_module(name, torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()))
stowage.record_history(True)
model(torch.randn(64, 64)).square().mean().backward()
stowage.mark_step()
open(sys.argv[1], "wb").write(pickle.dumps(stowage.snapshot(), protocol=4))
"""


def drawn(page: Path) -> tuple[str, str, list[dict[str, str]]]:
    """`page` opened in headless Chromium: its title, its text and its console's errors."""
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        driver.get(page.as_uri())
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        return driver.title, driver.find_element(By.TAG_NAME, "body").text, errors
    finally:
        driver.quit()


def make_report(trace: Path, folder: Path) -> Path:
    out = folder / f"{trace.name}.html"
    result = stowage("inspect", str(trace), "--html", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_the_report_is_small_and_self_contained(trace: Path, tmp_path: Path) -> None:
    out = make_report(trace, tmp_path)
    assert out.stat().st_size <= 5 << 20
    text = out.read_text(encoding="utf-8")
    assert "<script" not in text and "http://" not in text and "https://" not in text
    assert text.count('class="area"') >= 2  # a stacked series per site, and "other"


@pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (tools/bootstrap installs them)")
def test_the_report_draws_in_headless_chromium(tmp_path: Path) -> None:
    out = make_report(TRACES[0], tmp_path)
    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,2000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        start = time.perf_counter()
        driver.get(out.as_uri())
        assert driver.execute_script("return document.readyState") == "complete"
        seconds = time.perf_counter() - start
        assert seconds <= 3, f"the report took {seconds:.2f} s to load"
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
        areas = driver.find_elements(By.CSS_SELECTOR, "svg path.area")
        assert len(areas) >= 2
        assert all(area.get_attribute("d").count(",") > 10 for area in areas)
        if "segments" in driver.find_element(By.TAG_NAME, "body").text and "lists no segments" not in driver.page_source:
            assert len(driver.find_elements(By.CSS_SELECTOR, "svg rect")) > 0
        screenshot = tmp_path / "report.png"
        driver.save_screenshot(str(screenshot))
        assert screenshot.stat().st_size > 10_000
    finally:
        driver.quit()


@pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (tools/bootstrap installs them)")
def test_module_paths_and_a_file_name_from_a_recording_are_shown_as_their_escapes(tmp_path: Path) -> None:
    """A snapshot stowage recorded of modules named with ESC, BEL, a lone surrogate, NUL and a bidi
    override, saved under a name holding ESC: the report (whose write died on the surrogate)
    shows every one escaped, in its title too, and draws without errors."""
    snapshot = tmp_path / "esc\x1b[31m.pickle"
    recorded = subprocess.run([sys.executable, "-c", RECORD.format(names=HOSTILE_NAMES), str(snapshot)],
                              capture_output=True, text=True, timeout=120)
    assert recorded.returncode == 0, recorded.stderr
    out = tmp_path / "report.html"
    done = stowage("inspect", str(snapshot), "--html", str(out))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    data = out.read_bytes()
    assert not [raw for raw in (b"\x1b", b"\x07", b"\x00", b"\xed\xa0\x80", "\u202e".encode()) if raw in data]
    title, text, errors = drawn(out)
    assert title == "stowage inspect: esc\\x1b[31m.pickle"
    for shown in ("\\x1b]0;pwned\\x07", "\\ud800lone", "\\u202eevil"):
        assert shown in text, shown
    assert errors == []
