"""Local inference: an ONNX Runtime session that turns observations into actions."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import onnxruntime as ort

from tether.protocol.distributions import deterministic, dist_inputs_size, sample
from tether.protocol.model_input import ModelFeeds
from tether.protocol.spaces import Discrete, Space


class OnnxPolicy:
    """Wraps one ONNX model: obs (batch, obs_dim) -> action_dist_inputs (batch, K).

    Sessions use one intra-op thread: for the small networks games use, that is
    both the fastest per call and the kindest to the engine's own threads.
    """

    def __init__(
        self,
        model_bytes: bytes,
        action_space: Space | None = None,
        input_name: str | None = None,
        output_name: str | None = None,
        seed: int | None = None,
        observation_space: Space | None = None,
    ) -> None:
        """``observation_space``: needed for a Dict or Tuple observation (**[1.4]**: one input per leaf)."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.input_name = input_name or inputs[0].name
        #: float32 rows, or (1.4) a uint8 Box's observations in their own shape, or one input per
        #: leaf of a composite observation, fed from its flat rows (§12.1).
        self.feeds = ModelFeeds.of_session(inputs, observation_space, self.input_name)
        self.output_name = output_name or outputs[0].name
        self._output_names = [self.output_name]
        out_dim = outputs[0].shape[-1]
        # A server that does not describe its action space (RLlib's v1) serves
        # categorical logits: infer Discrete(K) from the output width.
        if action_space is None:
            if not isinstance(out_dim, int):
                raise ValueError("cannot infer the action space from the model; pass action_space")
            action_space = Discrete(out_dim)
        if isinstance(out_dim, int) and out_dim != dist_inputs_size(action_space):
            raise ValueError(
                f"model outputs {out_dim} action_dist_inputs but the action space "
                f"{action_space.to_json()} needs {dist_inputs_size(action_space)}"
            )
        self.action_space = action_space
        self._rng = random.Random(seed)

    def dist_inputs(self, obs_batch: np.ndarray) -> np.ndarray:
        """Raw model output for a batch of observations (rows)."""
        return self.session.run(self._output_names, self.feeds.feed(obs_batch, len(obs_batch)))[0]

    def dist_inputs_one(self, obs: np.ndarray) -> np.ndarray:
        """Raw model output for one observation."""
        return self.session.run(self._output_names, self.feeds.feed(obs, 1))[0][0]

    def sample(self, obs: np.ndarray, rng: random.Random | None = None) -> tuple[Any, float, np.ndarray]:
        """Sample one action for one observation: (action, logp, dist_inputs).

        ``rng`` defaults to the policy's own generator (seeded by ``seed``);
        the clients pass theirs, which outlives every model swap.
        """
        dist = self.dist_inputs_one(obs)
        action, logp = sample(self.action_space, dist, rng or self._rng)
        return action, logp, dist

    def act_deterministic(self, obs: np.ndarray) -> Any:
        """The most likely action (argmax / mean) for one observation."""
        dist = self.dist_inputs_one(obs)
        return deterministic(self.action_space, dist)
