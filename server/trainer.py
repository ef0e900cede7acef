"""Pools episode chunks from all clients, runs learner updates, and serves the
resulting weights. Runs on the server's event loop; the update itself runs in
a worker thread so clients keep being served while the learner works."""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable

import torch

from sdk_python.protocol.episodes import EpisodeChunk
from sdk_python.protocol.framing import encode_frame
from sdk_python.protocol.messages import PROTOCOL_VERSION, MessageType
from sdk_python.protocol.onnx_codec import encode_onnx
from sdk_python.protocol.spaces import Space

from .checkpoint import load_checkpoint, save_checkpoint
from .config import ServerConfig
from .learner import PPOHyperparams, PPOLearner, build_batch
from .metrics import EpisodeTracker, Metrics, TensorBoardWriter


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class _PooledChunk:
    chunk: EpisodeChunk
    weights_seq_no: int


class Trainer:
    """The training side of one server: sample pool, learner, weights, metrics."""

    def __init__(self, config: ServerConfig, observation_space: Space, action_space: Space) -> None:
        self.config = config
        self.observation_space = observation_space
        self.action_space = action_space
        torch.set_num_threads(max(1, config.torch_threads))
        hp = PPOHyperparams(
            lr=config.lr,
            gamma=config.gamma,
            gae_lambda=config.gae_lambda,
            clip_coef=config.clip_coef,
            vf_coef=config.vf_coef,
            ent_coef=config.ent_coef,
            num_epochs=config.num_epochs,
            minibatch_size=config.minibatch_size,
            max_grad_norm=config.max_grad_norm,
            norm_adv=config.norm_adv,
            clip_vloss=config.clip_vloss,
            hidden_sizes=tuple(config.hidden_sizes),
        )
        self.device = resolve_device(config.device)
        self.learner = PPOLearner(
            observation_space,
            action_space,
            hp,
            self.device,
            config.seed,
            config.onnx_input_name,
            config.onnx_output_name,
        )
        self.metrics = Metrics(window=config.metrics_window)
        self.episodes = EpisodeTracker()
        self.tensorboard = TensorBoardWriter(config.logdir) if config.tensorboard else None
        self.weights_seq_no = 0
        if config.resume:
            self._restore(config.resume)
        self._state_frame = self._make_state_frame(self.learner.export_onnx())
        self._pool: list[_PooledChunk] = []
        self._pool_steps = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-learner")
        self._update_task: asyncio.Task | None = None
        self._next_state: asyncio.Future | None = None
        #: Wall-clock time (time.time()) and env steps when stop_at_return was first met.
        self.reached_target_at: float | None = None
        self.env_steps_at_target: int | None = None
        self.stop_requested = asyncio.Event()

    # -- weights ---------------------------------------------------------------

    def _make_state_frame(self, onnx_bytes: bytes) -> bytes:
        return encode_frame(
            {
                "type": MessageType.SET_STATE.value,
                "weights_seq_no": self.weights_seq_no,
                "onnx_file": encode_onnx(onnx_bytes),
            }
        )

    def state_frame(self, client_holds: Any = None) -> bytes:
        """SET_STATE for the current weights; omits the model for a client that
        said it already holds this version (a Tether extension)."""
        if isinstance(client_holds, int) and not isinstance(client_holds, bool) and client_holds == self.weights_seq_no:
            return encode_frame({"type": MessageType.SET_STATE.value, "weights_seq_no": self.weights_seq_no})
        return self._state_frame

    def config_message(self) -> dict[str, Any]:
        """SET_CONFIG: the v1 fields plus Tether's description of spaces and model."""
        c = self.config
        return {
            "type": MessageType.SET_CONFIG.value,
            "env_steps_per_sample": c.env_steps_per_sample,
            "force_on_policy": c.force_on_policy,
            "protocol_version": PROTOCOL_VERSION,
            "observation_space": self.observation_space.to_json(),
            "action_space": self.action_space.to_json(),
            "onnx_input_names": [c.onnx_input_name],
            "onnx_output_names": [c.onnx_output_name],
            "train_batch_size": c.train_batch_size,
            "max_staleness": c.max_staleness,
        }

    # -- samples ---------------------------------------------------------------

    async def submit(
        self, connection: Hashable, chunks: list[EpisodeChunk], weights_seq_no: int, wait_for_update: bool
    ) -> None:
        """Take a validated message's chunks. With ``wait_for_update`` (on-policy
        EPISODES_AND_GET_STATE) return only once any update that these samples
        started, or that was running, has published new weights."""
        steps = sum(c.env_steps for c in chunks)
        self.metrics.env_steps_received += steps
        self.metrics.add_episodes(self.episodes.add(connection, chunks))
        self._check_stop()
        if self.weights_seq_no - weights_seq_no > self.config.max_staleness:
            self.metrics.samples_dropped_stale += steps
        else:
            self._pool.extend(_PooledChunk(c, weights_seq_no) for c in chunks)
            self._pool_steps += steps
        self._maybe_start_update()
        if wait_for_update and self._next_state is not None:
            await asyncio.shield(self._next_state)

    def _maybe_start_update(self) -> None:
        if self._update_task is not None or self._pool_steps < self.config.train_batch_size:
            return
        # Samples that became too stale while waiting in the pool are dropped here.
        fresh = []
        for pooled in self._pool:
            if self.weights_seq_no - pooled.weights_seq_no <= self.config.max_staleness:
                fresh.append(pooled)
            else:
                self.metrics.samples_dropped_stale += pooled.chunk.env_steps
        self._pool = fresh
        self._pool_steps = sum(p.chunk.env_steps for p in fresh)
        if self._pool_steps < self.config.train_batch_size:
            return
        chunks = [p.chunk for p in fresh]
        self._pool, self._pool_steps = [], 0
        loop = asyncio.get_running_loop()
        self._next_state = loop.create_future()
        self._update_task = loop.create_task(self._run_update(chunks))

    async def _run_update(self, chunks: list[EpisodeChunk]) -> None:
        loop = asyncio.get_running_loop()
        m = self.metrics
        try:
            stats, onnx_bytes = await loop.run_in_executor(self._executor, self._update_blocking, chunks)
        except Exception as exc:  # a failed update must not stop training for good
            print(f"[tether] learner update failed, batch of {sum(c.env_steps for c in chunks)} steps dropped: "
                  f"{exc!r}", file=sys.stderr, flush=True)
            stats = None
        if stats is not None:
            self.weights_seq_no += 1
            self._state_frame = self._make_state_frame(onnx_bytes)
            m.updates += 1
            m.weights_seq_no = self.weights_seq_no
            m.env_steps_trained += sum(c.env_steps for c in chunks)
            m.learner = stats
        # Waiting clients get the new weights now; logging and checkpoints follow.
        future, self._next_state = self._next_state, None
        if future is not None and not future.done():
            future.set_result(self.weights_seq_no)
        try:
            if stats is not None:
                await self._after_update(loop)
        except Exception as exc:
            print(f"[tether] writing metrics or checkpoint failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self._update_task = None
        self._maybe_start_update()

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

    def _update_blocking(self, chunks: list[EpisodeChunk]) -> tuple[dict[str, float], bytes]:
        stats = self.learner.update(build_batch(chunks))
        return stats, self.learner.export_onnx()

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
        """Write weights, optimizer state, weights_seq_no and counters atomically."""
        m = self.metrics
        state = {
            "format": "tether-checkpoint-1",
            "learner": self.learner.state_dict(),
            "weights_seq_no": self.weights_seq_no,
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

    @property
    def policy_path(self) -> Path:
        return Path(self.config.logdir) / "policy.onnx"

    def save_policy(self) -> Path:
        """Write the current policy as a plain ONNX file (what clients run)."""
        path = self.policy_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".onnx.tmp")
        tmp.write_bytes(self.learner.export_onnx())
        tmp.replace(path)
        return path

    def _restore(self, path: str) -> None:
        state = load_checkpoint(path)
        self.learner.load_state_dict(state["learner"])
        self.weights_seq_no = int(state["weights_seq_no"])
        self.metrics.weights_seq_no = self.weights_seq_no
        for key, value in state["counters"].items():
            setattr(self.metrics, key, value)

    async def close(self, checkpoint: bool = True) -> None:
        """Wait for a running update, write the final checkpoint, release threads."""
        if self._update_task is not None:
            await asyncio.gather(self._update_task, return_exceptions=True)
        loop = asyncio.get_running_loop()
        if checkpoint:
            await loop.run_in_executor(self._executor, self.save_checkpoint)
            await loop.run_in_executor(self._executor, self.save_policy)
        if self.tensorboard is not None:
            await loop.run_in_executor(self._executor, self.tensorboard.close)
        self._executor.shutdown(wait=True)
