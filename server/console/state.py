"""What the console shows, gathered while the server runs.

The server (``RLlinkService``, for TCP and websocket alike) reports connections,
requests, refusals and stored batches to a :class:`ConsoleState` (its
``observer``); the state samples the trainer's metrics once a second into a
bounded :class:`History`, and builds the feed's messages (docs/console.md):
``hello`` for a browser that connects (the whole history, the clients, the
error log, the last episodes) and one ``tick`` a second after that.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import orjson

from .history import History

#: Entries kept in the error/event log, episodes kept per module, clients gone kept for a while.
ERROR_LOG_SIZE = 500
EPISODES_PER_MODULE = 20
DEPARTED_CLIENTS = 50
#: Open episodes whose steps are kept, and steps kept per agent of an episode.
MAX_OPEN_EPISODES = 256
MAX_EPISODE_STEPS = 2000
#: Values (a step's reward and its action's numbers) kept per agent of an episode: an agent
#: with wide Box actions keeps fewer steps, so a kept episode's size does not grow with them.
MAX_AGENT_VALUES = 8000
#: Agents of one episode whose steps are kept (the others count in its return and length only).
MAX_DETAIL_AGENTS = 16
#: Values kept over all unfinished episodes together: their memory's bound.
MAX_OPEN_VALUES = 2_000_000
#: An open episode not heard of for this long is stale (its end was dropped, its client gave it
#: up, or its game is paused): the first to give its steps back when the budget is spent. (Wall
#: time, not batches: a client may send each episode, or each part of a frame, in a batch of its own.)
STALE_SECONDS = 60.0
#: Episodes forgotten for silence (MAX_OPEN_EPISODES) remembered, so one that comes back is
#: not shown as if it had started then.
MAX_FORGOTTEN_EPISODES = 4096
#: Actions per module the histogram is taken over.
ACTION_WINDOW = 2000
#: Schema version of the feed's messages (docs/console.md).
FEED_VERSION = 1
#: The compact metrics log beside the TensorBoard files, read by ``tether console --logdir``.
SAVED_RUN = "console.json"


@dataclass
class ClientInfo:
    """One client as the console shows it."""

    id: int
    address: str
    connected_at: float
    client_name: str | None = None
    protocol_version: str | None = None
    #: The client library and its version ("tether-python/0.1.0"), from PING's "sdk".
    sdk: str | None = None
    #: Earlier connections of the same client_session (reconnects of this SDK client).
    reconnects: int = 0
    last_seen: float = 0.0
    requests: int = 0
    batches: int = 0
    env_steps: int = 0
    errors: int = 0
    #: weights_seq_no per module the client said it acted with in its last batch.
    weights: dict[str, int] = field(default_factory=dict)
    client_session: str | None = None
    disconnected_at: float | None = None
    #: Seconds between a request and its answer, last one.
    round_trip_s: float | None = None
    _rate_mark: tuple[float, int] = (0.0, 0)
    env_steps_per_s: float = 0.0

    def to_json(self, current: dict[str, int], now: float) -> dict[str, Any]:
        staleness = {m: current[m] - v for m, v in self.weights.items() if m in current}
        return {
            "id": self.id, "address": self.address, "client_name": self.client_name, "sdk": self.sdk,
            "protocol_version": self.protocol_version, "connected_at": round(self.connected_at, 3),
            "last_seen_s_ago": round(now - self.last_seen, 3), "requests": self.requests, "batches": self.batches,
            "env_steps": self.env_steps, "env_steps_per_s": round(self.env_steps_per_s, 1), "errors": self.errors,
            "weights": dict(self.weights), "staleness": staleness, "client_session": self.client_session,
            "round_trip_ms": None if self.round_trip_s is None else round(self.round_trip_s * 1e3, 2),
            "reconnects": self.reconnects,
            "connected": self.disconnected_at is None,
        }


class ConsoleState:
    """Collects what the console shows; every method runs on the server's event loop."""

    def __init__(self, trainer: Any, history_capacity: int = 1024, clients_only: bool = False) -> None:
        self.trainer = trainer
        #: Only the client table (a rank > 0 of a group, reporting its clients to rank 0's console): no
        #: episodes or actions are kept, since no page shows them.
        self.clients_only = clients_only
        self.started = time.time()
        self.history = History(history_capacity)
        self.clients: dict[int, ClientInfo] = {}
        self.departed: deque[ClientInfo] = deque(maxlen=DEPARTED_CLIENTS)
        self.reconnects = 0
        self._sessions_seen: dict[str, int] = {}  # client_session -> connections seen
        self.errors: deque[dict[str, Any]] = deque(maxlen=ERROR_LOG_SIZE)
        self._error_seq = 0
        #: Curriculum changes already in the event log (the start's set is not an event).
        self._curriculum_seen = 1 if getattr(trainer, "curriculum", None) is not None else 0
        #: Per module, summaries of the last finished episodes, newest first.
        self.episodes: dict[str, deque] = {}
        #: Their steps, by episode id (encoded when first asked for, off the event loop).
        self._details: dict[int, EpisodeSteps] = {}
        self._episode_seq = 0
        #: Steps of episodes not finished yet, per (connection, episode id) and agent (bounded).
        self._open: dict[tuple, dict[str, dict]] = {}
        #: Those of them that keep steps, in the order they started (the youngest give theirs back first).
        self._keeping: dict[tuple, None] = {}
        #: When each open episode was last heard of (``clock``, seconds).
        self._heard: dict[tuple, float] = {}
        self._forgotten: OrderedDict[tuple, None] = OrderedDict()
        self._stale: list[tuple] | None = None  # this batch's stale episodes, worked out when first needed
        self.clock = time.monotonic
        #: Values they keep, together (at most MAX_OPEN_VALUES).
        self._open_values = 0
        self.actions: dict[str, deque] = {}
        self.loop_lag_ms = 0.0
        self._last_errors_sent = 0

    # -- what the TCP server reports ----------------------------------------------------

    def connected(self, session_id: int, peer: Any) -> None:
        now = time.time()
        address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        self.clients[session_id] = ClientInfo(session_id, address, now, last_seen=now, _rate_mark=(now, 0))

    def disconnected(self, session_id: int) -> None:
        # Its unfinished episodes end with it (a client that reconnects goes on under a new connection).
        for key in [k for k in self._open if k[0] == session_id]:
            self._release(self._close(key))
        for key in [k for k in self._forgotten if k[0] == session_id]:
            del self._forgotten[key]
        info = self.clients.pop(session_id, None)
        if info is not None:
            info.disconnected_at = time.time()
            self.departed.appendleft(info)

    def request(self, session_id: int, kind: str, message: dict[str, Any]) -> None:
        info = self.clients.get(session_id)
        if info is None:
            return
        info.last_seen = time.time()
        info.requests += 1
        if kind == "PING":
            name, version, sdk = message.get("client_name"), message.get("protocol_version"), message.get("sdk")
            # Shown as text: a lone surrogate (no Unicode text) is kept as its escape.
            if isinstance(name, str):
                info.client_name = name[:200].encode("utf-8", "backslashreplace").decode("utf-8")
            if isinstance(sdk, str):
                info.sdk = sdk[:100].encode("utf-8", "backslashreplace").decode("utf-8")
            if isinstance(version, str):
                info.protocol_version = version[:20]
        session = message.get("client_session")
        if isinstance(session, str) and info.client_session is None:
            info.client_session = session[:128]
            earlier = self._sessions_seen.get(session, 0)
            if earlier:
                self.reconnects += 1  # the same SDK client on a new connection
                info.reconnects = earlier
            self._sessions_seen[session] = earlier + 1
            while len(self._sessions_seen) > 10_000:  # sessions of clients long gone
                self._sessions_seen.pop(next(iter(self._sessions_seen)))

    def answered(self, session_id: int, kind: str, seconds: float) -> None:
        info = self.clients.get(session_id)
        if info is not None:
            info.round_trip_s = seconds

    def batch(self, session_id: int, env_steps: int, versions: dict[str, int], records: list) -> None:
        """A batch was stored: its counts, the versions it acted with, its actions, and the steps of
        its episodes (kept for the last finished ones, step by step, within bounds)."""
        info = self.clients.get(session_id)
        if info is not None:
            info.batches += 1
            info.env_steps += env_steps
            info.weights.update(versions)
        if self.clients_only:
            return
        now = self.clock()
        self._stale = None
        for record in records:  # (heard of now, whatever comes first in this batch)
            if (session_id, record.episode_id) in self._heard:
                self._heard[(session_id, record.episode_id)] = now
        for record in records:
            key = (session_id, record.episode_id)
            ending = record.is_terminated or record.is_truncated
            for agent in record.agents:
                window = self.actions.setdefault(agent.module_id, deque(maxlen=ACTION_WINDOW))
                window.extend(agent.chunk.actions[-ACTION_WINDOW:].tolist())
            if key in self._forgotten:  # its start is gone: not shown (its return would be a part's)
                if ending:
                    del self._forgotten[key]
                continue
            agents = self._open.pop(key, None)
            if agents is None:
                agents = {}
                self._keeping[key] = None
            self._open[key] = agents  # most recent last: the longest silent episode is forgotten first
            self._heard[key] = now
            while len(self._open) > MAX_OPEN_EPISODES:
                silent = next(iter(self._open))
                self._release(self._close(silent))
                self._forgotten[silent] = None
                if len(self._forgotten) > MAX_FORGOTTEN_EPISODES:
                    self._forgotten.popitem(last=False)
            for agent in record.agents:
                chunk = agent.chunk
                entry = agents.get(agent.agent_id)
                if entry is None:
                    shown = sum(1 for e in agents.values() if e["rewards"] is not None)
                    entry = agents[agent.agent_id] = {
                        "module": agent.module_id, "return": 0.0, "steps": 0, "kept": 0, "values": 0, "full": False,
                        # (None: an agent past MAX_DETAIL_AGENTS of its episode counts, its steps are not kept)
                        "rewards": [] if shown < MAX_DETAIL_AGENTS and key in self._keeping else None, "actions": []}
                entry["return"] += float(chunk.rewards.sum(dtype=float))
                entry["steps"] += chunk.env_steps
                if entry["rewards"] is not None:
                    self._keep(entry, chunk, key)
                if not ending and (chunk.is_terminated or chunk.is_truncated):
                    # It left an episode that goes on (a game scene's agent): shown now, not kept.
                    self._finish({agent.agent_id: agents.pop(agent.agent_id)})
            if ending:
                self._close(key)
                self._finish(agents)

    def _close(self, key: tuple) -> dict[str, dict]:
        """Takes an episode out of the open ones; its agents."""
        self._keeping.pop(key, None)
        self._heard.pop(key, None)
        return self._open.pop(key)

    def _keep(self, entry: dict, chunk: Any, key: tuple) -> None:
        """Keeps what fits of a chunk's steps for one agent: at most MAX_EPISODE_STEPS steps and
        MAX_AGENT_VALUES values per agent, MAX_OPEN_VALUES over all open episodes. When the
        budget is spent, stale episodes (not heard of for STALE_SECONDS), then the episodes that
        started after this one, give their steps back (they still count in their return and
        length, and keep no more): the oldest of those being played, which end first, are
        shown whole. An agent that cannot keep all it wants keeps
        no more after it, so what is kept is always its first steps, without a gap."""
        if entry["full"]:
            return
        per_step = 1 + math.prod(chunk.actions.shape[1:])
        limit = min(MAX_EPISODE_STEPS, MAX_AGENT_VALUES // per_step)
        wanted = min(limit - entry["kept"], len(chunk.rewards))
        if self._open_values + wanted * per_step > MAX_OPEN_VALUES:
            if self._stale is None:  # once a batch: each is forgotten once, so the walks stay short
                limit_s = self.clock() - STALE_SECONDS
                self._stale = [k for k in self._open if k in self._keeping and self._heard[k] <= limit_s]
            while self._stale and self._open_values + wanted * per_step > MAX_OPEN_VALUES:
                stale = self._stale.pop(0)
                if stale in self._keeping and stale != key:
                    self._forget_steps(stale)
            while self._keeping and self._open_values + wanted * per_step > MAX_OPEN_VALUES:
                younger = next(reversed(self._keeping))
                if younger == key:
                    break
                self._forget_steps(younger)
        room = max(0, min(wanted, (MAX_OPEN_VALUES - self._open_values) // per_step))
        if room == 0 and entry["kept"] == 0:  # nothing of it kept: not among the agents shown
            entry["rewards"] = None
            return
        if room > 0:
            entry["rewards"].append(chunk.rewards[:room].copy())
            entry["actions"].append(chunk.actions[:room].copy())
            entry["kept"] += room
            entry["values"] += room * per_step
            self._open_values += room * per_step
        entry["full"] = room < len(chunk.rewards)

    def _forget_steps(self, key: tuple) -> None:
        del self._keeping[key]
        self._release(self._open[key], forget_steps=True)

    def _release(self, agents: dict[str, dict], forget_steps: bool = False) -> None:
        """An open episode's kept values are given back to the MAX_OPEN_VALUES budget; with
        ``forget_steps`` its agents keep counting their return and length, and no more steps."""
        for entry in agents.values():
            self._open_values -= entry["values"]
            if forget_steps:
                entry["values"] = entry["kept"] = 0
                entry["rewards"], entry["actions"] = None, []

    def _finish(self, agents: dict[str, dict]) -> None:
        self._release(agents)
        if not agents:
            return
        by_module: dict[str, dict[str, dict]] = {}
        for agent_id, entry in agents.items():
            by_module.setdefault(entry["module"], {})[agent_id] = entry
        for module, members in by_module.items():
            steps = {agent_id: (_joined(e["rewards"]), _joined(e["actions"]), e["steps"])
                     for agent_id, e in members.items() if e["rewards"] is not None}
            self.episode(module, sum(e["return"] for e in members.values()), max(e["steps"] for e in members.values()),
                         EpisodeSteps(steps), agent_count=len(members))

    def episode(self, module: str, total_return: float, length: int, steps: EpisodeSteps | None,
                agent_count: int | None = None) -> None:
        """A finished episode of ``module``: its agents' return and its length, kept as a summary
        that every tick carries, and per agent its rewards and actions step by step (the first
        MAX_EPISODE_STEPS of at most MAX_DETAIL_AGENTS agents), sent only to a browser that
        asks for them (an ``episode`` request) and encoded then, off the event loop."""
        kept = self.episodes.setdefault(module, deque(maxlen=EPISODES_PER_MODULE))
        if len(kept) == kept.maxlen:
            self._details.pop(kept[-1]["id"], None)
        self._episode_seq += 1
        steps = steps if steps is not None else EpisodeSteps({})
        kept.appendleft({"id": self._episode_seq, "t": round(time.time() - self.started, 3),
                         "return": _finite(total_return), "length": length,
                         "agents": len(steps) if agent_count is None else agent_count, "agents_shown": len(steps)})
        self._details[self._episode_seq] = steps

    def find_episode(self, module: Any, episode_id: Any) -> tuple[dict[str, Any] | None, EpisodeSteps | None]:
        """A kept episode's summary and steps (None, None when it is not kept); on the event loop."""
        if not isinstance(module, str) or not isinstance(episode_id, int) or isinstance(episode_id, bool):
            return None, None
        summary = next((e for e in self.episodes.get(module, ()) if e["id"] == episode_id), None)
        return (summary, self._details.get(episode_id)) if summary is not None else (None, None)

    def episode_steps(self, module: Any, episode_id: Any) -> str:
        """The answer to a browser's ``episode`` request, encoded here: one kept episode step by step."""
        summary, steps = self.find_episode(module, episode_id)
        return episode_answer(module, episode_id, summary, None if steps is None else steps.text())

    def refused(self, session_id: int | None, code: str, message: str, request: str | None) -> None:
        info = self.clients.get(session_id) if session_id is not None else None
        if info is not None:
            info.errors += 1
        self.event("error", code=code, message=message[:500], request=request,
                   client=None if info is None else {"id": info.id, "address": info.address, "name": info.client_name})

    def event(self, kind: str, **fields: Any) -> None:
        """An entry of the error/event log (refusals, and every console control)."""
        self._error_seq += 1
        self.errors.appendleft({"seq": self._error_seq, "kind": kind, "t": round(time.time() - self.started, 3),
                                **fields})

    # -- sampling and messages -------------------------------------------------------------

    def sample(self) -> dict[str, float]:
        """Takes this second's metrics into the history; returns them."""
        now = time.time()
        values = self.trainer.metrics.snapshot()
        values.update(self._health())
        values["charts/updates"] = float(self.trainer.metrics.updates)
        for module, runtime in self.trainer.modules.items():
            if runtime.spec.snapshot_of is not None:
                continue  # (a self-play snapshot never trains: its ratings are the self_play series)
            values[f"module/{module}/weights_seq_no"] = float(runtime.weights_seq_no)
            # (the base the console sets, after its schedule at the share of the run the latest update started from)
            values[f"module/{module}/lr"] = float(runtime.learner.lr_now())
            values[f"module/{module}/ent_coef"] = float(runtime.learner.ent_coef_now())
        self.history.add(now - self.started, values)
        self._log_curriculum_changes()
        for info in self.clients.values():
            mark_t, mark_steps = info._rate_mark
            if now - mark_t >= 1.0:
                info.env_steps_per_s = (info.env_steps - mark_steps) / (now - mark_t)
                info._rate_mark = (now, info.env_steps)
        return values

    def _curriculum_summary(self) -> dict[str, Any] | None:
        curriculum = getattr(self.trainer, "curriculum", None)
        return None if curriculum is None else curriculum.summary()

    def _log_curriculum_changes(self) -> None:
        """Every change of the parameters or lesson into the event log (those the console made are
        logged as its controls)."""
        curriculum = getattr(self.trainer, "curriculum", None)
        if curriculum is None:
            return
        new = curriculum.changes_made - self._curriculum_seen
        self._curriculum_seen = curriculum.changes_made
        for cause, details in curriculum.changes[-new:] if new > 0 else ():
            if cause not in ("set_param", "set_lesson"):
                self.event("curriculum", cause=cause, **details)

    def _health(self) -> dict[str, float]:
        trainer = self.trainer
        return {
            "health/loop_lag_ms": self.loop_lag_ms,
            "health/pool_steps": float(trainer.pool_steps),
            "health/rss_mb": _rss_mb(),
            "health/paused": 1.0 if getattr(trainer, "paused", False) else 0.0,
        }

    def current_versions(self) -> dict[str, int]:
        return {m: rt.weights_seq_no for m, rt in self.trainer.modules.items()}

    def client_table(self) -> list[dict[str, Any]]:
        now, current = time.time(), self.current_versions()
        return ([c.to_json(current, now) for c in self.clients.values()]
                + [c.to_json(current, now) for c in self.departed])

    def action_histograms(self) -> dict[str, Any]:
        """Per module: counts per action for discrete spaces, per-dimension mean/std for Box."""
        out: dict[str, Any] = {}
        for module, window in self.actions.items():
            if not window:
                continue
            spec = self.trainer.modules[module].spec if module in self.trainer.modules else None
            kind = spec.action_space.to_json().get("type") if spec is not None else None
            values = list(window)
            if kind == "Box":
                rows = [v if isinstance(v, list) else [v] for v in values]
                dims = len(rows[0])
                means = [sum(r[d] for r in rows) / len(rows) for d in range(dims)]
                stds = [math.sqrt(sum((r[d] - means[d]) ** 2 for r in rows) / len(rows)) for d in range(dims)]
                out[module] = {"type": "Box", "mean": [_finite(m) for m in means], "std": [_finite(s) for s in stds],
                               "count": len(rows)}
            else:
                counts: dict[str, int] = {}
                for v in values:
                    key = ",".join(str(int(x)) for x in v) if isinstance(v, list) else str(int(v))
                    counts[key] = counts.get(key, 0) + 1
                out[module] = {"type": kind or "Discrete", "counts": dict(sorted(counts.items())), "count": len(values)}
        return out

    def hello(self) -> dict[str, Any]:
        trainer = self.trainer
        return {
            "type": "hello", "version": FEED_VERSION, "started_at": self.started,
            "run": {"modules": {m: {"observation_space": rt.spec.observation_space.to_json(),
                                    "action_space": rt.spec.action_space.to_json(),
                                    "trainable": rt.spec.trainable, "snapshot_of": rt.spec.snapshot_of}
                                for m, rt in trainer.modules.items()},
                    "groups": {g: list(spec.members) for g, spec in trainer.layout.groups.items()},
                    "train_batch_size": trainer.config.train_batch_size,
                    "force_on_policy": trainer.config.force_on_policy},
            "history": self.history.to_json(),
            **self._live(),
            "errors": list(self.errors),
        }

    def tick(self, values: dict[str, float], since_error_seq: int) -> dict[str, Any]:
        """One second's update: the new sample of every series, and what changed."""
        return {
            "type": "tick", "t": round(time.time() - self.started, 3),
            "values": {k: _finite(v) for k, v in values.items()},
            **self._live(),
            "errors": [e for e in self.errors if e["seq"] > since_error_seq],
        }

    def _live(self) -> dict[str, Any]:
        reports = getattr(self.trainer, "rank_reports", None)
        clients = self.client_table()
        ranks: list[dict[str, Any]] | None = None
        if reports is not None:  # several ranks: every rank's clients, and a row per rank (rank_reports.py)
            clients = [{**row, "rank": reports.rank} for row in clients] + reports.other_ranks_clients()
            ranks = reports.rows()
        return {
            "clients": clients,
            "ranks": ranks,
            "reconnects": self.reconnects,
            "weights": self.current_versions(),
            "paused": bool(getattr(self.trainer, "paused", False)),
            "actions": self.action_histograms(),
            "episodes": {m: list(e) for m, e in self.episodes.items()},
            "curriculum": self._curriculum_summary(),
        }

    @property
    def last_error_seq(self) -> int:
        return self._error_seq

    def saved_run(self) -> SavedRun:
        """The run as it is now, for ``console.json``: taken on the event loop, encoded and
        written by :meth:`RunLog.write`, in a thread."""
        data = self.hello()
        data["saved_at"] = time.time()
        return SavedRun(data, list(self._details.items()))


class EpisodeSteps:
    """A finished episode's steps per agent (rewards, actions, the agent's length), as arrays,
    encoded as JSON when first needed (a browser asks, or the run is saved) and kept as text.

    Encoding may run in any thread; the arrays are never changed after the episode ends.
    """

    __slots__ = ("_agents", "_count", "_text", "_lock")

    def __init__(self, agents: dict[str, tuple[np.ndarray, np.ndarray, int]]) -> None:
        self._agents: dict[str, tuple[np.ndarray, np.ndarray, int]] | None = agents
        self._count = len(agents)
        self._text: str | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Agents whose steps are kept."""
        return self._count

    def text(self) -> str:
        """``{agent id: {"rewards": [...], "actions": [...], "steps": n}}``, rewards and float
        actions rounded to 6 decimals, a value that is not finite as null (the last guard:
        rewards are checked finite on ingest)."""
        with self._lock:
            if self._text is None:
                agents = self._agents or {}
                # Agent by agent: each call holds the GIL (and so the event loop) only that long.
                parts = [_agent_text(agent_id, *steps) for agent_id, steps in agents.items()]
                self._text = "{" + ",".join(parts) + "}"
                self._agents = None  # the text replaces the arrays
            return self._text


class SavedRun:
    """One state of the run for ``console.json``: the ``hello`` then, and its kept episodes."""

    def __init__(self, hello: dict[str, Any], details: list[tuple[int, EpisodeSteps]]) -> None:
        self.hello = hello
        self.details = details

    def pieces(self) -> Iterator[str]:
        """``console.json``'s text in pieces, encoded as they are asked for (the history series
        by series, the episodes one by one): a thread writing them never holds the GIL, and so
        the event loop, for long at a time, nor makes one string of the whole log."""
        yield _encoded(self.hello, 2)[:-1] + ',"episode_details":{'
        for k, (episode_id, steps) in enumerate(self.details):
            yield f'{"," if k else ""}"{episode_id}":'
            yield steps.text()
            _offer_gil()
        yield "}}"

    def text(self) -> str:
        """``console.json``'s text."""
        return "".join(self.pieces())


class RunLog:
    """``console.json``, written atomically from any thread; a state older than the one on
    disk is not written (a periodic save that ends after the final one must not undo it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._taken = 0
        self._written = 0

    def take(self, state: ConsoleState) -> tuple[int, SavedRun]:
        """The run now, numbered; call on the event loop, then :meth:`write` it in any thread."""
        self._taken += 1
        return self._taken, state.saved_run()

    def write(self, run: SavedRun, number: int | None = None) -> bool:
        """Writes ``run`` through a temporary file (a reader never sees half of it) unless a
        later one is written already; returns whether it was."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                for piece in run.pieces():
                    out.write(piece)
            with self._lock:
                if number is not None and number <= self._written:
                    return False
                os.replace(tmp, self.path)
                if number is not None:
                    self._written = number
                return True
        finally:
            tmp.unlink(missing_ok=True)


def episode_answer(module: Any, episode_id: Any, summary: dict[str, Any] | None, detail: str | None) -> str:
    """The encoded ``episode`` message: the summary and, spliced in unparsed, the agents' steps."""
    if summary is None or detail is None:
        return json.dumps({"type": "episode", "module": str(module)[:200], "id": str(episode_id)[:40],
                           "error": f"no episode {str(episode_id)[:40]} of module {str(module)[:80]!r} is kept: "
                                    f"the server keeps the last {EPISODES_PER_MODULE} of each module"})
    head = json.dumps({"type": "episode", "module": module, **summary}, allow_nan=False, separators=(",", ":"))
    return f'{head[:-1]},"agent_steps":{detail}}}'


def _encoded(value: Any, depth: int) -> str:
    """Compact JSON of ``value``; a dict (to ``depth`` levels) encoded one entry per call."""
    if depth > 0 and isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_encoded(v, depth - 1)}" for k, v in value.items()) + "}"
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def _offer_gil() -> None:
    """Lets the event loop's thread take the GIL if it waits for it (between pieces of an
    encoding: otherwise CPython hands it over only every switch interval, 5 ms, and not in
    the middle of a C call)."""
    time.sleep(0)


def _agent_text(agent_id: str, rewards: np.ndarray, actions: np.ndarray, steps: int) -> str:
    try:
        body = orjson.dumps({"rewards": _rounded(rewards), "actions": _rounded(actions), "steps": int(steps)},
                            option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except (TypeError, ValueError):  # (an array the encoder cannot take: the agent is listed without its steps)
        body = json.dumps({"rewards": [], "actions": [], "steps": int(steps)})
    text = json.dumps(agent_id) + ":" + body
    _offer_gil()
    return text


def _rounded(values: np.ndarray) -> np.ndarray:
    """Floats to 6 decimals (what a chart shows; a non-finite one becomes null), integers as they are."""
    if values.dtype.kind == "f":
        return np.round(values.astype(np.float64), 6)
    return np.ascontiguousarray(values)


def _finite(value: float) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _rss_mb() -> float:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return math.nan
