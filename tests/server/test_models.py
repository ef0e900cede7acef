"""The model seam: built-in CNN and user networks, exported once per architecture and rewritten per
version, in parity with torch; model descriptions checked with clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tether.protocol import Box, Discrete, EpisodeChunk, MultiDiscrete
from tether.protocol.spaces import box
from tether.server.config import ServerConfig
from tether.server.learner import PPOHyperparams, PPOLearner, build_batch
from tether.server.learner.model_config import NATURE_CONV, ModelConfigError, parse_model_config
from tether.server.module_setup import build_layout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL_CNN = {"encoder": "cnn", "image_shape": [10, 12, 2], "conv": [[4, 3, 1], [8, 3, 2]], "dense": 16}
IMAGE = 10 * 12 * 2


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def onnx_outputs(model_bytes: bytes, obs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: obs})[0]


def torch_outputs(learner: PPOLearner, obs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return learner.model.dist_inputs(torch.from_numpy(obs)).numpy()


def perturb(learner: PPOLearner, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


CASES = {
    "cnn_one_image": (SMALL_CNN, IMAGE, Discrete(5)),
    "cnn_two_images": (SMALL_CNN, 2 * IMAGE, MultiDiscrete((3, 2))),
    "cnn_box_actions": (SMALL_CNN, IMAGE, Box(low=-np.ones(2), high=np.ones(2))),
    "user_discrete": ({"class": "custom_model:ResidualMlp", "options": {"width": 32}}, 7, Discrete(4)),
    "user_box": ({"class": "custom_model:ResidualMlp", "options": {"blocks": 1}}, 7, Box(low=-np.ones(3), high=np.ones(3))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_version_exports_the_current_weights_in_parity_with_torch(case: str) -> None:
    model, obs_dim, action_space = CASES[case]
    learner = PPOLearner(box(0, 255, (obs_dim,)), action_space, PPOHyperparams(model=model, hidden_sizes=(16,)), seed=0)
    obs = np.random.default_rng(1).uniform(0, 255, size=(33, obs_dim)).astype(np.float32)
    first = learner.export_onnx()  # traces the graph
    onnx.checker.check_model(onnx.load_from_string(first))
    np.testing.assert_allclose(onnx_outputs(first, obs), torch_outputs(learner, obs), rtol=1e-4, atol=1e-5)
    for version in range(2):  # later versions only rewrite the weights: they must be the new ones
        perturb(learner, version)
        exported = learner.export_onnx()
        want = torch_outputs(learner, obs)
        assert not np.allclose(onnx_outputs(first, obs), want, atol=1e-4), "the weights did not change"
        np.testing.assert_allclose(onnx_outputs(exported, obs), want, rtol=1e-4, atol=1e-5)
        assert onnx_outputs(exported, obs[:1]).shape == (1, want.shape[1])  # any batch size


def test_nature_cnn_on_84x84x4_by_default() -> None:
    learner = PPOLearner(box(0, 255, (84 * 84 * 4,)), Discrete(6),
                         PPOHyperparams(model={"encoder": "cnn", "image_shape": [84, 84, 4]}, hidden_sizes=()), seed=0)
    convs = [m for m in learner.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == list(NATURE_CONV)
    obs = np.random.default_rng(0).integers(0, 256, size=(4, 84 * 84 * 4)).astype(np.float32)
    learner.export_onnx()
    perturb(learner, 0)
    np.testing.assert_allclose(onnx_outputs(learner.export_onnx(), obs), torch_outputs(learner, obs),
                               rtol=1e-4, atol=1e-5)


def test_the_default_mlp_keeps_its_fixed_graph() -> None:
    """RLlib's v1 client runs the default network: Gemm/Tanh with the input name it feeds."""
    learner = PPOLearner(box(-1, 1, (4,)), Discrete(2), PPOHyperparams(model=None), seed=0)
    graph = onnx.load_from_string(learner.export_onnx()).graph
    assert {n.op_type for n in graph.node} <= {"Gemm", "Tanh", "Identity"}
    assert graph.input[0].name == "onnx::Gemm_0"


