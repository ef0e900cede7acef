"""OnnxPolicy's one-row calls (an engine's get_action) run through buffers bound once (IOBinding):
they give exactly what the unbound batch run gives for the same row, for every built-in model kind
(MLP, LSTM with its state, a uint8 CNN, a masked Dict observation), return new arrays each call, and
a call that finds the buffers in use by another thread runs unbound beside it."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tether.protocol.action_mask import resolve_action_mask
from tether.protocol.episodes import StateSpec
from tether.protocol.spaces import Dict, Discrete, box
from tether.sdk.policy import OnnxPolicy
from tether.server.learner import PPOHyperparams, PPOLearner

SCENE = Dict((("action_mask", box(0, 1, (4,))), ("camera", box(0, 255, (8, 8, 1), dtype="uint8")),
              ("speed", box(-1, 1, (3,)))))


def _policy(kind: str) -> tuple[OnnxPolicy, np.ndarray]:
    """A fresh learner's exported model as a client runs it, and random observation rows for it."""
    rng = np.random.default_rng(0)
    if kind == "mlp":
        learner = PPOLearner(box(-1, 1, (4,)), Discrete(2), PPOHyperparams(), seed=0)
        return OnnxPolicy(learner.export_onnx(), Discrete(2)), rng.normal(size=(5, 4)).astype(np.float32)
    if kind == "lstm":
        hp = PPOHyperparams(model={"recurrent": {"type": "lstm", "size": 8}})
        learner = PPOLearner(box(-1, 1, (6,)), Discrete(3), hp, seed=0)
        state = (StateSpec("state_in_h", "state_out_h", 8), StateSpec("state_in_c", "state_out_c", 8))
        policy = OnnxPolicy(learner.export_onnx(), Discrete(3), recurrent_state=state)
        return policy, rng.normal(size=(5, 6)).astype(np.float32)
    if kind == "cnn":
        image = box(0, 255, (12, 12, 2), dtype="uint8")
        hp = PPOHyperparams(model={"encoder": "cnn", "image_shape": [12, 12, 2], "conv": [[4, 3, 1]], "dense": 8},
                            hidden_sizes=())
        learner = PPOLearner(image, Discrete(4), hp, seed=0)
        return OnnxPolicy(learner.export_onnx(), Discrete(4)), rng.integers(0, 256, (5, 12, 12, 2)).astype(np.uint8)
    mask = resolve_action_mask(SCENE, Discrete(4), "action_mask")
    hp = PPOHyperparams(model={"encoder": "cnn", "conv": [[4, 3, 1]], "dense": 8})
    learner = PPOLearner(SCENE, Discrete(4), hp, seed=0, action_mask=mask)
    rows = np.zeros((5, SCENE.flat_dim), np.float32)
    for leaf in SCENE.leaves:
        part = slice(leaf.offset, leaf.offset + leaf.size)
        rows[:, part] = rng.integers(0, 2, (5, leaf.size)) if leaf.path == "action_mask" else \
            rng.integers(0, 256, (5, leaf.size)) if leaf.is_bytes else rng.normal(size=(5, leaf.size))
    rows[:, 0] = 1  # (something allowed)
    return OnnxPolicy(learner.export_onnx(), Discrete(4), observation_space=SCENE), rows


@pytest.mark.parametrize("kind", ["mlp", "lstm", "cnn", "masked_dict"])
def test_a_bound_one_row_run_equals_the_unbound_run(kind: str) -> None:
    policy, rows = _policy(kind)
    assert policy._one_row is not None  # (every built-in model has fixed sizes past the batch)
    state = policy.initial_state()
    first = None
    for row in rows:
        if state is None:
            one = policy.dist_inputs_one(row)
            np.testing.assert_array_equal(one, policy.dist_inputs(row[None])[0])
        else:
            one, after = policy.step_one(row, state)
            want, want_after = policy.step(row[None], state)
            np.testing.assert_array_equal(one, want[0])
            for got, expected in zip(after, want_after):
                np.testing.assert_array_equal(got, expected)
            assert all(a is not b for a, b in zip(after, state))
            state = after
        if first is None:
            first, kept = one, one.copy()
    np.testing.assert_array_equal(first, kept)  # (later calls wrote into the bound outputs, not into it)


def test_one_row_calls_run_bound_and_a_call_that_finds_the_buffers_in_use_runs_unbound() -> None:
    policy, rows = _policy("lstm")
    state = policy.initial_state()
    want = policy.step(rows[0][None], state)
    run = policy.session.run

    def unbound_run(*args, **kwargs):
        raise AssertionError("a one-row call ran unbound")

    policy.session.run = unbound_run  # (the bound path never calls InferenceSession.run)
    here = policy.step_one(rows[0], state)
    policy.session.run = run
    there: list = []
    with policy._one_row_lock:  # (another thread's call in progress holds the buffers)
        worker = threading.Thread(target=lambda: there.append(policy.step_one(rows[0], state)))
        worker.start()
        worker.join()
    for got in (here, there[0]):
        np.testing.assert_array_equal(got[0], want[0][0])
        for a, b in zip(got[1], want[1]):
            np.testing.assert_array_equal(a, b)


