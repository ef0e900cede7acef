"""Two ranks of one run on PyTorch distributed (gloo on loopback), started by torchrun as a cluster
would start them: ``python -m torch.distributed.run --nproc-per-node 2 -m tether.server.cli serve``.

* CartPole learns to 450 with a fleet of two clients given rank 0's address, one of which rank 0
  redirects to rank 1 (random play, measured here, stays far below), and both ranks end with
  bit-identical weights;
* a module whose data arrives at one rank only (module ``n``: its agent plays on rank 1 alone, and
  it normalizes its observations) is updated as often as the other, without a deadlock: every rank
  joins every module's sums, its statistics' too; rank 0's
  console and TensorBoard show both ranks, each rank's clients among them;
* a rank killed mid-run stops the group at once, and torchrun's restart (``--max-restarts``)
  resumes every rank from its checkpoint: the versions go on from there, the run keeps its id;
  a rank left one checkpoint behind takes the whole group back to that update;
* a model with memory, a demonstration dataset and a curriculum, in one run, train alike on both ranks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tether.server.checkpoint import load_checkpoint

from .server_process import REPO, free_port, two_free_ports, wait_until
from .test_cartpole_learning import random_returns

CONSOLE = re.compile(r"\[tether\] console: http://([\d.]+):(\d+)/\?token=(\S+)")
_SERVING = re.compile(r"serving on [\d.]+:(\d+) .*?\| rank (\d+) of (\d+)")
CLIENT = Path(__file__).with_name("two_module_cartpole_client.py")
GRU = '{"recurrent": {"type": "gru", "size": 16, "seq_len": 8, "burn_in": 2}}'
TWO_MODULES = """
env_steps_per_sample = 200
train_batch_size = 1000
minibatch_size = 250
policy_mapping = [{ pattern = "a_*", module = "m" }, { pattern = "b_*", module = "n" }]
[modules.m]
observation_space = { type = "Box", shape = [4], low = -inf, high = inf }
action_space = { type = "Discrete", n = 2 }
[modules.n]
observation_space = { type = "Box", shape = [4], low = -inf, high = inf }
action_space = { type = "Discrete", n = 2 }
normalize_observations = true
"""


class Group:
    """``torchrun --nproc-per-node ranks -m tether.server.cli serve <flags>``: its ranks' ports and output."""

    def __init__(self, tmp_path: Path, *flags: str, ranks: int = 2, restarts: int = 0, port: int = 0,
                 program: tuple[str, ...] = ("-m", "tether.server.cli", "serve")) -> None:
        self.logdir = tmp_path / "run"
        self.summary = tmp_path / "summary.json"
        self.cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                    "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "--max-restarts", str(restarts),
                    *program, "--port", str(port or two_free_ports()), "--logdir", str(self.logdir),
                    "--summary-file", str(self.summary), "--no-tensorboard", "--group-timeout-s", "60", *flags]
        self.lines: list[str] = []
        self.ports: dict[int, int] = {}
        # (its own process group: stop() ends torchrun and its ranks together, none left running)
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"), process_group=0)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            for match in _SERVING.finditer(line):  # (two ranks' lines can arrive as one)
                self.ports[int(match.group(2))] = int(match.group(1))

    def wait_serving(self, ranks: int = 2, timeout: float = 90) -> dict[int, int]:
        assert wait_until(lambda: len(self.ports) == ranks, timeout), "\n".join(
            line for line in self.lines if not line.startswith("[tether] update"))[-6000:]
        return dict(self.ports)

    def rank_summary(self, rank: int) -> dict[str, Any]:
        path = self.summary if rank == 0 else self.summary.with_name(f"summary.rank-{rank}.json")
        return json.loads(path.read_text())

    def checkpoint(self, rank: int) -> dict[str, Any]:
        return load_checkpoint(self.logdir / f"rank-{rank}" / "checkpoint.pt")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def start_clients(*commands: list[str]) -> list[subprocess.Popen]:
    return [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for cmd in commands]


