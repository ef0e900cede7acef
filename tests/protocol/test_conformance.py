"""Runs the shared conformance vectors (tests/conformance/*.json) through the
Python protocol core. The C# and C++ SDKs run the same files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tether.sdk.protocol import (
    FrameDecoder,
    FramingError,
    MessageError,
    Refusal,
    ServerConnection,
    decode_episodes,
    decode_message,
    dist_inputs_size,
    log_prob,
    space_from_json,
)

from tether.sdk.protocol.messages import EXPECTED_RESPONSE
from tether.sdk.protocol.multi_agent import ModuleSpec, decode_multi_agent_record
from tether.sdk.protocol.policy_mapping import PolicyMapping, fnv1a32

VECTORS = Path(__file__).resolve().parents[1] / "conformance"


def cases(name: str) -> list[dict]:
    data = json.loads((VECTORS / name).read_text())
    return data["cases"]


def ids(items: list[dict]) -> list[str]:
    return [c["name"] for c in items]


def feed_all(decoder: FrameDecoder, data: bytes, step: int) -> list[bytes]:
    """Feed in pieces of ``step`` bytes until the decoder fails or data ends."""
    bodies: list[bytes] = []
    for i in range(0, len(data), step):
        try:
            bodies += decoder.feed(data[i : i + step])
        except FramingError:
            break
        if decoder.error is not None:
            break
    return bodies


@pytest.mark.parametrize("step", [1, 7, 1 << 20], ids=["byte_by_byte", "7_bytes", "whole"])
@pytest.mark.parametrize("case", cases("framing.json"), ids=ids(cases("framing.json")))
def test_framing_vector(case: dict, step: int) -> None:
    decoder = FrameDecoder(case.get("max_frame_bytes", 64 * 1024 * 1024))
    bodies = feed_all(decoder, bytes.fromhex(case["input_hex"]), step)
    if "error" in case:
        # Frames complete before the bad header are still delivered, then the error holds.
        assert [b.decode() for b in bodies] == case.get("bodies_before_error", [])
        assert decoder.error is not None and decoder.error.code.value == case["error"]
        with pytest.raises(FramingError):
            decoder.feed(b"00000002{}")  # a failed decoder stays failed
    else:
        assert decoder.error is None
        assert [b.decode() for b in bodies] == case["bodies"]


@pytest.mark.parametrize("case", cases("messages.json"), ids=ids(cases("messages.json")))
def test_message_vector(case: dict) -> None:
    body = bytes.fromhex(case["body_hex"])
    if "error" in case:
        with pytest.raises(MessageError) as info:
            decode_message(body)
        assert info.value.code.value == case["error"]
    else:
        kind, message = decode_message(body)
        assert kind.value == case["type"] == message["type"]


@pytest.mark.parametrize("case", cases("spaces.json"), ids=ids(cases("spaces.json")))
def test_space_vector(case: dict) -> None:
    if "error" in case:
        with pytest.raises(MessageError) as info:
            space_from_json(case["space"])
        assert info.value.code.value == case["error"]
        return
    space = space_from_json(case["space"])
    assert list(space.shape) == case["shape"]
    assert dist_inputs_size(space) == case["dist_inputs_size"]
    # The canonical JSON a peer writes back parses to the same space.
    again = space_from_json(json.loads(json.dumps(space.to_json())))
    assert again.to_json() == space.to_json()


@pytest.mark.parametrize("case", cases("episodes.json"), ids=ids(cases("episodes.json")))
def test_episode_vector(case: dict) -> None:
    obs_space = space_from_json(case["observation_space"])
    act_space = space_from_json(case["action_space"])
    try:
        _, message = decode_message(case["body"].encode())
        chunks = decode_episodes(message, obs_space, act_space, case["require_logp"])
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"]
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert sum(c.env_steps for c in chunks) == case["env_steps"]
    for c in chunks:
        assert c.obs.shape[0] == c.env_steps + 1


@pytest.mark.parametrize("case", cases("logp.json"), ids=ids(cases("logp.json")))
def test_logp_vector(case: dict) -> None:
    space = space_from_json(case["space"])
    got = log_prob(space, np.asarray(case["dist_inputs"]), case["action"])
    assert math.isclose(got, case["logp"], rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("case", cases("session.json"), ids=ids(cases("session.json")))
def test_session_vector(case: dict) -> None:
    conn = ServerConnection(auth_token=case["server"].get("auth_token"))
    got = []
    for request in case["requests"]:
        (event,) = conn.receive_data(b"%08d" % len(json.dumps(request)) + json.dumps(request).encode())
        if isinstance(event, Refusal):
            got.append(f"ERROR:{event.error.code.value}")
        else:
            got.append(EXPECTED_RESPONSE[event.kind].value)
    assert got == case["responses"]


MAPPING = json.loads((VECTORS / "policy_mapping.json").read_text())


@pytest.mark.parametrize("case", MAPPING["cases"], ids=ids(MAPPING["cases"]))
def test_policy_mapping_vector(case: dict) -> None:
    if "fnv1a32" in case:
        assert fnv1a32(bytes.fromhex(case["fnv1a32_of_hex"])) == case["fnv1a32"]
        return
    mapping = PolicyMapping.from_json(MAPPING["rules"])
    if "error" in case:
        with pytest.raises(MessageError) as info:
            mapping.module_for(case["agent_id"], case["episode_id"])
        assert info.value.code.value == case["error"]
    else:
        assert mapping.module_for(case["agent_id"], case["episode_id"]) == case["module"]


@pytest.mark.parametrize("case", cases("multi_agent_episodes.json"), ids=ids(cases("multi_agent_episodes.json")))
def test_multi_agent_episode_vector(case: dict) -> None:
    modules = {m: ModuleSpec.from_json(m, spec) for m, spec in case["modules"].items()}
    try:
        record = decode_multi_agent_record(case["record"], 0, modules, case["require_logp"])
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"]
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert record.agent_steps == case["agent_steps"]
