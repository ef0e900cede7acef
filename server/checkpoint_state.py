"""What a checkpoint holds, and how a run starts again from one.

A checkpoint (written atomically by checkpoint.py) holds every module's weights,
optimizer and weights_seq_no, the metrics counters, the exactly-once batch table,
the pool and the journal generation from which the batches stored after it are
replayed (pool_journal.py). ``init_from`` starts a module from another run's
checkpoint, weights only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tether.protocol.onnx_codec import encode_onnx

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ServerConfig
from .data_guard import DataGuard
from .ingest.batch_dedup import BatchDedup
from .metrics import Metrics
from .curriculum import Curriculum
from .self_play import SelfPlay
from .module_runtime import ModuleRuntime
from .pool_journal import JournalEntry, PoolJournal, decode_entries, encode_entry
from .sample_pool import Pooled, SamplePool

FORMAT = "tether-checkpoint-2"
#: The Metrics counters a checkpoint keeps: a resumed run counts on from them.
COUNTERS = ("updates", "env_steps_received", "agent_steps_received", "agent_steps_trained", "episodes_total",
            "samples_dropped_stale", "samples_refused_stale", "updates_discarded", "batches_duplicate",
            "updates_isolated", "agent_steps_isolated", "episodes_excluded")


def checkpoint_state(modules: dict[str, ModuleRuntime], metrics: Metrics, dedup: BatchDedup, config: ServerConfig,
                     pool: SamplePool, journal: PoolJournal | None, self_play: SelfPlay | None = None,
                     curriculum: Curriculum | None = None, run_id: str | None = None,
                     guard: DataGuard | None = None) -> dict[str, Any]:
    """What a checkpoint holds, taken at once: the pool's chunks (encoded when written)
    and a new journal generation, from which a resume replays what came after; with
    self-play, its snapshots' bookkeeping and ratings (their weights are modules); the
    run's id (PONG run_id, §7.2), which a resume keeps."""
    metrics.batches_duplicate = dedup.duplicates
    return {
        "run_id": run_id,
        "self_play": self_play.state() if self_play is not None else None,
        "curriculum": curriculum.state() if curriculum is not None else None,
        "format": FORMAT,
        "modules": {
            mid: {"learner": rt.learner.state_dict(), "weights_seq_no": rt.weights_seq_no}
            for mid, rt in modules.items()
        },
        "counters": {name: getattr(metrics, name) for name in COUNTERS},
        "batch_dedup": dedup.state(),
        # The client_sessions refused (DATA_REFUSED): still refused after a resume.
        "data_guard": guard.state() if guard is not None else None,
        # Plain values only (loaded with weights_only=True); the auth token is never stored.
        "config": {k: v for k, v in config.to_dict().items() if k != "auth_token"},
        "pool": pool.items(),
        "journal_generation": journal.rotate() if journal is not None else None,
    }


def write_checkpoint(state: dict[str, Any], path: str | Path, journal: PoolJournal | None,
                     remove_journal_before: int | None = None) -> Path:
    """Write what ``checkpoint_state`` took, then delete the journal it makes redundant: the generations
    before its own, or before ``remove_journal_before`` when given (an older checkpoint is kept)."""
    state = dict(state)
    state["pool"] = encode_entry(JournalEntry(None, state["pool"]))
    written = save_checkpoint(path, state)
    if journal is not None and state["journal_generation"] is not None:
        journal.remove_before(state["journal_generation"] if remove_journal_before is None
                              else min(remove_journal_before, state["journal_generation"]))
    return written


