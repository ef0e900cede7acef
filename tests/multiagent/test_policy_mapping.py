"""Policy-mapping rules: order, globs, stable choices, clear errors."""

from __future__ import annotations

from collections import Counter

import pytest

from tether.multiagent import PolicyMapping, UnmappedAgentError, fnv1a32
from tether.protocol import MessageError

RULES = [
    {"agent_id": "adversary_0", "module": "boss"},
    {"pattern": "adversary_*", "module": "chaser"},
    {"pattern": "car_?", "choose_from": ["car_a", "car_b"]},
    {"pattern": "*", "module": "default"},
]


def test_first_match_wins_and_globs() -> None:
    mapping = PolicyMapping.from_json(RULES)
    assert mapping.module_for("adversary_0") == "boss"
    assert mapping.module_for("adversary_12") == "chaser"
    assert mapping.module_for("agent_0") == "default"
    assert mapping.modules() == {"boss", "chaser", "car_a", "car_b", "default"}
    assert PolicyMapping.from_json(mapping.to_json()).to_json() == RULES


def test_choice_is_stable_within_an_episode_and_varies_across_episodes() -> None:
    mapping = PolicyMapping.from_json(RULES)
    assert len({mapping.module_for("car_1", "ep-7") for _ in range(5)}) == 1
    picks = Counter(mapping.module_for("car_1", f"ep-{i}") for i in range(400))
    assert set(picks) == {"car_a", "car_b"} and min(picks.values()) > 150


def test_fnv1a_reference_values() -> None:
    # Published FNV-1a 32-bit test values: every SDK must reproduce them.
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_unmatched_agent_and_malformed_rules_are_clear_errors() -> None:
    mapping = PolicyMapping.from_json([{"pattern": "good_*", "module": "g"}])
    with pytest.raises(UnmappedAgentError, match="'bad_1'"):
        mapping.module_for("bad_1")
    for bad in [{"agent_id": "a"}, {"agent_id": "a", "pattern": "b", "module": "m"},
                {"pattern": "*", "module": "m", "choose_from": ["x"]}, {"pattern": "*", "modul": "m"}]:
        with pytest.raises(MessageError):
            PolicyMapping.from_json([bad])
