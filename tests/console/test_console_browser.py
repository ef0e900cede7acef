"""The console page in a real browser (headless Chromium through its WebDriver,
installed by scripts/install_browser.sh) against a real training server with a
real client: the page loads, the charts get points, the client appears with its
weights version, a bad request appears in the error log with its code, pause
stops updates and resume restarts them, and a control without the token is
refused. Screenshots are saved in the test's temporary directory."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from ..integration.server_process import RawClient, ServerProcess
from .test_console_feed import console_address, play


@pytest.fixture()
def browser():
    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ticks(driver) -> int:
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-ticks") or 0)


def chart_points(driver, chart: str) -> int:
    """Points the page's uPlot chart holds (its x array's length), -1 before it exists."""
    return driver.execute_script(
        "const c = window.tetherCharts[arguments[0]]; return c ? c.plot.data[0].length : -1;", chart)


def chart_follows(driver, chart: str) -> bool:
    """Whether the chart's x scale reaches its newest point (it follows the run)."""
    return driver.execute_script(
        "const p = window.tetherCharts[arguments[0]].plot; const x = p.data[0];"
        "return p.scales.x.max >= x[x.length - 1];", chart)


def test_the_console_in_a_browser(tmp_path: Path, browser) -> None:
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--console-port", "0", "--seed", "0",
                           "--env-steps-per-sample", "200", "--train-batch-size", "1000", "--checkpoint-every", "0").start()
    stop = threading.Event()
    player = threading.Thread(target=play, args=(server.port, stop), daemon=True)
    player.start()
    try:
        port, token = console_address(server)
        browser.get(f"http://127.0.0.1:{port}/?token={token}")
        assert browser.title == "Tether console"
        wait_for(lambda: ticks(browser) >= 2, what="ticks")
        browser.save_screenshot(str(tmp_path / "console-start.png"))
        # The charts receive points: the returns chart's data grows, and it shows the newest.
        first = wait_for(lambda: max(chart_points(browser, "returns"), 0), what="the returns chart")
        wait_for(lambda: chart_points(browser, "returns") >= first + 3, what="points added to the returns chart")
        assert chart_follows(browser, "returns") and chart_follows(browser, "throughput")
        count = lambda: browser.execute_script(  # noqa: E731
            "return document.querySelectorAll('#chart-returns .u-legend tr').length")
        assert count() >= 2  # x plus at least one return series
        # The client appears with the weights version it acts with.
        row = wait_for(lambda: next((r for r in browser.find_elements(By.CSS_SELECTOR, "#clients tbody tr")
                                     if "console-test-cartpole" in r.text and " v" in r.text), None),
                       what="the client's row")
        assert "default_policy v" in row.text and "connected" in row.text
        # A bad request shows in the error log with its code.
        bad = RawClient(server.port)
        bad.request({"type": "PING", "protocol_version": "1.3", "client_name": "bad-one"})
        answer = bad.request({"type": "EPISODES", "episodes": "not a list"})
        wait_for(lambda: any(answer["code"] in r.text and "bad-one" in r.text
                             for r in browser.find_elements(By.CSS_SELECTOR, "#errors tbody tr")), what="the error row")
        bad.sock.close()
        # A finished episode, clicked, shows its steps.
        episode = wait_for(lambda: next(iter(browser.find_elements(By.CSS_SELECTOR, "#episodes .episode")), None),
                           what="a finished episode")
        episode.click()
        rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#episode-detail table.steps tr"), what="its steps")
        assert len(rows) >= 2 and rows[1].find_elements(By.TAG_NAME, "td")[3].text == "1"  # CartPole: reward 1 a step
        # Pause stops updates, resume restarts them.
        wait_for(lambda: "v1" in browser.find_element(By.ID, "summary").text or "v2" in browser.find_element(By.ID, "summary").text,
                 timeout=60, what="a first update")
        browser.find_element(By.ID, "pause").click()
        wait_for(lambda: browser.find_element(By.ID, "status").text == "paused", what="paused")
        version = lambda: int(browser.find_element(By.ID, "summary").text.split(" v")[-1])  # noqa: E731
        time.sleep(1.5)  # an update already running may finish
        paused_at = version()
        time.sleep(4)
        assert version() == paused_at, "an update ran while paused"
        browser.save_screenshot(str(tmp_path / "console-paused.png"))
        browser.find_element(By.ID, "resume").click()
        wait_for(lambda: browser.find_element(By.ID, "status").text == "live" and version() > paused_at, timeout=60,
                 what="updates after resume")
        browser.save_screenshot(str(tmp_path / "console-live.png"))
        # The same page without the token: viewing works, a control is refused.
        browser.get(f"http://127.0.0.1:{port}/")
        wait_for(lambda: ticks(browser) >= 1, what="ticks without the token")
        browser.find_element(By.ID, "pause").click()
        wait_for(lambda: "refused" in browser.find_element(By.ID, "control-result").text, what="the refusal")
        assert browser.find_element(By.ID, "status").text == "live"
        assert all((tmp_path / f"console-{n}.png").stat().st_size > 10_000 for n in ("start", "paused", "live"))
    finally:
        stop.set()
        player.join(timeout=30)
        server.kill()
