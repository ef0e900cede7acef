"""Learning from actions the policy did not choose (protocol 1.6), end to end with real processes:

* behavioural cloning alone: a scripted expert's episodes recorded through the SDK's DemoWriter,
  converted to a Minari dataset (``tether demos convert``), cloned by ``tether pretrain``: the greedy
  policy reaches a return a random policy, measured in the same test, cannot (CartPole, Discrete; and
  Pendulum, a Box action);
* logged steps in training: a multi-agent client whose even carts are played by the scripted expert
  (``log_action``) in the same frames in which the odd carts ask the policy trains a policy above random;
* bad datasets: a truncated file and a dataset in other spaces are refused by name, no traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from tether.server.checkpoint_state import init_from_trained
from tether.server.cli import evaluate_policy
from tether.server.config import ServerConfig
from tether.server.minari_datasets import load_demonstrations
from tether.server.module_runtime import build_modules
from tether.server.module_setup import build_layout

from .server_process import REPO, ServerProcess

PENDULUM = ["--observation-space", '{"type":"Box","shape":[3],"low":[-1,-1,-8],"high":[1,1,8]}',
            "--action-space", '{"type":"Box","shape":[1],"low":-2,"high":2}']


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def tether(*args: str) -> subprocess.CompletedProcess:
    return run("-m", "tether.server.cli", *args)


def record_expert(game: str, episodes: int, path: Path) -> dict:
    out = run(str(REPO / "examples" / "scripted_demos_client.py"), "--game", game, "--episodes", str(episodes),
              "--demo-file", str(path))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def random_return(env_id: str, episodes: int, seed: int = 1000) -> float:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    totals = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        totals.append(total)
    return float(np.mean(totals))


def pretrain(dataset: Path, out: Path, *flags: str) -> dict:
    done = tether("pretrain", "--dataset", str(dataset), "--out", str(out), "--quiet", "--seed", "0", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["default_policy"]


def test_cloning_a_scripted_cartpole_expert_from_a_minari_dataset(tmp_path: Path) -> None:
    expert = record_expert("cartpole", 10, tmp_path / "expert.jsonl")
    assert expert["expert_return_mean"] == 500.0
    converted = tether("demos", "convert", str(tmp_path / "expert.jsonl"), "--out", str(tmp_path / "minari"))
    assert converted.returncode == 0, converted.stderr[-3000:]
    shown = json.loads(tether("demos", "show", str(tmp_path / "minari")).stdout)
    assert shown == {"modules": {"default_policy": {"episodes": 10, "steps": 5000, "logged_steps": 5000}}}
    original = load_demonstrations(tmp_path / "expert.jsonl", "default_policy")
    np.testing.assert_array_equal(load_demonstrations(tmp_path / "minari", "default_policy").cloning_data("default_policy")[0],
                                  original.cloning_data("default_policy")[0])
    report = pretrain(tmp_path / "minari", tmp_path / "pretrained.pt")
    assert report["steps"] == 5000 and report["loss_last_epoch"] < report["loss_first_epoch"] / 3
    cloned = evaluate_policy(Path(report["onnx"]), episodes=10)
    random = random_return("CartPole-v1", 20)
    assert random < 50 and cloned >= 400, (cloned, random)
    # The checkpoint is one `tether serve --init-from` starts from: its first model is the cloned one.
    config = ServerConfig(port=0, tensorboard=False, env="CartPole-v1", init_from=str(tmp_path / "pretrained.pt"))
    modules = build_modules(build_layout(config), config, torch.device("cpu"))
    init_from_trained(modules, build_layout(config).init_from)
    served = modules["default_policy"].learner.export_onnx()
    (tmp_path / "served.onnx").write_bytes(served)
    assert evaluate_policy(tmp_path / "served.onnx", episodes=3) >= 400


def test_cloning_a_scripted_pendulum_expert_box_actions(tmp_path: Path) -> None:
    expert = record_expert("pendulum", 30, tmp_path / "expert.jsonl")
    report = pretrain(tmp_path / "expert.jsonl", tmp_path / "pretrained.pt", "--epochs", "200", *PENDULUM)
    cloned = evaluate_policy(Path(report["onnx"]), episodes=10, env_id="Pendulum-v1")
    random = random_return("Pendulum-v1", 10)
    assert expert["expert_return_mean"] > -200 and random < -900
    assert cloned > random + 400, (cloned, random)


@pytest.mark.slow
def test_a_frame_of_logged_expert_agents_and_policy_agents_trains(tmp_path: Path) -> None:
    random = random_return("CartPole-v1", 20)
    with ServerProcess(tmp_path, "--train-batch-size", "1000", "--env-steps-per-sample", "250", "--seed", "0") as server:
        out = run(str(REPO / "examples" / "scripted_team_client.py"), "--port", str(server.port), "--agents", "2",
                  "--max-steps", "15000")
        assert out.returncode == 0, out.stderr[-3000:]
        summary = server.stop()
    played = json.loads(out.stdout.strip().splitlines()[-1])
    assert played["expert_return_mean"] == 500.0
    assert played["policy_return_last"] > 2 * random + 20, (played, random)
    assert summary["env_steps"] >= 10_000, summary


def test_a_truncated_dataset_and_one_of_other_spaces_are_refused_by_name(tmp_path: Path) -> None:
    record_expert("cartpole", 2, tmp_path / "expert.jsonl")
    text = (tmp_path / "expert.jsonl").read_text()
    (tmp_path / "cut.jsonl").write_text(text[: len(text) - 300])  # a crash in the middle of the last line
    cut = tether("pretrain", "--dataset", str(tmp_path / "cut.jsonl"), "--out", str(tmp_path / "x.pt"), "--quiet")
    assert cut.returncode == 2 and "line 3" in cut.stderr and "Traceback" not in cut.stderr, cut.stderr
    other = tether("serve", "--port", "0", "--logdir", str(tmp_path / "run"), "--no-tensorboard", "--quiet",
                   "--demos", str(tmp_path / "expert.jsonl"), *PENDULUM)
    assert other.returncode == 2 and "Traceback" not in other.stderr, other.stderr
    assert "observation_space" in other.stderr and "default_policy" in other.stderr, other.stderr
    assert not (tmp_path / "x.pt").exists()