def stop_clients(clients: list[subprocess.Popen]) -> list[str]:
    outs = []
    for client in clients:
        if client.poll() is None:
            client.send_signal(signal.SIGINT)
        try:
            outs.append(client.communicate(timeout=30)[0])
        except subprocess.TimeoutExpired:
            client.kill()
            outs.append(client.communicate()[0])
    return outs


def play_cartpole_on_every_rank(group: Group) -> None:
    """A CartPole client on each rank's port until the group ends its run (which must end well)."""
    clients: list[subprocess.Popen] = []
    try:
        ports = group.wait_serving()
        clients = start_clients(*([sys.executable, str(REPO / "examples" / "cartpole_client.py"), "--port", str(port),
                                   "--seed", str(rank)] for rank, port in ports.items()))
        assert group.proc.wait(240) == 0, "\n".join(group.lines[-40:])
    finally:
        stop_clients(clients)
        group.stop()


def assert_same_weights(group: Group) -> dict[str, int]:
    """Both ranks' final checkpoints hold bit-identical networks and optimizers; returns the versions."""
    first, second = group.checkpoint(0), group.checkpoint(1)
    assert first["run_id"] == second["run_id"], "one run, one id on every rank"
    versions = {}
    for module_id, saved in first["modules"].items():
        theirs = second["modules"][module_id]
        assert saved["weights_seq_no"] == theirs["weights_seq_no"]
        versions[module_id] = saved["weights_seq_no"]
        for name, tensor in saved["learner"]["model"].items():
            assert torch.equal(tensor, theirs["learner"]["model"][name]), (module_id, name)
        for slot, state in saved["learner"]["optimizer"]["state"].items():
            for key, value in state.items():
                assert torch.equal(value, theirs["learner"]["optimizer"]["state"][slot][key]), (module_id, slot, key)
    return versions


@pytest.mark.slow
def test_two_ranks_learn_cartpole_to_450_with_a_fleet_given_one_address(tmp_path: Path) -> None:
    best_random = max(random_returns(100, seed=7))
    group = Group(tmp_path, "--env", "CartPole-v1", "--stop-at-return", "450", "--max-env-steps", "400000")
    clients: list[subprocess.Popen] = []
    try:
        ports = group.wait_serving()
        # The fleet is given one address, rank 0's: rank 0 redirects one of the two clients to rank 1 (§6.7).
        clients = start_clients(*([sys.executable, str(REPO / "examples" / "cartpole_client.py"), "--port",
                                   str(ports[0]), "--seed", str(seed)] for seed in range(2)))
        assert group.proc.wait(360) == 0, "\n".join(group.lines[-40:])
        outs = stop_clients(clients)
    finally:
        stop_clients(clients)
        group.stop()
    summaries = [group.rank_summary(0), group.rank_summary(1)]
    for rank, summary in enumerate(summaries):
        assert summary["group"]["world_size"] == 2 and summary["group"]["failure"] is None
        assert summary["env_steps"] > 1000, f"rank {rank} ingested its client's data"
    # The group's stop rule saw 450 on the group's episodes (every active client on its own too), judged
    # alike by both ranks; each rank's own clients are far above a random policy.
    assert None not in (summaries[0]["reached_target_at"], summaries[1]["reached_target_at"])
    assert summaries[0]["env_steps_at_target"] == summaries[1]["env_steps_at_target"] > 0
    assert summaries[0]["return_mean_at_target"] == summaries[1]["return_mean_at_target"] >= 450 > best_random + 200
    returns = [summary["return_mean"] for summary in summaries]
    assert min(returns) > best_random + 200, (returns, best_random)
    # And the group's policy, played here on fresh episodes, is as good as the rule said.
    played = policy_returns(group.logdir / "rank-0" / "policy.onnx", episodes=30, seed=1000)
    assert sum(played) / len(played) >= 380 > best_random + 200, played
    assert summaries[0]["updates"] == summaries[1]["updates"] > 0
    assert summaries[0]["group"]["env_steps"] == summaries[1]["group"]["env_steps"] >= sum(
        s["env_steps"] for s in summaries) - 2 * 1000
    versions = assert_same_weights(group)
    assert versions["default_policy"] == summaries[0]["updates"]
    # One model per version across the group: both ranks wrote the same policy.
    assert (group.logdir / "rank-0" / "policy.onnx").read_bytes() == (group.logdir / "rank-1" / "policy.onnx").read_bytes()
    assert all('"stopped_by": "training_done"' in out for out in outs), outs
    reports = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert sorted(r["redirects"] for r in reports) == [0, 1], reports
    assert sorted(r["server_address"] for r in reports) == sorted(f"127.0.0.1:{p}" for p in ports.values())
    assert summaries[0]["group"]["redirected"] == [0, 1] and summaries[1]["group"]["redirected"] == [0, 0]


