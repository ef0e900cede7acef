"""A step the server has answered is trained exactly once, whatever stops the
server: SIGTERM and --resume, kill -9 and --resume (protocol §13.5).

A client sends on-policy batches of one 100-step episode whose steps carry their
id in observation 0, and resends a batch whose answer it lost, unchanged, after
reconnecting (as every SDK does). The server runs under recording_server.py,
which logs the ids each published update trained on. The weights that survive
are those of the checkpoint the next run resumes from, so the updates that
count are: every update of a run stopped by SIGTERM (its final checkpoint
follows them), those of a killed run up to the version its last checkpoint
holds, and those of the last run. Counted that way, with the steps left in the
final checkpoint's pool, every answered step is there exactly once."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tether.server.checkpoint import load_checkpoint
from tether.server.pool_journal import decode_entries

from .server_process import RawClient, ServerProcess, wait_until

STEPS = 100
RECORDING = Path(__file__).with_name("recording_server.py")
# A resumed server first trains what it restored, so its versions run ahead of a client's claims:
# a large max_staleness keeps the staleness rule (§13.2) out of what this test counts.
FLAGS = ("--train-batch-size", "300", "--num-epochs", "1", "--checkpoint-every", "2", "--no-verify-action-logp",
         "--max-staleness", "100")


def episode(seq: int) -> dict:
    obs = np.random.default_rng(seq).normal(size=(STEPS + 1, 4)).round(3)
    obs[:, 0] = seq * 1000 + np.arange(STEPS + 1)  # step j of batch seq has id seq*1000+j (exact in float32)
    return {"obs": obs.tolist(), "actions": [int(a) for a in np.arange(STEPS) % 2],
            "rewards": [1.0] * STEPS, "action_logp": [-0.693] * STEPS, "is_terminated": True, "is_truncated": False}


class Client(threading.Thread):
    """Sends batch after batch; a batch whose answer was lost is resent unchanged."""

    def __init__(self, session: str = "durable-test", first_seq: int = 1) -> None:
        super().__init__(daemon=True)
        self.port = 0
        #: Its client_session, and the number of its first batch (clients of one server keep their ids apart).
        self.session, self.first_seq = session, first_seq
        self.answered: list[int] = []
        self.errors: list[dict] = []
        self.halt = threading.Event()

    def run(self) -> None:
        conn, version, seq, pending = None, 0, self.first_seq - 1, None
        while not self.halt.is_set():
            try:
                if conn is None:
                    conn = RawClient(self.port, timeout=30)
                    assert conn.request({"type": "PING", "protocol_version": "1.3"})["type"] == "PONG"
                    version = conn.request({"type": "GET_STATE"})["weights_seq_no"]  # this run's numbering
                if pending is None:
                    seq += 1
                    pending = {"type": "EPISODES_AND_GET_STATE", "episodes": [episode(seq)], "weights_seq_no": version,
                               "client_session": self.session, "batch_seq": seq}
                reply = conn.request(pending)
                if reply["type"] != "SET_STATE":
                    self.errors.append(reply)
                    return
                self.answered.append(seq)
                version, pending = reply["weights_seq_no"], None
            except (OSError, ConnectionError):
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.1)
        if conn is not None:
            conn.close()


def trained_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def checkpoint_version(path) -> int:
    return int(load_checkpoint(path)["modules"]["default_policy"]["weights_seq_no"])


@pytest.mark.slow
def test_answered_steps_are_trained_once_across_sigterm_and_kill(tmp_path, monkeypatch) -> None:
    log = tmp_path / "trained.jsonl"
    monkeypatch.setenv("TETHER_TRAINED_LOG", str(log))
    checkpoint = tmp_path / "server-run" / "checkpoint.pt"
    client = Client()
    counted: list[int] = []  # ids of the updates whose weights the final policy descends from

    def run_server(*flags: str, port: int = 0) -> ServerProcess:
        server = ServerProcess(tmp_path, *FLAGS, *flags, port=port)
        server.cmd[1:4] = [str(RECORDING)]  # python recording_server.py <the flags of tether serve>
        return server.start()

    server = run_server()
    client.port = server.port
    client.start()
    assert wait_until(lambda: len(client.answered) >= 12, 60), client.errors
    server.stop()  # SIGTERM, possibly while a batch waits for an update
    pid = server.proc.pid
    counted += [i for line in trained_lines(log) if line["pid"] == pid for i in line["ids"]]

    server = run_server("--resume", str(checkpoint), port=client.port)
    assert wait_until(lambda: len(client.answered) >= 30, 60), client.errors
    server.proc.kill()  # kill -9: what was trained after the last checkpoint is lost with its weights
    server.proc.wait()
    kept_version, pid = checkpoint_version(checkpoint), server.proc.pid
    counted += [i for line in trained_lines(log) if line["pid"] == pid and line["version"] <= kept_version
                for i in line["ids"]]

    server = run_server("--resume", str(checkpoint), port=client.port)
    assert wait_until(lambda: len(client.answered) >= 45, 60), client.errors
    client.halt.set()
    client.join(30)
    summary = server.stop()
    pid = server.proc.pid
    counted += [i for line in trained_lines(log) if line["pid"] == pid for i in line["ids"]]
    entries, _ = decode_entries(load_checkpoint(checkpoint)["pool"])
    pooled = [int(i) for entry in entries for item in entry.items for i in item.chunk.obs[:-1, 0]]

    assert not client.errors
    answered = {seq * 1000 + j for seq in client.answered for j in range(STEPS)}
    times = Counter(counted + pooled)
    trained_batches = [(line["pid"], line["version"], sorted({i // 1000 for i in line["ids"]}))
                       for line in trained_lines(log)]
    assert [i for i in answered if times[i] != 1] == [], (kept_version, trained_batches)  # trained or pooled, once
    assert max(times.values()) == 1  # and nothing twice (a batch stored but not answered in time counts once too)
    assert summary["samples_dropped_stale"] == 0  # (whether a resend was a duplicate depends on where the stops fell)
