"""The learner's torch log-probabilities (server/learner/distributions.py) against the section-11
vectors that every SDK and the numpy core run: one formula, two libraries (§11)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tether.protocol.spaces import space_from_json
from tether.server.learner.distributions import ActionDistribution

CASES = json.loads((Path(__file__).resolve().parents[1] / "conformance" / "logp.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_torch_logp_matches_the_vector(case: dict) -> None:
    space = space_from_json(case["space"])
    inputs = torch.tensor([case["dist_inputs"]], dtype=torch.float64)
    action = torch.tensor([case["action"]], dtype=torch.float64 if space.to_json()["type"] == "Box" else torch.long)
    got = float(ActionDistribution(space, inputs).log_prob(action)[0])
    assert math.isclose(got, case["logp"], rel_tol=1e-9, abs_tol=1e-9), (got, case["logp"])
