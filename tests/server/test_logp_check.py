"""Behaviour logp is checked against the models the server served: what a real
client computes with ONNX Runtime passes with a wide margin, a made-up value
is refused with ACTION_LOGP_MISMATCH."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tether.sdk.policy import OnnxPolicy
from tether.protocol import Discrete, EpisodeChunk, MessageError
from tether.protocol.distributions import sample
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.protocol.spaces import MultiDiscrete, box
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.learner.distributions import ActionDistribution
from tether.server.ingest.logp_check import LOGP_TOLERANCE_ABS, PolicyHistory, _logp, check_behaviour_logp

OBS = box(-10, 10, (5,))
SPACES = {"discrete": Discrete(3), "multi_discrete": MultiDiscrete((2, 3)), "box": box(-1, 1, (2,))}


def client_data(learner: PPOLearner, steps: int, seed: int) -> EpisodeChunk:
    """What an SDK client records: ONNX Runtime dist inputs, the raw sample and its logp."""
    policy = OnnxPolicy(learner.export_onnx(), learner.action_space)
    rng, obs_rng = random.Random(seed), np.random.default_rng(seed)
    obs = obs_rng.normal(scale=3.0, size=(steps + 1, 5)).astype(np.float32)
    actions, logps = [], []
    for o in obs[:-1]:
        a, lp = sample(learner.action_space, policy.dist_inputs(o[None])[0], rng)
        actions.append(a)
        logps.append(lp)
    return EpisodeChunk(obs, np.asarray(actions), np.ones(steps, np.float32), np.asarray(logps, np.float32), None,
                        False, False)


def records(chunk: EpisodeChunk) -> list[MultiAgentRecord]:
    return [MultiAgentRecord(None, False, False, [AgentChunk("default_agent", "m", 0, chunk)])]


@pytest.mark.parametrize("kind", list(SPACES))
def test_onnx_runtime_logp_is_far_inside_the_tolerance(kind: str) -> None:
    learner = PPOLearner(OBS, SPACES[kind], PPOHyperparams(), seed=0)
    if learner.model.log_std is not None:
        learner.model.log_std.data.fill_(-5.0)  # a narrow Gaussian amplifies float32 differences
    chunk = client_data(learner, 500, seed=1)
    recomputed = _logp(learner.model, chunk.obs[:-1], chunk.actions)
    act_dtype = torch.float32 if kind == "box" else torch.long
    reference = ActionDistribution(learner.action_space, learner.model.dist_inputs(torch.as_tensor(chunk.obs[:-1])))
    np.testing.assert_allclose(recomputed, reference.log_prob(torch.as_tensor(chunk.actions, dtype=act_dtype))
                               .detach().numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(recomputed - chunk.action_logp).max() < LOGP_TOLERANCE_ABS / 10
    history = PolicyHistory(keep=2)
    history.add(0, learner.export_onnx(), learner.action_space)
    check_behaviour_logp(records(chunk), {"m": 0}, {"m": history})  # accepted


def test_made_up_logp_is_refused_and_older_kept_versions_count() -> None:
    learner = PPOLearner(OBS, Discrete(3), PPOHyperparams(), seed=0)
    history = PolicyHistory(keep=2)
    history.add(0, learner.export_onnx(), learner.action_space)
    old_data = client_data(learner, 50, seed=2)
    with torch.no_grad():
        learner.model.actor[-1].bias.add_(torch.tensor([3.0, 0.0, -3.0]))  # version 1 is a different policy
    history.add(1, learner.export_onnx(), learner.action_space)
    # Data computed with v0 but claiming v1 (a batch that straddled a model swap) is explained by a kept version.
    check_behaviour_logp(records(old_data), {"m": 1}, {"m": history})
    poisoned = client_data(learner, 50, seed=3)
    poisoned.action_logp[7] = -1000.0
    with pytest.raises(MessageError) as err:
        check_behaviour_logp(records(poisoned), {"m": 1}, {"m": history})
    assert err.value.code.value == "ACTION_LOGP_MISMATCH" and "episodes[0]: action_logp[7] = -1000" in err.value.message
    # A version the server no longer keeps (or never served) is not checked here: its data is dropped as stale.
    check_behaviour_logp(records(poisoned), {"m": 9}, {"m": history})
    history.add(2, learner.export_onnx(), learner.action_space)
    assert history.versions == [1, 2]


def test_per_step_versions_are_checked_by_their_own_kept_version_only() -> None:
    """A chunk whose runs name an evicted version for its first steps and a kept one for the rest:
    the old steps (no kept model explains them) are not checked, since they are refused as stale;
    the kept ones are, whatever the message claims."""
    learner = PPOLearner(OBS, Discrete(3), PPOHyperparams(), seed=0)
    history = PolicyHistory(keep=2)
    history.add(0, learner.export_onnx(), learner.action_space)
    v0 = client_data(learner, 20, seed=4)
    for version, shift in ((1, 3.0), (2, -6.0)):  # v1 and v2 are different policies; v0 is evicted
        with torch.no_grad():
            learner.model.actor[-1].bias.add_(torch.tensor([shift, 0.0, -shift]))
        history.add(version, learner.export_onnx(), learner.action_space)
    v2 = client_data(learner, 20, seed=5)
    mixed = EpisodeChunk(np.concatenate([v0.obs[:-1], v2.obs]), np.concatenate([v0.actions, v2.actions]),
                         np.ones(40, np.float32), np.concatenate([v0.action_logp, v2.action_logp]), None, False, False,
                         step_versions=np.array([-1] * 20 + [2] * 20))  # (an evicted version arrives as -1)
    assert np.abs(_logp(learner.model, v0.obs[:-1], v0.actions) - v0.action_logp).max() > LOGP_TOLERANCE_ABS
    check_behaviour_logp(records(mixed), {"m": -1}, {"m": history})  # accepted: v0's steps are not checked
    mixed.action_logp[25] = -1000.0
    with pytest.raises(MessageError) as err:
        check_behaviour_logp(records(mixed), {"m": -1}, {"m": history})
    assert "action_logp[25]" in err.value.message


def test_a_large_observation_module_has_a_random_sample_of_each_message_checked(monkeypatch) -> None:
    """Image observations (>= LARGE_OBSERVATION_VALUES values): SAMPLED_STEPS steps of a message go
    through the model, chosen at random; a message whose every logp is made up is still refused,
    and one with a single made-up step is caught in about SAMPLED_STEPS / steps of its sendings."""
    from tether.server.ingest import logp_check

    image = box(0, 255, (16, 16, 16), dtype="uint8")  # 4096 values
    learner = PPOLearner(image, Discrete(3), PPOHyperparams(model={"encoder": "cnn", "image_shape": [16, 16, 16],
                                                                   "conv": [[4, 4, 4]], "dense": 8}), seed=0)
    history = PolicyHistory(keep=1)
    history.add(0, learner.export_onnx(), learner.action_space, image)
    steps = 200
    obs = np.random.default_rng(0).integers(0, 256, (steps + 1, 16, 16, 16)).astype(np.uint8)
    actions = np.zeros(steps, np.int64)
    true_logp = history.model(0).dist_inputs(obs[:-1])
    true_logp = true_logp[:, 0] - np.log(np.exp(true_logp).sum(-1))
    rows_seen: list[int] = []
    real = logp_check._logp
    monkeypatch.setattr(logp_check, "_logp", lambda m, o, a: (rows_seen.append(len(o)), real(m, o, a))[1])

    def chunk(logp: np.ndarray) -> EpisodeChunk:
        return EpisodeChunk(obs, actions, np.zeros(steps, np.float32), logp.astype(np.float32), None, True, False)

    check_behaviour_logp(records(chunk(true_logp)), {"m": 0}, {"m": history})
    assert rows_seen == [logp_check.SAMPLED_STEPS]
    with pytest.raises(MessageError):
        check_behaviour_logp(records(chunk(true_logp - 5.0)), {"m": 0}, {"m": history})
    one_lie = true_logp.copy()
    one_lie[123] = -1000.0
    caught = 0
    for _ in range(200):
        try:
            check_behaviour_logp(records(chunk(one_lie)), {"m": 0}, {"m": history})
        except MessageError:
            caught += 1
    assert 0.06 < caught / 200 < 0.30, caught  # about 32 / 200 = 0.16


def test_several_chunks_are_checked_each_by_its_own_observations() -> None:
    """Three records of different lengths in one message: a step of the last one with a made-up
    logp is named by its record and step, and honest steps of every record pass (each step is
    checked against its own observation, not a neighbour's)."""
    learner = PPOLearner(OBS, Discrete(3), PPOHyperparams(), seed=0)
    with torch.no_grad():
        learner.model.actor[-1].weight.mul_(50.0)  # observations decide the action probabilities
    history = PolicyHistory(keep=2)
    history.add(0, learner.export_onnx(), learner.action_space)
    chunks = [client_data(learner, n, seed=10 + n) for n in (7, 1, 12)]
    several = [r for c in chunks for r in records(c)]
    check_behaviour_logp(several, {"m": 0}, {"m": history})
    # A neighbour's observation gives another logp: a check that mixed up rows would refuse honest data.
    assert np.abs(_logp(learner.model, chunks[2].obs[1:-1], chunks[2].actions[:-1])
                  - chunks[2].action_logp[:-1]).max() > LOGP_TOLERANCE_ABS
    chunks[2].action_logp[4] = -1000.0
    with pytest.raises(MessageError) as err:
        check_behaviour_logp(several, {"m": 0}, {"m": history})
    assert "episodes[2]: action_logp[4] = -1000" in err.value.message
