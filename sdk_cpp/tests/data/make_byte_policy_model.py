"""Writes the C++ and C# SDKs' ONNX test model for a byte box (protocol 1.4) and its expected outputs.

policy_bytes_2x3x1.onnx: the server's own export (PPOLearner.export_onnx) of a
policy for the observation space Box(shape [2, 3, 1], dtype uint8, 0..255) and
the action space Discrete(2): its input "obs" is uint8 (batch, 2, 3, 1), the
image in its own shape (docs/protocol.md §12.1), its output
"action_dist_inputs" float32 (batch, 2). The last layer's weights are scaled up
from the training init (gain 0.01) so the logits are of order 1 and a wrong
computation cannot hide under the test's 1e-5 tolerance.

policy_bytes_2x3x1.json: input/output names, the input's shape, a few
observations (integers 0-255) and the logits onnxruntime (Python, CPU)
computes for them.

Run from the repository root with the project's venv (the C# fixture uses another
seed, so the two SDKs are not checked against one set of numbers only):
    .venv/bin/python sdk_cpp/tests/data/make_byte_policy_model.py
    .venv/bin/python sdk_cpp/tests/data/make_byte_policy_model.py --out sdk_csharp/Tests/data --seed 5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tether.protocol.spaces import space_from_json
from tether.server.learner import PPOHyperparams, PPOLearner

HERE = Path(__file__).resolve().parent
NAME = "policy_bytes_2x3x1"
SHAPE = [2, 3, 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into (default: this one)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the scaled last layer and the observations")
    args = parser.parse_args()
    observation_space = space_from_json({"type": "Box", "shape": SHAPE, "dtype": "uint8", "low": 0, "high": 255})
    action_space = space_from_json({"type": "Discrete", "n": 2})
    learner = PPOLearner(observation_space, action_space, PPOHyperparams(), seed=0, onnx_input_name="obs")
    with torch.no_grad():
        torch.manual_seed(args.seed)
        learner.model.actor[-1].weight.mul_(100.0)
        learner.model.actor[-1].bias.uniform_(-0.5, 0.5)
    data = learner.export_onnx()
    (args.out / f"{NAME}.onnx").write_bytes(data)

    rng = np.random.default_rng(args.seed)
    obs = rng.integers(0, 256, size=(5, *SHAPE), dtype=np.uint8)
    obs[0] = 0
    obs[1] = 255
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    assert model_input.type == "tensor(uint8)" and list(model_input.shape[1:]) == SHAPE, model_input
    logits = session.run(["action_dist_inputs"], {"obs": obs})[0]
    assert np.abs(logits).max() > 0.1, "the logits are too small to tell a wrong computation apart"

    record = {
        "model": f"{NAME}.onnx",
        "input_name": "obs",
        "output_name": "action_dist_inputs",
        "input_shape": SHAPE,
        "obs_dim": int(np.prod(SHAPE)),
        "out_dim": 2,
        "onnxruntime_version": ort.__version__,
        "observations": obs.reshape(len(obs), -1).astype(int).tolist(),
        "outputs": logits.astype(np.float64).tolist(),
    }
    (args.out / f"{NAME}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {NAME}.onnx ({len(data)} bytes) and {NAME}.json")


if __name__ == "__main__":
    main()
