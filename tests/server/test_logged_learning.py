"""How the learner uses logged steps (protocol 1.6 §13.7) and demonstration datasets: never as samples of
its policy (no surrogate term, no logp check at ingest), cloned with ``bc_coef``, their values trained;
a dataset cloned beside PPO with a coefficient that decays; pretraining from a dataset."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tether.protocol.episodes import EpisodeChunk
from tether.protocol.multi_agent import DEFAULT_AGENT_ID, AgentChunk, MultiAgentRecord
from tether.protocol.spaces import Discrete, box
from tether.server.ingest.logp_check import PolicyHistory, _logp, check_behaviour_logp
from tether.server.learner import PPOHyperparams, PPOLearner
from tether.server.learner.rollout_batch import build_batch
from tether.server.sample_pool import split_chunk

OBS = box(-1, 1, (3,))


def chunk(n: int, logged: np.ndarray | None, actions: np.ndarray | None = None, logp: float = -0.69,
          seed: int = 0) -> EpisodeChunk:
    rng = np.random.default_rng(seed)
    return EpisodeChunk(obs=rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32),
                        actions=rng.integers(0, 2, n) if actions is None else actions,
                        rewards=rng.normal(size=n).astype(np.float32), action_logp=np.full(n, logp, np.float32),
                        action_dist_inputs=None, is_terminated=True, is_truncated=False, logged=logged)


def logp_of(learner: PPOLearner, c: EpisodeChunk) -> np.ndarray:
    with torch.no_grad():
        return _logp(learner.model, c.obs[:-1], c.actions)


def actor_parameters(learner: PPOLearner) -> list[torch.Tensor]:
    return [p.detach().clone() for name, p in learner.model.named_parameters() if "actor" in name]


def test_logged_steps_are_cloned_not_used_as_samples() -> None:
    """All steps logged, with a behaviour logp no policy has (-50): the update stays finite, has no
    surrogate term, and raises the probability of the logged actions by cloning them."""
    learner = PPOLearner(OBS, Discrete(2), PPOHyperparams(num_epochs=4, minibatch_size=64), seed=0)
    c = chunk(256, np.ones(256, bool), actions=np.ones(256, np.int64), logp=-50.0)
    before = logp_of(learner, c).mean()
    stats = learner.update(build_batch([c]))
    assert stats["policy_loss"] == 0.0 and stats["approx_kl"] == 0.0 and stats["logged_fraction"] == 1.0
    assert stats["bc_loss"] > 0 and np.isfinite(stats["value_loss"])
    assert logp_of(learner, c).mean() > before + 0.02  # (16 small Adam steps from a near-uniform policy)


def test_with_bc_coef_0_logged_steps_train_only_the_value() -> None:
    learner = PPOLearner(OBS, Discrete(2), PPOHyperparams(num_epochs=2, minibatch_size=64, bc_coef=0.0), seed=0)
    assert any("actor" in n for n, _ in learner.model.named_parameters())
    actor = actor_parameters(learner)
    value_before = [p.detach().clone() for n, p in learner.model.named_parameters() if "critic" in n]
    learner.update(build_batch([chunk(128, np.ones(128, bool), logp=-50.0)]))
    for a, b in zip(actor, actor_parameters(learner)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    after = [p for n, p in learner.model.named_parameters() if "critic" in n]
    assert any(not torch.equal(a, b) for a, b in zip(value_before, after))


def test_the_surrogate_runs_on_the_sampled_steps_of_a_mixed_batch() -> None:
    """Half the steps sampled (honest logp), half logged (logp -50): the ratios of sampled steps only make
    the KL statistic, which stays that of a small PPO step (with -50 counted it would be huge)."""
    learner = PPOLearner(OBS, Discrete(2), PPOHyperparams(num_epochs=2, minibatch_size=64), seed=0)
    logged = np.arange(256) % 2 == 1
    c = chunk(256, logged, logp=-50.0)
    honest = logp_of(learner, c)
    c.action_logp = np.where(logged, -50.0, honest).astype(np.float32)
    stats = learner.update(build_batch([c]))
    assert 0.0 <= stats["approx_kl"] < 0.1 and stats["logged_fraction"] == 0.5 and stats["policy_loss"] != 0.0


def test_logged_flags_survive_cuts_and_batches() -> None:
    c = chunk(6, np.array([0, 1, 1, 0, 0, 1], bool))
    head, tail = split_chunk(c, 2)
    assert head.logged.tolist() == [False, True] and tail.logged.tolist() == [True, False, False, True]
    batch = build_batch([chunk(3, None), tail])
    assert batch.logged.tolist() == [False] * 3 + [True, False, False, True]
    assert build_batch([chunk(3, None)]).logged is None


def test_logged_steps_are_not_checked_against_the_served_models() -> None:
    """§13.6: a logged Box action far outside anything the policy draws, with a made-up logp, passes the
    ingest check that refuses the same step unlogged."""
    learner = PPOLearner(OBS, box(-2, 2, (1,)), PPOHyperparams(), seed=0)
    history = PolicyHistory(1)
    history.add(0, learner.export_onnx(), learner.action_space)
    obs = np.zeros((4, 3), np.float32)
    actions = np.array([[2.0], [-2.0], [50.0]], np.float32)

    def record(logged: np.ndarray | None) -> list[MultiAgentRecord]:
        c = EpisodeChunk(obs=obs, actions=actions, rewards=np.zeros(3, np.float32), action_logp=np.zeros(3, np.float32),
                         action_dist_inputs=None, is_terminated=True, is_truncated=False, logged=logged)
        return [MultiAgentRecord("e", True, False, [AgentChunk(DEFAULT_AGENT_ID, "m", 0, c)])]

    check_behaviour_logp(record(np.ones(3, bool)), {"m": 0}, {"m": history})
    with pytest.raises(Exception, match="ACTION_LOGP_MISMATCH|action_logp"):
        check_behaviour_logp(record(None), {"m": 0}, {"m": history})


def episodes_of(obs: np.ndarray, actions: np.ndarray, length: int) -> list[EpisodeChunk]:
    """Demonstration episodes of ``length`` steps from step rows (each episode's last observation repeated
    as its final one)."""
    out = []
    for start in range(0, len(obs), length):
        o, a = obs[start:start + length], actions[start:start + length]
        out.append(EpisodeChunk(obs=np.concatenate([o, o[-1:]]), actions=a, rewards=np.ones(len(a), np.float32),
                                action_logp=None, action_dist_inputs=None, is_terminated=True, is_truncated=False))
    return out


def test_a_dataset_is_cloned_beside_ppo_with_a_decaying_coefficient() -> None:
    hp = PPOHyperparams(num_epochs=2, minibatch_size=64, demo_coef=2.0, demo_decay_updates=2)
    learner = PPOLearner(OBS, Discrete(2), hp, seed=0)
    rng = np.random.default_rng(1)
    demo_obs = rng.uniform(-1, 1, (300, 3)).astype(np.float32)
    demo_actions = (demo_obs[:, 0] > 0).astype(np.int64)  # an expert whose choice the observation decides
    learner.set_demonstrations(episodes_of(demo_obs, demo_actions, 30))
    seen = []
    for _ in range(3):
        stats = learner.update(build_batch([chunk(128, None, seed=len(seen))]))
        seen.append(stats.get("demo_coef"))
    assert seen == [2.0, 1.0, None]  # decayed linearly to 0 over 2 updates, then gone
    assert learner.state_dict()["demo_updates"] == 2
    with torch.no_grad():
        agree = (learner.model.dist_inputs(torch.as_tensor(demo_obs)).argmax(-1).numpy() == demo_actions).mean()
    assert agree > 0.7


def test_pretraining_clones_a_dataset() -> None:
    learner = PPOLearner(OBS, Discrete(2), PPOHyperparams(minibatch_size=64), seed=0)
    rng = np.random.default_rng(2)
    obs = rng.uniform(-1, 1, (512, 3)).astype(np.float32)
    actions = (obs[:, 1] + obs[:, 2] > 0).astype(np.int64)
    losses = learner.pretrain(episodes_of(obs, actions, 32), np.ones(512, np.float32), epochs=30)
    assert losses[-1] < 0.3 < losses[0]
    with torch.no_grad():
        agree = (learner.model.dist_inputs(torch.as_tensor(obs)).argmax(-1).numpy() == actions).mean()
    assert agree > 0.9


def cue_episodes(count: int, length: int, seed: int) -> list[EpisodeChunk]:
    """An expert that names, at every step, a cue shown only in its episode's first observation."""
    rng = np.random.default_rng(seed)
    out = []
    for cue in rng.integers(0, 2, count):
        obs = np.zeros((length + 1, 3), np.float32)
        obs[0] = [1.0, float(cue), 0.0]
        obs[1:, 2] = 1.0
        out.append(EpisodeChunk(obs=obs, actions=np.full(length, cue), rewards=np.zeros(length, np.float32),
                                action_logp=None, action_dist_inputs=None, is_terminated=True, is_truncated=False))
    return out


