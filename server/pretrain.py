"""``tether pretrain``: behavioural cloning from demonstrations into a checkpoint ``tether serve`` starts from.

The modules are built from the same options as ``tether serve`` (a TOML file, flags), so the
pretrained network is the one the server will train: ``tether serve --init-from CHECKPOINT`` (one
module) or a module's ``init_from = "CHECKPOINT#module"`` continues from it, and ``demos`` keeps the
dataset as a cloning term beside PPO (docs/demonstrations.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tether.protocol.demonstrations import DemonstrationError

from .checkpoint import save_checkpoint
from .checkpoint_state import FORMAT
from .config import ConfigError, ServerConfig
from .minari_datasets import load_demonstrations
from .module_runtime import build_modules, resolve_device
from .module_setup import build_layout


def pretrain(config: ServerConfig, dataset: str | Path, out: str | Path, epochs: int = 100,
             modules: list[str] | None = None) -> dict[str, Any]:
    """Clone the demonstrations at ``dataset`` (a .jsonl demonstration file or a Minari dataset folder)
    into the ``modules`` named (default: every module the dataset has episodes for, or the one module),
    write the checkpoint ``out`` and each module's ONNX policy beside it (``<out stem>.<module>.onnx``).
    Returns per module: steps, episodes, the cloning loss of the first and last epoch, seconds."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be at least 1 (got {epochs})")
    torch.set_num_threads(max(1, config.torch_threads))
    layout = build_layout(config)
    runtimes = build_modules(layout, config, resolve_device(config.device))
    try:
        demos = load_demonstrations(dataset, next(iter(runtimes)) if len(runtimes) == 1 else "default_policy")
    except DemonstrationError as exc:
        raise ConfigError(f"--dataset {str(dataset)!r}: {exc}") from None
    if modules is None:
        modules = [m for m in runtimes if m in demos.modules] or (list(runtimes) if len(runtimes) == 1 else [])
    if not modules:
        raise ConfigError(f"--dataset {str(dataset)!r} holds modules {sorted(demos.modules)}, the server has "
                          f"{sorted(runtimes)}: name the module to pretrain with --module")
    report: dict[str, Any] = {}
    out = Path(out)
    for module_id in modules:
        if module_id not in runtimes:
            raise ConfigError(f"--module {module_id!r} is not a module of the server ({sorted(runtimes)})")
        runtime = runtimes[module_id]
        recorded = module_id if module_id in demos.modules or len(demos.modules) != 1 else next(iter(demos.modules))
        try:
            demos.check_spaces(recorded, runtime.spec)
            obs, _ = demos.cloning_data(recorded)
        except DemonstrationError as exc:
            raise ConfigError(f"module {module_id!r}: --dataset {str(dataset)!r}: {exc}") from None
        returns = None if runtime.spec.value_obs_agents else demos.returns(recorded, runtime.learner.hp.gamma)
        started = time.monotonic()
        try:
            losses = runtime.learner.pretrain([e.chunk for e in demos.of_module(recorded)], returns, epochs)
        except ValueError as exc:
            raise ConfigError(f"module {module_id!r}: {exc}") from None
        onnx_path = out.with_name(f"{out.stem}.{module_id}.onnx")
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        onnx_path.write_bytes(runtime.learner.export_onnx())
        report[module_id] = {"steps": int(len(obs)), "episodes": len(demos.of_module(recorded)),
                             "loss_first_epoch": losses[0], "loss_last_epoch": losses[-1],
                             "seconds": round(time.monotonic() - started, 2), "onnx": str(onnx_path)}
    state = {"format": FORMAT, "pretrained_from": str(dataset),
             "modules": {m: {"learner": runtimes[m].learner.state_dict(), "weights_seq_no": 0} for m in modules},
             "config": {k: v for k, v in config.to_dict().items() if k != "auth_token"}}
    save_checkpoint(out, state)
    return report
