"""Training metrics: episode returns stitched from chunks, counters, the
progress line and TensorBoard scalars."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Iterable

from sdk_python.protocol.episodes import EpisodeChunk


class EpisodeTracker:
    """Adds up return and length of episodes that arrive in several chunks.

    Chunks are keyed by (connection, episode_id); a v1 client that sends no
    ids continues its one open episode with the first chunk of its next
    message, which the same key (connection, None) captures.
    """

    def __init__(self) -> None:
        self._open: dict[Hashable, tuple[float, int]] = {}

    def add(self, connection: Hashable, chunks: Iterable[EpisodeChunk]) -> list[tuple[float, int]]:
        """Feed a message's chunks; returns (return, length) of episodes they complete."""
        finished = []
        for chunk in chunks:
            key = (connection, chunk.episode_id)
            ret, length = self._open.pop(key, (0.0, 0))
            ret += float(chunk.rewards.sum())
            length += chunk.env_steps
            if chunk.is_terminated or chunk.is_truncated:
                finished.append((ret, length))
            else:
                self._open[key] = (ret, length)
        return finished

    def forget(self, connection: Hashable) -> None:
        """Drop a disconnected client's open episodes."""
        for key in [k for k in self._open if k[0] == connection]:
            del self._open[key]


@dataclass
class Metrics:
    """Everything the progress line and TensorBoard show."""

    window: int = 100
    returns: deque = field(default_factory=deque)
    lengths: deque = field(default_factory=deque)
    episodes_total: int = 0
    env_steps_received: int = 0
    env_steps_trained: int = 0
    samples_dropped_stale: int = 0
    updates: int = 0
    weights_seq_no: int = 0
    clients_connected: int = 0
    learner: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    _rate_mark: tuple[float, int] = (0.0, 0)
    env_steps_per_s: float = 0.0

    def __post_init__(self) -> None:
        self.returns = deque(maxlen=self.window)
        self.lengths = deque(maxlen=self.window)
        self._rate_mark = (time.monotonic(), 0)

    def add_episodes(self, finished: list[tuple[float, int]]) -> None:
        for ret, length in finished:
            self.returns.append(ret)
            self.lengths.append(length)
        self.episodes_total += len(finished)

    @property
    def return_mean(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    def snapshot(self) -> dict[str, float]:
        """Current scalar metrics keyed as in TensorBoard."""
        now = time.monotonic()
        mark_t, mark_steps = self._rate_mark
        if now - mark_t > 0.5:
            self.env_steps_per_s = (self.env_steps_received - mark_steps) / (now - mark_t)
            self._rate_mark = (now, self.env_steps_received)
        out = {
            "episode/return_mean": self.return_mean,
            "episode/return_min": min(self.returns) if self.returns else math.nan,
            "episode/return_max": max(self.returns) if self.returns else math.nan,
            "episode/length_mean": sum(self.lengths) / len(self.lengths) if self.lengths else math.nan,
            "episode/count": float(self.episodes_total),
            "charts/env_steps": float(self.env_steps_received),
            "charts/env_steps_per_s": self.env_steps_per_s,
            "charts/weights_seq_no": float(self.weights_seq_no),
            "charts/clients_connected": float(self.clients_connected),
            "charts/samples_dropped_stale": float(self.samples_dropped_stale),
        }
        out.update({f"losses/{k}": v for k, v in self.learner.items()})
        return out

    def progress_line(self) -> str:
        s = self.snapshot()
        return (
            f"[tether] update {self.updates:4d} | steps {self.env_steps_received:8d} | "
            f"return {s['episode/return_mean']:7.1f} (min {s['episode/return_min']:6.1f}, "
            f"max {s['episode/return_max']:6.1f}) | len {s['episode/length_mean']:6.1f} | "
            f"{self.env_steps_per_s:7.0f} steps/s | kl {self.learner.get('approx_kl', math.nan):.4f} | "
            f"entropy {self.learner.get('entropy', math.nan):.3f} | v{self.weights_seq_no} | "
            f"clients {self.clients_connected} | stale {self.samples_dropped_stale}"
        )


class TensorBoardWriter:
    """Writes scalars to TensorBoard event files; imported lazily (it is slow to import)."""

    def __init__(self, logdir: str | Path) -> None:
        self._logdir = str(logdir)
        self._writer: Any = None

    def write(self, scalars: dict[str, float], step: int) -> None:
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard not installed: say so once, keep training
                print(f"[tether] TensorBoard disabled: {exc}", file=sys.stderr)
                self._writer = False
                return
            self._writer = SummaryWriter(self._logdir)
        if self._writer is False:
            return
        for key, value in scalars.items():
            if not math.isnan(value):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer:
            self._writer.close()
