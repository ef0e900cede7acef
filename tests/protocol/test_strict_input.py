"""What a server refuses before it keeps anything (docs/protocol.md §4, §9.2, §10.5-§10.8):
ids that are not Unicode text, numbers written as strings or booleans, and bodies
nested deeper than 64 levels, which are refused before they are parsed."""

from __future__ import annotations

import json
import pickle
import random
import time

import numpy as np
import pytest

from tether.protocol import decode_episodes, decode_message
from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol import messages
from tether.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.protocol.spaces import space_from_json

OBS = space_from_json({"type": "Box", "shape": [2], "low": -10, "high": 10})
DISCRETE = space_from_json({"type": "Discrete", "n": 3})
BOX = space_from_json({"type": "Box", "shape": [2], "low": -1, "high": 1})
MODULES = {"m": ModuleSpec("m", OBS, DISCRETE),
           "critic": ModuleSpec("critic", OBS, DISCRETE, value_obs_agents=("a", "b"))}


def record(**overrides: object) -> dict:
    rec = {"obs": [[0.5, -0.5], [0.25, 0.0], [1.0, 2.0]], "actions": [0, 2], "rewards": [1.0, 0.5],
           "action_logp": [-1.1, -1.1], "action_dist_inputs": [[0.0, 0.0, 0.0], [0.1, 0.2, 0.3]],
           "is_terminated": False, "is_truncated": False}
    rec.update(overrides)
    return rec


def single(rec: dict, action_space=DISCRETE) -> ErrorCode | int:
    """The code a server answers for one single-agent record, or its steps."""
    try:
        chunks = decode_episodes({"type": "EPISODES", "episodes": [rec]}, OBS, action_space, True)
    except MessageError as exc:
        return exc.code
    return sum(c.env_steps for c in chunks)


def multi(agents: dict, **top: object) -> ErrorCode | int:
    rec = {"episode_id": "e", "is_terminated": False, "is_truncated": False, "agents": agents, **top}
    try:
        return decode_multi_agent_record(rec, 0, MODULES, True).agent_steps
    except MessageError as exc:
        return exc.code


# -- numbers (§10.5) ---------------------------------------------------------------------------------

NOT_NUMBERS = {
    "reward_numeric_string": {"rewards": ["1e30", 0.5]},
    "reward_string_after_numbers": {"rewards": [1.0, "0.5"]},
    "reward_true": {"rewards": [True, 0.5]},
    "all_rewards_booleans": {"rewards": [True, False]},
    "action_true": {"actions": [True, 0]},
    "action_false": {"actions": [0, False]},
    "action_numeric_string": {"actions": ["1", 0]},
    "obs_boolean": {"obs": [[0.5, True], [0.25, 0.0], [1.0, 2.0]]},
    "obs_boolean_row": {"obs": [[True, False], [0.25, 0.0], [1.0, 2.0]]},
    "obs_numeric_string": {"obs": [[0.5, -0.5], ["0.25", 0.0], [1.0, 2.0]]},
    "logp_boolean": {"action_logp": [-1.1, False]},
    "logp_numeric_string": {"action_logp": ["-1.1", -1.1]},
    "dist_inputs_boolean": {"action_dist_inputs": [[0.0, 0.0, 0.0], [0.1, True, 0.3]]},
    "dist_inputs_numeric_string": {"action_dist_inputs": [[0.0, "0", 0.0], [0.1, 0.2, 0.3]]},
}


@pytest.mark.parametrize("overrides", NOT_NUMBERS.values(), ids=list(NOT_NUMBERS))
def test_numbers_as_strings_or_booleans_are_refused(overrides: dict) -> None:
    assert single(record(**overrides)) is ErrorCode.INVALID_FIELD
    entry = dict(record(**overrides), module="m")
    assert multi({"a": entry}) is ErrorCode.INVALID_FIELD


