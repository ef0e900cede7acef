"""env_params.json (protocol §19) played through the Python protocol core: the sets a client takes or
ignores, what each sampler gives for given uniform draws, a whole set drawn in name order, and the
records a server refuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tether.protocol.env_params import (
    EnvParamsError,
    check_played_with,
    decode_record_env_params,
    draw,
    draw_all,
    parse_env_params,
    record_env_params,
)
from tether.protocol.errors import MessageError

CASES = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "env_params.json").read_text())["cases"]


def by_kind(kind: str) -> list:
    return [pytest.param(c, id=c["name"]) for c in CASES if c["kind"] == kind]


def uniforms(case: dict):  # type: ignore[no-untyped-def]
    it = iter(case["uniforms"])
    return lambda: next(it)


@pytest.mark.parametrize("case", by_kind("set"))
def test_set(case: dict) -> None:
    if case["valid"]:
        params = parse_env_params(case["env_params"])
        assert params.to_json() == {**case["env_params"], "values": {
            k: (float(v) if not isinstance(v, dict) else params.values[k]) for k, v in case["env_params"]["values"].items()}}
    else:
        with pytest.raises(EnvParamsError):
            parse_env_params(case["env_params"])


@pytest.mark.parametrize("case", by_kind("draw"))
def test_draw(case: dict) -> None:
    value = case["value"]
    if isinstance(value, dict):  # (normalised as a client parses it)
        value = parse_env_params({"seq": 1, "lesson": 0, "values": {"x": value}}).values["x"]
    next_uniform = uniforms(case)
    assert math.isclose(draw(value, next_uniform), case["expect"], rel_tol=1e-12, abs_tol=1e-300)
    with pytest.raises(StopIteration):  # every given draw was used, no more
        next_uniform()


@pytest.mark.parametrize("case", by_kind("draw_all"))
def test_draw_all(case: dict) -> None:
    values = parse_env_params({"seq": 1, "lesson": 0, "values": case["values"]}).values
    got = draw_all(values, uniforms(case))
    assert list(got) == sorted(case["expect"]) and all(
        math.isclose(got[k], case["expect"][k], rel_tol=1e-12) for k in got)


@pytest.mark.parametrize("case", by_kind("record"))
def test_record(case: dict) -> None:
    held = parse_env_params(case["held"])
    try:
        played = decode_record_env_params(case["record"], "episodes[0]")
        assert played is not None
        if played.seq == held.seq:
            check_played_with(played, held, "episodes[0]")
    except MessageError as exc:
        assert case["error"] == exc.code.value, exc
        assert "env_params" in exc.message
    else:
        assert case["error"] is None, "accepted"


def test_record_member_round_trips_through_the_check() -> None:
    member = record_env_params(3, {"speed": 2.0, "gravity": 9.5}, measure=0.25)
    assert member == {"seq": 3, "values": {"speed": 2.0, "gravity": 9.5}, "measure": 0.25}
    assert "measure" not in record_env_params(3, {"speed": 2.0})
    played = decode_record_env_params(member, "episodes[0]")
    assert played is not None and played.measure == 0.25 and played.values["gravity"] == 9.5
