"""The hand-written ONNX policy matches the torch module in onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tether.sdk.policy import OnnxPolicy
from tether.protocol import Box, Discrete, MultiDiscrete
from tether.protocol.spaces import box
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.learner.onnx_export import DEFAULT_INPUT_NAME


@pytest.mark.parametrize("action_space", [Discrete(3), MultiDiscrete((2, 4)), Box(low=-np.ones(2), high=np.ones(2))],
                         ids=["discrete", "multidiscrete", "box"])
def test_parity_with_torch_after_training_steps(action_space) -> None:
    learner = PPOLearner(box(-5, 5, (6,)), action_space, PPOHyperparams(hidden_sizes=(32, 16)), seed=0)
    # Perturb weights so parity is not only checked at initialisation.
    with torch.no_grad():
        for p in learner.model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model_bytes = learner.export_onnx()
    onnx.checker.check_model(onnx.load_from_string(model_bytes))
    session = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].name == DEFAULT_INPUT_NAME
    obs = np.random.default_rng(0).normal(size=(257, 6)).astype(np.float32)
    got = session.run(None, {DEFAULT_INPUT_NAME: obs})[0]
    with torch.no_grad():
        want = learner.model.dist_inputs(torch.from_numpy(obs)).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sdk_policy_loads_export_and_checks_output_width() -> None:
    learner = PPOLearner(box(-1, 1, (4,)), Discrete(2), PPOHyperparams(), seed=0)
    policy = OnnxPolicy(learner.export_onnx(), Discrete(2))
    action, logp, dist = policy.sample(np.zeros(4, np.float32))
    assert action in (0, 1) and logp < 0 and dist.shape == (2,)
    with pytest.raises(ValueError, match="needs 3"):
        OnnxPolicy(learner.export_onnx(), Discrete(3))


def test_custom_io_names() -> None:
    learner = PPOLearner(box(-1, 1, (4,)), Discrete(2), PPOHyperparams(), onnx_input_name="obs",
                         onnx_output_name="logits")
    session = ort.InferenceSession(learner.export_onnx(), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs"]
    assert [o.name for o in session.get_outputs()] == ["logits"]
