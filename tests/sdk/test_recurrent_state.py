"""The Python SDK carries a model's recurrent state (protocol 1.5, §12.4) so the engine never does:
zeros at an actor's first step, fed back at every step, recorded as each chunk's state_in, kept across
a new model of the same state, reset (with the steps not cut yet) by a reconnect that announces
another state, per agent and per group in the multi-agent client, and in greedy evaluation per
episode id. The model is recurrent.json's LSTM; expected states come from ONNX Runtime directly."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tether.protocol.episodes import decode_episode
from tether.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.protocol.spaces import space_from_json
from tether.sdk import MultiAgentClient, TetherClient

from .scripted_server import ScriptedServer, answering_server, sent_records, state

CARRY = next(c for c in json.loads((Path(__file__).resolve().parents[1] / "conformance" / "recurrent.json")
                                   .read_text())["cases"] if c["kind"] == "carry")
MODEL = base64.b64decode(CARRY["model_b64"])
STATES = CARRY["recurrent_state"]
OBS_SPACE = {"type": "Box", "shape": [2], "low": -1.0, "high": 1.0}
NAMES = {"onnx_input_names": ["onnx::Gemm_0"], "onnx_output_names": ["action_dist_inputs"]}


def run_model(observations: list[np.ndarray], start: np.ndarray | None = None) -> tuple[list, list]:
    """(dist inputs, state before) per step, the state fed back from zeros (or ``start``)."""
    session = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    current = np.zeros((2, 1, 3), np.float32) if start is None else start[:, None].astype(np.float32)
    dists, before = [], []
    for obs in observations:
        before.append(current[:, 0].copy())
        out = session.run(None, {"onnx::Gemm_0": obs[None].astype(np.float32), "state_in_h": current[0],
                                 "state_in_c": current[1]})
        dists.append(out[0][0])
        current = np.stack([out[1], out[2]])
    return dists, before


def single_config(states: list | None = STATES, steps: int = 4) -> dict[str, Any]:
    cfg = {"type": "SET_CONFIG", "env_steps_per_sample": steps, "force_on_policy": True, "protocol_version": "1.5",
           "observation_space": OBS_SPACE, "action_space": {"type": "Discrete", "n": 2}, **NAMES}
    if states:
        cfg["recurrent_state"] = states
    return cfg


def answering(config_for: Any, model_for: Any, drop_first_batch: bool = False) -> ScriptedServer:
    """Answers every batch with a new model (version n) of the connection's config."""
    return answering_server(config_for, lambda i, n: state(n, model_for(i)), lambda i: "1.5", drop_first_batch)


def episode_obs(n: int, seed: int = 0) -> list[np.ndarray]:
    return [row for row in np.random.default_rng(seed).uniform(-1, 1, (n, 2)).astype(np.float32)]


def test_the_state_is_fed_back_recorded_per_chunk_and_kept_across_new_models() -> None:
    obs = episode_obs(11)
    with answering(lambda i: single_config(), lambda i: MODEL) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        eid = client.start_episode()
        for o in obs[:-1]:
            client.get_action(eid, o)
            client.log_returns(eid, 1.0)
        client.end_episode(eid, obs[-1])
        client.flush()
        client.close()
    dists, before = run_model(obs[:-1])
    got = sent_records(server)
    assert len(got) >= 3 and sum(len(r["actions"]) for r in got) == 10
    spec = ModuleSpec("default_policy", space_from_json(OBS_SPACE), space_from_json({"type": "Discrete", "n": 2}),
                      recurrent_state=ModuleSpec.from_json("m", {**single_config(), "trainable": True}).recurrent_state)
    t = 0
    for i, record in enumerate(got):
        chunk = decode_episode(record, i, spec.observation_space, spec.action_space, True, None, spec.recurrent_state)
        # Each chunk starts from the state fed with its first observation (zeros only for the first), although
        # every batch brought a new model: a model of the same state keeps the episode's memory.
        np.testing.assert_allclose(chunk.state_in, before[t], atol=1e-6)
        np.testing.assert_allclose(chunk.action_dist_inputs, np.stack(dists[t:t + chunk.env_steps]), atol=1e-5)
        t += chunk.env_steps
    assert not np.allclose(before[t - 1], 0)