def test_box_action_boolean_is_refused() -> None:
    box = record(actions=[[0.5, True], [0.0, 0.0]], action_dist_inputs=[[0.0] * 4] * 2)
    assert single(box, BOX) is ErrorCode.INVALID_FIELD
    assert single(dict(box, actions=[[0.5, 1.0], [0.0, 0.0]]), BOX) == 2


def test_numbers_stay_accepted() -> None:
    """Integers for floats, floats for integral actions, zeros and ones: all still numbers."""
    assert single(record()) == 2
    assert single(record(rewards=[1, 0], actions=[1.0, 0], obs=[[0, 1], [1, 0], [0, 0]],
                         action_dist_inputs=[[0, 1, 0], [1, 0, 0]], action_logp=[0, -1])) == 2
    assert multi({"a": dict(record(), module="m")}) == 2


def test_null_is_still_not_finite() -> None:
    assert single(record(rewards=[None, 0.5])) is ErrorCode.NON_FINITE_VALUE
    assert single(record(obs=[[0.5, None], [0.25, 0.0], [1.0, 2.0]])) is ErrorCode.NON_FINITE_VALUE


@pytest.mark.parametrize("value_obs", [[["0"] * 4] * 3, [[True] + [0.0] * 3] * 3, [[0.0] * 4, [0.0] * 3 + [False], [0.0] * 4]],
                         ids=["numeric_strings", "booleans", "one_boolean"])
def test_value_obs_must_be_numbers(value_obs: list) -> None:
    """value_obs that is not a rectangular array of numbers is a shape mismatch (§9.7, §10.8)."""
    assert multi({"a": dict(record(), module="critic", value_obs=value_obs)}) is ErrorCode.OBS_SHAPE_MISMATCH
    assert multi({"a": dict(record(), module="critic", value_obs=[[0.5] * 4] * 3)}) == 2


def test_strict_conversion_matches_numpy_on_numbers() -> None:
    """On numbers the strict conversion gives what np.asarray gives; anything holding
    a string or a boolean is refused, at any position."""
    rng = random.Random(3)
    atoms = [True, False, "1.5", "x"]
    for _ in range(2000):
        rows, width = rng.randint(1, 4), 2
        obs = [[rng.choice([0, 1, 0.0, 1.0, -2, rng.random()]) for _ in range(width)] for _ in range(rows + 1)]
        rewards = [rng.choice([0, 1, 1.0, 0.5]) for _ in range(rows)]
        rec = record(obs=obs, rewards=rewards, actions=[rng.randrange(3) for _ in range(rows)],
                     action_logp=[-1.0] * rows, action_dist_inputs=[[0.0] * 3] * rows)
        _, message = decode_message(json.dumps({"type": "EPISODES", "episodes": [rec]}).encode())
        chunk = decode_episodes(message, OBS, DISCRETE, True)[0]
        assert np.array_equal(chunk.obs, np.asarray(obs, np.float32))
        assert np.array_equal(chunk.rewards, np.asarray(rewards, np.float32))
        key = rng.choice(["obs", "rewards"])
        bad = json.loads(json.dumps(rec))
        if key == "obs":
            bad["obs"][rng.randrange(rows + 1)][rng.randrange(width)] = rng.choice(atoms)
        else:
            bad["rewards"][rng.randrange(rows)] = rng.choice(atoms)
        assert single(bad) is ErrorCode.INVALID_FIELD, bad


# -- ids (§4.1, §9.2) ----------------------------------------------------------------------------------

LONE = ["\ud800", "agent_\udfff", "\udc00\ud800"]


@pytest.mark.parametrize("agent_id", LONE, ids=["high", "low_at_end", "reversed_pair"])
def test_agent_id_with_a_lone_surrogate_is_refused(agent_id: str) -> None:
    entry = dict(record(), module="m", is_terminated=True)
    assert multi({agent_id: entry}) is ErrorCode.INVALID_FIELD
    assert multi({"ok": dict(record(), module="m"), agent_id: entry}) is ErrorCode.INVALID_FIELD
    # A proper pair is one character, not a surrogate: fine.
    assert multi({"agent_\U0001F600": entry}) == 2


