"""recurrent.json (protocol 1.5 §9.1, §10.1, §10.6 check 19, §12.1, §12.4): modules with memory, run by
the Python core and SDK (the C++ and C# SDKs run the same file)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from tether.protocol.episodes import StateSpec, decode_episode
from tether.protocol.errors import MessageError
from tether.protocol.messages import decode_message
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.spaces import space_from_json
from tether.sdk.episode_recorder import EpisodeRecorder
from tether.sdk.policy import OnnxPolicy

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "recurrent.json").read_text())["cases"]


def _kind(kind: str) -> list[dict]:
    return [c for c in VECTORS if c["kind"] == kind]


def _states(entries: list[dict] | None) -> tuple[StateSpec, ...]:
    return tuple(StateSpec(e["input"], e["output"], e["size"]) for e in entries or ())


@pytest.mark.parametrize("case", _kind("module"), ids=lambda c: c["name"])
def test_module(case: dict) -> None:
    if case.get("error"):
        with pytest.raises(MessageError) as info:
            ModuleSpec.from_json("m", case["module"])
        assert info.value.code.value == case["error"] and "recurrent_state" in info.value.message
        return
    spec = ModuleSpec.from_json("m", case["module"])
    assert [s.to_json() for s in spec.recurrent_state] == case["recurrent_state"]
    again = ModuleSpec.from_json("m", json.loads(json.dumps(spec.to_json())))
    assert again.recurrent_state == spec.recurrent_state


@pytest.mark.parametrize("case", _kind("episode"), ids=lambda c: c["name"])
def test_episode(case: dict) -> None:
    obs_space = space_from_json(case["observation_space"])
    act_space = space_from_json(case["action_space"])
    try:
        _, message = decode_message(case["body"].encode())
        chunks = [decode_episode(r, i, obs_space, act_space, case["require_logp"], None,
                                 _states(case["recurrent_state"])) for i, r in enumerate(message["episodes"])]
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"], exc
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert chunks[0].env_steps == case["env_steps"]
    if case["state_in"] is None:
        assert chunks[0].state_in is None
    else:
        np.testing.assert_array_equal(chunks[0].state_in, np.asarray(case["state_in"], np.float32))


@pytest.mark.parametrize("case", _kind("carry"), ids=lambda c: c["name"])
def test_carry(case: dict) -> None:
    """The SDK's policy fed its own returned state, step after step, and its recorder's state_in per record."""
    states = _states(case["recurrent_state"])
    policy = OnnxPolicy(base64.b64decode(case["model_b64"]), space_from_json(case["action_space"]), case["input"],
                        case["output"], recurrent_state=states)
    recorder = EpisodeRecorder("e", True)
    state = policy.initial_state()
    observations = [np.asarray(o, np.float32) for o in case["observations"]]
    records = []
    for t, obs in enumerate(observations[:-1]):
        dist, after = policy.step_one(obs, state)
        np.testing.assert_allclose(dist, case["dist_inputs"][t], atol=case["tolerance"])
        np.testing.assert_allclose(np.concatenate(after), case["state_after"][t], atol=case["tolerance"])
        recorder.record_step(obs, 0, -0.5, dist, None, state)
        recorder.state = state = after
        if t + 1 == case["cut_after"]:  # the observation after the cut's last step closes the first record
            recorder.obs.append(observations[t + 1])
            records.append(recorder.cut(None, tuple(s.input for s in states))[0])
            recorder.obs.pop()
    recorder.finish(observations[-1], truncated=False)
    records.append(recorder.cut(None, tuple(s.input for s in states))[0])
    assert [len(r["actions"]) for r in records] == [case["cut_after"], len(observations) - 1 - case["cut_after"]]
    for record, want in zip(records, case["records_state_in"]):
        assert set(record["state_in"]) == set(want)
        for name, values in want.items():
            np.testing.assert_allclose(record["state_in"][name], values, atol=case["tolerance"])


def test_every_kind_is_covered() -> None:
    assert {c["kind"] for c in VECTORS} == {"module", "episode", "carry"}
    assert any(not np.allclose(c["records_state_in"][1]["state_in_h"], 0) for c in _kind("carry"))
