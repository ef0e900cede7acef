"""Training metrics: episode returns stitched from chunks, counters, the
progress line and TensorBoard scalars."""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Iterable

import numpy as np

from tether.protocol.multi_agent import MultiAgentRecord

from .say import say


@dataclass
class FinishedEpisode:
    """A completed episode: its total return, length and each agent's share.

    ``complete`` False: not an episode but agents that left one still running
    (their own terminated/truncated flag), reported when they leave so that a
    long episode (a game scene that never ends) shows its agents' returns and
    does not keep every agent that ever took part; the episode's final entry
    then lists only the agents still in it, and its total counts all.
    """

    total_return: float
    length: int
    agents: dict[str, tuple[str, float]]  # agent id -> (module, return)
    #: Agents behind the entries (a group counts its members); per-agent return = total_return / agent_count.
    agent_count: int = 1
    #: agent id -> env steps it took part in (its own episode length).
    agent_lengths: dict[str, int] = field(default_factory=dict)
    complete: bool = True
    #: The record's episode id (None for a v1 client's records).
    episode_id: str | None = None
    #: **[1.7]** The environment parameters the record that ended it says it was played with (§19.3).
    env_params: Any = None


_TRAILING_INDEX = re.compile(r"(?:[_\-#]?\d+)+$")  # "cart_3#2": a re-joined agent (name#n) too


#: Returns of at least this magnitude (2**64, about 1.8e19) are left out of the return metrics, as are
#: non-finite ones: no update can train on rewards that add up to it (its squared error overflows float32),
#: so such an episode is not one the run learns from, and one would swamp the window's mean.
RETURN_LIMIT = float(2.0**64)


def plausible_return(episode: FinishedEpisode) -> bool:
    """Whether an episode's return and each of its agents' returns are finite and under RETURN_LIMIT."""
    return all(math.isfinite(r) and abs(r) < RETURN_LIMIT
               for r in (episode.total_return, *(ret for _, ret in episode.agents.values())))


def agent_type(agent_id: str) -> str:
    """'adversary_2' -> 'adversary', 'cart_3#2' -> 'cart': the name the per-agent-type metrics use."""
    return _TRAILING_INDEX.sub("", agent_id) or agent_id


class EpisodeTracker:
    """Adds up returns and lengths of episodes that arrive in several chunks.

    Records are keyed by (connection, episode_id); a v1 client that sends no
    ids continues its one open episode with the first record of its next
    message, which the same key (connection, None) captures.
    """

    def __init__(self, groups: dict[str, tuple[int, str]] | None = None) -> None:
        # key -> {agent_id: [module, return, steps, start_step]}
        self._open: dict[Hashable, dict[str, list]] = {}
        # key -> [return, agent count, last env step] of the agents that already left the episode
        self._departed: dict[Hashable, list] = {}
        #: group id -> (members, reward rule "sum"|"mean"): a group's return counts for its members.
        self.groups = groups or {}

    def open_size(self) -> int:
        """Agent entries held for episodes not finished yet."""
        return sum(len(v) for v in self._open.values())

    def _team_share(self, agent_id: str, ret: float) -> tuple[float, int]:
        members, rule = self.groups.get(agent_id, (1, "sum"))
        return (ret * members if rule == "mean" else ret), members

    def add(self, connection: Hashable, records: Iterable[MultiAgentRecord]) -> list[FinishedEpisode]:
        """Feed a message's records; returns the episodes they complete (and the agents that left
        an episode still running, as entries with ``complete`` False)."""
        finished = []
        for record in records:
            key = (connection, record.episode_id)
            agents = self._open.setdefault(key, {})
            ending = record.is_terminated or record.is_truncated
            left = []
            for a in record.agents:
                entry = agents.setdefault(a.agent_id, [a.module_id, 0.0, 0, a.start_step])
                with np.errstate(over="ignore"):  # a huge reward makes an infinite return, not a warning
                    entry[1] += float(a.chunk.rewards.sum(dtype=np.float64))
                entry[2] += a.chunk.env_steps
                if not ending and (a.chunk.is_terminated or a.chunk.is_truncated):
                    left.append(a.agent_id)
            if left:
                departed = self._departed.setdefault(key, [0.0, 0, 0])
                shares = {}
                for aid in left:
                    module, ret, steps, start = agents.pop(aid)
                    share, members = self._team_share(aid, ret)
                    departed[0] += share
                    departed[1] += members
                    departed[2] = max(departed[2], start + steps)
                    shares[aid] = (module, ret, steps)
                finished.append(FinishedEpisode(
                    total_return=sum(r for _, r, _ in shares.values()), length=max(n for _, _, n in shares.values()),
                    agents={aid: (m, r) for aid, (m, r, _) in shares.items()}, agent_count=len(shares),
                    agent_lengths={aid: n for aid, (_, _, n) in shares.items()}, complete=False,
                    episode_id=record.episode_id))
            acted = bool(agents) or key in self._departed
            if ending or not acted:
                del self._open[key]  # (one no agent acted in holds nothing: a closing record alone is no episode)
            if ending and acted:
                total, count, end = self._departed.pop(key, (0.0, 0, 0))
                for aid, e in agents.items():
                    share, members = self._team_share(aid, e[1])
                    total += share
                    count += members
                finished.append(FinishedEpisode(
                    total_return=total,
                    length=max([end] + [e[3] + e[2] for e in agents.values()]),
                    agents={aid: (e[0], e[1]) for aid, e in agents.items()},
                    agent_count=max(count, 1),
                    agent_lengths={aid: e[2] for aid, e in agents.items()},
                    episode_id=record.episode_id,
                    env_params=record.env_params,
                ))
        return finished

    def forget(self, connection: Hashable) -> None:
        """Drop a disconnected client's open episodes."""
        for key in [k for k in self._open if k[0] == connection]:
            del self._open[key]
        for key in [k for k in self._departed if k[0] == connection]:
            del self._departed[key]


