"""Networks with memory on the server (model ``recurrent``): their description, the exported model with
its state as inputs and outputs in parity with torch step after step (every built-in combination), and
training on sequences: each chunk run from its recorded state, parts the pool cuts advanced over the
observations before them, windows that train every step once, burn-in, padding kept out of the losses."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tether.protocol.action_mask import resolve_action_mask
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import Dict, Discrete, box
from tether.server.learner.model_config import ModelConfigError, parse_model_config
from tether.server.learner.ppo import PPOHyperparams, PPOLearner
from tether.server.learner.rollout_batch import build_batch
from tether.server.learner.sequences import run_windows, state_pass, windows
from tether.server.sample_pool import split_chunk

SMALL_CNN = {"encoder": "cnn", "image_shape": [6, 6, 1], "conv": [[4, 3, 1]], "dense": 8}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """As the server runs its learner (torch_threads): small sequential steps, no thread hand-offs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("raw, message", [
    ({"recurrent": "lstm"}, "recurrent must be a table"),
    ({"recurrent": {"type": "rnn"}}, "recurrent type must be 'lstm' or 'gru'"),
    ({"recurrent": {"type": "lstm", "size": 0}}, "recurrent size must be a positive integer"),
    ({"recurrent": {"type": "lstm", "size": 5000}}, "above the limit 4096"),
    ({"recurrent": {"type": "gru", "seq_len": 1000, "burn_in": 100}}, "seq_len + burn_in is 1100"),
    ({"recurrent": {"type": "gru", "burn_in": -1}}, "burn_in must be an integer >= 0"),
    ({"recurrent": {"type": "gru", "layers": 2}}, "unknown member(s) layers"),
    ({"class": "custom_model:ResidualMlp", "recurrent": {"type": "gru"}}, "recurrent is for the built-in encoders"),
])
def test_bad_recurrent_descriptions_are_named(raw: dict, message: str) -> None:
    with pytest.raises(ModelConfigError, match="^module 'm': model") as caught:
        parse_model_config(raw, 4, "m")
    assert message in str(caught.value)


def onnx_steps(model: bytes, inputs: dict[str, np.ndarray], names: list[str], steps: list[dict[str, np.ndarray]]
               ) -> list[np.ndarray]:
    """The exported model run step by step, its returned state fed back (as every SDK does)."""
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    state = {f"state_in_{n}": np.zeros((len(steps[0][next(iter(steps[0]))]), 8), np.float32) for n in names}
    outs = []
    for feed in steps:
        result = session.run(["action_dist_inputs", *(f"state_out_{n}" for n in names)], {**feed, **state})
        outs.append(result[0])
        state = {f"state_in_{n}": value for n, value in zip(names, result[1:])}
    return outs


def torch_steps(learner: PPOLearner, rows: list[np.ndarray]) -> list[np.ndarray]:
    state = learner.model.state_shape
    assert state is not None
    current = tuple(torch.zeros(rows[0].shape[0], state[1]) for _ in range(state[0]))
    outs = []
    with torch.no_grad():
        for row in rows:
            dist, _, current = learner.model.step(torch.from_numpy(row), None, current)
            outs.append(dist.numpy())
    return outs


