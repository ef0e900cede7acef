"""Writes the ONNX models the managed backend's tests read (PolicyGraphTests).

policy_box_3x8x2.onnx: the project's exporter on a Box(2) policy, obs 3 -> 8 ->
2 means, with the state-independent log_std appended by Shape/Expand/Concat.
policy_matmul_relu.onnx: an MLP written as torch.onnx.export writes one
(MatMul + Add, Relu, Sigmoid, Gemm with alpha/beta and no transB), obs 5 -> 6 -> 3.
policy_softmax.onnx: a model with an operator the managed backend refuses.

Run from the repository root with the project's venv:
    .venv/bin/python sdk_csharp/Tests/data/make_policy_graph_models.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from tether.protocol.spaces import Box
from tether.server.learner.onnx_export import export_policy
from tether.server.learner.policy_network import ActorCritic

HERE = Path(__file__).resolve().parent


def _save(model: onnx.ModelProto, name: str) -> None:
    model.ir_version = 8
    onnx.checker.check_model(model)
    (HERE / name).write_bytes(model.SerializeToString())
    print(f"wrote {name}")


def main() -> None:
    torch.manual_seed(5)
    box = ActorCritic(obs_dim=3, action_space=Box(np.full(2, -1.0, np.float32), np.full(2, 1.0, np.float32)), hidden=(8,))
    with torch.no_grad():
        box.actor[-1].weight.mul_(50.0)
        box.log_std.copy_(torch.tensor([-0.3, 0.2]))
    (HERE / "policy_box_3x8x2.onnx").write_bytes(export_policy(box))
    print("wrote policy_box_3x8x2.onnx")

    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.normal(size=(5, 6)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.normal(size=(6,)).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.normal(size=(6, 3)).astype(np.float32), "w2")
    c2 = numpy_helper.from_array(rng.normal(size=(1, 3)).astype(np.float32), "c2")
    nodes = [
        helper.make_node("MatMul", ["obs", "w1"], ["h0"]),
        helper.make_node("Add", ["b1", "h0"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("Sigmoid", ["h2"], ["h3"]),
        helper.make_node("Gemm", ["h3", "w2", "c2"], ["out"], alpha=0.5, beta=2.0),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 5])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3])], [w1, b1, w2, c2])
    _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "policy_matmul_relu.onnx")

    w = numpy_helper.from_array(rng.normal(size=(2, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Gemm", ["obs", "w"], ["z"], transB=1), helper.make_node("Softmax", ["z"], ["out"], axis=1)]
    graph = helper.make_graph(nodes, "softmax", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 2])], [w])
    _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "policy_softmax.onnx")


if __name__ == "__main__":
    main()
