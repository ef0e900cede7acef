"""Builds the C++ SDK's configurations while the Python tests run.

Compiling four configurations of sdk_cpp (normal, -fno-exceptions, ASan+UBSan,
TSan) and the example programs is minutes of CPU. tests/conftest.py starts
this builder, at the lowest scheduling priority, as soon as the suite is
collected and runs the C++ tests last; by the time they run, their builds are
usually done and each test only has to run its programs. A test waits for its
configuration with wait(); it then runs build_and_test.sh itself, which
rebuilds nothing when the background build succeeded and shows the compiler's
errors when it did not.

Run as a program, it builds the configurations named on its command line, one
after the other, writing build/.background/CONFIG.log and CONFIG.rc.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "sdk_cpp" / "scripts" / "build_and_test.sh"
STATE = REPO / "sdk_cpp" / "build" / ".background"
#: The order they are built in: what the first C++ tests need first.
CONFIGS = ("normal", "examples", "noexcept", "asan", "tsan")

_process: subprocess.Popen | None = None


def start(configs: list[str]) -> None:
    """Start building `configs` (in CONFIGS order) in a background process at nice 19."""
    global _process
    wanted = [c for c in CONFIGS if c in configs]
    if not wanted or _process is not None:
        return
    STATE.mkdir(parents=True, exist_ok=True)
    for config in CONFIGS:
        for suffix in (".rc", ".log"):
            (STATE / f"{config}{suffix}").unlink(missing_ok=True)
    (STATE / "started").write_text(" ".join(wanted))
    _process = spawn_low_priority([sys.executable, __file__, *wanted], stdout=subprocess.DEVNULL)


def spawn_low_priority(cmd: list[str], **popen: object) -> subprocess.Popen:
    """Run `cmd` at nice 19 in a process group of its own (stop() ends the whole build) but in the
    suite's session: with the kernel's autogroup scheduling a new session is a new group that gets as
    much CPU as the whole suite whatever its nice value, and the learning tests ran at half speed."""
    return subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: os.nice(19), process_group=0, **popen)


def stop() -> None:
    """Stop the background builder if it still runs (the suite ended early)."""
    global _process
    if _process is not None and _process.poll() is None:
        try:
            os.killpg(_process.pid, 15)
        except ProcessLookupError:
            pass
        _process.wait(timeout=30)
    _process = None


def wait(config: str, timeout_s: float = 1800.0) -> None:
    """Wait until the background build of `config` finished (at once if none was started for it).

    Whether it succeeded does not matter here: the caller runs build_and_test.sh,
    which reports a failed build with the compiler's output.
    """
    if _process is None or config not in (STATE / "started").read_text().split():
        return
    deadline = time.monotonic() + timeout_s
    while not (STATE / f"{config}.rc").exists():
        if _process.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.5)


def _build(configs: list[str]) -> int:
    failed = 0
    for config in configs:
        with open(STATE / f"{config}.log", "w") as log:
            rc = subprocess.call(["bash", str(SCRIPT), "--build-only", config], cwd=REPO, stdout=log,
                                 stderr=subprocess.STDOUT)
        (STATE / f"{config}.rc").write_text(str(rc))
        failed |= rc != 0
    return failed


if __name__ == "__main__":
    sys.exit(_build(sys.argv[1:]))
