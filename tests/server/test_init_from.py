"""A module starts from trained weights (a module of another run's checkpoint): frozen, it serves
them as they are; trainable, it fine-tunes them; a network of another shape, a module the checkpoint
lacks, or a missing file is refused at start with a message naming them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tether.sdk.policy import OnnxPolicy
from tether.protocol.onnx_codec import decode_onnx
from tether.server.config import ServerConfig
from tether.server.module_setup import build_layout
from tether.server.trainer import Trainer

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
BOX4 = {"type": "Box", "shape": [4], "low": -1, "high": 1}
D2 = {"type": "Discrete", "n": 2}


def trained_checkpoint(tmp_path, hidden=(64, 64)) -> tuple[str, dict]:
    """A checkpoint of a run whose module 'runner' has weights no fresh module has (perturbed)."""
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path / "earlier"), quiet=True, seed=1,
                          hidden_sizes=list(hidden),
                          modules={"runner": {"observation_space": BOX4, "action_space": D2}},
                          policy_mapping=[{"pattern": "*", "module": "runner"}])
    trainer = Trainer(config, build_layout(config))
    with torch.no_grad():
        for p in trainer.modules["runner"].learner.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    path = tmp_path / "earlier" / "checkpoint.pt"
    trainer.write_checkpoint(trainer.checkpoint_state())
    asyncio.run(trainer.close(checkpoint=False))
    return str(path), trainer.modules["runner"].learner.model.state_dict()


def later_run(tmp_path, init_from: str, trainable: bool = False, **module) -> Trainer:
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path / "later"), quiet=True, seed=7,
                          modules={"chaser": {"observation_space": BOX4, "action_space": D2, "trainable": trainable,
                                              "init_from": init_from, **module},
                                   "fresh": {"observation_space": BOX4, "action_space": D2}},
                          policy_mapping=[{"pattern": "c_*", "module": "chaser"}, {"pattern": "*", "module": "fresh"}])
    return Trainer(config, build_layout(config))


def test_a_frozen_module_serves_the_trained_weights_of_another_runs_module(tmp_path) -> None:
    path, saved = trained_checkpoint(tmp_path)
    trainer = later_run(tmp_path, f"{path}#runner")
    runtime = trainer.modules["chaser"]
    for name, tensor in runtime.learner.model.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    assert runtime.weights_seq_no == 0 and not runtime.spec.trainable
    # What clients are served is that network, not a fresh one.
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    served = OnnxPolicy(decode_onnx(runtime.onnx_field)).dist_inputs(obs)
    fresh = OnnxPolicy(decode_onnx(trainer.modules["fresh"].onnx_field)).dist_inputs(obs)
    with torch.no_grad():
        expected = runtime.learner.model.actor(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(served, expected, atol=1e-5)
    assert not np.allclose(served, fresh, atol=1e-3)
    asyncio.run(trainer.close(checkpoint=False))


def test_a_trainable_module_starts_from_them_and_fine_tunes(tmp_path) -> None:
    path, saved = trained_checkpoint(tmp_path)
    trainer = later_run(tmp_path, f"{path}#runner", trainable=True)
    model = trainer.modules["chaser"].learner.model
    assert all(torch.equal(t, saved[n]) for n, t in model.state_dict().items())
    assert trainer.modules["chaser"].spec.trainable
    asyncio.run(trainer.close(checkpoint=False))


def test_what_cannot_be_started_from_is_refused_by_name(tmp_path) -> None:
    path, _ = trained_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=r"'chaser': init_from .* has no module 'chaser' \(it has \['runner'\]\)"):
        later_run(tmp_path, path)  # (no '#': the module of the same id)
    with pytest.raises(ValueError, match="'chaser': init_from .*#runner: that network does not fit this module"):
        later_run(tmp_path, f"{path}#runner", hidden_sizes=[32])
    with pytest.raises(ValueError, match="'chaser': init_from .*#runner: that network does not fit this module"):
        later_run(tmp_path, f"{path}#runner", model={"encoder": "cnn", "image_shape": [2, 2, 1], "conv": [[2, 1, 1]],
                                                     "dense": 8})
    with pytest.raises(ValueError, match="No such file"):
        later_run(tmp_path, str(tmp_path / "nowhere.pt"))
    with pytest.raises(ValueError, match="init_from must be a checkpoint path"):
        later_run(tmp_path, 7)


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "tether.server.cli", "serve", "--port", "0", "--env", "CartPole-v1",
                          "--init-from", str(tmp_path / "nowhere.pt"), "--no-tensorboard", "--logdir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "tether serve: error: module 'default_policy': init_from" in out.stderr
    assert "Traceback" not in out.stderr


def test_resuming_with_another_network_is_refused_by_name(tmp_path) -> None:
    path, _ = trained_checkpoint(tmp_path)
    config = ServerConfig(tensorboard=False, logdir=str(tmp_path / "resumed"), quiet=True, resume=path,
                          modules={"runner": {"observation_space": BOX4, "action_space": D2,
                                              "model": {"class": "custom_model:ResidualMlp"}}},
                          policy_mapping=[{"pattern": "*", "module": "runner"}])
    sys.path.insert(0, EXAMPLES)
    try:
        with pytest.raises(ValueError, match="module 'runner': the checkpoint's network does not fit this module"):
            Trainer(config, build_layout(config))
    finally:
        sys.path.remove(EXAMPLES)


MASKED_SPACE = {"type": "Dict", "spaces": {"action_mask": {"type": "Box", "shape": [2], "low": 0, "high": 1},
                                           "pos": {"type": "Box", "shape": [3], "low": -1, "high": 1}}}


@pytest.mark.parametrize("from_masked", [False, True], ids=["unmasked_into_masked", "masked_into_unmasked"])
def test_a_network_starts_a_module_with_or_without_the_action_mask(tmp_path, from_masked: bool) -> None:
    """The mask has no weights: a network trained without it starts a masked module of the same
    spaces, and the other way round; with the mask on, the masked action is never chosen."""
    def run(logdir: str, masked: bool, init_from: str | None = None) -> Trainer:
        module = {"observation_space": MASKED_SPACE, "action_space": D2, "action_mask": "action_mask" if masked else ""}
        if init_from is not None:
            module["init_from"] = init_from
        config = ServerConfig(tensorboard=False, logdir=str(tmp_path / logdir), quiet=True, seed=3 if init_from else 1,
                              modules={"m": module}, policy_mapping=[{"pattern": "*", "module": "m"}])
        return Trainer(config, build_layout(config))

    earlier = run("earlier", masked=from_masked)
    with torch.no_grad():
        for p in earlier.modules["m"].learner.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    earlier.write_checkpoint(earlier.checkpoint_state())
    asyncio.run(earlier.close(checkpoint=False))
    later = run("later", masked=not from_masked, init_from=str(tmp_path / "earlier" / "checkpoint.pt") + "#m")
    rows = np.random.default_rng(0).uniform(-1, 1, (32, 5)).astype(np.float32)
    rows[:, :2] = 1.0
    rows[:16, 0] = 0.0  # action 0 masked in half of the rows
    old_net, new_net = earlier.modules["m"].learner.model, later.modules["m"].learner.model
    with torch.no_grad():
        before, after = (m.dist_inputs(torch.from_numpy(rows)).numpy() for m in (old_net, new_net))
    masked_side = before if from_masked else after
    assert (masked_side[:16, 0] < -1e8).all(), "the masked module masks action 0"
    np.testing.assert_allclose(before[16:], after[16:], atol=1e-6)  # same network where nothing is masked
    np.testing.assert_allclose(before[:16, 1], after[:16, 1], atol=1e-6)
    asyncio.run(later.close(checkpoint=False))
