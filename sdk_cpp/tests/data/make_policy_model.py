"""Writes the C++ SDK's ONNX test model and its expected outputs.

policy_4x64x64x2.onnx: the project's policy exporter (tether.server.learner.
onnx_export.export_policy) applied to an ActorCritic with obs 4 -> 64 -> 64 ->
2 logits (Discrete(2)), dynamic batch. The last layer's weights are scaled up
from the training init (gain 0.01) so the logits are of order 1 and a wrong
computation cannot hide under the test's 1e-5 tolerance.

policy_4x64x64x2.json: input/output names, a few observations and the logits
onnxruntime (Python, CPU) computes for them.

Run from the repository root with the project's venv:
    .venv/bin/python sdk_cpp/tests/data/make_policy_model.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tether.protocol.spaces import Discrete
from tether.server.learner.onnx_export import DEFAULT_INPUT_NAME, DEFAULT_OUTPUT_NAME, export_policy
from tether.server.learner.policy_network import ActorCritic

HERE = Path(__file__).resolve().parent
NAME = "policy_4x64x64x2"


def main() -> None:
    torch.manual_seed(7)
    model = ActorCritic(obs_dim=4, action_space=Discrete(2), hidden=(64, 64))
    with torch.no_grad():
        model.actor[-1].weight.mul_(100.0)
        model.actor[-1].bias.uniform_(-0.5, 0.5)
    data = export_policy(model)
    (HERE / f"{NAME}.onnx").write_bytes(data)

    rng = np.random.default_rng(7)
    obs = rng.uniform(-2.0, 2.0, size=(5, 4)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    logits = session.run([DEFAULT_OUTPUT_NAME], {DEFAULT_INPUT_NAME: obs})[0]
    with torch.no_grad():
        reference = model.dist_inputs(torch.from_numpy(obs)).numpy()
    assert np.allclose(logits, reference, atol=1e-5), "onnxruntime and torch disagree"

    record = {
        "model": f"{NAME}.onnx",
        "input_name": DEFAULT_INPUT_NAME,
        "output_name": DEFAULT_OUTPUT_NAME,
        "obs_dim": 4,
        "out_dim": 2,
        "onnxruntime_version": ort.__version__,
        "observations": obs.tolist(),
        "outputs": logits.astype(np.float64).tolist(),
    }
    (HERE / f"{NAME}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {NAME}.onnx ({len(data)} bytes) and {NAME}.json")


if __name__ == "__main__":
    main()