MASKED = Dict((("action_mask", box(0, 1, (3,))), ("position", box(-1, 1, (2,)))))
CASES = {
    "lstm_mlp": (box(-1, 1, (4,)), Discrete(3), {"recurrent": {"type": "lstm", "size": 8}}, False),
    "gru_normalized": (box(-1, 1, (4,)), Discrete(3), {"recurrent": {"type": "gru", "size": 8}}, True),
    "lstm_box_actions": (box(-1, 1, (4,)), box(-1, 1, (2,)), {"recurrent": {"type": "lstm", "size": 8}}, False),
    "gru_cnn": (box(0, 255, (6, 6, 1), "uint8"), Discrete(3), {**SMALL_CNN, "recurrent": {"type": "gru", "size": 8}}, False),
    "lstm_masked": (MASKED, Discrete(3), {"recurrent": {"type": "lstm", "size": 8}}, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_model_carries_its_state_in_parity_with_torch(case: str) -> None:
    obs_space, act_space, model, normalize = CASES[case]
    mask = resolve_action_mask(obs_space, act_space, "action_mask") if case == "lstm_masked" else None
    learner = PPOLearner(obs_space, act_space, PPOHyperparams(model=model, hidden_sizes=(16,),
                                                               normalize_observations=normalize),
                         seed=0, action_mask=mask)
    names = ["h", "c"] if "lstm" in case else ["h"]
    rng = np.random.default_rng(1)
    dim = obs_space.flat_dim
    rows = [rng.uniform(0, 255 if "cnn" in case else 1, size=(5, dim)).round().astype(np.float32) for _ in range(6)]
    if normalize:
        learner.normalizer.observe(rng.normal(3.0, 2.0, size=(100, dim)))  # (statistics the graph must apply)

    def feeds() -> list[dict[str, np.ndarray]]:
        if case == "lstm_masked":
            return [{"action_mask": r[:, :3], "position": r[:, 3:]} for r in rows]
        if "cnn" in case:
            return [{"onnx::Gemm_0": r.astype(np.uint8).reshape(5, 6, 6, 1)} for r in rows]
        return [{"onnx::Gemm_0": r} for r in rows]

    for version in range(3):  # the first export traces; later ones rewrite the weights only
        if version:
            with torch.no_grad():
                for p in learner.model.parameters():
                    p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(version)))
        exported = learner.export_onnx()
        got, want = onnx_steps(exported, {}, names, feeds()), torch_steps(learner, rows)
        for step, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"version {version}, step {step}")
    # The state matters: the same observation after other ones gives other outputs.
    assert not np.allclose(want[0], torch_steps(learner, [rows[1], rows[0]])[1], atol=1e-4)


def _chunk(rng: np.random.Generator, steps: int, terminated: bool = True, size: int = 8) -> EpisodeChunk:
    return EpisodeChunk(rng.uniform(-1, 1, (steps + 1, 3)).astype(np.float32), rng.integers(0, 2, steps),
                        rng.normal(size=steps).astype(np.float32), np.full(steps, -0.69, np.float32), None,
                        terminated, False, state_in=rng.normal(0, 0.3, (1, size)).astype(np.float32))


def _learner(**recurrent: object) -> PPOLearner:
    return PPOLearner(box(-1, 1, (3,)), Discrete(2), PPOHyperparams(
        model={"recurrent": {"type": "gru", "size": 8, **recurrent}}, hidden_sizes=(16,), minibatch_size=12), seed=0)


def test_each_chunk_runs_from_its_recorded_state_and_a_cut_part_from_the_observations_before_it() -> None:
    learner = _learner()
    rng = np.random.default_rng(0)
    chunk = _chunk(rng, 12)
    recorded = chunk.state_in.copy()
    whole = state_pass(learner.model, build_batch([chunk]), torch.device("cpu"))
    np.testing.assert_array_equal(chunk.state_in, recorded)  # (the pass works on copies)
    head, tail = split_chunk(chunk, 5)
    assert tail.state_prefix is not None and tail.state_prefix.shape[0] == 5
    head2, tail2 = split_chunk(tail, 3)  # a part of a part: the prefix grows
    assert tail2.state_prefix.shape[0] == 8
    parts = state_pass(learner.model, build_batch([head, head2, tail2]), torch.device("cpu"))
    # head: o_0..o_5; head2: o_5..o_8; tail2: o_8..o_12 (each part repeats the observation it ends on)
    want = np.concatenate([whole.values[0:6], whole.values[5:9], whole.values[8:13]])
    np.testing.assert_allclose(parts.values, want, rtol=1e-5, atol=1e-6)
    # The recorded state matters: another one gives other values.
    other = EpisodeChunk(**{**chunk.__dict__, "state_in": np.zeros_like(chunk.state_in)})
    assert not np.allclose(state_pass(learner.model, build_batch([other]), torch.device("cpu")).values,
                           whole.values, atol=1e-4)


