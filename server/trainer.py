"""Pools experience from all clients, runs learner updates for every module,
and serves the resulting weights. Runs on the server's event loop; updates run
in a worker thread so clients keep being served while the learners work."""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

import torch

from tether.sdk.protocol.episodes import EpisodeChunk
from tether.sdk.protocol.framing import encode_frame
from tether.sdk.protocol.messages import PROTOCOL_VERSION, MessageType
from tether.sdk.protocol.multi_agent import ModuleSpec, MultiAgentRecord
from tether.sdk.protocol.onnx_codec import encode_onnx

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ServerConfig
from .learner import PPOLearner, build_batch
from .metrics import EpisodeTracker, Metrics, TensorBoardWriter
from .module_setup import DEFAULT_MODULE_ID, ModuleLayout


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _same_version(claimed: Any, current: int) -> bool:
    """Whether a client's claimed weights_seq_no (a JSON integer, not a boolean) is ``current``."""
    return isinstance(claimed, int) and not isinstance(claimed, bool) and claimed == current


class ModuleRuntime:
    """One module's learner and the model it currently serves."""

    def __init__(self, spec: ModuleSpec, learner: PPOLearner) -> None:
        self.spec = spec
        self.learner = learner
        self.weights_seq_no = 0
        self.onnx_field = encode_onnx(learner.export_onnx())

    def publish(self, onnx_bytes: bytes) -> None:
        self.weights_seq_no += 1
        self.onnx_field = encode_onnx(onnx_bytes)


@dataclass
class _Pooled:
    module_id: str
    chunk: EpisodeChunk
    weights_seq_no: int


