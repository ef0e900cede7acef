"""Console overhead: bench/e2e_cartpole.py's time to a mean return of 450, with
the live console served and 4 headless Chromium browsers watching it, against
the same run without a console. Runs alternate (plain, console, plain, ...) so
drift in background load affects both alike; each figure is the median.

The browsers start (on a blank page) before the clock; once the server listens
each one opens the console page, which draws every chart once a second. They
run on this machine, so their own CPU use counts against training, as it would
for someone watching a run on the training machine.

Prints one JSON object on stdout, e.g.::

    {"time_to_450_s_plain": 26.1, "time_to_450_s_console": 27.0, "overhead_pct": 3.4, "browsers": 4, ...}

Target: ``overhead_pct`` <= 10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (REPO_ROOT, add_quiet_argument, ensure_installed, free_port, install_cleanup, log,  # noqa: E402
                     run_server_with_clients, wait_for_port, wait_until_quiet)

TARGET = 450.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--browsers", type=int, default=4, help="browsers watching the console (default: 4)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each kind (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="learner and client seed (default: 0)")
    parser.add_argument("--max-env-steps", type=int, default=300_000, help="env-step budget per run (default: 300000)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run (default: 180)")
    add_quiet_argument(parser)
    return parser.parse_args(argv)


def open_browsers(count: int) -> list:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    drivers = []
    for _ in range(count):
        options = Options()
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
            options.add_argument(flag)
        options.binary_location = "/usr/bin/chromium"
        drivers.append(webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options))
    return drivers


def one_run(args: argparse.Namespace, console: bool, drivers: list) -> dict:
    port = free_port()
    server_args = ["--stop-at-return", str(TARGET), "--seed", str(args.seed), "--max-env-steps", str(args.max_env_steps)]
    watched: list[int] = []
    on_listening = None
    if console:
        console_port = free_port()
        server_args += ["--console-port", str(console_port)]

        def on_listening() -> None:  # noqa: F811 - the browsers open the page while the clients start
            def attach() -> None:
                # The console starts listening just after the RLlink port: a page asked for
                # before would fail to load (and the run would go on unwatched).
                wait_for_port(console_port, None, timeout_s=30, poll_s=0.01)
                for driver in drivers:
                    for attempt in range(3):
                        try:
                            driver.get(f"http://127.0.0.1:{console_port}/")
                            watched.append(1)
                            break
                        except Exception as exc:  # noqa: BLE001 - reported with the run's figures
                            log(f"a browser could not open the console (attempt {attempt + 1}): {exc!r:.200}")
                            time.sleep(0.2)
            threading.Thread(target=attach, daemon=True).start()

    client = [sys.executable, str(REPO_ROOT / "examples" / "cartpole_client.py"), "--port", str(port), "--seed",
              str(args.seed), "--reconnect-timeout", "2"]
    run = run_server_with_clients(server_args, [client], port, args.timeout, on_listening=on_listening)
    summary = run["summary"]
    reached = summary.get("reached_target_at")
    ticks = []
    for driver in drivers if console else []:
        try:
            ticks.append(int(driver.execute_script("return Number(document.body.dataset.ticks || 0)")))
            driver.get("about:blank")
        except Exception:
            ticks.append(-1)
    return {"time_to_450_s": None if reached is None else reached - run["t0"],
            "env_steps": summary.get("env_steps_at_target"), "browsers_attached": len(watched), "ticks": ticks,
            "other_load_cores": run["load"].get("other_load_cores")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_cleanup()
    ensure_installed("scripts/install_browser.sh", tools=["chromium", "chromedriver"], modules=["selenium"],
                     what="the browsers watching the console")
    if args.wait_quiet > 0:
        wait_until_quiet(args.wait_quiet)
    drivers = open_browsers(args.browsers)
    plain, console = [], []
    try:
        for i in range(args.repeats):
            plain.append(one_run(args, False, drivers))
            log(f"plain run {i + 1}: {plain[-1]}")
            console.append(one_run(args, True, drivers))
            log(f"console run {i + 1}: {console[-1]}")
    finally:
        for driver in drivers:
            driver.quit()
    times_plain = [r["time_to_450_s"] for r in plain if r["time_to_450_s"] is not None]
    times_console = [r["time_to_450_s"] for r in console if r["time_to_450_s"] is not None]
    t_plain = statistics.median(times_plain) if times_plain else None
    t_console = statistics.median(times_console) if times_console else None
    result = {
        "time_to_450_s_plain": None if t_plain is None else round(t_plain, 2),
        "time_to_450_s_console": None if t_console is None else round(t_console, 2),
        "overhead_pct": None if not (t_plain and t_console) else round(100 * (t_console / t_plain - 1), 1),
        "browsers": args.browsers,
        "repeats": args.repeats,
        "runs_plain": plain,
        "runs_console": console,
        "reached_all": len(times_plain) == len(plain) and len(times_console) == len(console),
        # (a console run with fewer browsers than asked for measures less than it claims)
        "all_browsers_attached": all(r["browsers_attached"] == args.browsers for r in console),
    }
    print(json.dumps(result), flush=True)
    return 0 if result["reached_all"] and result["all_browsers_attached"] else 1


if __name__ == "__main__":
    sys.exit(main())
