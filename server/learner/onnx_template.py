"""ONNX for any traceable network, fast on every update: the graph is traced once, the weights
are rewritten per version.

Tracing with ``torch.onnx.export`` costs a tenth of a second to seconds, too slow for every update,
but an update changes only the weights, never the graph. So the first export traces the policy
(``dist_inputs``) into a template with every parameter as a named initializer (no constant folding,
so each stays a plain copy of its tensor; float buffers too, such as normalisation statistics), and every export after it writes the current values into
those initializers and serializes. The built-in MLP keeps its hand-written graph (onnx_export.py),
which RLlib's v1 client runs; the CNN and user networks come through here.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

import onnx
import torch
from torch import nn

from tether.protocol.spaces import Leaf

from .model_config import ModelConfigError
from .onnx_export import IR_VERSION, OPSET
from .policy_model import PolicyModel


class _PolicyOnly(nn.Module):
    """What the engines run: the network's ``dist_inputs``; a uint8 input (an image in its own shape,
    §12.1) becomes float rows inside the graph, and **[1.4]** a composite observation's inputs, one
    per leaf, become the flat row the network reads (each flattened, converted, in leaf order).
    **[1.5]** A network with memory takes its state after the observation inputs and returns the next
    state after the dist inputs (§12.1)."""

    def __init__(self, model: PolicyModel, byte_input: bool, state_inputs: int = 0) -> None:
        super().__init__()
        self.model = model
        self.byte_input = byte_input
        self.state_inputs = state_inputs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        state = inputs[len(inputs) - self.state_inputs:] if self.state_inputs else ()
        inputs = inputs[:len(inputs) - self.state_inputs]
        if len(inputs) > 1 or self.byte_input:
            obs = torch.cat([x.flatten(1).to(torch.float32) for x in inputs], dim=1)
        else:
            obs = inputs[0]
        if not self.state_inputs:
            return self.model.dist_inputs(obs)
        dist_inputs, _, next_state = self.model.step(obs, None, tuple(state))
        return (dist_inputs, *next_state)


def _rename_inputs(model: onnx.ModelProto, names: dict[str, str]) -> None:
    """Gives the graph's inputs their protocol names (§12.1), wherever nodes read them."""
    graph = model.graph
    for graph_input in graph.input:
        graph_input.name = names.get(graph_input.name, graph_input.name)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in names:
                node.input[i] = names[name]


