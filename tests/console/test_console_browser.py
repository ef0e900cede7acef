"""The console page in a real browser (headless Chromium through its WebDriver,
installed by scripts/install_browser.sh) against a real training server with a
real client: the page loads, the charts get points, their series have readable
names, each y axis one unit, the returns a mean line in a min-max band, the
legends numbers (the latest off the chart, the one under the cursor on it), a
drag zooms; the client appears with its weights version, a bad request appears
in the error log with its code, pause stops updates and resume restarts them,
and a control without the token is refused. Screenshots are saved in the test's
temporary directory."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

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
        try:
            value = predicate()
        except StaleElementReferenceException:  # the page redrew what the predicate was reading: look again
            value = None
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


#: A series label that shows a raw metric key: its prefix, or a metric's underscores (after a module's name).
RAW_KEY = re.compile(r"\b(module|agent_type|health|charts|episode|self_play|losses)/|_[^:]*$")
#: The server's health series and their units: each must be on an axis of its unit alone, named in its label.
HEALTH_UNITS = {"health/loop_lag_ms": "ms", "health/pool_steps": "steps", "charts/samples_refused_stale": "steps",
                "charts/samples_dropped_stale": "steps", "health/rss_mb": "MB"}


def chart_report(driver) -> dict:
    """Per chart: its series' keys, labels and scales, its y axes (scale, label), its bands, and the
    rows its legend shows (label, value)."""
    return driver.execute_script("""
        const out = {};
        for (const [id, c] of Object.entries(window.tetherCharts)) {
          const p = c.plot;
          const rows = Array.from(p.root.querySelectorAll('.u-legend tr.u-series'))
            .filter(r => getComputedStyle(r).display !== 'none')
            .map(r => [r.querySelector('.u-label').textContent, r.querySelector('.u-value').textContent]);
          out[id] = {keys: c.keys, labels: p.series.slice(1).map(s => s.label), scales: p.series.slice(1).map(s => s.scale),
                     axes: p.axes.slice(1).map(a => [a.scale, a.label ?? null]), bands: p.bands.map(b => b.series),
                     legend: rows};
        }
        return out;""")


def number(text: str) -> bool:
    try:
        return math.isfinite(float(text.split()[0]))
    except (ValueError, IndexError):
        return False


def check_the_charts_read_at_a_glance(report: dict) -> None:
    for chart in report.values():
        for label in chart["labels"] + [label for label, _ in chart["legend"]]:
            assert label and not RAW_KEY.search(label), f"a raw key as a label: {label!r}"
        assert all(label for _, label in chart["axes"]), f"a y axis without its unit: {chart['axes']}"
    # One unit per axis: the health chart once had ms, steps and MB on one.
    charted = set()
    for chart in report.values():
        units: dict[str, set] = {}
        for key, scale in zip(chart["keys"], chart["scales"]):
            if key in HEALTH_UNITS:
                units.setdefault(scale, set()).add(HEALTH_UNITS[key])
                charted.add(key)
        labels = dict(chart["axes"])
        for scale, unit in units.items():
            assert len(unit) == 1 and next(iter(unit)) in labels[scale].split(), (scale, unit, labels)
    assert charted == set(HEALTH_UNITS)
    # Returns: a mean line in a band from min to max (the edges not in the legend), not three lines.
    returns = report["returns"]
    keys = returns["keys"]
    assert len(returns["bands"]) >= 1 and len(returns["bands"]) == sum(k.endswith("/return_mean") for k in keys)
    for top, bottom in returns["bands"]:
        assert keys[top - 1].endswith("/return_max") and keys[bottom - 1] == keys[top - 1][:-3] + "min"
    shown = [label for label, _ in returns["legend"][1:]]
    assert shown and all(label.endswith("mean return") for label in shown), shown
    assert "default_policy: mean return" in shown and report["returns_type"]["bands"]


def test_the_console_in_a_browser(tmp_path: Path, browser) -> None:
    curriculum = {"parameters": {"gravity": 9.8, "pole_length": {"sampler": "uniform", "low": 0.4, "high": 0.6}},
                  "bounds": {"gravity": [1, 20]}}
    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--console-port", "0", "--seed", "0",
                           "--env-steps-per-sample", "200", "--train-batch-size", "1000", "--checkpoint-every", "0",
                           "--curriculum", json.dumps(curriculum)).start()
    stop = threading.Event()
    seen: dict = {}
    player = threading.Thread(target=play, args=(server.port, stop, seen), daemon=True)
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
        # Readable at a glance: names, not keys; one unit per axis; bands; legends with numbers (the
        # latest: the cursor is not on a chart), not "--".
        glance = ("returns", "returns_type", "throughput", "health_lag", "health_steps", "health_memory")
        report = wait_for(lambda: (lambda r: r if all(c in r and all(number(v) for _, v in r[c]["legend"])
                                                      for c in glance) else None)(chart_report(browser)),
                          what="numbers in the legends")
        check_the_charts_read_at_a_glance(report)
        # The client appears with the weights version it acts with.
        # (Texts, not elements, leave the predicates: the tables are redrawn on every message.)
        row = wait_for(lambda: next((t for t in (r.text for r in browser.find_elements(By.CSS_SELECTOR, "#clients tbody tr"))
                                     if "console-test-cartpole" in t and " v" in t), None),
                       what="the client's row")
        assert "default_policy v" in row and "connected" in row
        # A bad request shows in the error log with its code.
        bad = RawClient(server.port)
        bad.request({"type": "PING", "protocol_version": "1.3", "client_name": "bad-one"})
        answer = bad.request({"type": "EPISODES", "episodes": "not a list"})
        wait_for(lambda: any(answer["code"] in r.text and "bad-one" in r.text
                             for r in browser.find_elements(By.CSS_SELECTOR, "#errors tbody tr")), what="the error row")
        for _ in range(5):  # (more log entries than parameter sets: the log numbers its own entries)
            bad.request({"type": "EPISODES", "episodes": "not a list"})
        bad.sock.close()
        # The curriculum panel shows the parameters; with the token a person changes one, a bad value
        # is refused naming why, and the change reaches the client with its next batch's answer.
        # Read in one script: the panel is redrawn on every tick, so elements found one call earlier go stale.
        params = lambda: browser.execute_script(  # noqa: E731
            "const rows = document.querySelectorAll('#curriculum-params tbody tr');"
            "return Object.fromEntries([...rows].map(r => [r.dataset.param, r.querySelectorAll('td')[1].innerText]));")
        assert wait_for(lambda: params() or None, what="the parameters") == {
            "gravity": "9.8", "pole_length": "uniform 0.4 to 0.6"}
        state = browser.find_element(By.ID, "curriculum-state").text
        first_set = int(re.search(r"parameter set (\d+)", state).group(1))  # (a run starts at a random seq)
        assert state.startswith("no lessons;") and "measure (return)" in state, state
        Select(browser.find_element(By.ID, "param-name")).select_by_value("gravity")
        for bad_value, why in (("heavy", "must be a number"), ("25", "outside its bounds")):
            browser.find_element(By.ID, "param-value").clear()
            browser.find_element(By.ID, "param-value").send_keys(bad_value)
            browser.find_element(By.ID, "set-param").click()
            wait_for(lambda: why in browser.find_element(By.ID, "control-result").text, what=f"the refusal of {bad_value}")
        browser.find_element(By.ID, "param-value").clear()
        browser.find_element(By.ID, "param-value").send_keys("12.5")
        browser.find_element(By.ID, "set-param").click()
        wait_for(lambda: "set_param: done" in browser.find_element(By.ID, "control-result").text, what="the change")
        wait_for(lambda: params().get("gravity") == "12.5", what="the new value on the page")
        held = wait_for(lambda: (lambda p: p if p is not None and p.values["gravity"] == 12.5 else None)(
            seen.get("env_params")), timeout=30, what="the new value at the client")
        assert held.seq == first_set + 1 and held.values["pole_length"] == {"sampler": "uniform", "low": 0.4, "high": 0.6}
        # An empty lesson box is no lesson (not lesson 0); this run has none to go to.
        browser.find_element(By.ID, "set-lesson").click()
        wait_for(lambda: "no lessons" in browser.find_element(By.ID, "control-result").text, what="the lesson refusal")
        wait_for(lambda: any("set_param" in r.text and f"gravity = 12.5; parameter set {held.seq}" in r.text
                             for r in browser.find_elements(By.CSS_SELECTOR, "#errors tbody tr")), what="the event row")
        # A finished episode, clicked, shows its steps.
        def click_an_episode() -> bool:
            episodes = browser.find_elements(By.CSS_SELECTOR, "#episodes .episode")
            if episodes:
                episodes[0].click()
            return bool(episodes)

        wait_for(click_an_episode, what="a finished episode")
        rows = wait_for(lambda: browser.execute_script(
            "return [...document.querySelectorAll('#episode-detail table.steps tr')]"
            ".map(r => [...r.querySelectorAll('td')].map(c => c.innerText));"), what="its steps")
        assert len(rows) >= 2 and rows[1][3] == "1", rows  # CartPole: reward 1 a step
        # Pause stops updates, resume restarts them.
        wait_for(lambda: "v1" in browser.find_element(By.ID, "summary").text or "v2" in browser.find_element(By.ID, "summary").text,
                 timeout=60, what="a first update")
        browser.find_element(By.ID, "pause").click()
        wait_for(lambda: browser.find_element(By.ID, "status").text == "paused", what="paused")
        version = lambda: int(browser.find_element(By.ID, "summary").text.split(" v")[-1])  # noqa: E731
        time.sleep(1.5)  # an update already running may finish
        paused_at = version()
        waited = time.monotonic()
        # (Meanwhile:) on a chart, the legend shows the value under the cursor; off it, the latest again.
        over = browser.find_element(By.CSS_SELECTOR, "#chart-throughput .u-over")
        ActionChains(browser).move_to_element_with_offset(over, -over.size["width"] // 2 + 3, 0).perform()
        legend_x = ("const p = window.tetherCharts.throughput.plot; const i = p.cursor.idx; return [i,"
                    " p.data[0][i ?? p.data[0].length - 1], p.root.querySelector('.u-legend .u-value').textContent];")
        idx, at, shown = browser.execute_script(legend_x)
        assert idx is not None and shown == f"{math.floor(at + 0.5)} s", (idx, at, shown)
        # A drag zooms into the past: the chart stops following the new points; a double-click zooms out.
        ActionChains(browser).click_and_hold().move_by_offset(over.size["width"] // 3, 0).release().perform()
        wait_for(lambda: not chart_follows(browser, "throughput"), what="a zoomed chart that keeps its range")
        ActionChains(browser).move_to_element(browser.find_element(By.ID, "status")).perform()
        idx, at, shown = wait_for(lambda: (lambda r: r if r[0] is None else None)(browser.execute_script(legend_x)),
                                  what="the cursor off the chart")
        assert shown == f"{math.floor(at + 0.5)} s", (at, shown)  # the newest point's time, zoomed or not
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));", over)
        wait_for(lambda: chart_follows(browser, "throughput"), what="the zoom reset")
        time.sleep(max(0.0, 4 - (time.monotonic() - waited)))
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