def image_bandit(n: int, rng: np.random.Generator, learner: PPOLearner) -> tuple[list[EpisodeChunk], np.ndarray]:
    """One-step episodes on 10x12x2 images, actions sampled from ``learner``'s policy: bright images
    pay for action 1, dark ones for action 0. Also returns which images were bright."""
    bright = rng.integers(2, size=n)
    images = np.where(bright[:, None], rng.uniform(150, 255, (n, IMAGE)), rng.uniform(0, 100, (n, IMAGE)))
    images = images.astype(np.float32)
    probs = torch.softmax(torch.from_numpy(torch_outputs(learner, images)), -1).numpy().astype(np.float64)
    chunks = []
    for i in range(n):
        action = int(rng.choice(2, p=probs[i] / probs[i].sum()))
        chunks.append(EpisodeChunk(
            obs=np.stack([images[i], images[i]]), actions=np.array([action]),
            rewards=np.array([float(action == bright[i])], np.float32),
            action_logp=np.array([np.log(probs[i, action])], np.float32), action_dist_inputs=None,
            is_terminated=True, is_truncated=False))
    return chunks, bright


def test_a_cnn_learns_what_the_image_shows() -> None:
    """Which action pays depends only on the image: the CNN's policy must read it (a policy that does not
    is right half the time, the untrained one too)."""
    learner = PPOLearner(box(0, 255, (IMAGE,)), Discrete(2),
                         PPOHyperparams(model=SMALL_CNN, hidden_sizes=(), lr=3e-3, num_epochs=4, minibatch_size=64), seed=0)
    test, bright = image_bandit(200, np.random.default_rng(7), learner)
    obs = np.stack([c.obs[0] for c in test])

    def p_right() -> float:
        probs = torch.softmax(torch.from_numpy(torch_outputs(learner, obs)), -1).numpy()
        return float(probs[np.arange(len(test)), bright].mean())

    before = p_right()
    rng = np.random.default_rng(0)
    for _ in range(14):
        learner.update(build_batch(image_bandit(256, rng, learner)[0]))
    assert abs(before - 0.5) < 0.05 and p_right() > 0.9, (before, p_right())


def test_a_cnn_critic_reads_every_agents_image() -> None:
    """A centralized critic over image observations: the same CNN reads each agent's image."""
    learner = PPOLearner(box(0, 255, (IMAGE,)), Discrete(2), PPOHyperparams(model=SMALL_CNN, hidden_sizes=(8,)),
                         seed=0, value_obs_dim=2 * IMAGE)
    critic_input = torch.rand(5, 3 * IMAGE) * 255
    assert learner.model.value(critic_input).shape == (5,)
    changed = critic_input.clone()
    changed[:, :IMAGE] = 0  # another agent's image
    assert not torch.allclose(learner.model.value(critic_input), learner.model.value(changed))


def test_a_resumed_learner_exports_the_same_model() -> None:
    hp = PPOHyperparams(model=SMALL_CNN)
    a = PPOLearner(box(0, 255, (IMAGE,)), Discrete(3), hp, seed=0)
    perturb(a, 3)
    b = PPOLearner(box(0, 255, (IMAGE,)), Discrete(3), PPOHyperparams(model=SMALL_CNN), seed=1)
    b.export_onnx()
    b.load_state_dict(a.state_dict())
    obs = np.random.default_rng(0).uniform(0, 255, size=(3, IMAGE)).astype(np.float32)
    np.testing.assert_array_equal(onnx_outputs(b.export_onnx(), obs), onnx_outputs(a.export_onnx(), obs))


