"""One module's learner and the model it currently serves, built from the layout."""

from __future__ import annotations

import copy

import torch

from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.onnx_codec import encode_onnx

from tether.protocol.demonstrations import DemonstrationError
from tether.protocol.episodes import EpisodeChunk

from .config import ConfigError, ServerConfig
from .learner import PPOLearner
from .learner.model_config import ModelConfigError
from .minari_datasets import load_demonstrations
from .module_setup import ModuleLayout


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ModuleRuntime:
    """One module's learner and the model it currently serves."""

    def __init__(self, spec: ModuleSpec, learner: PPOLearner) -> None:
        self.spec = spec
        self.learner = learner
        self.weights_seq_no = 0
        self.onnx_field = encode_onnx(learner.export_onnx())

    def copy_policy(self, source: "ModuleRuntime") -> str:
        """Take ``source``'s current network (a self-play snapshot); returns its model as SET_STATE
        carries it, for ``publish``. Runs in the learner thread (the export takes a while)."""
        before = self.copy_weights(source)
        try:
            return encode_onnx(self.learner.export_onnx())
        except Exception:
            self.restore_weights(before)  # (its weights stay those of the model it serves)
            raise

    def copy_weights(self, source: "ModuleRuntime") -> dict[str, torch.Tensor]:
        """Take ``source``'s current network, without exporting it; returns this module's network as it
        was, for ``restore_weights`` (several ranks: every rank copies, rank 0 alone exports)."""
        before = copy.deepcopy(self.learner.model.state_dict())
        self.learner.model.load_state_dict(copy.deepcopy(source.learner.model.state_dict()))
        return before

    def restore_weights(self, before: dict[str, torch.Tensor]) -> None:
        """Put back the network ``copy_weights`` replaced (the snapshot's export failed)."""
        self.learner.model.load_state_dict(before)

    def publish(self, onnx_field: str) -> None:
        """Serve the next version: ``onnx_field`` is its model as SET_STATE carries it (encode_onnx)."""
        self.weights_seq_no += 1
        self.onnx_field = onnx_field


def build_modules(layout: ModuleLayout, config: ServerConfig, device: torch.device) -> dict[str, ModuleRuntime]:
    """A fresh learner per module of the layout (module i seeded with seed + i)."""
    modules: dict[str, ModuleRuntime] = {}
    for i, (module_id, spec) in enumerate(layout.specs.items()):
        try:
            learner = PPOLearner(
                spec.observation_space, spec.action_space, layout.hyperparams[module_id], device,
                None if config.seed is None else config.seed + i, spec.onnx_input_name, spec.onnx_output_name,
                spec.value_obs_dim, spec.action_mask,
            )
            modules[module_id] = ModuleRuntime(spec, learner)  # (its first export traces the network)
        except ModelConfigError as exc:  # (a user network that cannot be built or exported)
            raise ModelConfigError(f"module {module_id!r}: {exc}") from None
        demos = layout.hyperparams[module_id].demos
        if demos:
            try:
                learner.set_demonstrations(demonstration_episodes(demos, module_id, spec))
            except ValueError as exc:
                raise ConfigError(f"module {module_id!r}: demos: {exc}") from None
    return modules


def demonstration_episodes(path: str, module_id: str, spec: ModuleSpec) -> list[EpisodeChunk]:
    """The episodes of the demonstrations at ``path`` for module ``module_id``, checked against its
    spaces; ConfigError naming what is wrong. A file of one module serves any module of the same
    spaces; a file of several needs one named ``module_id``."""
    try:
        demos = load_demonstrations(path, module_id)
        recorded = module_id if module_id in demos.modules or len(demos.modules) != 1 else next(iter(demos.modules))
        demos.check_spaces(recorded, spec)
        demos.cloning_data(recorded)  # (refuses, by name, a module without episodes)
        return [e.chunk for e in demos.of_module(recorded)]
    except DemonstrationError as exc:
        raise ConfigError(f"module {module_id!r}: demos {path!r}: {exc}") from None