class Trainer:
    """The training side of one server: sample pool, one learner per module, weights, metrics."""

    def __init__(self, config: ServerConfig, layout: ModuleLayout) -> None:
        self.config = config
        self.layout = layout
        torch.set_num_threads(max(1, config.torch_threads))
        self.device = resolve_device(config.device)
        self.modules: dict[str, ModuleRuntime] = {}
        for i, (module_id, spec) in enumerate(layout.specs.items()):
            learner = PPOLearner(
                spec.observation_space, spec.action_space, layout.hyperparams[module_id], self.device,
                None if config.seed is None else config.seed + i, spec.onnx_input_name, spec.onnx_output_name,
                spec.value_obs_dim,
            )
            self.modules[module_id] = ModuleRuntime(spec, learner)
        #: The module a single-agent (v1) client is served; None if no rule maps default_agent.
        self.default_module = layout.default_module()
        self.metrics = Metrics(window=config.metrics_window)
        self.episodes = EpisodeTracker()
        self.tensorboard = TensorBoardWriter(config.logdir) if config.tensorboard else None
        if config.resume:
            self._restore(config.resume)
        self._pool: list[_Pooled] = []
        self._pool_steps = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-learner")
        self._update_task: asyncio.Task | None = None
        self._next_state: asyncio.Future | None = None
        #: Wall-clock time (time.time()) and env steps when stop_at_return was first met.
        self.reached_target_at: float | None = None
        self.env_steps_at_target: int | None = None
        self.stop_requested = asyncio.Event()

    # -- weights ---------------------------------------------------------------

    @property
    def weights_seq_no(self) -> int:
        """The v1 client's view: the default module's version (else the first module's)."""
        return self.modules[self.default_module or next(iter(self.modules))].weights_seq_no

    def state_message(self, client_holds: Any = None, may_omit_model: bool = False) -> dict[str, Any]:
        """SET_STATE. A 1.2 client that sends ``weights_seq_nos`` gets ``models``
        with only the modules that changed; others get the v1 fields for the
        default module (without the model for a 1.1 client that holds it)."""
        msg: dict[str, Any] = {"type": MessageType.SET_STATE.value}
        if isinstance(client_holds, dict):
            msg["models"] = {
                m: {"weights_seq_no": rt.weights_seq_no, "onnx_file": rt.onnx_field}
                for m, rt in self.modules.items()
                if not _same_version(client_holds.get(m), rt.weights_seq_no)
            }
            return msg
        runtime = self.modules[self.default_module or next(iter(self.modules))]
        msg["weights_seq_no"] = runtime.weights_seq_no
        holds = _same_version(client_holds, runtime.weights_seq_no)
        if not (may_omit_model and holds):
            msg["onnx_file"] = runtime.onnx_field
        return msg

    def state_frame(self, client_holds: Any = None, may_omit_model: bool = False) -> bytes:
        return encode_frame(self.state_message(client_holds, may_omit_model))

    def config_message(self) -> dict[str, Any]:
        """SET_CONFIG: the v1 fields, the 1.1 single-module description, and the 1.2 layout."""
        c, layout = self.config, self.layout
        msg: dict[str, Any] = {
            "type": MessageType.SET_CONFIG.value,
            "env_steps_per_sample": c.env_steps_per_sample,
            "force_on_policy": c.force_on_policy,
            "protocol_version": PROTOCOL_VERSION,
        }
        if self.default_module is not None:
            spec = layout.specs[self.default_module]
            msg.update({
                "observation_space": spec.observation_space.to_json(),
                "action_space": spec.action_space.to_json(),
                "onnx_input_names": [spec.onnx_input_name],
                "onnx_output_names": [spec.onnx_output_name],
            })
        msg.update({
            "train_batch_size": c.train_batch_size,
            "max_staleness": c.max_staleness,
            "modules": {m: s.to_json() for m, s in layout.specs.items()},
            "policy_mapping": layout.mapping.to_json() if layout.mapping is not None else None,
            "groups": {g: spec.to_json() for g, spec in layout.groups.items()},
            "policies_to_train": layout.trainable,
        })
        return msg

    # -- samples ---------------------------------------------------------------

    async def submit(
        self, connection: Hashable, records: list[MultiAgentRecord], seq_for: dict[str, int], wait_for_update: bool
    ) -> None:
        """Take a validated message's records. ``seq_for[module]`` is the weights
        version the data was computed with. With ``wait_for_update`` (on-policy
        EPISODES_AND_GET_STATE) return only once any update that these samples
        started, or that was running, has published new weights."""
        m = self.metrics
        steps = sum(r.agent_steps for r in records)
        m.env_steps_received += steps
        m.add_episodes(self.episodes.add(connection, records))
        self._check_stop()
        for record in records:
            for agent in record.agents:
                runtime = self.modules[agent.module_id]
                seq = seq_for.get(agent.module_id, runtime.weights_seq_no)
                if not runtime.spec.trainable:
                    continue  # frozen modules are served, not trained
                if runtime.weights_seq_no - seq > self.config.max_staleness:
                    m.samples_dropped_stale += agent.chunk.env_steps
                else:
                    self._pool.append(_Pooled(agent.module_id, agent.chunk, seq))
                    self._pool_steps += agent.chunk.env_steps
        self._maybe_start_update()
        if wait_for_update and self._next_state is not None:
            await asyncio.shield(self._next_state)

    def _maybe_start_update(self) -> None:
        if self._update_task is not None or self._pool_steps < self.config.train_batch_size:
            return
        # Samples that became too stale while waiting in the pool are dropped here.
        fresh = []
        for pooled in self._pool:
            if self.modules[pooled.module_id].weights_seq_no - pooled.weights_seq_no <= self.config.max_staleness:
                fresh.append(pooled)
            else:
                self.metrics.samples_dropped_stale += pooled.chunk.env_steps
        self._pool = fresh
        self._pool_steps = sum(p.chunk.env_steps for p in fresh)
        if self._pool_steps < self.config.train_batch_size:
            return
        by_module: dict[str, list[EpisodeChunk]] = {}
        for pooled in fresh:
            by_module.setdefault(pooled.module_id, []).append(pooled.chunk)
        self._pool, self._pool_steps = [], 0
        loop = asyncio.get_running_loop()
        self._next_state = loop.create_future()
        self._update_task = loop.create_task(self._run_update(by_module))

    async def _run_update(self, by_module: dict[str, list[EpisodeChunk]]) -> None:
        loop = asyncio.get_running_loop()
        m = self.metrics
        results: dict[str, tuple[dict[str, float], bytes]] = {}
        try:
            results = await loop.run_in_executor(self._executor, self._update_blocking, by_module)
        except Exception as exc:  # a failed update must not stop training for good
            steps = sum(c.env_steps for chunks in by_module.values() for c in chunks)
            print(f"[tether] learner update failed, {steps} steps dropped: {exc!r}", file=sys.stderr, flush=True)
        for module_id, (stats, onnx_bytes) in results.items():
            self.modules[module_id].publish(onnx_bytes)
            m.module_updates[module_id] = stats
            m.env_steps_trained += sum(c.env_steps for c in by_module[module_id])
        if results:
            m.updates += 1
            m.weights_seq_no = self.weights_seq_no
            first = self.default_module if self.default_module in results else next(iter(results))
            m.learner = results[first][0]
        # Waiting clients get the new weights now; logging and checkpoints follow.
        future, self._next_state = self._next_state, None
        if future is not None and not future.done():
            future.set_result(self.weights_seq_no)
        try:
            if results:
                await self._after_update(loop)
        except Exception as exc:
            print(f"[tether] writing metrics or checkpoint failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self._update_task = None
        self._maybe_start_update()

    def _update_blocking(self, by_module: dict[str, list[EpisodeChunk]]) -> dict[str, tuple[dict[str, float], bytes]]:
        results = {}
        for module_id, chunks in by_module.items():
            learner = self.modules[module_id].learner
            stats = learner.update(build_batch(chunks))
            results[module_id] = (stats, learner.export_onnx())
        return results

    async def _after_update(self, loop: asyncio.AbstractEventLoop) -> None:
        m = self.metrics
        if not self.config.quiet:
            print(m.progress_line(), flush=True)
        scalars = m.snapshot()
        if self.tensorboard is not None:
            await loop.run_in_executor(self._executor, self.tensorboard.write, scalars, m.env_steps_received)
        every = self.config.checkpoint_every
        if every and m.updates % every == 0:
            await loop.run_in_executor(self._executor, self.save_checkpoint)

    def _check_stop(self) -> None:
        c, m = self.config, self.metrics
        hit_target = (
            c.stop_at_return is not None and len(m.returns) >= min(c.metrics_window, 100) and m.return_mean >= c.stop_at_return
        )
        if hit_target and self.reached_target_at is None:
            self.reached_target_at = time.time()
            self.env_steps_at_target = m.env_steps_received
        if hit_target or (c.max_env_steps is not None and m.env_steps_received >= c.max_env_steps):
            self.stop_requested.set()

    # -- lifecycle -------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.config.logdir) / "checkpoint.pt"

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write every module's weights and optimizer, weights_seq_nos and counters atomically."""
        m = self.metrics
        state = {
            "format": "tether-checkpoint-2",
            "modules": {
                mid: {"learner": rt.learner.state_dict(), "weights_seq_no": rt.weights_seq_no}
                for mid, rt in self.modules.items()
            },
            "counters": {
                "updates": m.updates,
                "env_steps_received": m.env_steps_received,
                "env_steps_trained": m.env_steps_trained,
                "episodes_total": m.episodes_total,
                "samples_dropped_stale": m.samples_dropped_stale,
            },
            "config": self.config.to_dict(),
        }
        return save_checkpoint(path or self.checkpoint_path, state)

    def policy_path(self, module_id: str | None = None) -> Path:
        """Where the final ONNX policy of a module is written (policy.onnx for the default one)."""
        module_id = module_id or self.default_module or next(iter(self.modules))
        name = "policy.onnx" if module_id == (self.default_module or DEFAULT_MODULE_ID) else f"policy-{module_id}.onnx"
        return Path(self.config.logdir) / name

    def save_policies(self) -> None:
        """Write every module's current policy as a plain ONNX file (what clients run)."""
        for module_id, runtime in self.modules.items():
            path = self.policy_path(module_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".onnx.tmp")
            tmp.write_bytes(runtime.learner.export_onnx())
            tmp.replace(path)

    def _restore(self, path: str) -> None:
        state = load_checkpoint(path)
        for module_id, saved in state["modules"].items():
            if module_id not in self.modules:
                raise ValueError(f"checkpoint has module {module_id!r} that this configuration lacks")
            runtime = self.modules[module_id]
            runtime.learner.load_state_dict(saved["learner"])
            runtime.weights_seq_no = int(saved["weights_seq_no"])
            runtime.onnx_field = encode_onnx(runtime.learner.export_onnx())
        self.metrics.weights_seq_no = self.weights_seq_no
        for key, value in state["counters"].items():
            setattr(self.metrics, key, value)

    async def close(self, checkpoint: bool = True) -> None:
        """Wait for a running update, write the final checkpoint and policies, release threads."""
        if self._update_task is not None:
            await asyncio.gather(self._update_task, return_exceptions=True)
        loop = asyncio.get_running_loop()
        if checkpoint:
            await loop.run_in_executor(self._executor, self.save_checkpoint)
            await loop.run_in_executor(self._executor, self.save_policies)
        if self.tensorboard is not None:
            await loop.run_in_executor(self._executor, self.tensorboard.close)
        self._executor.shutdown(wait=True)
