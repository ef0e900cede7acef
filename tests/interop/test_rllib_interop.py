"""Wire compatibility with RLlib's own RLlink v1 implementation, both ways.

The peer is ray[rllib]==2.48.0 (``ray/rllib/env/tcp_client_inference_env_runner.py``),
run unmodified in its own virtual environment:

a. RLlib's example client ``_dummy_client`` connects to ``tether serve`` and
   learns CartPole-v1.
b. Tether's Python SDK connects to RLlib's server (PPO with
   ``TcpClientInferenceEnvRunner``, see ``rllib_server.py``), trains with it for
   several on-policy exchanges and acts with the ONNX models RLlib sends.

The RLlib Python is ``$TETHER_RAY_PYTHON``, else ``<repo>/.venv-ray/bin/python``;
``bash scripts/install_ray_peer.sh`` creates the latter. Without it the tests
are skipped. Run them with ``pytest -m ray tests/interop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = Path(__file__).resolve().with_name("rllib_server.py")
RAY_VERSION = "2.48.0"

pytestmark = pytest.mark.ray


# -- helpers -------------------------------------------------------------------


def _ray_python_path() -> Path:
    configured = os.environ.get("TETHER_RAY_PYTHON")
    return Path(configured) if configured else REPO_ROOT / ".venv-ray" / "bin" / "python"


@pytest.fixture(scope="module")
def ray_python() -> str:
    """The Python that has RLlib; skips the tests when there is none."""
    path = _ray_python_path()
    if not path.exists():
        pytest.skip(
            f"RLlib peer not installed ({path} does not exist): run `bash scripts/install_ray_peer.sh` "
            f"to create .venv-ray, or set TETHER_RAY_PYTHON to a Python with ray[rllib]=={RAY_VERSION}, "
            f"torch, onnx, onnxscript and onnxruntime"
        )
    check = subprocess.run(
        [str(path), "-c", "import ray, onnxruntime, gymnasium, torch; print(ray.__version__)"],
        capture_output=True, text=True, timeout=120,
    )
    if check.returncode != 0:
        pytest.fail(f"{path} cannot import the RLlib peer's packages (re-run `bash scripts/install_ray_peer.sh`):\n"
                    f"{check.stderr[-2000:]}")
    found = check.stdout.strip()
    if found != RAY_VERSION:
        pytest.fail(f"{path} has ray {found}; these tests pin RLlib's RLlink v1 of ray {RAY_VERSION}")
    return str(path)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A subprocess in its own process group, its output collected by a thread."""

    def __init__(self, name: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.popen = subprocess.Popen(
            [str(c) for c in cmd], cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, errors="replace", process_group=0,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self, last: int = 40) -> str:
        return f"--- last output of {self.name} ---\n" + "\n".join(self.lines[-last:])

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Wait until a line containing ``text`` was printed; fail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return
            if not self.running:
                self._reader.join(timeout=2)
                if any(text in line for line in self.lines):
                    return
                pytest.fail(f"{self.name} exited with code {self.popen.returncode} before printing "
                            f"{text!r}\n{self.output()}")
            time.sleep(0.05)
        pytest.fail(f"{self.name} did not print {text!r} within {timeout:.0f} s\n{self.output()}")

    def wait(self, timeout: float) -> int | None:
        """Exit code, or None if still running after ``timeout`` seconds."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=5)
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group at once."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it if it does not end in time."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # children left in the group (e.g. Ray's helper processes) go too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._reader.join(timeout=5)


@contextlib.contextmanager
def running(
    name: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None, kill_after: float | None = None
) -> Iterator[Proc]:
    """Run ``cmd`` for the duration of the block; always stopped at its end.

    ``kill_after`` seconds after the start the process group is killed even if
    the block is still running, e.g. blocked on a socket the process holds.
    """
    proc = Proc(name, cmd, cwd, env)
    timer = None
    if kill_after is not None:
        timer = threading.Timer(kill_after, proc.kill)
        timer.daemon = True
        timer.start()
    try:
        yield proc
    finally:
        if timer is not None:
            timer.cancel()
        proc.stop()


# -- a. RLlib's client -> Tether's server -----------------------------------------

# The windowed (last 100 episodes) mean return the server must report. CartPole-v1
# caps episodes at 500; with one RLlib dummy client (about 2,000-4,000 env steps/s
# here) Tether's default PPO settings reach 450 after 60,000-75,000 env steps,
# in 20-30 s on two CPU cores.
TARGET_RETURN = 450.0
#: Episodes the target mean is taken over (a full window of 100 would add some 50,000 steps of a
#: policy that already plays 500, checking nothing more than 20 do).
WINDOW = 20
MAX_ENV_STEPS = 300_000
LEARN_TIMEOUT_S = 150.0

DUMMY_CLIENT = "from ray.rllib.env.tcp_client_inference_env_runner import _dummy_client; _dummy_client(port={port})"


def test_rllib_dummy_client_learns_cartpole_on_tether_server(ray_python: str, tmp_path: Path) -> None:
    port = _free_port()
    summary_file = tmp_path / "summary.json"
    client_dir = tmp_path / "client"  # _dummy_client writes its model to ./_temp_onnx
    client_dir.mkdir()
    server_cmd = [
        sys.executable, "-m", "tether.server.cli", "serve",
        "--port", str(port),
        "--env", "CartPole-v1",
        "--stop-at-return", str(TARGET_RETURN),
        "--metrics-window", str(WINDOW),
        "--max-env-steps", str(MAX_ENV_STEPS),
        "--summary-file", str(summary_file),
        "--logdir", str(tmp_path / "run"),
        "--seed", "0",
        "--no-tensorboard",
        "--checkpoint-every", "0",
    ]
    started = time.monotonic()
    with running("tether serve", server_cmd, cwd=REPO_ROOT) as server:
        server.wait_for_line("[tether] serving on", timeout=60)
        with running("RLlib _dummy_client", [ray_python, "-c", DUMMY_CLIENT.format(port=port)], cwd=client_dir) as client:
            deadline = time.monotonic() + LEARN_TIMEOUT_S
            while server.running and time.monotonic() < deadline:
                if not client.running:
                    # The dummy client only stops when its server goes away (or on an assertion of its own).
                    time.sleep(1.0)
                    if server.running:
                        pytest.fail(f"RLlib's client exited (code {client.popen.returncode}) while the server still "
                                    f"runs\n{client.output()}\n{server.output()}")
                time.sleep(0.2)
            if server.running:
                server.stop()  # SIGTERM: the server still writes its summary
                pytest.fail(f"the server did not reach a mean return of {TARGET_RETURN:g} within "
                            f"{LEARN_TIMEOUT_S:.0f} s\n{server.output()}")
            code = server.wait(timeout=30)
        assert code == 0, f"tether serve exited with {code}\n{server.output()}"
    elapsed = time.monotonic() - started

    summary = json.loads(summary_file.read_text())
    progress = "\n".join(line for line in server.lines if line.startswith("[tether] update"))[-3000:]
    assert summary["reached_target_at"] is not None, (
        f"stopped without reaching {TARGET_RETURN:g} (mean {summary['return_mean']:.1f} after "
        f"{summary['env_steps']} env steps)\n{progress}"
    )
    assert summary["return_mean"] >= TARGET_RETURN
    assert summary["episodes"] >= WINDOW  # the mean is over a full window of episodes
    assert summary["updates"] >= 1 and summary["weights_seq_no"] == summary["updates"]
    # The v1 client sends no weights_seq_no; none of its on-policy data may count as stale.
    assert summary["samples_dropped_stale"] == 0
    print(f"RLlib _dummy_client -> tether serve: mean return {summary['return_mean']:.1f} after "
          f"{summary['env_steps']} env steps, {summary['updates']} updates, {elapsed:.1f} s")


# -- b. Tether's SDK -> RLlib's server ----------------------------------------------

ITERATIONS = 8
TRAIN_BATCH = 1000  # RLlib's SET_CONFIG tells the client env_steps_per_sample = train batch size
# Bounds: RLlib's launcher exits by itself after RLLIB_TIME_LIMIT_S; the test
# kills it after TEST_BUDGET_S whatever happens (which also unblocks a client
# waiting for an answer). A normal run takes about 20 s.
RLLIB_TIME_LIMIT_S = 120
TEST_BUDGET_S = 170


def test_tether_sdk_trains_with_rllib_server(ray_python: str, tmp_path: Path) -> None:
    import gymnasium as gym

    from tether.sdk import OnnxPolicy, TetherClient, run_env

    port = _free_port()
    summary_file = tmp_path / "rllib_summary.json"
    cmd = [
        ray_python, str(LAUNCHER),
        "--port", str(port),
        "--iters", str(ITERATIONS),
        "--train-batch-size", str(TRAIN_BATCH),
        "--time-limit", str(RLLIB_TIME_LIMIT_S),
        "--summary-file", str(summary_file),
        "--logdir", str(tmp_path / "rllib_logs"),
    ]
    started = time.monotonic()
    with running("RLlib server", cmd, cwd=tmp_path, kill_after=TEST_BUDGET_S) as rllib:
        # Printed by RLlib's TcpClientInferenceEnvRunner once it listens. (Probing
        # the port instead would use up the single connection it accepts.)
        rllib.wait_for_line(f"Waiting for client to connect to port {port}", timeout=100)

        env = gym.make("CartPole-v1")
        env.reset(seed=0)
        client = TetherClient(
            "127.0.0.1", port, client_name="tether-interop",
            # RLlib's SET_CONFIG does not describe the spaces: the client takes them from here.
            observation_space=env.observation_space, action_space=env.action_space,
            reconnect_timeout_s=20, seed=0,
        )
        try:
            # Handshake answered by RLlib: plain v1 PONG and SET_CONFIG, initial weights.
            assert client.server_info == {"type": "PONG"}
            assert client.server_config == {"type": "SET_CONFIG", "env_steps_per_sample": TRAIN_BATCH,
                                            "force_on_policy": True}
            assert client.env_steps_per_sample == TRAIN_BATCH and client.force_on_policy
            assert client.weights_seq_no == 0
            assert client.policy is not None
            assert [i.name for i in client.policy.session.get_inputs()] == ["onnx::Gemm_0"]
            first_policy = client.policy

            # CartPole episodes (<= 500 steps) are shorter than a batch, so at
            # most one exchange happens per episode: looking after each is enough.
            versions: list[int | None] = [client.weights_seq_no]
            policies: list[OnnxPolicy | None] = [client.policy]

            def note_state() -> None:
                if client.policy is not policies[-1]:
                    policies.append(client.policy)
                if client.weights_seq_no != versions[-1]:
                    versions.append(client.weights_seq_no)

            def on_episode_end(ret: float, length: int) -> None:
                note_state()

            # One step more than ITERATIONS batches: the action for that step
            # triggers the last EPISODES_AND_GET_STATE (the SDK sends a batch when
            # the next action is asked for), so RLlib gets exactly ITERATIONS
            # batches of TRAIN_BATCH steps, and answers each with new weights.
            returns = run_env(client, env, max_steps=ITERATIONS * TRAIN_BATCH + 1, on_episode_end=on_episode_end)
            note_state()
        finally:
            client.close()
            env.close()

        code = rllib.wait(timeout=30)
        assert code == 0, f"RLlib server exited with {code}\n{rllib.output()}"
    elapsed = time.monotonic() - started

    summary = json.loads(summary_file.read_text())
    # Every exchange produced a new version, and the client swapped in each model.
    assert client.weights_seq_no == ITERATIONS
    assert versions == list(range(ITERATIONS + 1)), versions
    assert len(policies) == ITERATIONS + 1  # a new ONNX model with every SET_STATE
    assert client.reconnects == 0
    # RLlib trained on exactly the steps the SDK sent, in full batches.
    assert client.env_steps_sent == ITERATIONS * TRAIN_BATCH
    assert summary["finished"] and summary["iterations"] == ITERATIONS
    assert summary["env_steps_sampled"] == ITERATIONS * TRAIN_BATCH
    assert summary["weights_seq_no"] == ITERATIONS
    # The model the client acts with is RLlib's: its ONNX output equals the
    # logits of RLlib's final RLModule, and it differs from the first model.
    # RLlib exports its model with a fixed batch dimension of 1: one observation per call.
    probe = np.asarray(summary["probe_obs"], dtype=np.float32)
    first_logits = np.concatenate([first_policy.dist_inputs(row[None]) for row in probe])
    final_logits = np.concatenate([client.policy.dist_inputs(row[None]) for row in probe])
    assert final_logits.shape == (len(probe), 2)
    np.testing.assert_allclose(final_logits, np.asarray(summary["probe_logits"]), rtol=1e-4, atol=1e-4)
    assert not np.allclose(first_logits, final_logits, atol=1e-3)
    # RLlib's episode statistics come from the SDK's episode records.
    history = summary["history"]
    assert all(h["episode_return_mean"] is not None for h in history)
    assert history[-1]["episode_return_mean"] > history[0]["episode_return_mean"], history
    print(f"Tether SDK -> RLlib server: {ITERATIONS} exchanges, weights_seq_no 0 -> {client.weights_seq_no}, "
          f"{len(returns)} episodes (client's mean return, first 10: {np.mean(returns[:10]):.1f}, "
          f"last 10: {np.mean(returns[-10:]):.1f}), RLlib's mean return {history[0]['episode_return_mean']:.1f} -> "
          f"{history[-1]['episode_return_mean']:.1f}, {elapsed:.1f} s")