@pytest.mark.parametrize("burn_in", [0, 3])
def test_windows_train_every_step_once_from_the_state_before_it(burn_in: int) -> None:
    learner = _learner(seq_len=4, burn_in=burn_in)
    rng = np.random.default_rng(1)
    batch = build_batch([_chunk(rng, 10), _chunk(rng, 3, terminated=False), _chunk(rng, 1)])
    states = state_pass(learner.model, batch, torch.device("cpu"))
    win = windows(batch, 4, burn_in)
    assert win.count == 3 + 1 + 1  # (10 steps: 4 + 4 + 2; then 3; then 1)
    obs = torch.from_numpy(batch.all_obs)
    with torch.no_grad():
        steps, dists, values = run_windows(learner.model, win, np.arange(win.count), obs, obs, states.state_before)
    assert sorted(steps.tolist()) == list(range(batch.size))  # every step once, no padding
    step_rows = torch.as_tensor(batch.next_obs_index - 1)[steps]
    # With the weights unchanged, a window's steps (after its burn-in) give what the pass gave there.
    np.testing.assert_allclose(values.numpy(), states.values[step_rows.numpy()], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dists.numpy(), states.dist_inputs[step_rows].numpy(), rtol=1e-5, atol=1e-6)
    # Padding is never read: poisoning the observation rows no window trains on changes nothing.
    unused = np.ones(batch.all_obs.shape[0], bool)
    unused[win.rows[win.rows >= 0]] = False
    if unused.any():
        poisoned = obs.clone()
        poisoned[torch.from_numpy(unused)] = 1e6
        with torch.no_grad():
            _, _, again = run_windows(learner.model, win, np.arange(win.count), poisoned, poisoned,
                                      states.state_before)
        np.testing.assert_allclose(again.numpy(), values.numpy(), rtol=1e-6)


def test_burn_in_starts_a_window_earlier() -> None:
    win = windows(build_batch([_chunk(np.random.default_rng(2), 10)]), 4, 3)
    # The second window trains steps 4-7 after running steps 1-3; the first has no step before it.
    assert win.rows[0].tolist() == [-1, -1, -1, 0, 1, 2, 3]
    assert win.rows[1].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert win.steps[1].tolist() == [-1, -1, -1, 4, 5, 6, 7]
    assert win.start_rows.tolist() == [0, 1, 5]


def test_a_recurrent_learner_learns_to_remember_what_a_feedforward_one_cannot() -> None:
    """A recorded cue at the first step decides the reward at the third: only the core can carry it.
    The update on sequences raises the logp of the rewarded action at step 2 given the cue."""
    learner = PPOLearner(box(-1, 1, (2,)), Discrete(2), PPOHyperparams(
        model={"recurrent": {"type": "gru", "size": 16, "seq_len": 3}}, hidden_sizes=(16,), minibatch_size=64,
        num_epochs=4, lr=3e-3, ent_coef=0.0), seed=0)
    rng = np.random.default_rng(3)

    def episodes(n: int) -> list[EpisodeChunk]:
        out = []
        for _ in range(n):
            cue = int(rng.integers(2))
            obs = np.zeros((4, 2), np.float32)
            obs[0, cue] = 1.0
            actions = rng.integers(0, 2, 3)
            rewards = np.array([0, 0, 1.0 if actions[2] == cue else -1.0], np.float32)
            # (no behaviour logp: the learner takes the current policy's, so clipping does not cap the gain)
            out.append(EpisodeChunk(obs, actions, rewards, None, None, True, False,
                                    state_in=np.zeros((1, 16), np.float32)))
        return out

    def right_at_the_end() -> float:
        probs = []
        for cue in (0, 1):
            obs = np.zeros((3, 1, 2), np.float32)
            obs[0, 0, cue] = 1.0
            state = (torch.zeros(1, 16),)
            with torch.no_grad():
                for t in range(3):
                    dist, _, state = learner.model.step(torch.from_numpy(obs[t]), None, state)
            probs.append(float(torch.softmax(dist, -1)[0, cue]))
        return min(probs)

    before = right_at_the_end()
    for _ in range(15):
        stats = learner.update(build_batch(episodes(64)))
        assert np.isfinite(stats["policy_loss"])
    assert right_at_the_end() > max(0.75, before + 0.2), (before, right_at_the_end())