def test_a_model_with_memory_needs_its_whole_state_and_one_without_takes_none() -> None:
    policy, rows = _policy("lstm")
    state = policy.initial_state()
    for call in (lambda: policy.dist_inputs_one(rows[0]), lambda: policy.step_one(rows[0], state[:1])):
        with pytest.raises(ValueError, match="state tensor"):
            call()
    mlp, mlp_rows = _policy("mlp")
    with pytest.raises(ValueError, match="state tensor"):
        mlp.step_one(mlp_rows[0], state)


def test_a_row_or_state_of_another_size_is_refused_not_spread() -> None:
    """The bound buffers are assigned in place: a single value must not fill a whole row or state."""
    policy, rows = _policy("lstm")
    state = policy.initial_state()
    with pytest.raises(ValueError, match="observation of 1 values"):
        policy.step_one(rows[0][:1], state)
    with pytest.raises(ValueError, match="state tensor of shape"):
        policy.step_one(rows[0], [state[0][:, :1], state[1]])
    mlp, mlp_rows = _policy("mlp")
    with pytest.raises(ValueError, match="observation of"):
        mlp.dist_inputs_one(mlp_rows[0][:-1])
    np.testing.assert_array_equal(mlp.dist_inputs_one(mlp_rows[0]), mlp.dist_inputs(mlp_rows[0][None])[0])
    # Any layout of a row's values, float64 and lists included, runs as the flat row does.
    want = mlp.dist_inputs_one(mlp_rows[0])
    for layout in (mlp_rows[0][:, None], mlp_rows[0][None], mlp_rows[0].astype(np.float64), mlp_rows[0].tolist()):
        np.testing.assert_array_equal(mlp.dist_inputs_one(layout), want)


def test_a_model_with_open_sizes_runs_unbound() -> None:
    """A model whose input leaves its width open cannot be bound once; it runs as before."""
    x = helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("action_dist_inputs", TensorProto.FLOAT, ["batch", "width"])
    graph = helper.make_graph([helper.make_node("Neg", ["obs"], ["action_dist_inputs"])], "open", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    policy = OnnxPolicy(model.SerializeToString(), Discrete(3))
    assert policy._one_row is None
    np.testing.assert_array_equal(policy.dist_inputs_one(np.array([1, 2, 3], np.float32)), [-1, -2, -3])
    onnx.checker.check_model(model)


def test_actors_that_take_turns_each_keep_their_own_memory_on_the_clients_path() -> None:
    """``step_own`` (the clients' path) leaves the state where the next step reads it and skips
    assigning it when the same actor steps again: actors taking turns in any order, a public
    ``step_one`` between them, a state changed in place before ``step_one``, and a call refused
    half-way all give what the unbound batch run gives."""
    policy, rows = _policy("lstm")
    actors = {name: policy.initial_state() for name in "ab"}
    want = {name: policy.initial_state() for name in "ab"}
    for t, name in enumerate("aababbbaab"):
        row = rows[t % len(rows)]
        if t == 4:  # (refused before anything runs: the next step of the same actor is unharmed)
            with pytest.raises(ValueError, match="observation of"):
                policy.step_own(row[:2], actors[name])
        if t == 6:  # (the public path, its state edited in place as a caller may: no step is skipped)
            actors[name][0] *= 0.5
            want[name][0] = want[name][0] * 0.5
            dist, actors[name] = policy.step_one(row, actors[name])
        else:
            dist, actors[name] = policy.step_own(row, actors[name])
        expected, want[name] = policy.step(row[None], want[name])
        np.testing.assert_array_equal(dist, expected[0])
        for got, expected_state in zip(actors[name], want[name]):
            np.testing.assert_array_equal(got, expected_state)
    kept = [array.copy() for array in actors["a"]]
    policy.step_own(rows[0], actors["a"])
    for before, now in zip(kept, actors["a"]):
        np.testing.assert_array_equal(before, now)  # (a returned state is the actor's own: never written again)


def test_the_state_an_actor_kept_is_not_assigned_again_and_a_state_refused_half_way_leaves_no_skip() -> None:
    policy, rows = _policy("lstm")
    state = policy.initial_state()
    _, kept = policy.step_own(rows[0], state)
    want, _ = policy.step(rows[1][None], kept)
    kept[0][...] = 7.0  # (changed in place, which step_own's contract rules out: its values are not read again)
    np.testing.assert_array_equal(policy.step_own(rows[1], kept)[0], want[0])
    _, kept = policy.step_own(rows[2], policy.initial_state())
    want, _ = policy.step(rows[3][None], kept)
    # Another caller's state of the right width whose second tensor is refused: its first was assigned
    # already, so the kept state is not where the model reads it any more.
    other = [np.full((1, 8), 3.0, np.float32), np.zeros((1, 5), np.float32)]
    with pytest.raises(ValueError, match="state tensor of shape"):
        policy.step_one(rows[0], other)
    np.testing.assert_array_equal(policy.step_own(rows[3], kept)[0], want[0])


def test_a_state_given_to_a_model_without_memory_is_refused_and_the_policy_still_runs() -> None:
    policy, rows = _policy("mlp")
    lstm, _ = _policy("lstm")
    for call in (lambda: policy.step_own(rows[0], lstm.initial_state()), lambda: lstm.step_own(rows[0][:4], None)):
        with pytest.raises(ValueError, match="state tensor"):
            call()
    np.testing.assert_array_equal(policy.dist_inputs_one(rows[0]), policy.dist_inputs(rows[0][None])[0])
