"""Writes the C++ SDK's ONNX test model for a Dict observation with an action mask (protocol 1.4).

policy_dict_mask.onnx: the server's own export (PPOLearner.export_onnx) of a
policy for the observation space Dict(action_mask: Box [3] int8 0..1,
board: Box [2, 2], cam: Box [2, 1] uint8) and the action space Discrete(3),
masked by the leaf "action_mask" (docs/protocol.md §11.6): one input per leaf,
named by its path (§12.1; "cam" uint8 (batch, 2, 1), the others float32
(batch, size)), its output "action_dist_inputs" float32 (batch, 3) with -1e9
where the mask is 0.

policy_dict_mask.json: the leaves, a few flat rows (leaf order) and the logits
onnxruntime (Python, CPU) computes for them, fed leaf by leaf.

Run from the repository root with the project's venv:
    .venv/bin/python sdk_cpp/tests/data/make_dict_policy_model.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tether.protocol.action_mask import resolve_action_mask
from tether.protocol.spaces import space_from_json
from tether.server.learner import PPOHyperparams, PPOLearner

HERE = Path(__file__).resolve().parent
NAME = "policy_dict_mask"
SPACE = {"type": "Dict", "spaces": {
    "action_mask": {"type": "Box", "shape": [3], "dtype": "int8", "low": 0, "high": 1},
    "board": {"type": "Box", "shape": [2, 2], "low": 0, "high": 1},
    "cam": {"type": "Box", "shape": [2, 1], "dtype": "uint8", "low": 0, "high": 255}}}


def main() -> None:
    observation_space = space_from_json(SPACE)
    action_space = space_from_json({"type": "Discrete", "n": 3})
    mask = resolve_action_mask(observation_space, action_space, "action_mask")
    learner = PPOLearner(observation_space, action_space, PPOHyperparams(), seed=0, action_mask=mask)
    with torch.no_grad():
        torch.manual_seed(7)
        inner = learner.model.inner  # (the network inside the masking)
        inner.actor[-1].weight.mul_(100.0)
        inner.actor[-1].bias.uniform_(-0.5, 0.5)
    data = learner.export_onnx()
    (HERE / f"{NAME}.onnx").write_bytes(data)

    rows = np.array([[1, 0, 1, 0, 1, 1, 0, 7, 200],
                     [0, 1, 0, 1, 1, 1, 1, 0, 255],
                     [1, 1, 1, 0, 0, 0, 0, 31, 4],
                     [0, 0, 1, 1, 0, 1, 0, 128, 128]], dtype=np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feeds = {}
    for leaf in observation_space.leaves:
        part = rows[:, leaf.offset:leaf.offset + leaf.size]
        feeds[leaf.path] = part.reshape(len(rows), *leaf.space.shape).astype(np.uint8) if leaf.is_bytes else part
    logits = session.run(["action_dist_inputs"], feeds)[0]
    assert np.abs(logits[logits > -1e8]).max() > 0.1, "the logits are too small to tell a wrong computation apart"
    record = {
        "model": f"{NAME}.onnx",
        "observation_space": SPACE,
        "action_mask": "action_mask",
        "inputs": [i.name for i in session.get_inputs()],
        "output_name": "action_dist_inputs",
        "rows": rows.tolist(),
        "expected": logits.astype(float).tolist(),
    }
    (HERE / f"{NAME}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
