"""The recurrent core (server/learner/recurrent_core.py): the same function as torch's own cells,
a sequence equal to its steps, and an ONNX export whose every weight is one initializer as it is
(what the writer's per-version rewrite needs) and that ONNX Runtime runs with its state fed back."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from tether.server.learner.recurrent_core import RecurrentCore


def copy_into_torch_cell(core: RecurrentCore) -> nn.Module:
    cell = nn.LSTMCell(core.input_gates.in_features, core.size) if core.kind == "lstm" else \
        nn.GRUCell(core.input_gates.in_features, core.size)
    with torch.no_grad():
        cell.weight_ih.copy_(core.input_gates.weight)
        cell.bias_ih.copy_(core.input_gates.bias)
        cell.weight_hh.copy_(core.state_gates.weight)
        cell.bias_hh.copy_(core.state_gates.bias)
    return cell


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_step_is_torchs_cell_and_a_sequence_is_its_steps(kind: str) -> None:
    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, 7)
    with torch.no_grad():  # (random biases too: the zero-initialised ones would hide a misplaced one)
        for p in core.parameters():
            p.normal_()
    cell = copy_into_torch_cell(core)
    x = torch.randn(4, 6, 5)
    state = tuple(torch.randn(4, 7) for _ in range(core.state_count))
    ours, last = core.sequence(x, state)
    theirs = state if kind == "lstm" else state[0]
    for t in range(6):
        theirs = cell(x[:, t], theirs)
        h = theirs[0] if kind == "lstm" else theirs
        torch.testing.assert_close(ours[:, t], h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last[0], theirs[0] if kind == "lstm" else theirs, rtol=1e-5, atol=1e-6)
    assert [tuple(s.shape) for s in core.initial_state(3)] == [(3, 7)] * core.state_count
    assert all(float(s.abs().sum()) == 0 for s in core.initial_state(3))


class _Step(nn.Module):
    """What an engine runs: features and the state in, the output and the next state out."""

    def __init__(self, core: RecurrentCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, x: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, next_state = self.core.step(x, tuple(state))
        return (out, *next_state)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_exported_step_keeps_every_weight_and_runs_with_its_state_fed_back(kind: str) -> None:
    torch.manual_seed(1)
    core = RecurrentCore(kind, 3, 4)
    with torch.no_grad():
        for p in core.parameters():
            p.normal_(std=0.5)
    state_names = ["state_in_h", "state_in_c"][:core.state_count]
    out_names = ["features", *[n.replace("_in_", "_out_") for n in state_names]]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Step(core), (torch.zeros(1, 3), *core.initial_state(1)), buffer,
                          input_names=["x", *state_names], output_names=out_names,
                          dynamic_axes={n: {0: "batch"} for n in ["x", *state_names, *out_names]},
                          opset_version=17, do_constant_folding=False, dynamo=False)
    model = onnx.load_from_string(buffer.getvalue())
    state = core.state_dict()
    initializers = {i.name.removeprefix("core."): onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for key, value in state.items():  # each weight one initializer, as it is
        assert key in initializers, (key, sorted(initializers))
        np.testing.assert_array_equal(initializers[key], value.numpy())
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(10, 2, 3)).astype(np.float32)
    fed = [np.zeros((2, 4), np.float32) for _ in state_names]
    with torch.no_grad():
        want, _ = core.sequence(torch.from_numpy(xs).transpose(0, 1), core.initial_state(2))
    for t in range(10):  # the state the model returns is the next call's input, as an SDK carries it
        out, *fed = session.run(out_names, {"x": xs[t], **dict(zip(state_names, fed))})
        np.testing.assert_allclose(out, want[:, t].numpy(), rtol=1e-4, atol=1e-5)


def test_a_core_is_lstm_or_gru_of_positive_sizes() -> None:
    for args in (("rnn", 3, 4), ("lstm", 0, 4), ("gru", 3, 0)):
        with pytest.raises(ValueError):
            RecurrentCore(*args)
