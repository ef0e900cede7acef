"""The C++ SDK survives a real server killed and restarted mid-run.

The C++ CartPole (examples/cpp) trains against ``tether serve``; the server is
killed with SIGKILL once it has trained on the client's data, and a new one
starts on the same port. The engine keeps acting through the outage (with
--when-queue-full drop_oldest it never waits for the network, and its longest
get_action is measured), the client reconnects by itself, and the new server
receives and trains on its new batches.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

from tests.integration.server_process import ServerProcess, free_port, wait_until

# Network waits are seconds (connect timeout, backoff); scheduling noise on a
# loaded 2-core machine is milliseconds. A frame that waited on the network
# would be far above this.
MAX_ACT_MS = 250.0


def test_cpp_client_survives_a_server_killed_and_restarted_mid_run(examples: Path, tmp_path: Path) -> None:
    port = free_port()
    flags = ["--env-steps-per-sample", "500", "--train-batch-size", "2000"]
    first = ServerProcess(tmp_path, *flags, port=port, name="first").start()
    second: ServerProcess | None = None
    client = subprocess.Popen([str(examples / "cartpole"), "--port", str(port), "--max-steps", "1000000000",
                               "--seed", "0", "--reconnect-timeout", "30", "--when-queue-full", "drop_oldest"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in client.stdout), daemon=True).start()
    try:
        assert wait_until(lambda: any("update" in line for line in first.lines), 120), \
            f"the first server never trained: {first.lines[-5:]} {lines[-5:]}"
        first.kill()  # SIGKILL mid-run
        down_at = time.monotonic()
        assert client.poll() is None, f"the client stopped with the server: {lines[-5:]}"
        second = ServerProcess(tmp_path, *flags, port=port, name="second").start()
        outage_s = time.monotonic() - down_at
        assert wait_until(lambda: any("update" in line for line in second.lines), 120), \
            f"the restarted server never trained on the client's data: {second.lines[-5:]} {lines[-5:]}"
        client.send_signal(signal.SIGINT)  # finish the episode and report
        assert client.wait(60) == 0, lines[-10:]
        time.sleep(0.2)  # let the reader thread take the last line
        summary = second.stop()
    finally:
        if client.poll() is None:
            client.kill()
        first.kill()
        if second is not None:
            second.kill()
    report = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    print(f"outage {outage_s:.2f} s; client {report}; second server: {summary.get('env_steps')} env steps")
    assert report["stopped_by"] == "interrupted", report
    assert report["reconnects"] >= 1, report
    assert report["max_act_ms"] < MAX_ACT_MS, f"a frame waited {report['max_act_ms']} ms during the outage"
    assert summary["env_steps"] > 0, summary  # the new server received the client's batches