def policy_returns(policy: Path, episodes: int, seed: int) -> list[float]:
    """CartPole returns of a policy.onnx, its actions sampled as in training."""
    import gymnasium as gym
    import numpy as np

    from tether.protocol.distributions import to_env_action
    from tether.protocol.spaces import from_gymnasium
    from tether.sdk import OnnxPolicy

    env = gym.make("CartPole-v1")
    space = from_gymnasium(env.action_space)
    model = OnnxPolicy(policy.read_bytes(), space, seed=seed)
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(
                to_env_action(space, model.sample(np.asarray(obs, np.float32))[0]))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def console_shows_both_ranks(group: Group, ports: dict[int, int]) -> dict[str, Any]:
    """Rank 0's console feed, until a tick shows both ranks: a row each (address, clients, ingest) and
    every rank's clients, marked with their rank; returns that tick."""
    from websockets.sync.client import connect

    assert wait_until(lambda: any(CONSOLE.search(line) for line in group.lines), 60), group.lines[-20:]
    _, port, token = next(CONSOLE.search(line) for line in group.lines if CONSOLE.search(line)).groups()
    deadline = time.monotonic() + 90
    with connect(f"ws://127.0.0.1:{port}/feed?token={token}") as ws:
        while time.monotonic() < deadline:
            tick = json.loads(ws.recv(timeout=10))
            ranks, clients = tick.get("ranks") or [], tick.get("clients") or []
            if (len(ranks) == 2 and all(r["clients_connected"] >= 1 and r["env_steps"] > 0 for r in ranks)
                    and {(c["rank"], c["client_name"]) for c in clients if c["batches"] > 0}
                    >= {(0, "two-module-1"), (1, "two-module-2")}
                    and (tick.get("values") or {}).get("rank/1/env_steps_per_s") is not None):
                assert [r["address"] for r in ranks] == [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"]
                assert all(r["pool_steps"] >= 0 and r["rss_mb"] > 50 and r["loop_lag_ms"] >= 0 for r in ranks), ranks
                return tick
    raise AssertionError(f"no tick showed both ranks: {tick.get('ranks')}")


@pytest.mark.slow
def test_a_module_whose_data_reaches_one_rank_only_trains_on_both_without_a_deadlock(tmp_path: Path) -> None:
    """Also: rank 0's console and TensorBoard show both ranks (their clients, ingest and health)."""
    config = tmp_path / "two_modules.toml"
    config.write_text(TWO_MODULES)
    group = Group(tmp_path, "--config", str(config), "--max-env-steps", "12000", "--console-port", "0",
                  "--tensorboard")
    clients: list[subprocess.Popen] = []
    try:
        ports = group.wait_serving()
        clients = start_clients([sys.executable, str(CLIENT), "--port", str(ports[0]), "--seed", "1"],
                                [sys.executable, str(CLIENT), "--port", str(ports[1]), "--seed", "2", "--both"])
        console_shows_both_ranks(group, ports)
        assert group.proc.wait(240) == 0, "\n".join(group.lines[-40:])
        outs = stop_clients(clients)
    finally:
        stop_clients(clients)
        group.stop()
    played = [json.loads(out.strip().splitlines()[-1])["played"] for out in outs]
    assert played[0]["b_0"] == 0 and played[1]["b_0"] > 0, "module n's data reached rank 1 only"
    summaries = [group.rank_summary(0), group.rank_summary(1)]
    assert summaries[0]["group"]["env_steps"] >= 12000
    versions = assert_same_weights(group)
    assert versions["n"] >= 3 and versions["m"] >= 3, versions
    assert summaries[0]["modules_weights_seq_no"] == summaries[1]["modules_weights_seq_no"] == versions
    # Rank 0's TensorBoard holds every rank's series.
    script = ("import sys; from tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E;"
              "e=E(sys.argv[1]); e.Reload(); t=e.Tags()['scalars'];"
              "print(*(k in t for k in ('rank/0/env_steps_per_s', 'rank/1/env_steps_per_s', 'rank/1/clients')))")
    out = subprocess.run([sys.executable, "-c", script, str(group.logdir / "rank-0")], cwd=REPO, capture_output=True,
                         text=True)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr[-2000:]


@pytest.mark.slow
def test_a_killed_rank_stops_the_group_and_torchrun_resumes_it_from_the_checkpoints(tmp_path: Path) -> None:
    group = Group(tmp_path, "--env", "CartPole-v1", "--max-env-steps", "20000", "--train-batch-size", "1000",
                  "--checkpoint-every", "2", "--resume", str(tmp_path / "run" / "checkpoint.pt"), restarts=1)
    clients: list[subprocess.Popen] = []
    try:
        ports = group.wait_serving()
        clients = start_clients(*([sys.executable, str(REPO / "examples" / "cartpole_client.py"), "--port", str(port),
                                   "--seed", str(rank), "--reconnect-timeout", "60"] for rank, port in ports.items()))
        # Both ranks published v2 and checkpointed it (--checkpoint-every 2); the run goes on to 20,000 env steps.
        # (both ranks' update 2; two ranks' lines can arrive as one)
        assert wait_until(lambda: sum(line.count("update    2 |") for line in group.lines) >= 2, 180), group.lines[-20:]
        # (the checkpoint of update 2 is written after its line is printed)
        checkpoint = group.logdir / "rank-0" / "checkpoint.pt"
        assert wait_until(lambda: checkpoint.exists() and load_checkpoint(checkpoint)["counters"]["updates"] >= 2, 60)
        run_id = group.checkpoint(0)["run_id"]
        ranks = subprocess.run(["pgrep", "-P", str(group.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(ranks) == 2, ranks
        group.ports.clear()
        killed_at = time.monotonic()
        os.kill(int(ranks[-1]), signal.SIGKILL)
        # torchrun stops the other rank and starts the group again: both ranks serve anew, on the same ports.
        group.wait_serving(timeout=120)
        restarted_in = time.monotonic() - killed_at
        assert group.proc.wait(240) == 0, "\n".join(group.lines[-40:])
        stop_clients(clients)
    finally:
        stop_clients(clients)
        group.stop()
    assert restarted_in < 60, restarted_in
    assert any("a collective with the other ranks failed" in line for line in group.lines), "the survivor says why"
    resumed = [line for line in group.lines if "resumed" in line or "rank" in line and "serving on" in line]
    assert sum(len(_SERVING.findall(line)) for line in group.lines) == 4, resumed  # (two ranks' lines may be one)
    summaries = [group.rank_summary(0), group.rank_summary(1)]
    versions = assert_same_weights(group)
    assert group.checkpoint(0)["run_id"] == run_id, "the restarted group is the same run"
    assert summaries[0]["group"]["env_steps"] >= 20000 and versions["default_policy"] >= 3


@pytest.mark.slow
def test_a_rank_left_one_checkpoint_behind_takes_the_whole_group_back_to_it(tmp_path: Path) -> None:
    """A rank killed while the ranks wrote a checkpoint keeps the one before (simulated: rank 1's last
    checkpoint replaced by its previous one). The resumed group starts every rank from that update,
    rank 0 from its own previous checkpoint and its journal since, so no rank's weights already hold
    updates that trained steps rank 1 replays and trains again."""
    config = tmp_path / "two_modules.toml"
    config.write_text(TWO_MODULES)
    resume = str(tmp_path / "run" / "checkpoint.pt")

    def run(budget: int) -> Group:
        group = Group(tmp_path, "--config", str(config), "--max-env-steps", str(budget), "--checkpoint-every", "2",
                      "--resume", resume)
        clients: list[subprocess.Popen] = []
        try:
            ports = group.wait_serving()
            clients = start_clients(*([sys.executable, str(CLIENT), "--port", str(port), "--seed", str(rank)]
                                      for rank, port in ports.items()))
            assert group.proc.wait(240) == 0, "\n".join(group.lines[-40:])
        finally:
            stop_clients(clients)
            group.stop()
        return group

    first = run(10000)
    last_update = first.checkpoint(0)["counters"]["updates"]
    before = load_checkpoint(first.logdir / "rank-1" / "checkpoint.prev.pt")["counters"]["updates"]
    assert before < last_update == first.checkpoint(1)["counters"]["updates"]
    os.replace(first.logdir / "rank-1" / "checkpoint.prev.pt", first.logdir / "rank-1" / "checkpoint.pt")
    second = run(16000)
    back = [line for line in second.lines if "the newest update every rank has a checkpoint of" in line]
    assert len(back) == 1 and f"(update {before})" in back[0] and "rank 0" in back[0], back
    assert any("replayed" in line for line in second.lines), "rank 0 replays its journal since that update"
    versions = assert_same_weights(second)
    summaries = [second.rank_summary(0), second.rank_summary(1)]
    assert summaries[0]["group"]["env_steps"] >= 16000 and versions["m"] > before


CURRICULUM = """
[curriculum]
measure = "return"
[curriculum.parameters]
pole_length = 0.5
[[curriculum.lessons]]
name = "first"
threshold = 12
min_episodes = 30
[[curriculum.lessons]]
name = "second"
values = {pole_length = 0.6}
"""


@pytest.mark.slow
def test_two_ranks_train_memory_demonstrations_and_a_curriculum_together_alike(tmp_path: Path) -> None:
    """A GRU policy, a demonstration dataset and a curriculum on two ranks, played by real clients:

    * memory: each rank trains on whole windows of its own chunks, as many minibatches per epoch as one
      learner would take of the group's steps (tests/server/test_data_parallel_ranks.py covers empty
      minibatches and a rank without steps);
    * demonstrations (``--demos``, the cloning term decaying over the updates): every rank adds the term to
      its gradients and it decays with the group's updates on every rank (one may have no steps in one);
    * the curriculum: rank 1 hands the measures of its episodes to rank 0, whose lesson advances on both
      ranks' episodes, and rank 1 serves rank 0's parameter set under rank 0's seq;

    and the weights stay identical."""
    expert = tmp_path / "expert.jsonl"
    recorded = subprocess.run([sys.executable, str(REPO / "examples" / "scripted_demos_client.py"), "--game", "cartpole",
                               "--episodes", "3", "--demo-file", str(expert)], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    config = tmp_path / "curriculum.toml"
    config.write_text(CURRICULUM)
    group = Group(tmp_path, "--env", "CartPole-v1", "--model", GRU, "--config", str(config), "--demos", str(expert),
                  "--demo-coef", "0.5", "--demo-decay-updates", "6", "--max-env-steps", "12000",
                  "--train-batch-size", "1000")
    play_cartpole_on_every_rank(group)
    versions = assert_same_weights(group)
    assert versions["default_policy"] >= 2
    first, second = (group.rank_summary(r) for r in (0, 1))
    assert all(summary["env_steps"] > 500 for summary in (first, second)), "both ranks trained on their own steps"
    decayed = [group.checkpoint(r)["modules"]["default_policy"]["learner"]["demo_updates"] for r in (0, 1)]
    assert decayed[0] == decayed[1] == min(6, versions["default_policy"]) > 0, (decayed, versions)
    assert first["curriculum"]["lesson"] == second["curriculum"]["lesson"] == 1, (first["curriculum"], second["curriculum"])
    assert first["curriculum"]["seq"] == second["curriculum"]["seq"]
    assert second["curriculum"]["values"] == {"pole_length": 0.6}
    # Rank 0 counted rank 1's episodes too (those it took before the run ended, of the lesson then).
    assert 0 < first["curriculum"].get("counted_from_other_ranks", 0) <= second["curriculum"]["forwarded"]
    assert second["episodes"] > 0 and "forwarded" not in first["curriculum"]