@dataclass
class Metrics:
    """Everything the progress line and TensorBoard show."""

    window: int = 100
    returns: deque = field(default_factory=deque)
    lengths: deque = field(default_factory=deque)
    episodes_total: int = 0
    #: Env steps (one per environment step) and agent steps (one per decision) received.
    env_steps_received: int = 0
    agent_steps_received: int = 0
    agent_steps_trained: int = 0
    samples_dropped_stale: int = 0
    #: Agent steps not stored because they would be older than max_staleness when trained (the client is told).
    samples_refused_stale: int = 0
    #: The share of new training episodes clients are asked to record (§13.2).
    record_share: float = 1.0
    #: Module updates thrown away because the loss, a gradient or a weight was not finite.
    updates_discarded: int = 0
    #: Module updates published without the data of a client that made them non-finite, and
    #: the agent steps left out so (also those of a refused client, dropped from the pool).
    updates_isolated: int = 0
    agent_steps_isolated: int = 0
    #: Clients (connections or client_sessions) refused for their data (ERROR DATA_REFUSED).
    clients_refused: int = 0
    #: Finished episodes left out of the return metrics: a return of RETURN_LIMIT or more,
    #: or a client whose data made an update non-finite (see add_episodes and exclude).
    episodes_excluded: int = 0
    #: TensorBoard writes that failed (logged; checkpoints are written regardless).
    metrics_write_failures: int = 0
    #: Most agent steps ever waiting in the pool, and the size of the last update (agent steps).
    pool_steps_max: int = 0
    last_update_steps: int = 0
    #: Batches answered as duplicates (protocol 1.3 client_session + batch_seq), not stored.
    batches_duplicate: int = 0
    updates: int = 0
    weights_seq_no: int = 0
    clients_connected: int = 0
    #: Several ranks, on rank 0: each rank's ingest, clients and health as ``rank/<r>/...`` (rank_reports.py).
    rank_scalars: dict = field(default_factory=dict)
    learner: dict[str, float] = field(default_factory=dict)
    started_at: float = field(default_factory=time.monotonic)
    _rate_mark: tuple[float, int] = (0.0, 0)
    env_steps_per_s: float = 0.0
    #: Self-play's ratings (server/self_play.py), reported with the other metrics; None without it.
    self_play: Any = None
    #: The curriculum's lesson, measure and parameters (server/curriculum.py); None without one.
    curriculum: Any = None

    def __post_init__(self) -> None:
        self.returns = deque(maxlen=self.window)
        self.lengths = deque(maxlen=self.window)
        #: Per episode, the mean of its agents' returns.
        self.agent_returns: deque = deque(maxlen=self.window)
        #: Per module and per agent type (a group's id is its type): the last returns and lengths.
        self.module_returns: dict[str, deque] = {}
        self.module_lengths: dict[str, deque] = {}
        self.agent_type_returns: dict[str, deque] = {}
        self.agent_type_lengths: dict[str, deque] = {}
        self.module_updates: dict[str, dict[str, float]] = {}
        #: Per return window, who sent each entry (aligned at the right; see exclude).
        self._sources: dict[str, deque] = {}
        #: Whether any episode had more than one agent (the progress line then shows per-agent returns).
        self.multi_agent = False
        self._rate_mark = (time.monotonic(), 0)

    #: Agent types with their own return metric; further types share "other" (ids are client-chosen).
    MAX_AGENT_TYPES = 64

    def add_episodes(self, finished: list[FinishedEpisode], source: Hashable = None, suspect: bool = False) -> None:
        """Count finished episodes and add their returns to the windows. ``source`` names
        who sent them (see exclude). An episode of a ``suspect`` sender (one whose data
        made an update non-finite), or whose return is not plausible_return, is counted
        in ``episodes_excluded`` and not in the windows."""
        for episode in finished:
            if suspect or not plausible_return(episode):
                self.episodes_excluded += episode.complete
                continue
            if episode.complete:
                self._push("returns", self.returns, episode.total_return, source)
                self.lengths.append(episode.length)
                if episode.agents or episode.agent_count > 1:
                    self._push("agent_returns", self.agent_returns, episode.total_return / episode.agent_count, source)
                    self.multi_agent = self.multi_agent or episode.agent_count > 1
            for agent_id, (module, ret) in episode.agents.items():
                length = episode.agent_lengths.get(agent_id, episode.length)
                self._push(f"module/{module}", self.module_returns.setdefault(module, deque(maxlen=self.window)),
                           ret, source)
                self.module_lengths.setdefault(module, deque(maxlen=self.window)).append(length)
                kind = agent_type(agent_id)
                if kind not in self.agent_type_returns and len(self.agent_type_returns) >= self.MAX_AGENT_TYPES:
                    kind = "other"
                self._push(f"agent_type/{kind}", self.agent_type_returns.setdefault(kind, deque(maxlen=self.window)),
                           ret, source)
                self.agent_type_lengths.setdefault(kind, deque(maxlen=self.window)).append(length)
        self.episodes_total += sum(1 for episode in finished if episode.complete)

    def _push(self, key: str, window: deque, value: float, source: Hashable) -> None:
        window.append(value)
        self._sources.setdefault(key, deque(maxlen=self.window)).append(source)

    def exclude(self, sources: set) -> int:
        """Take the returns (and their lengths) that ``sources`` sent out of every window,
        once their data was found to make an update non-finite; returns the episodes removed."""
        removed = self._drop_from("returns", self.returns, sources, self.lengths)
        self._drop_from("agent_returns", self.agent_returns, sources)
        for prefix, returns_by, lengths_by in (("module", self.module_returns, self.module_lengths),
                                               ("agent_type", self.agent_type_returns, self.agent_type_lengths)):
            for name in list(returns_by):
                self._drop_from(f"{prefix}/{name}", returns_by[name], sources, lengths_by.get(name))
                if not returns_by[name]:  # a mean of nothing is not shown
                    del returns_by[name]
                    lengths_by.pop(name, None)
                    self._sources.pop(f"{prefix}/{name}", None)
        self.episodes_excluded += removed
        return removed

    def _drop_from(self, key: str, window: deque, sources: set, lengths: deque | None = None) -> int:
        tags = list(self._sources.get(key, ()))[-len(window):] if window else []
        tags = [None] * (len(window) - len(tags)) + tags  # entries added without _push: nobody's
        keep = [tag not in sources for tag in tags]
        if all(keep):
            return 0
        values = [v for v, k in zip(window, keep) if k]
        window.clear()
        window.extend(values)
        self._sources[key] = deque((t for t, k in zip(tags, keep) if k), maxlen=self.window)
        if lengths is not None and len(lengths) == len(keep):
            kept_lengths = [n for n, k in zip(lengths, keep) if k]
            lengths.clear()
            lengths.extend(kept_lengths)
        return keep.count(False)

    @property
    def agent_return_mean(self) -> float:
        """Mean per-agent episode return over the last ``window`` episodes."""
        return sum(self.agent_returns) / len(self.agent_returns) if self.agent_returns else math.nan

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
            "charts/agent_steps": float(self.agent_steps_received),
            "charts/env_steps_per_s": self.env_steps_per_s,
            "charts/updates_discarded": float(self.updates_discarded),
            "charts/updates_isolated": float(self.updates_isolated),
            "charts/agent_steps_isolated": float(self.agent_steps_isolated),
            "charts/clients_refused": float(self.clients_refused),
            "charts/episodes_excluded": float(self.episodes_excluded),
            "charts/batches_duplicate": float(self.batches_duplicate),
            "charts/weights_seq_no": float(self.weights_seq_no),
            "charts/clients_connected": float(self.clients_connected),
            "charts/samples_dropped_stale": float(self.samples_dropped_stale),
            "charts/samples_refused_stale": float(self.samples_refused_stale),
            "charts/record_share": float(self.record_share),
        }
        out["episode/agent_return_mean"] = self.agent_return_mean
        for prefix, returns_by, lengths_by in (("module", self.module_returns, self.module_lengths),
                                               ("agent_type", self.agent_type_returns, self.agent_type_lengths)):
            for name, returns in returns_by.items():
                lengths = lengths_by[name]
                out[f"{prefix}/{name}/return_mean"] = sum(returns) / len(returns)
                out[f"{prefix}/{name}/return_min"] = float(min(returns))
                out[f"{prefix}/{name}/return_max"] = float(max(returns))
                out[f"{prefix}/{name}/length_mean"] = sum(lengths) / len(lengths)
        out.update({f"losses/{k}": v for k, v in self.learner.items()})
        for module, stats in self.module_updates.items():
            out.update({f"module/{module}/{k}": v for k, v in stats.items()})
        if self.self_play is not None:
            out.update(self.self_play.scalars())
        if self.curriculum is not None:
            out.update(self.curriculum.scalars())
        out.update(self.rank_scalars)
        return out

    def progress_line(self) -> str:
        """One line per update. ``return`` is the mean episode return per agent;
        multi-agent runs add the team total (all agents' returns summed)."""
        s = self.snapshot()
        returns = f"return {s['episode/agent_return_mean']:7.1f}"
        if self.multi_agent:
            returns += f" per agent (team {s['episode/return_mean']:.1f})"
        else:
            returns += f" (min {s['episode/return_min']:6.1f}, max {s['episode/return_max']:6.1f})"
        return (
            f"[tether] update {self.updates:4d} | batch {self.last_update_steps:6d} | env steps {self.env_steps_received:8d} | "
            f"agent steps {self.agent_steps_received:8d} | {returns} | len {s['episode/length_mean']:6.1f} | "
            f"{self.env_steps_per_s:7.0f} env steps/s | kl {self.learner.get('approx_kl', math.nan):.4f} | "
            f"entropy {self.learner.get('entropy', math.nan):.3f} | v{self.weights_seq_no} | "
            f"clients {self.clients_connected} | stale {self.samples_dropped_stale} (refused {self.samples_refused_stale})"
            + (f" | discarded {self.updates_discarded}" if self.updates_discarded else "")
            + (f" | isolated {self.agent_steps_isolated} steps" if self.agent_steps_isolated else "")
            + self._module_part()
        )

    def _module_part(self) -> str:
        if len(self.module_returns) < 2:
            return ""
        parts = [f"{m} {sum(r) / len(r):.2f}" for m, r in sorted(self.module_returns.items())]
        return " | per-agent return: " + ", ".join(parts)


class TensorBoardWriter:
    """Writes scalars to TensorBoard event files; imported lazily (it is slow to import)."""

    def __init__(self, logdir: str | Path) -> None:
        self._logdir = str(logdir)
        self._writer: Any = None
        # The learner's thread writes each update's scalars; the event loop writes a control's or a
        # curriculum change's: one at a time (and one writer made).
        self._lock = threading.Lock()

    def write(self, scalars: dict[str, float], step: int) -> None:
        with self._lock:
            self._write(scalars, step)

    def _write(self, scalars: dict[str, float], step: int) -> None:
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard not installed: say so once, keep training
                say(f"[tether] TensorBoard disabled: {exc}")
                self._writer = False
                return
            self._writer = SummaryWriter(self._logdir)
        if self._writer is False:
            return
        for key, value in scalars.items():
            if not math.isnan(value):
                # A name built from a client's id may hold a lone surrogate, which event files cannot encode.
                self._writer.add_scalar(key.encode("utf-8", "backslashreplace").decode("utf-8"), value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer:
            self._writer.close()
