"""examples/cartpole_client.py survives the outage it advertises: a real
``tether serve`` is killed and a new one starts on the same port about 4 s
later, inside the default --reconnect-timeout of 5 s. The new server is a new
run (no --resume): the steps the example played with the old run's model during
the outage are not sent to it (their versions name other weights there, and its
behaviour-logp check would refuse their batch, §6.5)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from ..integration.server_process import REPO, ServerProcess, free_port, wait_until

# The replacement server has done its imports and a first (throwaway) model
# export before the outage starts, so the outage is what the test chooses: the
# real `tether serve` then starts in well under a second.
PREWARMED_SERVE = """
import sys, tempfile
import tether.server.cli as cli
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer
warm = ServerConfig(logdir=tempfile.mkdtemp(), tensorboard=False)
Trainer(warm, build_layout(warm))
print("imported", flush=True)
sys.stdin.readline()
sys.exit(cli.main(sys.argv[1:]))
"""
OUTAGE_BEFORE_START_S = 3.5
ADVERTISED_S = 5.0


class Lines:
    """Collects a process's output lines on a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.at: list[float] = []
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line.rstrip())
            self.at.append(time.monotonic())

    def find(self, text: str) -> float | None:
        return next((t for line, t in zip(self.lines, self.at) if text in line), None)


def test_cartpole_example_survives_a_server_restart_within_its_advertised_outage(tmp_path) -> None:
    port = free_port()
    flags = ["--env-steps-per-sample", "200", "--train-batch-size", "1000", "--no-tensorboard"]
    first = ServerProcess(tmp_path, *flags, port=port, name="first").start()
    second_summary = tmp_path / "second-summary.json"
    second = subprocess.Popen(
        [sys.executable, "-c", PREWARMED_SERVE, "serve", "--port", str(port), "--logdir", str(tmp_path / "second-run"),
         "--summary-file", str(second_summary), *flags],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    example = subprocess.Popen([sys.executable, str(REPO / "examples" / "cartpole_client.py"), "--port", str(port)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second_out, example_out = Lines(second), Lines(example)
    try:
        assert wait_until(lambda: second_out.find("imported") is not None, 120), second_out.lines
        assert wait_until(lambda: any("update" in line for line in first.lines), 120), "the example trains"
        first.kill()  # the outage starts
        down_at = time.monotonic()
        time.sleep(OUTAGE_BEFORE_START_S)
        assert example.poll() is None, f"the example gave up early: {example_out.lines}"
        second.stdin.write("go\n")
        second.stdin.flush()
        assert wait_until(lambda: second_out.find("serving on") is not None, 30), second_out.lines
        outage = second_out.find("serving on") - down_at
        assert OUTAGE_BEFORE_START_S <= outage < ADVERTISED_S - 0.3, f"outage of {outage:.2f} s"
        assert wait_until(lambda: any("update" in line for line in second_out.lines), 60), \
            f"the example must train with the new server: {example_out.lines[-5:]}"
        example.send_signal(2)  # SIGINT: the example stops and reports
        example.wait(30)
        report = json.loads(next(line for line in example_out.lines if line.startswith("{")))
        second.terminate()
        second.wait(30)
    finally:
        for proc in (example, second):
            if proc.poll() is None:
                proc.kill()
        first.kill()
    assert report["stopped_by"] == "interrupted" and report["reconnects"] >= 1
    assert report["other_run_steps_dropped"] > 0, "the steps played during the outage were the old run's"
    assert not any("ACTION_LOGP_MISMATCH" in line for line in example_out.lines + second_out.lines)
    summary = json.loads(second_summary.read_text())
    assert summary["env_steps"] >= 1000 and summary["updates"] >= 1
