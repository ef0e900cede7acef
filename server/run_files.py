"""The files a run keeps in its logdir beside its checkpoint and journal: each module's version as
last served (``versions.json``), each module's policy as a plain ONNX file, and the offline policy
(§20). Each is replaced atomically (written beside, then renamed). A failure to write versions.json or
the offline policy is said and the run goes on, as for the journal; one to write a policy is raised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import orjson

from tether.protocol.offline_policy import FILE_NAME as OFFLINE_POLICY_FILE
from tether.protocol.onnx_codec import decode_onnx

from .module_runtime import ModuleRuntime
from .module_setup import DEFAULT_MODULE_ID
from .say import say

#: Each module's version as last served, in the logdir (see record_versions).
VERSIONS_FILE = "versions.json"


def _replace(path: Path, body: bytes) -> None:
    """Write ``body`` to ``path`` atomically (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(body)
    tmp.replace(path)


def record_versions(logdir: str | Path, modules: Mapping[str, ModuleRuntime]) -> None:
    """Write down each module's version as served now (before any client hears of it): a resume after
    a crash then knows which numbers were given out after its checkpoint, and does not give them to
    other weights (§13.1)."""
    path = Path(logdir) / VERSIONS_FILE
    try:
        _replace(path, json.dumps({m: rt.weights_seq_no for m, rt in modules.items()}).encode())
    except OSError as exc:
        say(f"[tether] could not write {path}: {exc}")


def skip_versions_served_after(path: Path, modules: Mapping[str, ModuleRuntime]) -> None:
    """Resumed from a checkpoint older than the last versions served (``path``: the versions.json beside
    it; a crash, kill -9): the numbers given out after it named weights that died with the process, and
    clients may still hold steps claiming them. The restored weights are served under the next unused
    number instead, so within one run (one run_id) a number always names one set of weights."""
    try:
        served = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # (none written yet, or a run from before the file: the checkpoint's numbers stand)
    for module_id, runtime in modules.items():
        last = served.get(module_id) if isinstance(served, dict) else None
        if isinstance(last, int) and last > runtime.weights_seq_no:
            print(f"[tether] module {module_id!r}: v{runtime.weights_seq_no + 1}..v{last} were served after the "
                  f"checkpoint and died with the process; its restored weights are served as v{last + 1}",
                  flush=True)
            runtime.weights_seq_no = last + 1


def policy_path(logdir: str | Path, module_id: str, default_module: str | None) -> Path:
    """Where a module's final ONNX policy is written: policy.onnx for the default one, else policy-<id>.onnx."""
    name = "policy.onnx" if module_id == (default_module or DEFAULT_MODULE_ID) else f"policy-{module_id}.onnx"
    return Path(logdir) / name


def write_policies(logdir: str | Path, modules: Mapping[str, ModuleRuntime], module_ids: Iterable[str],
                   default_module: str | None) -> None:
    """Write each of ``module_ids``' current policy as a plain ONNX file (what clients run); a self-play
    snapshot's is the model it was served with (several ranks: rank 0's export, on every rank)."""
    for module_id in module_ids:
        runtime = modules[module_id]
        _replace(policy_path(logdir, module_id, default_module),
                 decode_onnx(runtime.onnx_field) if runtime.spec.snapshot_of is not None
                 else runtime.learner.export_onnx())


def write_offline_policy(logdir: str | Path, offline: Callable[[], dict[str, Any]]) -> Path | None:
    """Write ``offline_policy.json`` (§20): the configuration and models a client acts with where no server
    runs, as ``offline()`` gives them. A failure (to take them or to write them) is said and the run goes
    on (None)."""
    path = Path(logdir) / OFFLINE_POLICY_FILE
    try:
        _replace(path, orjson.dumps(offline()))
    except (OSError, TypeError, ValueError) as exc:
        say(f"[tether] could not write {path}: {exc}")
        return None
    return path