class TracedPolicyExporter:
    """Exports one network's policy; traces on the first call, rewrites weights after."""

    def __init__(self, input_name: str, output_name: str, obs_dim: int,
                 byte_shape: tuple[int, ...] | None = None, leaves: tuple[Leaf, ...] | None = None,
                 state: tuple[tuple[str, str, int], ...] = ()) -> None:
        """``byte_shape``: the model takes (batch, *byte_shape) uint8 (a uint8 Box), else (batch, obs_dim) float32.
        ``leaves``: **[1.4]** a composite observation's: one input per leaf, named by its path (§12.1).
        ``state``: **[1.5]** a network with memory's (input name, output name, units) per state tensor."""
        self.output_name = output_name
        self.state = state
        self.obs_dim = obs_dim
        self.byte_shape = byte_shape
        self.composite = leaves is not None
        #: Per input: (name, dtype, shape after the batch dimension).
        self.inputs: list[tuple[str, torch.dtype, tuple[int, ...]]]
        if leaves is not None:
            self.inputs = [(leaf.path, torch.uint8, tuple(leaf.space.shape)) if leaf.is_bytes
                           else (leaf.path, torch.float32, (leaf.size,)) for leaf in leaves]
        elif byte_shape is not None:
            self.inputs = [(input_name, torch.uint8, tuple(byte_shape))]
        else:
            self.inputs = [(input_name, torch.float32, (obs_dim,))]
        self.inputs += [(name, torch.float32, (size,)) for name, _, size in state]
        self.output_names = [output_name, *(name for _, name, _ in state)]
        self._template: onnx.ModelProto | None = None
        #: (initializer, state_dict key) of every weight the graph holds.
        self._weights: list[tuple[onnx.TensorProto, str]] = []

    def export(self, model: PolicyModel) -> bytes:
        """Serialized ONNX mapping obs (batch, obs_dim) -> dist_inputs (batch, K) with ``model``'s weights."""
        state = model.state_dict()
        if self._template is None:
            self._template = self._trace(model, state)
        for initializer, key in self._weights:
            initializer.raw_data = state[key].detach().to("cpu", torch.float32).numpy().tobytes()
        return self._template.SerializeToString()

    def _trace(self, model: PolicyModel, state: dict[str, torch.Tensor]) -> onnx.ModelProto:
        buffer = io.BytesIO()
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        # The exporter merges equal initializers (two zero biases become one and an Identity):
        # traced with distinct random values, every weight keeps its own initializer.
        saved = {key: value.clone() for key, value in state.items()}
        try:
            self._randomize(model, seed=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (the TorchScript exporter announces its deprecation)
                try:
                    # Traced under plain names, renamed after: the tracer mangles some (a leaf path "0").
                    names = [f"input_{i}" for i in range(len(self.inputs))]
                    torch.onnx.export(
                        self._policy(model), self._dummy(1, device), buffer,
                        input_names=names, output_names=self.output_names,
                        dynamic_axes={name: {0: "batch"} for name in (*names, *self.output_names)},
                        opset_version=OPSET, do_constant_folding=False, dynamo=False,
                    )
                except Exception as exc:  # noqa: BLE001 - whatever the tracer raises, the network is not exportable
                    raise ModelConfigError(f"model: its dist_inputs cannot be exported to ONNX: {exc}") from None
            template = onnx.load_from_string(buffer.getvalue())
            template.ir_version = IR_VERSION
            _rename_inputs(template, {f"input_{i}": name for i, (name, _, _) in enumerate(self.inputs)})
            for initializer in template.graph.initializer:
                key = initializer.name.removeprefix("model.")
                if key not in state:
                    continue  # a constant of the graph (a shape, a scale), not a weight
                if tuple(initializer.dims) != tuple(state[key].shape) or initializer.data_type != onnx.TensorProto.FLOAT:
                    raise ModelConfigError(f"model: weight {key} was exported as {list(initializer.dims)}, not as its "
                                           f"float32 tensor {list(state[key].shape)}")
                initializer.ClearField("float_data")
                self._weights.append((initializer, key))
            # Once: other random weights, rewritten into the template, must give torch's outputs. A weight
            # the graph holds as a constant (read with .item(), merged, folded) would stay frozen: refused.
            self._randomize(model, seed=1)
            self._check(model, template, device)
        finally:
            model.load_state_dict(saved)
            model.train(was_training)
        return template

    def _policy(self, model: PolicyModel) -> _PolicyOnly:
        return _PolicyOnly(model, self.byte_shape is not None, len(self.state))

    def _dummy(self, rows: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(seed)
        out = []
        leaf_inputs = len(self.inputs) - len(self.state)
        for i, (_, dtype, shape) in enumerate(self.inputs):
            if i >= leaf_inputs:  # a recurrent state: values in (-1, 1), as an LSTM's h
                out.append(torch.rand((rows, *shape), generator=generator) * 2 - 1)
            elif dtype == torch.uint8:
                out.append(torch.randint(0, 256, (rows, *shape), generator=generator, dtype=torch.uint8))
            else:
                values = torch.rand((rows, *shape), generator=generator)
                # A composite's float leaves get 0 and 1: an action mask among them then masks some
                # logits, so the check below covers masked outputs too.
                out.append(values.round() if self.composite else values)
        return tuple(x.to(device) for x in out)

    @staticmethod
    def _randomize(model: PolicyModel, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                if tensor.is_floating_point():
                    tensor.copy_(torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype).to(tensor.device))

    def _check(self, model: PolicyModel, template: onnx.ModelProto, device: torch.device) -> None:
        import onnxruntime as ort

        state = model.state_dict()
        for initializer, key in self._weights:
            initializer.raw_data = state[key].detach().to("cpu", torch.float32).numpy().tobytes()
        obs = self._dummy(3, device, seed=2)
        with torch.no_grad():
            want = self._policy(model)(*obs)
        wants = [x.to("cpu", torch.float32).numpy() for x in (want if isinstance(want, tuple) else (want,))]
        session = ort.InferenceSession(template.SerializeToString(), providers=["CPUExecutionProvider"])
        gots = session.run(self.output_names, {name: x.cpu().numpy() for (name, _, _), x in zip(self.inputs, obs)})
        if any(got.dtype != np.float32 or got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4)
               for got, want in zip(gots, wants)):
            raise ModelConfigError(
                "model: the exported dist_inputs does not follow the network's weights (a weight read as a Python "
                "number or merged into a constant, or an output that is not float32): export it as a tensor op")
