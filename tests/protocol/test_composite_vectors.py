"""composite.json (protocol 1.4 §8.6, §10.6 checks 4c and 14b-14d, §11.6, §12.1): Dict and Tuple
spaces, their flat rows and model inputs, records of leaves, and action masks, run by the Python core
(the C++ and C# SDKs run the same file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tether.protocol.action_mask import resolve_action_mask
from tether.protocol.episodes import decode_episode
from tether.protocol.errors import InvalidInputError, MessageError
from tether.protocol.messages import decode_message
from tether.protocol.spaces import Dict, Tuple, box, flatten_observation, space_from_json

from .test_conformance import space_or_refusal

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "composite.json").read_text())["cases"]


def _kind(kind: str) -> list[dict]:
    return [c for c in VECTORS if c["kind"] == kind]


@pytest.mark.parametrize("case", _kind("space"), ids=lambda c: c["name"])
def test_space(case: dict) -> None:
    space = space_or_refusal(case)
    if space is None:
        return
    assert [{"path": l.path, "offset": l.offset, "size": l.size, "dtype": "uint8" if l.is_bytes else "float32"}
            for l in space.leaves] == case["leaves"]
    assert space.flat_dim == case["flat_dim"]
    assert [{"name": l.path, "dtype": "uint8" if l.is_bytes else "float32",
             "dims": list(l.space.shape) if l.is_bytes else [l.size]} for l in space.leaves] == case["inputs"]
    assert space_from_json(json.loads(json.dumps(space.to_json()))).to_json() == space.to_json()


@pytest.mark.parametrize("case", _kind("observation"), ids=lambda c: c["name"])
def test_observation(case: dict) -> None:
    space = space_from_json(case["space"])
    if case.get("error"):
        with pytest.raises(InvalidInputError) as info:
            flatten_observation(space, case["observation"])
        assert info.value.code == case["error"]
        return
    assert flatten_observation(space, case["observation"]).tolist() == pytest.approx(case["flat_row"])


@pytest.mark.parametrize("case", _kind("episode"), ids=lambda c: c["name"])
def test_episode(case: dict) -> None:
    obs_space = space_from_json(case["observation_space"])
    act_space = space_from_json(case["action_space"])
    mask = resolve_action_mask(obs_space, act_space, case["action_mask"]) if case["action_mask"] else None
    try:
        _, message = decode_message(case["body"].encode())
        chunks = [[decode_episode(r, i, obs_space, act_space, case["require_logp"], mask)
                   for i, r in enumerate(message["episodes"])]]
    except MessageError as exc:
        assert "error" in case, f"unexpected {exc}"
        assert exc.code.value == case["error"], exc
        return
    assert "error" not in case, f"expected {case.get('error')}"
    assert sum(c.env_steps for c in chunks[0]) == case["env_steps"]
    assert chunks[0][0].obs.shape == (case["env_steps"] + 1, obs_space.flat_dim)
    if "flat_rows" in case:  # the leaves' values, in leaf order, whatever order they were written in
        np.testing.assert_array_equal(chunks[0][0].obs, np.asarray(case["flat_rows"], np.float32))


@pytest.mark.parametrize("case", _kind("mask"), ids=lambda c: c["name"])
def test_mask_before_sampling(case: dict) -> None:
    act = space_from_json(case["action_space"])
    size = len(case["mask"])
    space = Dict((("action_mask", box(0, 1, (size,))),))
    why = resolve_action_mask(space, act, None).why_not_actable(np.asarray(case["mask"], dtype=np.float32))
    if case["error"] is None:
        assert why is None
    else:
        assert why is not None and why[0] == case["error"], why


def test_every_kind_is_covered() -> None:
    assert {c["kind"] for c in VECTORS} == {"space", "observation", "episode", "mask"}
    assert isinstance(space_from_json(_kind("space")[2]["space"]), Tuple)


def test_a_leaf_of_the_right_size_in_another_shape_is_refused() -> None:
    """A CHW camera for an HWC leaf has the right number of values but the wrong layout: refused by
    name; the leaf's own shape and the flat form are taken."""
    space = Dict((("camera", box(0, 255, (4, 3, 2), "uint8")), ("speed", box(-1, 1, (2,)))))
    hwc = np.arange(24, dtype=np.uint8).reshape(4, 3, 2)
    row = flatten_observation(space, {"camera": hwc, "speed": [0.5, 1]})
    np.testing.assert_array_equal(flatten_observation(space, {"camera": hwc.reshape(-1), "speed": [0.5, 1]}), row)
    with pytest.raises(InvalidInputError) as info:
        flatten_observation(space, {"camera": hwc.transpose(2, 0, 1), "speed": [0.5, 1]})
    assert info.value.code == "OBS_SHAPE_MISMATCH" and "'camera' has shape [2, 4, 3]" in str(info.value)
