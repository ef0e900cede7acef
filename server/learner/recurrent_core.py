"""A recurrent core (LSTM or GRU) written from Linear layers and element-wise operations.

Memory for policies (issue 22): the core sits after the observation encoders and before the heads.
The engines run one step per call, with the state fed back by their SDK; the learner runs whole
sequences from a recorded state. Both go through ``step``, so they compute the same function.

Why not ``nn.LSTM``: torch.onnx exports it as ONNX's LSTM operator, whose weights are the
parameters re-packed (gate order iofc, input and recurrent weights apart), so they are not plain
copies of the parameters. The ONNX writer (onnx_template.py) traces a network once and rewrites its
parameters into the graph on every update, which needs each parameter to be one initializer as it
is. Here a step is two ``Gemm`` nodes (input and state) and element-wise gates: every weight stays
one initializer, and ONNX Runtime runs it in every SDK.

State: a GRU's is ``(h,)``, an LSTM's ``(h, c)``, each ``(batch, size)`` float32, zeros at an
agent's first step.
"""

from __future__ import annotations

import torch
from torch import nn

CORES = ("lstm", "gru")


class RecurrentCore(nn.Module):
    """One LSTM or GRU layer of ``size`` units on ``in_dim`` features."""

    def __init__(self, kind: str, in_dim: int, size: int) -> None:
        super().__init__()
        if kind not in CORES:
            raise ValueError(f"a recurrent core is one of {', '.join(CORES)}, not {kind!r}")
        if in_dim < 1 or size < 1:
            raise ValueError("a recurrent core needs at least one input and one unit")
        self.kind = kind
        self.size = size
        gates = 4 if kind == "lstm" else 3
        self.input_gates = nn.Linear(in_dim, gates * size)
        self.state_gates = nn.Linear(size, gates * size)
        for layer in (self.input_gates, self.state_gates):
            nn.init.orthogonal_(layer.weight)
            nn.init.zeros_(layer.bias)
        if kind == "lstm":  # a forget-gate bias of 1: the state is kept by default (Jozefowicz et al. 2015)
            with torch.no_grad():
                self.input_gates.bias[size:2 * size] = 1.0

    @property
    def state_count(self) -> int:
        """Tensors in the state: 2 for an LSTM (h, c), 1 for a GRU (h)."""
        return 2 if self.kind == "lstm" else 1

    def initial_state(self, batch: int, device: torch.device | None = None) -> tuple[torch.Tensor, ...]:
        """Zeros: the state of an agent that has not acted yet."""
        return tuple(torch.zeros(batch, self.size, device=device) for _ in range(self.state_count))

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """One step for a batch: features ``x`` (batch, in_dim) and the state before it -> (output, next state)."""
        h = state[0]
        size = self.size
        if self.kind == "lstm":
            c = state[1]
            gates = self.input_gates(x) + self.state_gates(h)
            i = torch.sigmoid(gates[:, :size])
            f = torch.sigmoid(gates[:, size:2 * size])
            g = torch.tanh(gates[:, 2 * size:3 * size])
            o = torch.sigmoid(gates[:, 3 * size:])
            c = f * c + i * g
            h = o * torch.tanh(c)
            return h, (h, c)
        from_input, from_state = self.input_gates(x), self.state_gates(h)
        r = torch.sigmoid(from_input[:, :size] + from_state[:, :size])
        z = torch.sigmoid(from_input[:, size:2 * size] + from_state[:, size:2 * size])
        n = torch.tanh(from_input[:, 2 * size:] + r * from_state[:, 2 * size:])
        h = (1 - z) * n + z * h
        return h, (h,)

    def sequence(self, x: torch.Tensor, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Steps along time: ``x`` (batch, time, in_dim) from ``state`` -> (outputs (batch, time, size), last state).
        A sequence never crosses an episode's start: a chunk holds one agent's steps of one episode."""
        outputs = []
        for t in range(x.shape[1]):
            out, state = self.step(x[:, t], state)
            outputs.append(out)
        return torch.stack(outputs, dim=1), state
