"""A minimal protocol-1.3 client written from docs/check-client.md with the
protocol core only (no SDK): the reference that ``tether check-client``
must pass, and, with ``--defect``, clients it must fail.

    python tests/integration/raw_check_client.py --port 5556 [--defect reuse-seq|no-reconnect|clip-record|no-heartbeat|stale-claim|revert]
"""

from __future__ import annotations

import argparse
import random
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from tether.protocol import (  # noqa: E402
    ClientConnection,
    ErrorCode,
    TetherError,
    decode_onnx,
    sample,
    space_from_json,
    to_env_action,
)

CLOSING = {code for code in ErrorCode if code.closes_connection}
#: revert: the second batch after a model swap is played (and honestly claimed) with the first model again.
DEFECTS = ("none", "reuse-seq", "no-reconnect", "clip-record", "no-heartbeat", "stale-claim", "revert")


class Lost(Exception):
    """The connection is gone or its byte stream broke."""


class RawClient:
    def __init__(self, host: str, port: int, defect: str, seed: int) -> None:
        self.host, self.port, self.defect = host, port, defect
        self.session = uuid.uuid4().hex
        self.seq = 0
        self.rng = random.Random(seed)
        self.sock: socket.socket | None = None
        self.conn = ClientConnection()
        self.config: dict[str, Any] = {}
        self.model: ort.InferenceSession | None = None
        self.first_model: ort.InferenceSession | None = None
        self.weights_seq_no = 0
        self.batches_since_swap = -1  # batches sent since the first new model arrived

    # -- connection ----------------------------------------------------------

    def connect(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                self.sock = socket.create_connection((self.host, self.port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.sock.settimeout(30)
        self.conn.reset()
        self.request({"type": "PING", "protocol_version": "1.3", "client_name": f"raw-check-{self.defect}"})
        self.config = self.request({"type": "GET_CONFIG"})
        self.obs_space = space_from_json(self.config["observation_space"])
        self.action_space = space_from_json(self.config["action_space"])
        self.apply_state(self.request({"type": "GET_STATE"}))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.sock is not None
        try:
            self.sock.sendall(self.conn.send(message))
            while True:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise Lost("server closed the connection")
                for request_type, response in self.conn.receive_data(data):
                    if response.get("type") == "ERROR" and "request" not in response and \
                            ErrorCode(response.get("code")) in CLOSING:
                        # A connection-level refusal answers nothing: the connection is ending.
                        print(f"server closed the connection: {response['code']}", flush=True)
                        raise Lost(response["code"])
                    if request_type is not None:
                        return response
        except (OSError, TetherError, Lost) as exc:
            self.close()
            raise Lost(str(exc)) from None

    def apply_state(self, state: dict[str, Any]) -> None:
        if "onnx_file" in state:
            self.model = ort.InferenceSession(decode_onnx(state["onnx_file"]), providers=["CPUExecutionProvider"])
            self.first_model = self.first_model or self.model
        if state["weights_seq_no"] > 0 and self.batches_since_swap < 0:
            self.batches_since_swap = 0
        self.weights_seq_no = state["weights_seq_no"]

    @property
    def reverted(self) -> bool:
        return self.defect == "revert" and self.batches_since_swap == 1

    # -- batches ---------------------------------------------------------------

    def send_batch(self, records: list[dict[str, Any]]) -> None:
        if not (self.defect == "reuse-seq" and self.seq >= 1):
            self.seq += 1
        steps = sum(len(r["actions"]) for r in records)
        message = {"type": "EPISODES_AND_GET_STATE", "episodes": records, "env_steps": steps, "agent_steps": steps,
                   "weights_seq_no": 0 if self.defect == "stale-claim" or self.reverted else self.weights_seq_no,
                   "client_session": self.session, "batch_seq": self.seq}
        while True:
            try:
                if self.sock is None:
                    self.connect()
                answer = self.request(message)
                break
            except Lost:
                if self.defect == "no-reconnect":
                    sys.exit(3)
        if self.batches_since_swap >= 0:
            self.batches_since_swap += 1
        if answer["type"] == "ERROR":
            print(f"server refused batch {self.seq}: {answer['code']}: {answer['message']}", flush=True)
        else:
            self.apply_state(answer)

    def act(self, obs: np.ndarray) -> tuple[Any, Any, float, list[float]]:
        assert self.model is not None
        names = self.config["onnx_input_names"][0], self.config["onnx_output_names"][0]
        model = self.first_model if self.reverted else self.model
        assert model is not None
        dist = model.run([names[1]], {names[0]: obs.reshape(1, -1)})[0][0]
        raw, logp = sample(self.action_space, dist, self.rng)
        env_action = to_env_action(self.action_space, raw)
        if self.defect == "clip-record":
            raw = env_action
        return raw, env_action, logp, dist.tolist()

    def idle(self, seconds: float) -> None:
        interval = float(self.config.get("heartbeat_interval_s", 15))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(interval, max(0.0, end - time.monotonic())))
            if self.defect != "no-heartbeat" and time.monotonic() < end:
                self.request({"type": "PING"})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5556)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--idle-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--defect", choices=DEFECTS, default="none")
    args = parser.parse_args()
    client = RawClient(args.host, args.port, args.defect, args.seed)
    client.connect()
    per_sample = int(client.config["env_steps_per_sample"])
    finished: list[dict[str, Any]] = []
    steps = 0
    while steps < args.steps:
        obs = np.array([0.0, 0.0, 1.0], np.float32)  # the echo env, 10 steps per episode
        record: dict[str, Any] = {"obs": [obs.tolist()], "actions": [], "rewards": [], "action_logp": [],
                                  "action_dist_inputs": [], "is_terminated": False, "is_truncated": False,
                                  "episode_id": uuid.uuid4().hex}
        for t in range(1, 11):
            raw, env_action, logp, dist = client.act(obs)
            executed = float(np.asarray(env_action).ravel()[0])
            obs = np.array([t / 10, executed, 1.0], np.float32)
            record["obs"].append(obs.tolist())
            record["actions"].append(np.asarray(raw).tolist())
            record["rewards"].append(executed)
            record["action_logp"].append(logp)
            record["action_dist_inputs"].append(dist)
            steps += 1
        record["is_terminated"] = True
        finished.append(record)
        if sum(len(r["actions"]) for r in finished) >= per_sample:
            client.send_batch(finished)
            finished = []
    client.idle(args.idle_s)
    client.close()
    print(f"played {steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
