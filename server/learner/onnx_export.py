"""Writes a module's policy network as an ONNX model, directly from its weights.

The policy is a fixed stack of Linear+Tanh layers, so the graph is written
with onnx.helper (Gemm, Tanh, and for Box actions a Concat with the broadcast
log_std) instead of tracing it with torch.onnx.export: that takes well under
a millisecond per update, where the tracing exporter takes seconds. Parity
with the torch module is checked in tests/server/test_onnx_export.py.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from .policy_network import ActorCritic

#: IR 8 / opset 17 load in every ONNX Runtime from 1.14 on, including the
#: older builds engines ship with.
IR_VERSION = 8
OPSET = 17

#: Input name RLlib's v1 example client feeds ("onnx::Gemm_0", what
#: torch.onnx.export names a first Linear's input); keeping it lets that
#: client run against Tether unmodified. SET_CONFIG announces the names.
DEFAULT_INPUT_NAME = "onnx::Gemm_0"
DEFAULT_OUTPUT_NAME = "action_dist_inputs"


def export_policy(
    model: ActorCritic,
    input_name: str = DEFAULT_INPUT_NAME,
    output_name: str = DEFAULT_OUTPUT_NAME,
) -> bytes:
    """Serialized ONNX model mapping obs (batch, obs_dim) -> action_dist_inputs (batch, K)."""
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    current = input_name
    layers = list(model.actor)
    for i, layer in enumerate(layers):
        if isinstance(layer, nn.Linear):
            w = numpy_helper.from_array(layer.weight.detach().cpu().numpy().astype(np.float32), f"actor.{i}.weight")
            b = numpy_helper.from_array(layer.bias.detach().cpu().numpy().astype(np.float32), f"actor.{i}.bias")
            initializers += [w, b]
            out = f"actor.{i}.out"
            nodes.append(helper.make_node("Gemm", [current, w.name, b.name], [out], transB=1))
            current = out
        elif isinstance(layer, nn.Tanh):
            out = f"actor.{i}.tanh"
            nodes.append(helper.make_node("Tanh", [current], [out]))
            current = out
        else:
            raise TypeError(f"cannot export layer {layer!r}: only Linear and Tanh are supported")

    out_dim = layers[-1].out_features
    if model.log_std is not None:
        log_std = model.log_std.detach().cpu().numpy().astype(np.float32).reshape(1, -1)
        initializers.append(numpy_helper.from_array(log_std, "log_std"))
        nodes += [
            helper.make_node("Shape", [current], ["mean.shape"]),
            helper.make_node("Expand", ["log_std", "mean.shape"], ["log_std.batch"]),
            helper.make_node("Concat", [current, "log_std.batch"], [output_name], axis=1),
        ]
        out_dim *= 2
    else:
        nodes.append(helper.make_node("Identity", [current], [output_name]))

    graph = helper.make_graph(
        nodes,
        "tether_policy",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", model.obs_dim])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", out_dim])],
        initializers,
    )
    onnx_model = helper.make_model(
        graph, producer_name="tether", opset_imports=[helper.make_opsetid("", OPSET)]
    )
    onnx_model.ir_version = IR_VERSION
    return onnx_model.SerializeToString()
