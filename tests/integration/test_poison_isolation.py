"""One client whose data makes updates non-finite harms no one else. While an
honest CartPole client trains, an attacker sends whole episodes with rewards
of 3e38 and 1e20 and genuine behaviour log-probabilities (they pass every
check of the protocol). The server leaves the attacker's data out of the
updates and trains on the honest client's: updates keep being published,
almost every honest step is trained, the attacker is refused with
DATA_REFUSED after a few strikes (also on a new connection of the same
client_session), and no reported return is beyond what a CartPole episode can
reach (500).

Run as a script (``python -m tests.integration.test_poison_isolation 15``)
it prints the figures of one run of the given length in seconds."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from tether.sdk.policy import OnnxPolicy
from tether.protocol import Discrete, FrameDecoder, decode_message, decode_onnx, encode_frame, log_prob

from .server_process import REPO, ServerProcess, wait_until

#: The most a CartPole-v1 episode can return.
CARTPOLE_MAX_RETURN = 500.0
_RETURN_MAX = re.compile(r"max\s+(\S+)\)")


class Attacker:
    """Sends terminated episodes of constant huge rewards, with the action_logp the
    served model really gives (so they pass the behaviour-logp check), at a fixed rate."""

    def __init__(self, port: int, session: str = "attacker", steps: int = 20) -> None:
        self.port, self.session, self.steps = port, session, steps
        self.batch_seq = 0
        self.accepted = self.refused = 0
        self.accepted_steps = 0
        self.codes: list[str] = []
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.decoder, self.pending = FrameDecoder(), []
        self._take_state(self._request({"type": "GET_STATE"}))

    def reconnect(self) -> None:
        """A new connection of the same client_session."""
        self.sock.close()
        self._connect()

    def _receive(self) -> dict[str, Any]:
        while not self.pending:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("closed by server")
            self.pending.extend(self.decoder.feed(data))
        return decode_message(self.pending.pop(0))[1]

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(encode_frame(message))
        return self._receive()

    def _take_state(self, state: dict[str, Any]) -> None:
        assert state["type"] == "SET_STATE", state
        self.seq = state["weights_seq_no"]
        if "onnx_file" in state:
            self.policy = OnnxPolicy(decode_onnx(state["onnx_file"]), Discrete(2))

    def send(self, reward: float) -> str | None:
        """One episode message (EPISODES, then GET_STATE to learn the outcome); the ERROR code or None."""
        logp = log_prob(Discrete(2), self.policy.dist_inputs_one(np.zeros(4, np.float32)), 0)
        self.batch_seq += 1
        self.sock.sendall(encode_frame({
            "type": "EPISODES", "weights_seq_no": self.seq, "client_session": self.session, "batch_seq": self.batch_seq,
            "episodes": [{"obs": [[0.0] * 4] * (self.steps + 1), "actions": [0] * self.steps,
                          "rewards": [reward] * self.steps, "action_logp": [logp] * self.steps,
                          "is_terminated": True, "is_truncated": False}]}))
        reply = self._request({"type": "GET_STATE"})
        code = None
        if reply["type"] == "ERROR":
            code = reply["code"]
            self.codes.append(code)
            self.refused += 1
            reply = self._receive()
        else:
            self.accepted += 1
            self.accepted_steps += self.steps
        self._take_state(reply)
        return code

    def run(self, stop: threading.Event, rate: float) -> None:
        """Alternate 3e38 and 1e20 rewards at ``rate`` messages a second until ``stop``."""
        rewards, i = (3e38, 1e20), 0
        while not stop.is_set():
            started = time.monotonic()
            self.send(rewards[i % 2])
            i += 1
            stop.wait(max(0.0, 1.0 / rate - (time.monotonic() - started)))

    def close(self) -> None:
        self.sock.close()


def run_attack(tmp_path: Path, seconds: float, rate: float = 10.0) -> dict[str, Any]:
    """An honest client and an attacker against one server for ``seconds``; the figures of the run."""
    server = ServerProcess(tmp_path, "--seed", "0", "--max-staleness", "2").start()
    stop_file = tmp_path / "stop"
    honest = subprocess.Popen([sys.executable, str(REPO / "tests/integration/stoppable_client.py"), "--port",
                               str(server.port), "--stop-file", str(stop_file)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stop = threading.Event()
    try:
        assert wait_until(lambda: any("update    1 " in line for line in server.lines), 60), "\n".join(server.lines)
        attacker = Attacker(server.port)
        thread = threading.Thread(target=attacker.run, args=(stop, rate), daemon=True)
        thread.start()
        time.sleep(seconds)
        stop.set()
        thread.join(30)
        stop_file.write_text("")
        sent = json.loads(honest.communicate(timeout=120)[0].strip().splitlines()[-1])
        # The refusal holds for the client_session, whatever connection it comes on.
        attacker.reconnect()
        after_reconnect = attacker.send(3e38)
        attacker.close()
        summary = server.stop(60)
    finally:
        stop.set()
        honest.kill()
        server.kill()
    maxima = [float(m.group(1)) for line in server.lines if "[tether] update" in line
              for m in [_RETURN_MAX.search(line)] if m]
    return {
        "updates_published": summary["updates"], "updates_discarded": summary["updates_discarded"],
        "honest_steps_sent": sent["env_steps_sent"], "agent_steps_trained": summary["agent_steps_trained"],
        "honest_trained_share": summary["agent_steps_trained"] / max(1, sent["env_steps_sent"]),
        "attacker_accepted": attacker.accepted, "attacker_refused": attacker.refused,
        "attacker_codes": sorted(set(attacker.codes)), "after_reconnect": after_reconnect,
        "return_mean": summary["return_mean"], "return_max_seen": max(maxima, default=float("nan")),
        "log": server.lines,
    }


def test_an_attacker_is_isolated_and_refused_while_the_honest_client_trains(tmp_path) -> None:
    out = run_attack(tmp_path, seconds=8.0)
    log = "\n".join(out["log"][-40:])
    # The attacker's data never costs an update, and the honest client's data is trained.
    assert out["updates_discarded"] == 0, log
    assert out["updates_published"] >= 5, log
    # At most what waits in the pool at the end (twice the batch and a message) is not trained.
    assert out["agent_steps_trained"] >= out["honest_steps_sent"] - 2 * 2000 - 1000 > 0, (out["agent_steps_trained"], log)
    # Three strikes (updates that left its data out), then every message of that
    # client_session is refused, on any connection, and none of its data reaches an update.
    refusal = [i for i, line in enumerate(out["log"]) if "refused (DATA_REFUSED)" in line]
    assert len(refusal) == 1, log
    attacker = out["log"][refusal[0]].split("client ", 1)[1].split(" refused", 1)[0]
    strikes = [i for i, line in enumerate(out["log"]) if f"left out, from client(s) {attacker} (" in line]
    assert len(strikes) == 3 and strikes[-1] < refusal[0], log
    assert out["attacker_accepted"] >= 1 and out["attacker_refused"] >= 1, out
    assert out["attacker_codes"] == ["DATA_REFUSED"] and out["after_reconnect"] == "DATA_REFUSED", out["attacker_codes"]
    # No reported return is beyond what a CartPole episode can have.
    assert out["return_max_seen"] <= CARTPOLE_MAX_RETURN and out["return_mean"] <= CARTPOLE_MAX_RETURN, log


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        figures = run_attack(Path(tmp), float(sys.argv[1]) if len(sys.argv) > 1 else 15.0)
        figures.pop("log")
        print(json.dumps(figures, indent=2))
