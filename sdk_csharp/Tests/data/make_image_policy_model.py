"""Writes the C# SDK's ONNX test model for a real-size image observation (protocol 1.4).

policy_image_84x84x4.onnx: a one-convolution policy for the observation space
Box(shape [84, 84, 4], dtype uint8, 0..255) and the action space Discrete(6),
laid out as the server's exports of a byte box are (docs/protocol.md §12.1): its
input "obs" is uint8 (batch, 84, 84, 4), the image in its own shape, its output
"action_dist_inputs" float32 (batch, 6). Inside: Cast to float, scale by 1/255,
NHWC -> NCHW, Conv 4 -> 8 channels (8x8, stride 4), Relu, GlobalAveragePool,
Flatten and a linear layer 8 -> 6; a few KB, so that the test of
steady-state allocations on full images (ByteObservationTests) runs a real image
through ONNX Runtime without a large fixture.

Run from the repository root with the project's venv:
    .venv/bin/python sdk_csharp/Tests/data/make_image_policy_model.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
NAME = "policy_image_84x84x4.onnx"
SHAPE = [84, 84, 4]
ACTIONS = 6


def main() -> None:
    rng = np.random.default_rng(11)
    conv_w = rng.normal(0.0, 0.2, size=(8, SHAPE[2], 8, 8)).astype(np.float32)
    conv_b = rng.normal(0.0, 0.1, size=(8,)).astype(np.float32)
    fc_w = rng.normal(0.0, 1.0, size=(8, ACTIONS)).astype(np.float32)
    fc_b = rng.normal(0.0, 0.5, size=(ACTIONS,)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["obs"], ["obs_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["obs_f", "scale"], ["obs_s"]),
        helper.make_node("Transpose", ["obs_s"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["nchw", "conv_w", "conv_b"], ["conv"], kernel_shape=[8, 8], strides=[4, 4]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"], axis=1),
        helper.make_node("MatMul", ["features", "fc_w"], ["fc"]),
        helper.make_node("Add", ["fc", "fc_b"], ["action_dist_inputs"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(1.0 / 255.0, dtype=np.float32), "scale"),
        numpy_helper.from_array(conv_w, "conv_w"),
        numpy_helper.from_array(conv_b, "conv_b"),
        numpy_helper.from_array(fc_w, "fc_w"),
        numpy_helper.from_array(fc_b, "fc_b"),
    ]
    graph = helper.make_graph(
        nodes, "policy_image_84x84x4",
        [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["batch", *SHAPE])],
        [helper.make_tensor_value_info("action_dist_inputs", TensorProto.FLOAT, ["batch", ACTIONS])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="tether-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    images = np.random.default_rng(3).integers(0, 256, size=(2, *SHAPE), dtype=np.uint8)
    logits = session.run(["action_dist_inputs"], {"obs": images})[0]
    assert logits.shape == (2, ACTIONS) and np.isfinite(logits).all()
    (HERE / NAME).write_bytes(data)
    print(f"wrote {NAME} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