def test_episode_id_with_a_lone_surrogate_is_refused() -> None:
    assert single(record(episode_id="ep\ud800")) is ErrorCode.INVALID_FIELD
    assert single(record(episode_id="ep\U0001F600")) == 2
    assert multi({"a": dict(record(), module="m")}, episode_id="\udbff") is ErrorCode.INVALID_FIELD


def test_module_name_with_a_lone_surrogate_is_refused() -> None:
    assert multi({"a": dict(record(), module="m\ud800")}) is ErrorCode.INVALID_FIELD
    assert multi({"a": dict(record(), module="nope")}) is ErrorCode.UNKNOWN_MODULE


def test_refusal_of_a_lone_surrogate_is_ascii_and_crosses_processes() -> None:
    """The error message names the id with an escape, so it can be written as UTF-8."""
    try:
        decode_multi_agent_record({"agents": {"\ud800": dict(record(), module="m")}}, 4, MODULES, True)
    except MessageError as exc:
        exc.message.encode("utf-8")
        assert exc.message.startswith("episodes[4]") and "\\ud800" in exc.message
        again = pickle.loads(pickle.dumps(exc))
        assert again.code is ErrorCode.INVALID_FIELD and again.message == exc.message
    else:
        raise AssertionError("not refused")


def test_map_agents_and_client_session_ids_must_be_text() -> None:
    from tether.server.ingest.batch_dedup import batch_id
    from tether.server.config import ServerConfig
    from tether.server.ingest.validation import EpisodeIngest
    from tether.server.module_setup import build_layout

    ingest = EpisodeIngest(build_layout(ServerConfig(), None), True)
    assert ingest.assign(1, {"type": "MAP_AGENTS", "agent_ids": ["a"], "episode_id": "e"}) == {"a": "default_policy"}
    for message in ({"agent_ids": ["a", "\ud800"]}, {"agent_ids": ["a"], "episode_id": "\ud800"}):
        with pytest.raises(MessageError) as info:
            ingest.assign(1, {"type": "MAP_AGENTS", **message})
        assert info.value.code is ErrorCode.INVALID_FIELD
    assert batch_id({"client_session": "s\U0001F600", "batch_seq": 1}) is not None
    with pytest.raises(MessageError) as info:
        batch_id({"client_session": "s\ud800", "batch_seq": 1})
    assert info.value.code is ErrorCode.INVALID_FIELD and "client_session" in info.value.message


# -- nesting (§4.1, §4.2) --------------------------------------------------------------------------------

def nested(depth: int, inner: bytes = b"1") -> bytes:
    """A PING whose unknown field nests arrays so that the body is ``depth`` levels deep."""
    return b'{"type": "PING", "x": ' + b"[" * (depth - 1) + inner + b"]" * (depth - 1) + b"}"


def test_bodies_up_to_64_levels_are_read() -> None:
    assert messages.MAX_NESTING == 64
    assert decode_message(nested(64))[0].value == "PING"
    assert decode_message(b'{"type": "PING", "x": ' + b'{"a": ' * 63 + b"1" + b"}" * 63 + b"}")[0].value == "PING"


@pytest.mark.parametrize("body", [nested(65), nested(900), b'{"type": "PING", "x": ' + b'{"a": ' * 64 + b"1" + b"}" * 64 + b"}",
                                  b'{"type": ' + b"[" * 1000 + b"]" * 1000 + b"}", b"[" * 100_000],
                         ids=["65", "900", "objects_65", "type_1000", "unclosed"])
def test_deeper_bodies_are_invalid_json(body: bytes) -> None:
    with pytest.raises(MessageError) as info:
        decode_message(body)
    assert info.value.code is ErrorCode.INVALID_JSON


