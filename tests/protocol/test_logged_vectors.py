"""logged.json (protocol 1.6 §10.1, §10.6 check 20, §10.7): logged steps, run by the Python core and SDK
(the C++ and C# SDKs run the same file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tether.protocol.episodes import decode_episode
from tether.protocol.errors import MessageError
from tether.protocol.messages import decode_message
from tether.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.protocol.spaces import space_from_json
from tether.sdk.episode_recorder import EpisodeRecorder

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "logged.json").read_text())["cases"]


def _kind(kind: str) -> list[dict]:
    return [c for c in VECTORS if c["kind"] == kind]


@pytest.mark.parametrize("case", _kind("episode"), ids=lambda c: c["name"])
def test_episode(case: dict) -> None:
    obs_space, act_space = space_from_json(case["observation_space"]), space_from_json(case["action_space"])
    _, message = decode_message(case["body"].encode())
    try:
        chunk = decode_episode(message["episodes"][0], 0, obs_space, act_space, case["require_logp"])
    except MessageError as exc:
        assert exc.code.value == case.get("error"), exc
        assert "logged_runs" in exc.message or case["error"] == "ACTION_OUT_OF_SPACE", exc.message
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert chunk.env_steps == case["env_steps"]
    logged = [] if chunk.logged is None else np.flatnonzero(chunk.logged).tolist()
    assert logged == case["logged_steps"]


@pytest.mark.parametrize("case", _kind("agent_entry"), ids=lambda c: c["name"])
def test_agent_entry(case: dict) -> None:
    modules = {m: ModuleSpec.from_json(m, spec) for m, spec in case["modules"].items()}
    try:
        record = decode_multi_agent_record(case["record"], 0, modules, case["require_logp"])
    except MessageError as exc:
        assert exc.code.value == case.get("error"), exc
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert record.agent_steps == case["agent_steps"]
    for agent in record.agents:
        logged = [] if agent.chunk.logged is None else np.flatnonzero(agent.chunk.logged).tolist()
        assert logged == case["logged_steps"][agent.agent_id]


@pytest.mark.parametrize("case", _kind("record"), ids=lambda c: c["name"])
def test_client_records(case: dict) -> None:
    """The SDK's recorder, fed sampled and logged steps and cut where the case says, writes each
    record's logged_runs (absent when none of its steps is logged)."""
    recorder = EpisodeRecorder("e", True)
    cuts, records = list(case["cuts"]), []
    for t, call in enumerate(case["calls"]):
        recorder.record_step(np.array([0.5, -0.5], np.float32), 1, 0.0 if call == "log" else -0.7,
                             np.zeros(3, np.float32), None, None, call == "log")
        if cuts and t + 1 == cuts[0]:  # cut once the next observation is known
            recorder.obs.append(np.array([0.0, 0.0], np.float32))
            records.append(recorder.cut())
            recorder.obs.pop()
            cuts.pop(0)
    recorder.finish(np.array([0.0, 0.0], np.float32), truncated=False)
    records.append(recorder.cut())
    got = [None if r is None else r[0].get("logged_runs") for r in records]
    assert got == case["records_logged_runs"]
