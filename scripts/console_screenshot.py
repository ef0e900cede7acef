"""Takes docs/console.png: the console of a real multi-agent run (the relay game of
examples/csharp/MultiAgent.cs, two modules and a group, trained by tether serve),
in headless Chromium.

    .venv/bin/python scripts/console_screenshot.py [--out docs/console.png]

Needs the C# SDK built (bash sdk_csharp/scripts/build_and_test.sh --build-only)
and Chromium (bash scripts/install_browser.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cpp.test_cpp_examples import server_flags  # noqa: E402
from tests.integration.server_process import ServerProcess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "docs" / "console.png"))
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    tmp = Path(tempfile.mkdtemp(prefix="tether-console-shot-"))
    flags = server_flags(REPO / "examples" / "configs" / "cpp_multi_agent.json")
    server = ServerProcess(tmp, *flags, "--seed", "0", "--console-port", "0").start()
    env = dict(os.environ, LD_LIBRARY_PATH=str(REPO / "sdk_cpp" / "third_party" / "onnxruntime" / "lib"))
    game = subprocess.Popen(["mono", str(REPO / "sdk_csharp" / ".build" / "examples" / "multiagent.exe"), "--port",
                             str(server.port), "--max-steps", "40000", "--seed", "0"], env=env, stdout=subprocess.PIPE)
    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1950"):
        options.add_argument(flag)
    options.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        match = next(m for m in (re.search(r"console: (http://\S+)", line) for line in server.lines) if m)
        driver.get(match.group(1))
        game.wait(timeout=300)
        time.sleep(2.5)
        driver.save_screenshot(args.out)
        print(json.dumps({"screenshot": args.out, "game": game.stdout.read().decode().strip().splitlines()[-1]}))
    finally:
        driver.quit()
        game.kill()
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
