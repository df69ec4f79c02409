"""Renders `stowage inspect --html` for a snapshot in headless Chromium and saves a screenshot.

    bench/inspect/screenshot_report.py SNAPSHOT OUT.png [--width 1200] [--height 2400]

Prints the page's load time and the number of drawn SVG elements. Needs Debian's chromium and
chromium-driver and selenium (tools/bootstrap installs them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def browser(width: int, height: int) -> webdriver.Chrome:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.html"
        subprocess.run([sys.executable, "-m", "stowage", "inspect", args.snapshot, "--html", str(report)],
                       check=True, stdout=subprocess.DEVNULL)
        driver = browser(args.width, args.height)
        try:
            start = time.perf_counter()
            driver.get(report.as_uri())
            seconds = time.perf_counter() - start
            drawn = len(driver.find_elements(By.CSS_SELECTOR, "svg path, svg rect"))
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
    print(f"{args.snapshot}: {report.name} loaded in {seconds:.2f} s, {drawn} SVG elements drawn; saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