def test_greedy_evaluation_remembers_per_episode_id() -> None:
    """(This model's greedy action does not depend on its state, so the states themselves are compared.)"""
    obs = episode_obs(6, seed=4)
    _, before = run_model(obs + [obs[0]])
    with answering(lambda i: single_config(), lambda i: MODEL) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1)
        for o in obs:
            client.compute_action(o, "eval-1")
        np.testing.assert_allclose(np.concatenate(client._evaluation.state), before[6], atol=1e-6)
        client.compute_action(obs[3], "eval-2")  # a new id starts from zeros
        np.testing.assert_allclose(np.concatenate(client._evaluation.state), run_model([obs[3], obs[0]])[1][1],
                                   atol=1e-6)
        # A recorded episode is refused (a greedy step would be missing from its record), its state untouched.
        recorded = client.start_episode()
        client.get_action(recorded, obs[0])
        kept = [tensor.copy() for tensor in client._episodes[recorded].state]
        with pytest.raises(ValueError, match="being recorded"):
            client.compute_action(obs[1], recorded)
        np.testing.assert_array_equal(np.concatenate(client._episodes[recorded].state), np.concatenate(kept))
        # A running episode that is not recorded has its state advanced by compute_action as by get_action.
        eid = client.start_episode(training_enabled=False)
        for o in obs[:3]:
            client.compute_action(o, eid)
        client.get_action(eid, obs[3])
        np.testing.assert_allclose(np.concatenate(client._episodes[eid].state), before[4], atol=1e-6)
        client.close()


def test_a_reconnect_that_announces_another_state_starts_from_zeros_and_drops_the_uncut_steps() -> None:
    """The first connection loses its first batch; the second one's model has no memory any more (a
    server restarted with another model): the steps recorded with states are dropped, the episode goes on."""
    from .scripted_server import constant_model

    plain = constant_model(2, [0.0, 0.0], "onnx::Gemm_0")
    obs = episode_obs(16, seed=2)
    with answering(lambda i: single_config(None if i else STATES),
                   lambda i: plain if i else MODEL, drop_first_batch=True) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, reconnect_timeout_s=5, wait_for_weights=True)
        eid = client.start_episode("kept")
        for o in obs[:-1]:
            client.get_action(eid, o)
        client.end_episode(eid, obs[-1])
        client.flush()
        client.close()
    assert client.reconnects >= 1
    later = [r for r in sent_records(server)][1:]
    assert later and all("state_in" not in r for r in later), "records for the server without memory have none"
    assert all(r["episode_id"] == "kept" for r in later)