def restore_checkpoint(path: str, modules: dict[str, ModuleRuntime], metrics: Metrics, dedup: BatchDedup,
                       pool: SamplePool, self_play: SelfPlay | None = None,
                       curriculum: Curriculum | None = None,
                       guard: DataGuard | None = None) -> tuple[int | None, str | None]:
    """Load a checkpoint; returns the journal generation to replay from (None: it predates the journal)
    and the run's id (None: the checkpoint predates run ids)."""
    state = load_checkpoint(path)
    if curriculum is not None and state.get("curriculum") is not None:
        curriculum.load_state(state["curriculum"])
    if self_play is not None and state.get("self_play") is not None:
        self_play.load_state(state["self_play"])
    for module_id, saved in state["modules"].items():
        if module_id not in modules:
            raise ValueError(f"checkpoint has module {module_id!r} that this configuration lacks")
        runtime = modules[module_id]
        try:
            runtime.learner.load_state_dict(saved["learner"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ValueError(
                f"module {module_id!r}: the checkpoint's network does not fit this module (observation or action "
                f"space, model, hidden sizes or critic width differ from the run that wrote it): {str(exc)[:300]}"
            ) from None
        runtime.weights_seq_no = int(saved["weights_seq_no"])
        runtime.onnx_field = encode_onnx(runtime.learner.export_onnx())
    counters = dict(state["counters"])
    if "env_steps_trained" in counters:  # written before env and agent steps were counted apart
        counters.setdefault("agent_steps_trained", counters.pop("env_steps_trained"))
        counters.setdefault("agent_steps_received", counters["env_steps_received"])
    for key, value in counters.items():
        if hasattr(metrics, key):
            setattr(metrics, key, int(value))
    dedup.load_state(state.get("batch_dedup", {}))
    if guard is not None and isinstance(state.get("data_guard"), dict):  # (a checkpoint from before it: none)
        guard.load_state(state["data_guard"])
    dedup.duplicates = metrics.batches_duplicate
    entries, _ = decode_entries(state.get("pool", b""))
    if steps := sum(pool_again(entry.items, modules, pool) for entry in entries):
        print(f"[tether] resumed with {steps} agent steps in the pool", flush=True)
    generation = state.get("journal_generation")
    run_id = state.get("run_id")
    return None if generation is None else int(generation), run_id if isinstance(run_id, str) else None


#: What a restored item's source name starts with: its connection belongs to a run that ended, and this
#: run's connections, numbered from 1 again, must not share its name (a strike would count against both).
REPLAYED_SOURCE = "replayed "


def pool_again(items: list[Pooled], modules: dict[str, ModuleRuntime], pool: SamplePool) -> int:
    """Pool restored items (of modules this configuration has) as replayed; returns their steps."""
    kept = [replace(item, replayed=True, source=item.source if item.source.startswith(REPLAYED_SOURCE)
                    else REPLAYED_SOURCE + item.source)
            for item in items if item.module_id in modules]
    for item in kept:
        pool.add(item)
    return sum(item.chunk.env_steps for item in kept)


def replay_journal(entries: list[JournalEntry], modules: dict[str, ModuleRuntime], metrics: Metrics,
                   dedup: BatchDedup, pool: SamplePool) -> list[JournalEntry]:
    """Store again the batches the journal holds after the checkpoint: their marks,
    their counts and their chunks (trained whatever their staleness)."""
    steps = 0
    for entry in entries:
        if entry.batch is not None:
            dedup.mark_stored(entry.batch)
        metrics.env_steps_received += entry.env_steps
        metrics.agent_steps_received += entry.agent_steps
        steps += pool_again(entry.items, modules, pool)
    if entries:
        print(f"[tether] replayed {len(entries)} batches ({steps} agent steps to train) from the journal",
              flush=True)
    return entries


def _load_network(model: Any, state: dict[str, Any]) -> None:
    """Load a saved network into ``model``, with or without an action mask on either side: the mask
    wrapper (the outermost, MaskedPolicy) has no weights of its own, so a network trained unmasked
    can start a masked module of the same spaces, and the other way round. Raises the first
    attempt's error when neither fits (a partly loaded network is never kept: the server stops)."""
    from .learner.action_masking import MaskedPolicy

    try:
        model.load_state_dict(state)
        return
    except RuntimeError as exc:
        first = exc
    try:
        if isinstance(model, MaskedPolicy):
            model.inner.load_state_dict(state)  # (an unmasked network into a masked module)
            return
        if state and all(k.startswith("inner.") for k in state):
            model.load_state_dict({k[len("inner."):]: v for k, v in state.items()})  # (masked into unmasked)
            return
    except RuntimeError:
        pass
    raise first


def init_from_trained(modules: dict[str, ModuleRuntime], init_from: dict[str, tuple[str, str]]) -> None:
    """Start modules from the network of a module in another run's checkpoint (its weights only:
    the optimizer, counters and weights_seq_no start afresh). Frozen, the module serves them as
    they are; trainable, it fine-tunes them. A network of another shape is refused, by name."""
    loaded: dict[str, dict[str, Any]] = {}
    for module_id, (path, source) in init_from.items():
        if path not in loaded:
            try:
                loaded[path] = load_checkpoint(path)
            except OSError as exc:
                raise ValueError(f"module {module_id!r}: init_from {path!r}: {exc.strerror or exc}") from None
            except ValueError as exc:  # (CheckpointError: not a checkpoint of tensors and plain values)
                raise ValueError(f"module {module_id!r}: init_from: {exc}") from None
        saved = loaded[path].get("modules", {}) if isinstance(loaded[path], dict) else {}
        if source not in saved:
            raise ValueError(f"module {module_id!r}: init_from {path!r} has no module {source!r} "
                             f"(it has {sorted(saved)})")
        runtime = modules[module_id]
        try:
            _load_network(runtime.learner.model, saved[source]["learner"]["model"])
        except (RuntimeError, KeyError, TypeError) as exc:
            raise ValueError(
                f"module {module_id!r}: init_from {path!r}#{source}: that network does not fit this module "
                f"(observation or action space, model, hidden sizes or critic width differ): {str(exc)[:300]}") from None
        runtime.onnx_field = encode_onnx(runtime.learner.export_onnx())
        print(f"[tether] module {module_id!r} starts from {source!r} of {path}"
              f" ({'trained on' if runtime.spec.trainable else 'frozen'})", flush=True)