@pytest.mark.parametrize("raw, obs_dim, message", [
    ("cnn", 4, "must be a table"),
    ({"encoder": "rnn"}, 4, "encoder must be one of mlp, cnn"),
    ({"encoder": "cnn"}, 4, "needs image_shape"),
    ({"encoder": "cnn", "image_shape": [2, 2]}, 4, "needs image_shape"),
    ({"encoder": "cnn", "image_shape": [84, 84, 4]}, 84 * 84 * 3, "holds 28224 values, but the observation has 21168"),
    ({"encoder": "cnn", "image_shape": [8, 8, 1]}, 64, "shrink a 8x8 image to nothing"),
    ({"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[4, 3, 0]]}, 64, "conv values must be a positive integer"),
    ({"encoder": "cnn", "image_shape": [8, 8, 1], "conv": [[4, 3, 1]], "scale": -1}, 64, "scale must be a positive"),
    ({"encoder": "mlp", "dense": 5}, 4, "only apply to encoder 'cnn'"),
    ({"encoder": "cnn", "image_shape": [8, 8, 1], "options": {"a": 1}}, 64, "options are for a user class"),
    ({"hidden": [3]}, 4, "unknown member(s) hidden"),
    ({"class": "no_colon"}, 4, "package.module:Class"),
])
def test_bad_model_descriptions_are_named(raw, obs_dim: int, message: str) -> None:
    with pytest.raises(ModelConfigError, match="^module 'm': model") as caught:
        parse_model_config(raw, obs_dim, "m")
    assert message in str(caught.value)


@pytest.mark.parametrize("target, message", [
    ("no_such_package.models:Net", "cannot import 'no_such_package.models:Net'"),
    ("custom_model:NoSuchClass", "cannot import"),
    ("custom_model:ResidualBlock", "is not a subclass of tether.server.learner.policy_model.PolicyModel"),
])
def test_user_classes_that_cannot_be_a_network_are_named(target: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match="model") as caught:
        PPOLearner(box(-1, 1, (4,)), Discrete(2), PPOHyperparams(model={"class": target}), seed=0)
    assert message in str(caught.value)


def test_a_user_network_with_the_wrong_output_width_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "narrow_model.py").write_text(
        "import torch\nfrom tether.server.learner.policy_model import PolicyModel\n"
        "class Narrow(PolicyModel):\n"
        "    def __init__(self, observation_space, action_space, obs_dim, critic_input_dim):\n"
        "        super().__init__(); self.pi = torch.nn.Linear(obs_dim, 2); self.v = torch.nn.Linear(critic_input_dim, 1)\n"
        "    def dist_inputs(self, obs): return self.pi(obs)\n"
        "    def value(self, x): return self.v(x).squeeze(-1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelConfigError, match=r"returns dist_inputs of shape \(2, 2\).*needs \(2, 5\)"):
        PPOLearner(box(-1, 1, (4,)), Discrete(5), PPOHyperparams(model={"class": "narrow_model:Narrow"}), seed=0)
    sys.modules.pop("narrow_model", None)


def test_the_server_names_the_module_whose_model_is_wrong() -> None:
    config = ServerConfig(modules={
        "ok": {"observation_space": {"type": "Box", "low": 0, "high": 1, "shape": [4]},
               "action_space": {"type": "Discrete", "n": 2}},
        "eyes": {"observation_space": {"type": "Box", "low": 0, "high": 1, "shape": [30]},
                 "action_space": {"type": "Discrete", "n": 2}, "model": {"encoder": "cnn", "image_shape": [4, 4, 1]}},
    }, policy_mapping=[{"pattern": "*", "module": "ok"}])
    with pytest.raises(ValueError, match="module 'eyes': model: image_shape \\[4, 4, 1\\] holds 16 values"):
        build_layout(config)


def scaled_chunks(n: int, rng: np.random.Generator, scale: float, offset: float) -> list[EpisodeChunk]:
    return [EpisodeChunk(
        obs=(rng.normal(size=(3, 4)) * scale + offset).astype(np.float32), actions=np.array([0, 1]),
        rewards=np.array([1.0, 0.0], np.float32), action_logp=np.array([np.log(0.5)] * 2, np.float32),
        action_dist_inputs=None, is_terminated=True, is_truncated=False) for _ in range(n)]


def test_normalisation_statistics_are_those_of_every_observation_trained_on() -> None:
    learner = PPOLearner(box(-1e6, 1e6, (4,)), Discrete(2), PPOHyperparams(normalize_observations=True), seed=0)
    rng = np.random.default_rng(0)
    first, second = scaled_chunks(40, rng, 1000.0, 500.0), scaled_chunks(60, rng, 10.0, -3.0)
    seen = []
    for chunks in (first, second):
        learner.update(build_batch(chunks))
        seen += [c.obs for c in chunks]
    every = np.concatenate(seen).astype(np.float64)
    np.testing.assert_allclose(learner.model.running_mean.numpy(), every.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(learner.model.running_var.numpy(), every.var(axis=0), rtol=1e-9)
    # The exported graph carries them: raw observations in, the network's outputs on normalised ones out.
    obs = (rng.normal(size=(5, 4)) * 1000 + 500).astype(np.float32)
    np.testing.assert_allclose(onnx_outputs(learner.export_onnx(), obs), torch_outputs(learner, obs),
                               rtol=1e-4, atol=1e-5)
    inner = learner.model.inner
    normalised = np.clip((obs - every.mean(0)) / np.sqrt(every.var(0) + 1e-8), -10, 10).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(torch_outputs(learner, obs), inner.dist_inputs(torch.from_numpy(normalised)).numpy(),
                                   rtol=1e-4, atol=1e-5)


def test_normalised_values_are_clipped_and_a_critic_normalises_each_observation() -> None:
    learner = PPOLearner(box(-1e6, 1e6, (4,)), Discrete(2), PPOHyperparams(normalize_observations=True,
                                                                          normalize_clip=2.0),
                         seed=0, value_obs_dim=4)
    normalizer = learner.model
    normalizer.observe(np.random.default_rng(0).normal(size=(500, 4)))
    far = torch.full((1, 4), 1e5)
    assert torch.equal(normalizer.normalize(far), torch.full((1, 4), 2.0))
    two = torch.cat([far, -far], dim=1)  # another agent's observation, then the own one
    assert torch.equal(normalizer.normalize(two), torch.tensor([[2.0] * 4 + [-2.0] * 4]))


def test_normalisation_is_rolled_back_with_the_weights_and_resumed_from_a_checkpoint() -> None:
    from tether.server.learner import NonFiniteUpdate

    hp = PPOHyperparams(normalize_observations=True)
    learner = PPOLearner(box(-1e6, 1e6, (4,)), Discrete(2), hp, seed=0)
    learner.update(build_batch(scaled_chunks(30, np.random.default_rng(0), 5.0, 1.0)))
    before = learner.model.running_mean.clone()
    poisoned = scaled_chunks(30, np.random.default_rng(1), 5.0, 1.0)
    poisoned[0].rewards[0] = np.float32(3e38)  # overflows the value loss: the update is undone
    with pytest.raises(NonFiniteUpdate):
        learner.update(build_batch(poisoned))
    assert torch.equal(learner.model.running_mean, before)
    resumed = PPOLearner(box(-1e6, 1e6, (4,)), Discrete(2), PPOHyperparams(normalize_observations=True), seed=5)
    resumed.load_state_dict(learner.state_dict())
    obs = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32) * 5
    np.testing.assert_array_equal(onnx_outputs(resumed.export_onnx(), obs), onnx_outputs(learner.export_onnx(), obs))


def test_normalisation_with_the_cnn_is_refused_at_start() -> None:
    config = ServerConfig(observation_space={"type": "Box", "low": 0, "high": 255, "shape": [16]},
                          action_space={"type": "Discrete", "n": 2}, normalize_observations=True,
                          model={"encoder": "cnn", "image_shape": [4, 4, 1], "conv": [[2, 2, 1]], "dense": 4})
    with pytest.raises(ValueError, match="normalize_observations applies to vector observations"):
        build_layout(config)


def test_a_user_network_that_fails_is_named_with_its_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import, construction, a failing dist_inputs and a weight frozen into the graph: each stops the server at
    start with the module's name, never a traceback."""
    from tether.server.trainer import Trainer

    (tmp_path / "broken_models.py").write_text(
        "import torch\nfrom tether.server.learner.policy_model import PolicyModel\n"
        "class Base(PolicyModel):\n"
        "    def __init__(self, observation_space, action_space, obs_dim, critic_input_dim, fail=False):\n"
        "        super().__init__()\n"
        "        if fail: raise ValueError('no such layer')\n"
        "        self.pi = torch.nn.Linear(obs_dim, 2); self.v = torch.nn.Linear(critic_input_dim, 1)\n"
        "        self.temp = torch.nn.Parameter(torch.tensor(1.0))\n"
        "    def dist_inputs(self, obs): return self.pi(obs)\n"
        "    def value(self, x): return self.v(x).squeeze(-1)\n"
        "class Raises(Base):\n"
        "    def dist_inputs(self, obs): raise RuntimeError('shape trouble')\n"
        "class Frozen(Base):\n"
        "    def dist_inputs(self, obs): return self.pi(obs) * self.temp.item()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    box4 = {"type": "Box", "low": -1, "high": 1, "shape": [4]}
    for model, message in [({"class": "broken_models:Base", "options": {"fail": True}}, "no such layer"),
                           ({"class": "broken_models:Raises"}, "fails on 2 observations"),
                           ({"class": "broken_models:Frozen"}, "does not follow the network's weights"),
                           ({"class": "nope_pkg:X"}, "cannot import")]:
        config = ServerConfig(tensorboard=False, logdir=str(tmp_path / "run"), quiet=True,
                              modules={"pilot": {"observation_space": box4, "action_space": {"type": "Discrete", "n": 2},
                                                 "model": model}},
                              policy_mapping=[{"pattern": "*", "module": "pilot"}])
        with pytest.raises(ModelConfigError, match="^module 'pilot': model") as caught:
            Trainer(config, build_layout(config))
        assert message in str(caught.value)
    sys.modules.pop("broken_models", None)
