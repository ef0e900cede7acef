"""A client from before protocol 1.4, frozen: the Python SDK and protocol core as they were at the last
1.3 commit, taken from this repository's history, train CartPole against today's server unchanged
(§15: JSON numbers stay valid in every record, new fields are ignored)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile

from .server_process import REPO, ServerProcess

#: The last commit whose clients spoke 1.3 (the next one introduced protocol 1.4).
LAST_1_3_COMMIT = "d4fbaed"

PLAY = """
import json, sys
import gymnasium as gym
import tether.protocol.messages as messages
from tether.sdk import TetherClient, run_env
client = TetherClient("127.0.0.1", int(sys.argv[1]), client_name="frozen-1.3", seed=0)
returns = run_env(client, gym.make("CartPole-v1"), max_steps=3000)
client.flush()
print(json.dumps({"version": messages.PROTOCOL_VERSION, "episodes": len(returns), "sent": client.env_steps_sent,
                  "server_version": client.link.server_info.get("protocol_version")}))
client.close()
"""


def frozen_sdk(tmp_path) -> str:
    """The old ``tether.protocol`` and ``tether.sdk`` as an importable package; returns its root."""
    archive = subprocess.run(["git", "archive", LAST_1_3_COMMIT, "protocol", "sdk_python"], cwd=REPO,
                             capture_output=True, check=True).stdout
    root = tmp_path / "frozen"
    package = root / "tether"
    package.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(package, filter="data")
    (package / "sdk_python").rename(package / "sdk")
    (package / "__init__.py").write_text("")
    return str(root)


def test_a_1_3_client_from_before_protocol_1_4_trains_unchanged(tmp_path) -> None:
    root = frozen_sdk(tmp_path)
    with ServerProcess(tmp_path, "--train-batch-size", "1000", "--seed", "0") as server:
        out = subprocess.run([sys.executable, "-c", PLAY, str(server.port)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=180, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr[-3000:]
        summary = server.stop()
    played = json.loads(out.stdout.strip().splitlines()[-1])
    assert played["version"] == "1.3" and played["server_version"] == "1.9", played
    # (the server may ask to record only a share of the episodes once it has a backlog: not all 3000 go)
    assert played["sent"] >= 1000 and summary["env_steps"] == played["sent"], (played, summary)
    assert summary["updates"] >= 1, summary


CONNECT = """
import sys
from tether.sdk import TetherClient
try:
    TetherClient("127.0.0.1", int(sys.argv[1]), client_name="frozen-1.3", reconnect_timeout_s=5)
except Exception as exc:  # noqa: BLE001 - what the old client raises is what is checked
    print(type(exc).__name__, exc)
"""


def test_a_1_3_client_refuses_a_dict_space_clearly_and_sends_nothing(tmp_path) -> None:
    """A module with a Dict observation needs a 1.4 client (§15): an older one refuses the space in
    SET_CONFIG with a local INVALID_FIELD that names it, and the server sees no data."""
    root = frozen_sdk(tmp_path)
    space = {"type": "Dict", "spaces": {"action_mask": {"type": "Box", "shape": [2], "low": 0, "high": 1},
                                        "board": {"type": "Box", "shape": [3]}}}
    with ServerProcess(tmp_path, "--observation-space", json.dumps(space), "--action-space",
                       '{"type": "Discrete", "n": 2}') as server:
        out = subprocess.run([sys.executable, "-c", CONNECT, str(server.port)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
        summary = server.stop()
    assert "INVALID_FIELD" in out.stdout and "'Dict'" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert summary["env_steps"] == 0