def greedy_last_step_accuracy(learner: PPOLearner, episodes: list[EpisodeChunk]) -> float:
    """How often the greedy action at each episode's last step names its cue (the model run from zeros)."""
    right = 0
    with torch.no_grad():
        for e in episodes:
            state = None if learner.recurrent is None else tuple(
                torch.zeros(1, learner.recurrent.size) for _ in learner.recurrent.state_names)
            for o in e.obs[:-1]:
                x = torch.as_tensor(o[None])
                if state is None:
                    dist = learner.model.dist_inputs(x)
                else:
                    dist, _, state = learner.model.step(x, x, state)
            right += int(dist.argmax(-1).item() == e.actions[-1])
    return right / len(episodes)


def test_a_network_with_memory_clones_what_only_memory_can_imitate() -> None:
    """Demonstrations for a module with memory are cloned along sequences from each episode's zero state
    (cloning.py): a GRU learns to name a cue it saw 6 steps before; an MLP, given the same episodes,
    stays at chance at the last step."""
    train, held_out = cue_episodes(200, 6, seed=0), cue_episodes(100, 6, seed=1)
    gru = PPOLearner(OBS, Discrete(2), PPOHyperparams(minibatch_size=120, lr=3e-3, model={
        "recurrent": {"type": "gru", "size": 16, "seq_len": 8}}), seed=0)
    losses = gru.pretrain(train, None, epochs=40)
    mlp = PPOLearner(OBS, Discrete(2), PPOHyperparams(minibatch_size=120, lr=3e-3), seed=0)
    mlp.pretrain(train, None, epochs=40)
    assert losses[-1] < losses[0] / 4, losses
    assert greedy_last_step_accuracy(gru, held_out) >= 0.95
    assert greedy_last_step_accuracy(mlp, held_out) <= 0.7
    # The same sequences as a cloning term beside PPO: the term is computed and the update stays finite.
    gru.hp.demo_coef = 1.0
    gru.set_demonstrations(train)
    stats = gru.update(build_batch([replace(c, state_in=np.zeros((1, 16), np.float32), action_logp=np.full(6, -0.69,
                                                                                                         np.float32))
                                    for c in cue_episodes(8, 6, seed=2)]))
    assert stats["demo_bc_loss"] < 0.2 and np.isfinite(stats["value_loss"])
    critic = PPOLearner(OBS, Discrete(2), PPOHyperparams(model={"recurrent": {"type": "gru", "size": 8}}), seed=0,
                        value_obs_dim=6)
    with pytest.raises(ValueError, match="centralized critic"):
        critic.set_demonstrations(train)


