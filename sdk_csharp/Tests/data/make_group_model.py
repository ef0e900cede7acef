"""Writes the C# SDK's second ONNX test model: a group's policy.

policy_4x16x4.onnx: the project's policy exporter applied to an ActorCritic
with obs 4 -> 16 -> 4 outputs (MultiDiscrete([2, 2]): two members' 2-way
choices), dynamic batch. The multi-agent client tests use it for a group of two
members who observe 2 values each.

Run from the repository root with the project's venv:
    .venv/bin/python sdk_csharp/Tests/data/make_group_model.py
"""

from __future__ import annotations

from pathlib import Path

import torch

from tether.protocol.spaces import MultiDiscrete
from tether.server.learner.onnx_export import export_policy
from tether.server.learner.policy_network import ActorCritic

HERE = Path(__file__).resolve().parent


def main() -> None:
    torch.manual_seed(11)
    model = ActorCritic(obs_dim=4, action_space=MultiDiscrete([2, 2]), hidden=(16,))
    with torch.no_grad():
        model.actor[-1].weight.mul_(100.0)
    data = export_policy(model)
    (HERE / "policy_4x16x4.onnx").write_bytes(data)
    print(f"wrote policy_4x16x4.onnx ({len(data)} bytes)")


if __name__ == "__main__":
    main()
