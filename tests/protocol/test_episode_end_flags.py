"""§10.7: an agent entry in a record that ends the episode, whose own flags are both false,
takes the record's (terminated wins), so the learner does not bootstrap a terminal state."""

from __future__ import annotations

import pytest

from tether.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.protocol.spaces import Discrete, box
from tether.server.learner.rollout_batch import build_batch

MODULES = {"m": ModuleSpec("m", box(-1.0, 1.0, (3,)), Discrete(2), "obs", "action_dist_inputs")}


def entry(**flags: bool) -> dict:
    return {"module": "m", "obs": [[0.0] * 3] * 3, "actions": [0, 1], "rewards": [1.0, 1.0],
            "action_logp": [-0.7, -0.7], "is_terminated": flags.get("is_terminated", False),
            "is_truncated": flags.get("is_truncated", False)}


@pytest.mark.parametrize("record_flags, expected", [
    ({"is_terminated": True}, (True, False)),
    ({"is_truncated": True}, (False, True)),
    ({"is_terminated": True, "is_truncated": True}, (True, False)),
    ({}, (False, False)),
])
def test_an_entry_without_flags_ends_with_its_record(record_flags: dict, expected: tuple) -> None:
    record = {"episode_id": "e", "agents": {"a": entry(), "b": entry(is_truncated=True)}, **record_flags}
    decoded = decode_multi_agent_record(record, 0, MODULES, True)
    a, b = decoded.agents
    assert (a.chunk.is_terminated, a.chunk.is_truncated) == expected
    assert (b.chunk.is_terminated, b.chunk.is_truncated) == (False, True), "an entry's own flags stay"
    batch = build_batch([a.chunk])
    assert bool(batch.terminated[-1]) == expected[0], "a terminal last step is not bootstrapped"
