"""/dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver, which
scripts/setup installs) driven by Selenium against `flare run --engine sim` under 64 concurrent
streams.

Rules: the page loads its charts without script errors; under load the decision table keeps
filling and a row expands to the alternatives and prices; once the server is idle, the table holds
one row per decision and its graphs add up exactly to /metrics' graph counters.

This test never skips silently: without a browser it fails, unless HELIOS_SKIP_BROWSER_TESTS=1 says
on purpose that this machine has none.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter

import httpx
import pytest

from .support import FlareServer, graph_counts, metrics, wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
STREAMS = 64


def _browser():
    if not (CHROMIUM and DRIVER):
        if os.environ.get("HELIOS_SKIP_BROWSER_TESTS") == "1":
            pytest.skip("HELIOS_SKIP_BROWSER_TESTS=1: no browser on this machine")
        pytest.fail("the dashboard test needs Debian's chromium and chromium-driver (bash scripts/setup "
                    "installs them; HELIOS_SKIP_BROWSER_TESTS=1 skips on purpose)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1100"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture(scope="module")
def server():
    s = FlareServer("--engine", "sim", "--slots", str(STREAMS), "--max-context", "512",
                    "--client-share", "1")  # one process plays every client
    assert s.ready_line, s.error_text()
    yield s
    assert s.stop() == 0


def _load(url: str, done: list) -> None:
    def one(i: int) -> None:
        body = {"model": "helios-sim", "prompt": "z" * (16 + 7 * i), "max_tokens": 12 + i % 9, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                pass
            done.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)


def _rows(driver) -> list[tuple[int, str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#decisions tr.decision')].map(r => [+r.dataset.seq, r.dataset.graph])")


def test_the_dashboard_fills_with_the_decisions_that_ran(server, tmp_path):
    driver = _browser()
    try:
        driver.get(server.url + "/dashboard")
        wait_for(lambda: "live" in driver.find_element("id", "status").text, 30, "the page's first poll")
        done: list[int] = []
        load = threading.Thread(target=_load, args=(server.url, done), daemon=True)
        load.start()
        # Under load: the table fills and keeps filling, and a row opens onto its alternatives and prices.
        first = wait_for(lambda: len(_rows(driver)) >= 5 and len(_rows(driver)), 60, "decision rows under load")
        wait_for(lambda: len(_rows(driver)) > first or not load.is_alive(), 60, "more rows while streams run")
        busy = lambda: int(driver.find_element("id", "tile-slots").text.split(" / ")[0] or 0)  # noqa: E731
        wait_for(lambda: busy() >= STREAMS // 4 or not load.is_alive(), 60, "a quarter of the streams running")
        row = driver.find_element("css selector", "#decisions tr.decision")
        row.click()
        detail = driver.find_element("css selector", "#decisions tr.detail")
        assert "value rate" in detail.text and "cohort (" in detail.text
        driver.save_screenshot(str(os.environ.get("HELIOS_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png"))
        load.join(200)
        assert done == [200] * STREAMS
        # Idle: every decision has a row, and the rows' graphs are /metrics' graph counters.
        recorded = httpx.get(server.url + "/debug/decisions?limit=1", timeout=10).json()["recorded"]
        wait_for(lambda: len(_rows(driver)) == recorded, 30, "the table to show every decision")
        rows = _rows(driver)
        assert sorted(seq for seq, _ in rows) == list(range(1, recorded + 1))
        counters = {k: int(v) for k, v in graph_counts(metrics(server.url)).items() if v}
        assert Counter(graph for _, graph in rows) == counters
        assert int(driver.find_element("id", "tile-decisions").text) == recorded
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
