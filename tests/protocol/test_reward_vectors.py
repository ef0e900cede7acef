"""tests/conformance/rewards.json against the Python SDK's episode recorder (§10.5): a step's
reward never goes out beyond float32; the call that would take it there is refused and adds nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tether.protocol.errors import InvalidInputError
from tether.sdk.episode_recorder import EpisodeRecorder

CASES = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "rewards.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_step_rewards(case: dict) -> None:
    recorder = EpisodeRecorder("e", True)
    refused = []
    for index, call in enumerate(case["calls"]):
        if call == "act":
            recorder.record_step(np.array([0.5, -0.5], np.float32), 1, -0.7, np.zeros(2, np.float32), None, None)
            continue
        before = (list(recorder.rewards), recorder.total_return)
        try:
            recorder.add_reward(call)
        except InvalidInputError as exc:
            assert exc.code == "NON_FINITE_VALUE" and "float32" in str(exc)
            assert (list(recorder.rewards), recorder.total_return) == before  # nothing added
            refused.append(index)
    recorder.finish(np.array([0.0, 0.0], np.float32), truncated=False)
    record = recorder.cut()[0]
    assert refused == case["refused"]
    assert len(record["rewards"]) == len(case["step_rewards"])
    for got, want in zip(record["rewards"], case["step_rewards"]):
        assert math.isclose(got, want, rel_tol=1e-9), (record["rewards"], case["step_rewards"])
