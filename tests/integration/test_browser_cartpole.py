"""examples/browser: CartPole written in JavaScript, running in a web page in
headless Chromium, acting locally with onnxruntime-web and training against
``tether serve`` over RLlink on a websocket, reaches a mean return of 450."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .server_process import ServerProcess
from .test_websocket_rllink import ws_url

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "examples" / "browser"


@pytest.fixture(scope="module")
def page_server():
    fetched = subprocess.run(["bash", str(PAGE / "fetch_onnxruntime_web.sh")], capture_output=True, text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    class Files(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript"}

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=str(PAGE)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.mark.slow
def test_browser_cartpole_learns_to_450_over_a_websocket(tmp_path: Path, page_server: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    server = ServerProcess(tmp_path, "--env", "CartPole-v1", "--ws-port", "0", "--stop-at-return", "450",
                           "--max-env-steps", "400000", "--seed", "0").start()
    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    started = time.monotonic()
    try:
        driver.get(f"{page_server}/index.html?ws={ws_url(server)}")
        status: dict = {}
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            status = driver.execute_script("return window.cartpole || {}")
            if status.get("state") in ("training_done", "server_gone", "failed"):
                break
            time.sleep(1.0)
        wall_s = time.monotonic() - started
        assert status.get("state") == "training_done", (status, driver.get_log("browser")[-20:], server.lines[-20:])
        summary = server.wait(60)
    finally:
        driver.quit()
        server.kill()
    print(f"browser CartPole: {status}; wall {wall_s:.1f} s; server: {summary.get('return_mean')} after "
          f"{summary.get('env_steps')} env steps")
    # The server reached its target and said so (TRAINING_DONE, §6.6), with its summary.
    assert status.get("state") == "training_done" and status["summary"]["reason"] == "stop_at_return", status
    assert summary["reached_target_at"] is not None, summary
    assert status["meanReturn100"] >= 450, status
    assert status["envStepsSent"] > 0 and status["version"] >= 1
