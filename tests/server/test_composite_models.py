"""Dict and Tuple observations (§8.6) and action masks (§11.6) in the learner: one ONNX input per
leaf, masked logits inside the graph, in parity with torch for every built-in model and a user
network, version after version; the loss trains on the masked distribution; the configuration
refuses what cannot be masked or encoded, naming the module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tether.protocol import Discrete, EpisodeChunk, MultiDiscrete
from tether.protocol.action_mask import MASKED_LOGIT, resolve_action_mask
from tether.protocol.model_input import ModelFeeds
from tether.protocol.spaces import Box, Dict, Tuple, box, flatten_observation, space_from_json
from tether.server.config import ServerConfig
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch
from tether.server.learner.model_config import ModelConfigError
from tether.server.module_setup import build_layout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CAMERA = box(0, 255, (8, 8, 1), dtype="uint8")
SCENE = Dict((("action_mask", box(0, 1, (4,))), ("camera", CAMERA), ("speed", box(-1, 1, (3,)))))
TUPLE = Tuple((Discrete(5), Dict((("a", box(-1, 1, (2, 2))), ("mask", box(0, 1, (5,)))))))
SMALL_CNN = {"encoder": "cnn", "conv": [[4, 3, 1]], "dense": 8}


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def rows(space, count: int, seed: int) -> np.ndarray:
    """Random flat rows of ``space``: bytes for byte leaves, 0/1 masks with something allowed."""
    rng = np.random.default_rng(seed)
    out = np.zeros((count, space.flat_dim), np.float32)
    for leaf in space.leaves:
        part = slice(leaf.offset, leaf.offset + leaf.size)
        if leaf.is_bytes:
            out[:, part] = rng.integers(0, 256, (count, leaf.size))
        elif "mask" in leaf.path:
            out[:, part] = rng.integers(0, 2, (count, leaf.size))
            out[:, leaf.offset] = 1  # (every row allows its first action)
        else:
            out[:, part] = rng.normal(size=(count, leaf.size))
    return out


CASES = {
    "mlp_dict_masked": (SCENE, Discrete(4), None, "action_mask", False),
    "cnn_dict_masked": (SCENE, Discrete(4), SMALL_CNN, "action_mask", False),
    "cnn_dict_normalized": (SCENE, Discrete(4), SMALL_CNN, "action_mask", True),
    "mlp_tuple_multidiscrete_mask": (TUPLE, MultiDiscrete((2, 3)), None, "1.mask", True),
    "cnn_dict_no_mask": (SCENE, MultiDiscrete((2, 2)), SMALL_CNN, "", False),
    "user_network_masked": (SCENE, Discrete(4), {"class": "custom_model:ResidualMlp", "options": {"width": 16}},
                            "action_mask", False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_takes_one_input_per_leaf_and_follows_torch(case: str) -> None:
    space, action_space, model, mask_leaf, normalize = CASES[case]
    mask = resolve_action_mask(space, action_space, mask_leaf)
    learner = PPOLearner(space, action_space, PPOHyperparams(model=model, normalize_observations=normalize), seed=0,
                         action_mask=mask)
    obs = rows(space, 6, seed=1)
    for version in range(2):
        session = ort.InferenceSession(learner.export_onnx(), providers=["CPUExecutionProvider"])
        inputs = {i.name: (i.type, i.shape[1:]) for i in session.get_inputs()}
        assert inputs == {leaf.path: (("tensor(uint8)", list(leaf.space.shape)) if leaf.is_bytes
                                      else ("tensor(float)", [leaf.size])) for leaf in space.leaves}
        feeds = ModelFeeds.of_session(session.get_inputs(), space).feed(obs, len(obs))
        got = session.run(None, feeds)[0]
        with torch.no_grad():
            want = learner.model.dist_inputs(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        if mask is not None:
            forbidden = mask.of_rows(obs) == 0
            assert forbidden.any() and (got[forbidden] == np.float32(MASKED_LOGIT)).all()
            assert (got[~forbidden] > MASKED_LOGIT / 2).all()
        with torch.no_grad():  # the next version: other weights, rewritten into the same graph
            for p in learner.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        if learner.normalizer is not None:  # and other statistics
            learner.normalizer.observe(rows(space, 16, seed=5 + version) * 3.0 + 1.0)


def test_the_update_trains_the_masked_distribution() -> None:
    """Masked actions keep probability 0 through updates, and the allowed ones learn: the loss
    differentiates the masked logits, not the raw ones."""
    space, action_space = SCENE, Discrete(4)
    mask = resolve_action_mask(space, action_space, None)
    learner = PPOLearner(space, action_space, PPOHyperparams(lr=3e-3, minibatch_size=64, num_epochs=4), seed=0,
                         action_mask=mask)
    obs = rows(space, 257, seed=2)
    obs[:, 0:4] = [1, 0, 1, 1]  # action 1 always forbidden
    actions = np.where(np.arange(256) % 2 == 0, 0, 2)
    chunk = EpisodeChunk(obs=obs, actions=actions, rewards=(actions == 2).astype(np.float32),
                         action_logp=None, action_dist_inputs=None,
                         is_terminated=True, is_truncated=False)
    for _ in range(8):
        learner.update(build_batch([chunk]))
    with torch.no_grad():
        probs = torch.softmax(learner.model.dist_inputs(torch.from_numpy(obs[:50])), dim=-1).numpy()
    assert (probs[:, 1] == 0).all()
    assert probs[:, 2].mean() > 0.5 > probs[:, 0].mean()


def test_normalisation_leaves_images_and_the_mask_as_they_are() -> None:
    mask = resolve_action_mask(SCENE, Discrete(4), None)
    learner = PPOLearner(SCENE, Discrete(4), PPOHyperparams(normalize_observations=True), seed=0, action_mask=mask)
    normalizer = learner.normalizer
    obs = rows(SCENE, 64, seed=3)
    obs[:, -3:] = obs[:, -3:] * 1000 + 500
    normalizer.observe(obs)
    out = normalizer.normalize(torch.from_numpy(obs)).numpy()
    np.testing.assert_array_equal(out[:, :4 + 64], obs[:, :4 + 64])  # mask and camera untouched
    assert abs(out[:, -3:].mean()) < 0.1 and 0.8 < out[:, -3:].std() < 1.2


@pytest.mark.parametrize("modules, message", [
    ({"m": {"observation_space": SCENE.to_json(), "action_space": {"type": "Box", "shape": [2]}}},
     "needs a Discrete or MultiDiscrete action space"),
    ({"m": {"observation_space": SCENE.to_json(), "action_space": {"type": "Discrete", "n": 5}}},
     "must be a Box of 5 values"),
    ({"m": {"observation_space": SCENE.to_json(), "action_space": {"type": "Discrete", "n": 4},
            "action_mask": "speed.x"}}, "no such leaf"),
    ({"m": {"observation_space": SCENE.to_json(), "action_space": SCENE.to_json(), "action_mask": ""}},
     "Dict or Tuple action space"),
    ({"m": {"observation_space": SCENE.to_json(), "action_space": {"type": "Discrete", "n": 4},
            "model": {"encoder": "cnn", "image_shape": [8, 8, 1]}}}, "take their shapes from their leaves"),
])
def test_the_configuration_refuses_what_cannot_work(modules: dict, message: str) -> None:
    config = ServerConfig(modules=modules, policy_mapping=[{"pattern": "*", "module": "m"}])
    with pytest.raises((ValueError, ModelConfigError)) as info:
        build_layout(config)
    assert message in str(info.value) and "'m'" in str(info.value)


def test_a_cnn_needs_an_image_leaf() -> None:
    space = Dict((("speed", box(-1, 1, (3,))),))
    with pytest.raises(ModelConfigError, match="needs an image leaf"):
        PPOLearner(space, Discrete(2), PPOHyperparams(model=SMALL_CNN), seed=0)


def test_the_default_mask_is_the_action_mask_leaf_and_announced() -> None:
    config = ServerConfig(observation_space=SCENE.to_json(), action_space={"type": "Discrete", "n": 4})
    spec = build_layout(config).specs["default_policy"]
    assert spec.action_mask_leaf == "action_mask"
    assert spec.to_json()["action_mask"] == "action_mask"
    assert spec.to_json()["onnx_input_names"] == ["action_mask", "camera", "speed"]
    off = ServerConfig(observation_space=SCENE.to_json(), action_space={"type": "Discrete", "n": 4}, action_mask="")
    assert build_layout(off).specs["default_policy"].action_mask_leaf is None


def test_a_centralized_critic_reads_composite_rows_of_other_agents() -> None:
    """value_obs of composite rows (§9.7: the listed agents' flat rows): the CNN reads each image of
    the critic's input with the same weights, and an update trains on it."""
    mask = resolve_action_mask(SCENE, Discrete(4), None)
    learner = PPOLearner(SCENE, Discrete(4), PPOHyperparams(model=SMALL_CNN, minibatch_size=32), seed=0,
                         value_obs_dim=2 * SCENE.flat_dim, action_mask=mask)
    obs = rows(SCENE, 33, seed=4)
    chunk = EpisodeChunk(obs=obs, actions=np.zeros(32, np.int64), rewards=np.ones(32, np.float32), action_logp=None,
                         action_dist_inputs=None, is_terminated=True, is_truncated=False)
    chunk.value_obs = np.concatenate([rows(SCENE, 33, seed=5), rows(SCENE, 33, seed=6)], axis=1)
    before = [p.detach().clone() for p in learner.model.parameters()]
    stats = learner.update(build_batch([chunk]))
    assert np.isfinite(stats["value_loss"]) if "value_loss" in stats else all(np.isfinite(v) for v in stats.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


def test_a_leaf_named_like_a_tensor_member_still_reads_its_attachment() -> None:
    """bind_attachment (§10.9) tells a composite obs from a tensor by its members' values, not names:
    a Dict leaf called "shape" is a leaf."""
    from tether.protocol.messages import decode_message
    from tether.protocol.multi_agent import ModuleSpec, decode_single_agent_record
    from tether.protocol.tensors import bind_attachment

    space = Dict((("shape", box(0, 255, (2,), dtype="uint8")), ("speed", box(-1, 1, (1,)))))
    spec = ModuleSpec("m", space, Discrete(2))
    record = {"obs": {"shape": {"dtype": "uint8", "shape": [2, 2], "offset": 0},
                      "speed": {"dtype": "float32", "shape": [2, 1], "offset": 4}},
              "actions": [1], "rewards": [0.0], "is_terminated": True, "is_truncated": False}
    import json
    import struct
    body = json.dumps({"type": "EPISODES", "episodes": [record]}).encode()
    attachment = bytes([1, 2, 3, 4]) + struct.pack("<2f", 0.5, -0.5)
    _, message = decode_message(body)
    bind_attachment(message, memoryview(attachment))
    chunk = decode_single_agent_record(message["episodes"][0], 0, {"m": spec}, "m", False).agents[0].chunk
    np.testing.assert_array_equal(chunk.obs, [[1, 2, 0.5], [3, 4, -0.5]])