def test_the_layout_announces_the_state_and_refuses_chunks_longer_than_the_limit() -> None:
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout

    space = {"type": "Box", "shape": [2], "low": 0, "high": 1}
    layout = build_layout(ServerConfig(observation_space=space, action_space={"type": "Discrete", "n": 2},
                                       model={"recurrent": {"type": "lstm", "size": 5}}))
    assert [s.to_json() for s in layout.specs["default_policy"].recurrent_state] == [
        {"input": "state_in_h", "output": "state_out_h", "size": 5},
        {"input": "state_in_c", "output": "state_out_c", "size": 5}]
    with pytest.raises(ValueError, match="env_steps_per_sample \\(10001\\) must not be larger"):
        build_layout(ServerConfig(observation_space=space, action_space={"type": "Discrete", "n": 2},
                                  model={"recurrent": {"type": "gru"}}, env_steps_per_sample=10_001))


def test_a_made_up_behaviour_logp_leaves_its_source_out_of_the_update() -> None:
    """A model with memory's logps are not rechecked at ingest (§13.6); the learner's screen leaves a
    source whose logps no recent policy gives out of the update (blamed), and trains on the others."""
    from tether.server.learner.isolation import update_isolating

    learner = _learner(seq_len=4)
    rng = np.random.default_rng(5)
    honest = [_chunk(rng, 8) for _ in range(5)]
    for chunk in honest:  # the current policy's own logps, as a client acting with it records them
        chunk.action_logp = learner._current_logp(build_batch([chunk]), state_pass(
            learner.model, build_batch([chunk]), torch.device("cpu"))).astype(np.float32)
    liar = _chunk(rng, 8)
    liar.action_logp = np.full(8, -20.0, np.float32)
    result = update_isolating(learner, [(f"honest-{i}", c) for i, c in enumerate(honest)] + [("liar", liar)])
    assert set(result.guilty) == {"liar"} and "behaviour log-probabilities" in result.guilty["liar"]
    assert result.stats is not None and abs(result.stats["policy_loss"]) < 1.0, result.stats
    assert len(result.kept) == 5


def test_minibatches_are_packed_to_minibatch_size_steps_whatever_the_chunks_length() -> None:
    """Many short chunks (an agent among many sends few steps) make more windows per minibatch, not
    smaller minibatches."""
    rng = np.random.default_rng(6)
    batch = build_batch([_chunk(rng, int(n)) for n in rng.integers(1, 4, 60)])
    win = windows(batch, 16, 0)
    packed = win.minibatches(rng.permutation(win.count), 24)
    sizes = [int(win.lengths[m].sum()) for m in packed]
    assert all(size >= 24 for size in sizes[:-1]) and sum(sizes) == batch.size
    assert sorted(np.concatenate(packed).tolist()) == list(range(win.count))


def test_gradients_flow_back_through_a_window_and_stop_at_its_start() -> None:
    """Backpropagation through time: a window's last output depends on every observation of the
    window (through the core's state) and on none before it (its start state is given)."""
    learner = _learner(seq_len=4)
    batch = build_batch([_chunk(np.random.default_rng(7), 8)])
    states = state_pass(learner.model, batch, torch.device("cpu"))
    win = windows(batch, 4, 0)  # steps 0-3 and 4-7
    obs = torch.from_numpy(batch.all_obs).clone().requires_grad_(True)
    steps, dists, _ = run_windows(learner.model, win, np.array([1]), obs, None, states.state_before)
    assert steps.tolist() == [4, 5, 6, 7]
    dists[-1].sum().backward()
    per_row = obs.grad.abs().sum(dim=1)
    assert all(per_row[r] > 0 for r in (4, 5, 6, 7)), per_row  # through the state, back to the window's start
    assert all(per_row[r] == 0 for r in (0, 1, 2, 3)), per_row  # nothing across the window's edge


def test_the_update_unrolls_the_configured_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    import tether.server.learner.ppo as ppo

    seen = []
    monkeypatch.setattr(ppo, "windows", lambda batch, seq_len, burn_in: seen.append((seq_len, burn_in)) or
                        windows(batch, seq_len, burn_in))
    learner = _learner(seq_len=5, burn_in=2)
    learner.update(build_batch([_chunk(np.random.default_rng(8), 12)]))
    assert seen == [(5, 2)]