def test_a_module_with_memory_clones_logged_steps_in_sequence_minibatches() -> None:
    """Sequence minibatches (learner/sequences.py) index steps as step minibatches do: logged steps with a
    behaviour logp no policy gives (-50) are neither screened out (untrainable_steps) nor in the surrogate;
    cloning them raises the probability of their actions, the state recomputed from state_in."""
    hp = PPOHyperparams(num_epochs=4, minibatch_size=32, model={"recurrent": {"type": "gru", "size": 8, "seq_len": 8}})
    learner = PPOLearner(OBS, Discrete(2), hp, seed=0)
    logged = np.arange(64) % 4 != 0
    c = chunk(64, logged, actions=np.ones(64, np.int64), logp=-50.0)
    c.state_in = np.zeros((1, 8), np.float32)
    batch = build_batch([c])
    bad = learner.untrainable_steps(batch)
    assert not bad[logged].any() and bad[~logged].all()  # (the sampled steps' -50 is far from any policy)
    c.action_logp = np.where(logged, -50.0, np.log(0.5)).astype(np.float32)  # (sampled: near the initial policy's)
    batch = build_batch([c])
    assert not learner.untrainable_steps(batch).any()

    def mean_logp() -> float:
        from tether.server.learner.sequences import state_pass
        return float(learner._current_logp(batch, state_pass(learner.model, batch, learner.device))[logged].mean())

    before = mean_logp()
    stats = learner.update(batch)
    assert stats["bc_loss"] > 0 and stats["logged_fraction"] == 0.75 and 0.0 <= stats["approx_kl"] < 0.1
    assert mean_logp() > before + 0.02


@pytest.mark.parametrize("option", ["bc_coef", "demo_coef", "demo_decay_updates"])
def test_a_negative_cloning_coefficient_is_refused_at_start(option: str) -> None:
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout

    config = ServerConfig(port=0, tensorboard=False, observation_space={"type": "Box", "shape": [3], "low": -1, "high": 1},
                          action_space={"type": "Discrete", "n": 2}, **{option: -1})
    with pytest.raises(ValueError, match="must be >= 0"):
        build_layout(config)