def ma_config() -> dict[str, Any]:
    module = {"observation_space": OBS_SPACE, "action_space": {"type": "Discrete", "n": 2}, **NAMES, "trainable": True,
              "recurrent_state": STATES}
    team = {**module, "observation_space": {"type": "Box", "shape": [4], "low": -1.0, "high": 1.0},
            "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}, "recurrent_state": None}
    return {"type": "SET_CONFIG", "env_steps_per_sample": 6, "force_on_policy": True, "protocol_version": "1.5",
            "modules": {"mem": module, "team": {k: v for k, v in team.items() if v is not None}},
            "policy_mapping": [{"pattern": "a_*", "module": "mem"}, {"pattern": "pair", "module": "team"}],
            "groups": {"pair": {"members": ["g_0", "g_1"], "reward": "sum"}}}


def test_an_agent_alone_in_its_modules_frame_steps_as_a_batch_of_one_would_bit_for_bit() -> None:
    """A module's lone row in a frame runs through the policy's bound one-row path (``step_own``), more rows as
    one batch: agents of one module with memory acting alone in turns, and together, get the dist inputs and
    the states that an unbound batch of one gives (a policy of its own), bit for bit."""
    from tether.protocol.multi_agent import recurrent_state_from_json
    from tether.protocol.spaces import Discrete
    from tether.sdk.policy import OnnxPolicy

    from .scripted_server import constant_model

    cfg = {**ma_config(), "env_steps_per_sample": 1000}  # (nothing cut while the recorders are compared)
    models = {"mem": {"weights_seq_no": 0, "onnx_file": state(0, MODEL)["onnx_file"]},
              "team": {"weights_seq_no": 0, "onnx_file": state(0, constant_model(4, [0.0] * 4, "onnx::Gemm_0"))[
                  "onnx_file"]}}
    reference = OnnxPolicy(MODEL, Discrete(2), recurrent_state=recurrent_state_from_json(STATES, "mem"))
    rows = {"a_0": episode_obs(12, seed=7), "a_1": episode_obs(12, seed=8)}
    turns = ["a_0", "a_1", "a_0 a_1", "a_0", "a_0", "a_1", "a_1 a_0", "a_1", "a_0", "a_1", "a_0", "a_0"]
    with answering_server(lambda i: cfg, lambda i, n: {"type": "SET_STATE", "models": models if n == 0 else {}},
                          lambda i: "1.5") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        eid = client.start_episode("ma")
        client.get_action(eid, {"a_0": rows["a_0"][0]})  # (the models have come: the policy can be watched)
        policy = client.policies["mem"]
        lone_steps = []
        step_own = policy.step_own
        policy.step_own = lambda obs, kept: lone_steps.append(1) or step_own(obs, kept)
        for t, turn in enumerate(turns[1:], 1):
            client.get_action(eid, {agent: rows[agent][t] for agent in turn.split()})
        recorders = {agent: client._episodes[eid].actors[agent].recorder for agent in rows}
        client.close()
    assert len(lone_steps) == sum(1 for turn in turns[1:] if " " not in turn)
    for agent, recorder in recorders.items():
        kept = reference.initial_state()
        steps = [t for t, turn in enumerate(turns) if agent in turn.split()]
        assert len(recorder.dist_inputs) == len(steps) == len(recorder.states)
        for dist, before, t in zip(recorder.dist_inputs, recorder.states, steps):
            for got, want in zip(before, kept):
                np.testing.assert_array_equal(got, want)
            expected, kept = reference.step(rows[agent][t][None], kept)
            np.testing.assert_array_equal(dist, expected[0])


def test_each_agent_has_its_own_state_and_a_module_without_memory_sends_none() -> None:
    from .scripted_server import constant_model

    cfg = ma_config()
    team_model = constant_model(4, [0.0, 0.0, 0.0, 0.0], "onnx::Gemm_0")

    models = {"mem": {"weights_seq_no": 0, "onnx_file": state(0, MODEL)["onnx_file"]},
              "team": {"weights_seq_no": 0, "onnx_file": state(0, team_model)["onnx_file"]}}
    first, later = {"type": "SET_STATE", "models": models}, {"type": "SET_STATE", "models": {}}
    a0, a1 = episode_obs(9, seed=5), episode_obs(9, seed=6)
    with answering_server(lambda i: cfg, lambda i, n: later if n else first, lambda i: "1.5") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        eid = client.start_episode("ma")
        for t in range(8):
            frame = {"a_0": a0[t], "g_0": a0[t], "g_1": a1[t]}
            if t >= 2:  # a_1 joins later: its state starts from zeros then
                frame["a_1"] = a1[t]
            client.get_action(eid, frame)
        client.end_episode(eid, {"a_0": a0[8], "a_1": a1[8], "g_0": a0[8], "g_1": a1[8]})
        client.flush()
        client.close()
    specs = {m: ModuleSpec.from_json(m, s) for m, s in cfg["modules"].items()}
    _, before0 = run_model(a0[:8])
    _, before1 = run_model(a1[2:8])
    starts = {"a_0": 0, "a_1": 2}
    seen = {"a_0": 0, "a_1": 0}
    for i, record in enumerate(sent_records(server)):
        decoded = decode_multi_agent_record(record, i, specs, True)  # (what the server checks)
        for agent in decoded.agents:
            entry = record["agents"][agent.agent_id]
            if agent.agent_id == "pair":
                assert "state_in" not in entry
                continue
            want = (before0 if agent.agent_id == "a_0" else before1)[seen[agent.agent_id]]
            np.testing.assert_allclose(agent.chunk.state_in, want, atol=1e-6)
            assert entry["start_step"] == starts[agent.agent_id]
            seen[agent.agent_id] += agent.chunk.env_steps
    assert seen == {"a_0": 8, "a_1": 6}
