"""The checker's environment, the "echo env" (docs/check-client.md), and the two fixed
models it serves: what a correct client's records must agree with, step by step."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tether.protocol.messages import MessageType
from tether.protocol.spaces import box

#: The checker's environment ("echo env", docs/check-client.md): obs [t/10, last executed action, 1].
OBS_SPACE = box(np.full(3, -10.0), np.full(3, 10.0))
ACTION_SPACE = box(np.array([-1.0]), np.array([1.0]))
EPISODE_LENGTH = 10
INPUT_NAME = "check_obs"
OUTPUT_NAME = "check_dist_inputs"
STEPS_PER_SAMPLE = 20

#: Model A (weights_seq_no 0) has mean near +0.8, model B (weights_seq_no 1) near -0.8,
#: both with a std that puts about a third of the raw samples outside [-1, 1].
MODEL_WEIGHTS = {
    0: (np.array([[0.1, 0.2, 0.0], [0.0, 0.0, 0.0]], np.float32), np.array([0.8, math.log(0.5)], np.float32)),
    1: (np.array([[-0.1, 0.1, 0.0], [0.0, 0.0, 0.0]], np.float32), np.array([-0.8, math.log(0.4)], np.float32)),
}


def build_model(version: int) -> bytes:
    """The fixed policy ``version`` as ONNX: dist_inputs = obs @ W.T + b (mean, log_std)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight, bias = MODEL_WEIGHTS[version]
    graph = helper.make_graph(
        [helper.make_node("Gemm", [INPUT_NAME, "W", "b"], [OUTPUT_NAME], transB=1)],
        f"tether_check_model_{version}",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, producer_name="tether-check", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def dist_inputs(version: int, obs: np.ndarray) -> np.ndarray:
    """What model ``version`` outputs for a batch of observations (float32, as ONNX Runtime computes)."""
    weight, bias = MODEL_WEIGHTS[version]
    return (obs.astype(np.float32) @ weight.T + bias).astype(np.float32)


def config_message(heartbeat_s: float) -> dict[str, Any]:
    spec = {"observation_space": OBS_SPACE.to_json(), "action_space": ACTION_SPACE.to_json(),
            "onnx_input_names": [INPUT_NAME], "onnx_output_names": [OUTPUT_NAME], "trainable": True}
    return {
        "type": MessageType.SET_CONFIG.value, "env_steps_per_sample": STEPS_PER_SAMPLE, "force_on_policy": True,
        "protocol_version": "1.3", "observation_space": spec["observation_space"],
        "action_space": spec["action_space"], "onnx_input_names": [INPUT_NAME], "onnx_output_names": [OUTPUT_NAME],
        "train_batch_size": STEPS_PER_SAMPLE, "max_staleness": 1, "modules": {"default_policy": spec},
        "policy_mapping": [{"pattern": "*", "module": "default_policy"}], "groups": {},
        "policies_to_train": ["default_policy"], "heartbeat_interval_s": heartbeat_s,
        "client_timeout_s": heartbeat_s * 4,
    }