def test_brackets_in_strings_do_not_count() -> None:
    deep_text = json.dumps({"type": "PING", "client_name": "[" * 500 + "{" * 500}).encode()
    assert decode_message(deep_text)[0].value == "PING"
    # Escaped quotes and backslashes do not end a string early.
    tricky = (b'{"type": "PING", "a": "\\\\", "b": "\\"[[[[", "c": "\\\\\\"' + b"[" * 100 + b'", "d": '
              + b"[" * 60 + b"]" * 60 + b"}")
    assert decode_message(tricky)[1]["c"] == '\\"' + "[" * 100
    with pytest.raises(MessageError) as info:
        decode_message(tricky.replace(b"[" * 60 + b"]" * 60, b"[" * 64 + b"]" * 64))
    assert info.value.code is ErrorCode.INVALID_JSON


def test_invalid_utf8_is_reported_before_nesting() -> None:
    with pytest.raises(MessageError) as info:
        decode_message(nested(100).replace(b"PING", b"P\xffNG"))
    assert info.value.code is ErrorCode.INVALID_UTF8


def _scan(text: bytes) -> tuple[int, bool]:
    """The deepest nesting of ``text``, character by character, and whether it can be JSON
    (brackets balanced, backslashes only inside strings)."""
    depth = deepest = 0
    in_string = escaped = False
    balanced = True
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c == 0x5C:  # a backslash outside a string: no JSON
            balanced = False
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in b"]}":
            depth -= 1
            balanced = balanced and depth >= 0
    return deepest, balanced and depth == 0 and not in_string


def test_nesting_check_agrees_with_a_character_loop() -> None:
    """On random JSON-like texts (valid or not, strings with escapes), the check says
    "deeper than the limit" exactly when a character-by-character count does."""
    rng = random.Random(11)
    pieces = [b"[", b"]", b"{", b"}", b'"', b"\\", b"\\\\", b'\\"', b"1", b",", b":", b" ", b"[[[[", b"]]]]"]
    for _ in range(3000):
        text = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        limit = rng.randint(1, 6)
        # Only balanced texts, escapes only in strings, can be JSON; the parser refuses the others anyway.
        deepest, balanced = _scan(text)
        if balanced:
            assert messages.nesting_exceeds(text, limit) == (deepest > limit), (text, limit)


def test_nesting_check_is_fast_on_a_large_body() -> None:
    """It runs on every body: on a 3 MB EPISODES body it costs a small part of the parse."""
    rng = random.Random(0)
    steps = 27_000
    rec = {"obs": [[rng.uniform(-1, 1) for _ in range(4)] for _ in range(steps + 1)], "actions": [1] * steps,
           "rewards": [1.0] * steps, "action_logp": [-0.7] * steps,
           "action_dist_inputs": [[0.1, -0.1]] * steps, "is_terminated": True, "is_truncated": False}
    body = json.dumps({"type": "EPISODES", "episodes": [rec]}).encode()
    assert len(body) > 3_000_000

    def best(f) -> float:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return min(times)

    import orjson

    assert not messages.nesting_exceeds(body)
    assert best(lambda: messages.nesting_exceeds(body)) < 0.25 * best(lambda: orjson.loads(body))


@pytest.mark.parametrize("agents", ['"a_0"', '{"a_0": 1}', "3", '["a_0", 1]', "[null]"])
def test_value_obs_agents_that_are_not_an_array_of_agent_ids_are_refused(agents: str) -> None:
    """A module's value_obs_agents (§9.1) is an array of agent ids, or absent or null: a string is not
    split into one-letter ids (the critic would silently see zeros), and nothing else is taken."""
    module = {"observation_space": {"type": "Box", "shape": [2], "low": 0, "high": 1},
              "action_space": {"type": "Discrete", "n": 2}}
    assert ModuleSpec.from_json("m", dict(module, value_obs_agents=["a_0", "a_1"])).value_obs_agents == ("a_0", "a_1")
    assert ModuleSpec.from_json("m", module).value_obs_agents == ()
    assert ModuleSpec.from_json("m", dict(module, value_obs_agents=None)).value_obs_agents == ()
    with pytest.raises(MessageError) as info:
        ModuleSpec.from_json("m", dict(module, value_obs_agents=json.loads(agents)))
    assert info.value.code is ErrorCode.INVALID_FIELD and "value_obs_agents" in info.value.message
