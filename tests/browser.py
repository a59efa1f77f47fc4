"""Open a report page in headless Chromium (Debian's package; Playwright drives it, its own browser download
is not used) and read back what it drew, every console error and every request it made."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    charts: dict[str, Any]  # window.reportCharts: per chart id, its series names and plotted arrays
    console_errors: list[str]
    requests: list[str]
    watermarks: int  # visible SIMULATED marks inside chart areas
    text: str  # the page's visible text


def render(page_file: Path, screenshot: Path | None = None) -> Rendered:
    """Load ``page_file`` from disk, wait for its charts, and report what the browser saw."""
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium: scripts/test.sh installs Debian's chromium package")
        pytest.skip("no chromium on this machine (scripts/test.sh installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1320, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_file.resolve().as_uri())
            drawn = "window.reportCharts && Object.keys(window.reportCharts).length >= 6"
            page.wait_for_function(drawn, timeout=30_000)
            charts = page.evaluate("window.reportCharts")
            marks = page.locator(".chart .watermark:visible").count()
            text = page.inner_text("body")
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return Rendered(charts, errors, requests, marks, text)


def points(chart: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per series name, its plotted (x, y) points (the aligned arrays' non-null entries)."""
    xs = chart["data"][0]
    return {
        name: [(x, y) for x, y in zip(xs, chart["data"][i + 1], strict=True) if y is not None]
        for i, name in enumerate(chart["series"])
    }
