"""Open a report page in headless Chromium (Debian's package; Playwright drives it, its own browser download
is not used) and read back what it drew, every console error and every request it made."""

from __future__ import annotations

import json
import os
import shutil
import statistics
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


def expected_speedups(trials: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per configuration, (level, median speedup over every no-speculation run's median): the throughput
    objective recomputed from the trials as the API returns them."""
    base: dict[float, list[float]] = {}
    runs: dict[str, dict[float, list[float]]] = {}
    for t in trials:
        if t["status"] != "succeeded":
            continue
        for lv in t["result"]["levels"]:
            if t["speculative_config"] is None:
                base.setdefault(lv["level"]["value"], []).append(lv["output_throughput"])
    for t in trials:
        if t["status"] != "succeeded" or t["speculative_config"] is None:
            continue
        key = json.dumps(t["speculative_config"], sort_keys=True)
        for lv in t["result"]["levels"]:
            b = statistics.median(base[lv["level"]["value"]])
            runs.setdefault(key, {}).setdefault(lv["level"]["value"], []).append(lv["output_throughput"] / b)
    return {k: sorted((x, statistics.median(v)) for x, v in per.items()) for k, per in runs.items()}


def assert_charts_plot(charts: dict[str, Any], trials: list[dict[str, Any]]) -> None:
    """The report's charts plot exactly the job's trials as GET /tune/{id}/trials returns them (throughput
    objective): every trial's level on the latency charts, each configuration's speedups and acceptance."""
    # throughput against p99 TPOT: one point per trial and level, exactly the trials' figures
    plotted = sorted(p for pts in points(charts["chart-pareto-tpot"]).values() for p in pts)
    measured = sorted(
        (lv["tpot_ms"]["p99"], lv["output_throughput"]) for t in trials if t["result"] for lv in t["result"]["levels"]
    )
    assert [v for p in plotted for v in p] == pytest.approx([v for p in measured for v in p])
    # speedup by concurrency: each measured configuration's points are the trials' ratios to the baseline
    drawn = points(charts["chart-speedup"])
    measured_series = sorted(sorted(v) for k, v in drawn.items() if not k.startswith("predicted: "))
    expected = sorted(expected_speedups(trials).values())
    assert len(measured_series) == len(expected)
    for got, want in zip(measured_series, expected, strict=True):
        assert [v for p in got for v in p] == pytest.approx([v for p in want for v in p])
    # cumulative acceptance per position: accepted at i / drafts over each configuration's runs and levels
    sums: dict[str, tuple[list[int], int]] = {}
    for t in trials:
        if not (t["result"] and t["speculative_config"] and t["status"] == "succeeded"):
            continue
        for lv in t["result"]["levels"]:
            sd = lv["spec_decode"]
            if sd and sd["num_drafts"]:
                key = json.dumps(t["speculative_config"], sort_keys=True)
                acc, drafts = sums.get(key, ([], 0))
                acc.extend([0] * (len(sd["accepted_per_position"]) - len(acc)))
                for i, n in enumerate(sd["accepted_per_position"]):
                    acc[i] += n
                sums[key] = (acc, drafts + sd["num_drafts"])
    want_acc = sorted([n / drafts for n in acc] for acc, drafts in sums.values())
    got_acc = sorted([y for _, y in pts] for pts in points(charts["chart-accept-cum"]).values())
    assert len(got_acc) == len(want_acc)
    for got, want in zip(got_acc, want_acc, strict=True):
        assert got == pytest.approx(want)
