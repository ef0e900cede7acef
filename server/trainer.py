"""Pools experience from all clients, runs learner updates for every module,
and serves the resulting weights. Runs on the server's event loop; updates run
in a worker thread so clients keep being served while the learners work."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Hashable

import numpy as np
import torch

from tether.sdk.protocol.framing import encode_frame
from tether.sdk.protocol.messages import PROTOCOL_VERSION, MessageType
from tether.sdk.protocol.episodes import EpisodeChunk
from tether.sdk.protocol.multi_agent import ModuleSpec, MultiAgentRecord
from tether.sdk.protocol.onnx_codec import encode_onnx

from .batch_dedup import BatchDedup, BatchId
from .checkpoint import load_checkpoint, save_checkpoint
from .config import ServerConfig
from .data_guard import DataGuard
from .ingest import EpisodeIngest, record_env_steps
from .learner import IsolatedUpdate, PPOLearner, update_isolating
from .logp_check import PolicyHistory, check_behaviour_logp
from .metrics import EpisodeTracker, Metrics, TensorBoardWriter, plausible_return
from .module_setup import DEFAULT_MODULE_ID, ModuleLayout
from .pool_journal import JournalEntry, PoolJournal, decode_entries, encode_entry, journal_files, read_journal
from .record_share import RecordShare
from .sample_pool import Admission, Pooled, SamplePool, part_of
from .stop_rule import ClientReturns

#: Freeing at least this many per-agent entries at once also hands free heap pages back to the OS.
_TRIM_AFTER_ENTRIES = 10_000


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim); a no-op elsewhere.
    Without it, the RSS of a client's freed per-agent state stays with the process."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


#: Consecutive updates at whose end the windowed mean return must be >= stop_at_return.
TARGET_UPDATES = 3


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _same_version(claimed: Any, current: int) -> bool:
    """Whether a client's claimed weights_seq_no (a JSON integer, not a boolean) is ``current``."""
    return isinstance(claimed, int) and not isinstance(claimed, bool) and claimed == current


#: The version given to data whose claimed weights version could not be checked:
#: never a kept version, so such data counts as stale and is not trained on.
UNVERIFIED_VERSION = -1
#: The version such steps are judged by: no staleness bound admits it.
_NEVER_FRESH = -(2**62)


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
        self._init_from_trained(layout.init_from)
        #: The module a single-agent (v1) client is served; None if no rule maps default_agent.
        self.default_module = layout.default_module()
        self.metrics = Metrics(window=config.metrics_window)
        self.episodes = EpisodeTracker({g: (len(spec.members), spec.reward) for g, spec in layout.groups.items()})
        self.tensorboard = TensorBoardWriter(config.logdir) if config.tensorboard else None
        #: Exactly-once batches: client_session -> highest batch_seq stored (kept in checkpoints).
        self.dedup = BatchDedup()
        #: Strikes against clients whose data made updates non-finite; refuses those that keep at it.
        self.guard = DataGuard()
        # Each update takes at most train_batch_size agent steps; the pool holds at most twice that plus a message.
        self._pool = SamplePool(config.train_batch_size, 2 * config.train_batch_size)
        #: Every stored batch is written here before it is answered (see pool_journal).
        self.journal: PoolJournal | None = None
        replay_dir = Path(config.resume).parent / "journal" if config.resume else None
        journal_from: int | None = None
        if config.resume:
            journal_from = 0
            if Path(config.resume).exists():
                journal_from = self._restore(config.resume)
            else:  # a crash before the first checkpoint: only the journal, if any, to resume from
                print(f"[tether] --resume {config.resume}: no checkpoint there yet; starting fresh", flush=True)
            if config.pool_journal and journal_from is not None and replay_dir is not None:
                self._replay(read_journal(replay_dir, journal_from))
        if config.pool_journal:
            existing = journal_files(self.journal_dir)
            if not config.resume:  # a new run: an earlier run's journal in this logdir is not ours to replay
                for _, old in existing:
                    old.unlink()
            # Never below the checkpoint's generation: files older than it are not replayed (a journal
            # folder emptied by hand, or a checkpoint copied without its journal).
            self.journal = PoolJournal(self.journal_dir, max(existing[-1][0] + 1 if existing else 0, journal_from or 0))
            if not config.resume or (replay_dir is not None and replay_dir.resolve() != self.journal_dir.resolve()):
                # A new run, or one resumed from another folder: a checkpoint here at once holds its
                # weights, pool and marks and starts its journal, so a crash before the first periodic
                # one loses nothing when resumed from here (and an older run's checkpoint left in this
                # folder is never resumed with this run's journal).
                self.save_checkpoint()
        #: Per trainable module, the policies of the last max_staleness + 1 versions (behaviour-logp check).
        self.histories = {m: PolicyHistory(config.max_staleness + 1) for m, rt in self.modules.items() if rt.spec.trainable}
        for module_id, history in self.histories.items():
            history.add(self.modules[module_id].weights_seq_no, self.modules[module_id].learner.model)
        self.ingest = EpisodeIngest(layout, require_logp=config.force_on_policy,
                                    logp_check=self._check_logp if config.verify_action_logp else None)
        #: client_session -> connections using it, and expiry timers of sessions no connection uses.
        self._session_users: dict[str, set[Hashable]] = {}
        self._session_expiry: dict[str, asyncio.TimerHandle] = {}
        self._target_streak: list[tuple[float, int, int]] = []
        #: Each client's own returns: every active client must reach stop_at_return (see stop_rule).
        self.client_returns = ClientReturns(min(config.metrics_window, 100), active_updates=TARGET_UPDATES)
        self._window_fresh_from = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-learner")
        self._update_task: asyncio.Task | None = None
        #: Modules the running update trains, until it has published (each will add 1 to its version).
        self._training_modules: set[str] = set()
        #: The share of new episodes clients are asked to record (SET_STATE record_share, §13.2).
        self.record_share = RecordShare(time.monotonic(), config.train_batch_size, config.env_steps_per_sample)
        self._next_state: asyncio.Future | None = None
        #: Wall-clock time (time.time()) and env steps when the mean return first met stop_at_return
        #: in the run of updates that confirmed it (see _check_target).
        self.reached_target_at: float | None = None
        #: Why the run ends, once it does: "stop_at_return" or "max_env_steps" (the run is done:
        #: clients are told TRAINING_DONE), "signal" (an operator stopped it: clients reconnect).
        self.stop_reason: str | None = None
        self.env_steps_at_target: int | None = None
        self.target_confirmed_at: float | None = None
        self.stop_requested = asyncio.Event()
        #: Updates do not start while paused (the console's control); data keeps arriving into the bounded pool.
        self.paused = False

    # -- weights ---------------------------------------------------------------

    @property
    def weights_seq_no(self) -> int:
        """The v1 client's view: the default module's version (else the first module's)."""
        return self.modules[self.default_module or next(iter(self.modules))].weights_seq_no

    @property
    def served_module(self) -> str:
        """The module of the single-module SET_STATE: the default module, else the first."""
        return self.default_module or next(iter(self.modules))

    def state_message(
        self, client_holds: Any = None, may_omit_model: bool = False, sent: dict[str, int] | None = None,
        clients: int = 1,
    ) -> dict[str, Any]:
        """SET_STATE. A 1.2 client that sends ``weights_seq_nos`` gets ``models``
        with only the modules that changed; others get the v1 fields for the
        default module (without the model for a 1.1 client that holds it).
        ``sent``: the version of each module whose model the connection already
        got; with ``may_omit_model``, a module the request does not name counts
        as held at that version (a model is sent once per version and connection)."""
        msg: dict[str, Any] = {"type": MessageType.SET_STATE.value}
        share = round(self.record_share.current(clients), 6)
        self.metrics.record_share = share
        if may_omit_model:  # to a client that announced a version (§13.2)
            if share < 1.0:
                msg["record_share"] = share
            every = self.record_share.steps_per_batch(time.monotonic())
            if every is not None:
                msg["steps_per_batch"] = every
        sent = sent if may_omit_model and sent is not None else {}
        if isinstance(client_holds, dict):
            msg["models"] = {
                m: {"weights_seq_no": rt.weights_seq_no, "onnx_file": rt.onnx_field}
                for m, rt in self.modules.items()
                if not _same_version(client_holds.get(m, sent.get(m)), rt.weights_seq_no)
            }
            return msg
        runtime = self.modules[self.served_module]
        msg["weights_seq_no"] = runtime.weights_seq_no
        if client_holds is None:
            client_holds = sent.get(self.served_module)
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

    def _check_logp(self, records: list[MultiAgentRecord], versions: dict[str, int]) -> None:
        check_behaviour_logp(records, versions, self.histories)

    def owner(self, connection: Hashable, batch: BatchId | None) -> Hashable:
        """Who owns episode state: the client_session when the batch names one
        (so it survives a reconnect), else the connection."""
        if batch is None:
            return connection
        session = batch.client_session
        self._session_users.setdefault(session, set()).add(connection)
        timer = self._session_expiry.pop(session, None)
        if timer is not None:
            timer.cancel()
        return ("client_session", session)

    def forget_connection(self, connection: Hashable) -> None:
        """A connection closed: free its episode state now, and that of its
        client_sessions once no connection has used them for session_state_ttl_s."""
        held = self.ingest.open_state_size() + self.episodes.open_size()
        self.ingest.forget(connection)
        self.episodes.forget(connection)
        if held - self.ingest.open_state_size() - self.episodes.open_size() >= _TRIM_AFTER_ENTRIES:
            release_free_memory()
        for session, users in list(self._session_users.items()):
            users.discard(connection)
            if not users:
                del self._session_users[session]
                loop = asyncio.get_running_loop()
                self._session_expiry[session] = loop.call_later(
                    self.config.session_state_ttl_s, self._expire_session, session)

    def _expire_session(self, session: str) -> None:
        self._session_expiry.pop(session, None)
        if session not in self._session_users:
            held = self.ingest.open_state_size() + self.episodes.open_size()
            self.ingest.forget(("client_session", session))
            self.episodes.forget(("client_session", session))
            if held - self.ingest.open_state_size() - self.episodes.open_size() >= _TRIM_AFTER_ENTRIES:
                release_free_memory()

    async def submit(
        self, connection: Hashable, records: list[MultiAgentRecord], seq_for: dict[str, int], wait_for_update: bool,
        env_steps: int | None = None, source: str = "", batch: BatchId | None = None,
    ) -> int:
        """Take a validated message's records. ``seq_for[module]`` is the weights
        version the data was computed with; ``env_steps`` the env steps the
        message covers (see ingest.message_env_steps); ``source`` names the
        client in logs. Waits while the pool is full (backpressure). With
        ``wait_for_update`` (on-policy EPISODES_AND_GET_STATE) return only
        once any update that these samples started, or that was running, has
        published new weights. ``batch`` (exactly-once id) is marked stored as its data
        is pooled, and written with it to the journal; this returns only once the
        journal has it on disk, so an answer always follows a durable store.

        Returns the agent steps not stored because an update would take them
        only once older than ``max_staleness`` (or they are already): §13.2."""
        # Data restored by --resume may fill the pool beyond its room before any update ran.
        self._maybe_start_update()
        await self._pool.wait_for_room()
        self.guard.check(connection, source)  # a client whose data kept making updates non-finite: DATA_REFUSED
        self.guard.note(connection, source)
        m = self.metrics
        agent_steps = sum(r.agent_steps for r in records)
        if env_steps is None:
            env_steps = sum(record_env_steps(r) for r in records)
        m.env_steps_received += env_steps
        m.agent_steps_received += agent_steps
        finished = self.episodes.add(connection, records)
        suspect = self.guard.is_suspect(connection, source)
        m.add_episodes(finished, source, suspect)
        if self.config.stop_at_return is not None and (records or finished):
            # A suspect client still has a say (it stays active), but its returns do not count toward the target.
            # (A batch with no records, of a client holding its episodes back, does not make it active.)
            self.client_returns.note(connection, () if suspect else (
                e.total_return for e in finished if e.complete and plausible_return(e)), m.updates)
        self._check_stop()
        pooled: list[Pooled] = []
        refused = 0
        admission = Admission(self._pool, self._training_modules)
        for record in records:
            for agent in record.agents:
                runtime = self.modules[agent.module_id]
                if not runtime.spec.trainable:
                    continue  # frozen modules are served, not trained
                versions = self._step_versions(agent.module_id, agent.chunk, seq_for)
                # Only the steps an update takes while they are within max_staleness are stored: the
                # rest would be dropped after the answer.
                parts = admission.fresh_parts(agent.module_id, runtime.weights_seq_no - versions,
                                              self.config.max_staleness)
                refused += agent.chunk.env_steps - sum(end - start for start, end in parts)
                for start, end in parts:
                    admission.append(agent.module_id, end - start)
                    pooled.append(Pooled(agent.module_id, part_of(agent.chunk, start, end),
                                         int(versions[start:end].min()), source))
                    self._pool.add(pooled[-1])
        m.samples_refused_stale += refused
        self._note_starving()
        self.record_share.note(sum(p.chunk.env_steps for p in pooled), refused, time.monotonic())
        if batch is not None:  # stored now: a resend after any stop, even before the answer, is a duplicate
            self.dedup.mark_stored(batch)
        written = (self.journal.append(JournalEntry(batch, pooled, env_steps, agent_steps))
                   if self.journal is not None else None)
        m.pool_steps_max = max(m.pool_steps_max, self._pool.steps)
        self._maybe_start_update()
        if written is not None:
            try:
                await asyncio.shield(written)
            except asyncio.CancelledError:
                # The connection is going away: still hold the batch's session (the caller's dedup
                # slot) until the batch is on disk, so a resend on another connection that is
                # answered as a duplicate is answered after a durable store too.
                await written
                raise
        if wait_for_update and self._next_state is not None:
            await asyncio.shield(self._next_state)
        return refused

    def _step_versions(self, module_id: str, chunk: EpisodeChunk, seq_for: dict[str, int]) -> np.ndarray:
        """The weights version of each step: from the chunk's weights_seq_no_runs, else the message's claim
        for its module. Steps the behaviour-logp check could not check were marked UNVERIFIED_VERSION on
        arrival (tcp_server): they get a version no staleness allows."""
        claim = seq_for.get(module_id, self.modules[module_id].weights_seq_no)
        if chunk.step_versions is None:
            versions = np.full(chunk.env_steps, claim, np.int64)
        else:
            versions = chunk.step_versions.astype(np.int64, copy=False)
        return np.where(versions == UNVERIFIED_VERSION, _NEVER_FRESH, versions)

    def _note_starving(self) -> None:
        """Tell the record share whether the learner now waits for data."""
        starved = self._update_task is None and not self.paused and self._pool.steps < self.config.train_batch_size
        self.record_share.starving(starved, time.monotonic())

    @property
    def pool_steps(self) -> int:
        """Agent steps waiting for an update."""
        return self._pool.steps

    def pause(self) -> None:
        """No new update starts until resume(); one in progress finishes."""
        self.paused = True
        self._note_starving()  # a paused learner does not wait for data

    def resume(self) -> None:
        self.paused = False
        self._maybe_start_update()

    def _maybe_start_update(self) -> None:
        if self.paused or self._update_task is not None or self._pool.steps < self.config.train_batch_size:
            return
        # Samples that became too stale while waiting in the pool are dropped here.
        self.metrics.samples_dropped_stale += self._pool.drop(
            lambda p: p.replayed or self.modules[p.module_id].weights_seq_no - p.weights_seq_no <= self.config.max_staleness)
        if self._pool.steps < self.config.train_batch_size:
            return
        by_module: dict[str, list[Pooled]] = {}
        for pooled in self._pool.take():
            by_module.setdefault(pooled.module_id, []).append(pooled)
        self.metrics.last_update_steps = sum(p.chunk.env_steps for items in by_module.values() for p in items)
        self._training_modules = set(by_module)
        self.record_share.starving(False, time.monotonic())
        loop = asyncio.get_running_loop()
        self._next_state = loop.create_future()
        self._update_task = loop.create_task(self._run_update(by_module))

    async def _run_update(self, by_module: dict[str, list[Pooled]]) -> None:
        loop = asyncio.get_running_loop()
        m = self.metrics
        results: dict[str, Any] = {}
        try:
            results = await loop.run_in_executor(self._executor, self._update_blocking, by_module)
        except Exception as exc:  # a failed update must not stop training for good
            steps = sum(p.chunk.env_steps for items in by_module.values() for p in items)
            print(f"[tether] learner update failed, {steps} steps dropped: {exc!r}", file=sys.stderr, flush=True)
        self.guard.tick()
        published = {}
        #: source -> why its data was left out of an update of this round.
        guilty: dict[str, str] = {}
        for module_id, (outcome, stats, onnx_bytes, snapshot) in results.items():
            items = by_module[module_id]
            guilty.update((s, why) for s, why in outcome.guilty.items() if s not in guilty)
            kept = set(outcome.kept)
            blamed = [p for p in items if p.source in outcome.guilty]
            if blamed:
                m.agent_steps_isolated += sum(p.chunk.env_steps for p in blamed)
                print(f"[tether] update of module {module_id!r}: {sum(p.chunk.env_steps for p in blamed)} agent steps "
                      f"left out, from client(s) {self._describe(outcome.guilty)}", file=sys.stderr, flush=True)
            if stats is None:
                unblamed = [p for p in items if p.source not in outcome.guilty]
                if not unblamed:
                    continue  # only the data of clients to blame: nothing else lost, nothing to publish
                m.updates_discarded += 1
                # Returns of the episodes behind this batch may be bogus too: the
                # stop rule waits until a whole window of episodes came after it.
                self._target_streak, self._window_fresh_from = [], m.episodes_total
                sources = sorted({p.source for p in unblamed if p.source})
                print(f"[tether] update of module {module_id!r} discarded ({outcome.error}); weights stay at "
                      f"v{self.modules[module_id].weights_seq_no}; {sum(p.chunk.env_steps for p in unblamed)} agent "
                      f"steps from client(s) {', '.join(sources) or 'unknown'}", file=sys.stderr, flush=True)
                continue
            unkept = [p for p in items if p.source not in kept]
            if unkept:
                m.updates_isolated += 1
                cleared = [p for p in unkept if p.source not in outcome.guilty]
                if cleared:  # the trials ran out before these clients were cleared: left out unblamed
                    m.agent_steps_isolated += sum(p.chunk.env_steps for p in cleared)
                    print(f"[tether] update of module {module_id!r}: {sum(p.chunk.env_steps for p in cleared)} agent "
                          f"steps of client(s) {', '.join(sorted({p.source for p in cleared}))} left out unblamed "
                          f"({outcome.trials} trial updates)", file=sys.stderr, flush=True)
            runtime = self.modules[module_id]
            runtime.publish(onnx_bytes)
            self.histories[module_id].add(runtime.weights_seq_no, snapshot, onnx_bytes)
            m.module_updates[module_id] = stats
            m.agent_steps_trained += sum(p.chunk.env_steps for p in items if p.source in kept)
            published[module_id] = stats
        if guilty:
            # Their returns are not the run's: out of the windows before anything reports them.
            m.exclude(set(guilty))
            for source in self.guard.strike(guilty):
                print(f"[tether] client {source} refused (DATA_REFUSED): its data made "
                      f"{self.guard.strikes_to_refuse} updates non-finite", file=sys.stderr, flush=True)
            m.clients_refused = self.guard.refused_count
            m.agent_steps_isolated += self._pool.drop(lambda p: not self.guard.is_refused(p.source))
        if published:
            m.updates += 1
            m.weights_seq_no = self.weights_seq_no
            first = self.default_module if self.default_module in published else next(iter(published))
            m.learner = published[first]
            self._check_target()
        self._training_modules = set()
        # Waiting clients get the new weights now; logging and checkpoints follow.
        future, self._next_state = self._next_state, None
        if future is not None and not future.done():
            future.set_result(self.weights_seq_no)
        try:
            if published:
                await self._after_update(loop)
        except Exception as exc:
            print(f"[tether] writing metrics or checkpoint failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            self._update_task = None
        self._maybe_start_update()
        self._note_starving()

    @staticmethod
    def _describe(guilty: dict[str, str]) -> str:
        """'#3 1.2.3.4:5 (why); …' for a log line."""
        return "; ".join(f"{source or 'unknown'} ({why})" for source, why in sorted(guilty.items()))

    def _update_blocking(self, by_module: dict[str, list[Pooled]]) -> dict[str, Any]:
        """Per module: (IsolatedUpdate, stats, ONNX bytes, the model); the last three None when
        nothing was trained. A client whose data makes the update non-finite is left out of
        it (learner/isolation.py), so its neighbours' data is still trained on."""
        results: dict[str, Any] = {}
        for module_id, items in by_module.items():
            learner = self.modules[module_id].learner
            started = time.perf_counter()
            # Atomic per module: a module whose update or export fails is put back as it was and reported
            # as discarded; the others still publish (their weights and steps are never lost with it).
            before = learner.save_state()
            try:
                outcome = update_isolating(learner, [(p.source, p.chunk) for p in items])
                if outcome.stats is None:
                    results[module_id] = (outcome, None, None, None)
                    continue
                trained = time.perf_counter()
                onnx_bytes = learner.export_onnx()
            except Exception as exc:
                learner.load_state(before)
                print(f"[tether] update of module {module_id!r} failed: {exc!r:.300}", file=sys.stderr, flush=True)
                results[module_id] = (IsolatedUpdate(None, [], error=exc), None, None, None)
                continue
            # Seconds the update (its trials included) and the ONNX export took (the console's health panel, TensorBoard).
            stats = {**outcome.stats, "update_s": trained - started, "export_s": time.perf_counter() - trained,
                     "update_trials": float(outcome.trials)}
            results[module_id] = (outcome, stats, onnx_bytes, learner.model)  # only its action space is read
        return results

    async def _after_update(self, loop: asyncio.AbstractEventLoop) -> None:
        m = self.metrics
        m.batches_duplicate = self.dedup.duplicates
        if not self.config.quiet:
            print(m.progress_line(), flush=True)
        scalars = m.snapshot()
        if self.tensorboard is not None:
            # Metrics are a view of the run: their failure is logged and never skips the checkpoint below.
            try:
                await loop.run_in_executor(self._executor, self.tensorboard.write, scalars, m.env_steps_received)
            except Exception as exc:
                m.metrics_write_failures += 1
                print(f"[tether] writing TensorBoard metrics failed: {exc!r:.300}", file=sys.stderr, flush=True)
        every = self.config.checkpoint_every
        if every and m.updates % every == 0:
            state = self.checkpoint_state()  # on the loop: the pool and the journal's generation agree
            await loop.run_in_executor(self._executor, self.write_checkpoint, state)

    def request_stop(self, reason: str) -> None:
        """End the run (the first reason given is kept): "stop_at_return", "max_env_steps" or "signal"."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop_requested.set()

    def training_summary(self) -> dict[str, Any]:
        """What a client is told of the run when it is done (TRAINING_DONE's ``summary``, §6.6)."""
        m = self.metrics
        return {"reason": self.stop_reason, "env_steps": m.env_steps_received, "agent_steps": m.agent_steps_received,
                "agent_steps_trained": m.agent_steps_trained, "updates": m.updates,
                "weights_seq_no": self.weights_seq_no, "episodes": m.episodes_total,
                "return_mean": m.return_mean if math.isfinite(m.return_mean) else None}

    def _check_stop(self) -> None:
        c, m = self.config, self.metrics
        if c.max_env_steps is not None and m.env_steps_received >= c.max_env_steps:
            self.request_stop("max_env_steps")

    def _check_target(self) -> None:
        """stop_at_return, checked after each published update. The windowed mean
        must be >= the target at the end of TARGET_UPDATES consecutive updates,
        across which at least half a window of new episodes finished: one
        message of made-up episodes is trained on by at most one update and is
        half pushed out of the window by real episodes before the run can end.
        After a discarded (non-finite) update, a whole window of new episodes
        must finish before the return counts again. Every client active in the
        last TARGET_UPDATES updates must also have reached the target on its own
        last episodes (stop_rule): one client's made-up returns cannot end a run
        while another client's episodes fall short."""
        c, m = self.config, self.metrics
        need = min(c.metrics_window, 100)
        if c.stop_at_return is None:
            return
        if (len(m.returns) < need or not m.return_mean >= c.stop_at_return
                or m.episodes_total - self._window_fresh_from < need and self._window_fresh_from > 0
                or self.client_returns.below(c.stop_at_return, m.updates)):
            self._target_streak = []
            return
        self._target_streak.append((time.time(), m.env_steps_received, m.episodes_total))
        first_t, first_steps, first_episodes = self._target_streak[0]
        if len(self._target_streak) >= TARGET_UPDATES and m.episodes_total - first_episodes >= need // 2:
            if self.reached_target_at is None:
                self.reached_target_at, self.env_steps_at_target = first_t, first_steps
                self.target_confirmed_at = time.time()
            self.request_stop("stop_at_return")

    # -- lifecycle -------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.config.logdir) / "checkpoint.pt"

    @property
    def journal_dir(self) -> Path:
        return Path(self.config.logdir) / "journal"

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write every module's weights and optimizer, weights_seq_nos, counters, the
        exactly-once batch table and the pool atomically. Call it between updates, from
        the thread that feeds the pool (the event loop), or split it as
        ``write_checkpoint(checkpoint_state())`` to write in another thread."""
        return self.write_checkpoint(self.checkpoint_state(), path)

    def write_checkpoint(self, state: dict[str, Any], path: str | Path | None = None) -> Path:
        """Write what ``checkpoint_state`` took, then delete the journal it makes redundant."""
        state = dict(state)
        state["pool"] = encode_entry(JournalEntry(None, state["pool"]))
        written = save_checkpoint(path or self.checkpoint_path, state)
        if self.journal is not None and state["journal_generation"] is not None:
            self.journal.remove_before(state["journal_generation"])
        return written

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds, taken at once: the pool's chunks (encoded when written)
        and a new journal generation, from which a resume replays what came after."""
        m = self.metrics
        m.batches_duplicate = self.dedup.duplicates
        state = {
            "format": "tether-checkpoint-2",
            "modules": {
                mid: {"learner": rt.learner.state_dict(), "weights_seq_no": rt.weights_seq_no}
                for mid, rt in self.modules.items()
            },
            "counters": {
                "updates": m.updates,
                "env_steps_received": m.env_steps_received,
                "agent_steps_received": m.agent_steps_received,
                "agent_steps_trained": m.agent_steps_trained,
                "episodes_total": m.episodes_total,
                "samples_dropped_stale": m.samples_dropped_stale,
                "samples_refused_stale": m.samples_refused_stale,
                "updates_discarded": m.updates_discarded,
                "batches_duplicate": m.batches_duplicate,
                "updates_isolated": m.updates_isolated,
                "agent_steps_isolated": m.agent_steps_isolated,
                "episodes_excluded": m.episodes_excluded,
            },
            "batch_dedup": self.dedup.state(),
            # Plain values only (loaded with weights_only=True); the auth token is never stored.
            "config": {k: v for k, v in self.config.to_dict().items() if k != "auth_token"},
            "pool": self._pool.items(),
            "journal_generation": self.journal.rotate() if self.journal is not None else None,
        }
        return state

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

    def _init_from_trained(self, init_from: dict[str, tuple[str, str]]) -> None:
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
            saved = loaded[path].get("modules", {}) if isinstance(loaded[path], dict) else {}
            if source not in saved:
                raise ValueError(f"module {module_id!r}: init_from {path!r} has no module {source!r} "
                                 f"(it has {sorted(saved)})")
            runtime = self.modules[module_id]
            try:
                runtime.learner.model.load_state_dict(saved[source]["learner"]["model"])
            except (RuntimeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"module {module_id!r}: init_from {path!r}#{source}: that network does not fit this module "
                    f"(observation or action space, hidden sizes or critic width differ): {str(exc)[:300]}") from None
            runtime.onnx_field = encode_onnx(runtime.learner.export_onnx())
            print(f"[tether] module {module_id!r} starts from {source!r} of {path}"
                  f" ({'trained on' if runtime.spec.trainable else 'frozen'})", flush=True)

    def _restore(self, path: str) -> int | None:
        """Load a checkpoint; returns the journal generation to replay from (None: it predates the journal)."""
        state = load_checkpoint(path)
        for module_id, saved in state["modules"].items():
            if module_id not in self.modules:
                raise ValueError(f"checkpoint has module {module_id!r} that this configuration lacks")
            runtime = self.modules[module_id]
            runtime.learner.load_state_dict(saved["learner"])
            runtime.weights_seq_no = int(saved["weights_seq_no"])
            runtime.onnx_field = encode_onnx(runtime.learner.export_onnx())
        self.metrics.weights_seq_no = self.weights_seq_no
        counters = dict(state["counters"])
        if "env_steps_trained" in counters:  # written before env and agent steps were counted apart
            counters.setdefault("agent_steps_trained", counters.pop("env_steps_trained"))
            counters.setdefault("agent_steps_received", counters["env_steps_received"])
        for key, value in counters.items():
            if hasattr(self.metrics, key):
                setattr(self.metrics, key, int(value))
        self.dedup.load_state(state.get("batch_dedup", {}))
        self.dedup.duplicates = self.metrics.batches_duplicate
        pool, _ = decode_entries(state.get("pool", b""))
        if steps := sum(self._pool_again(entry.items) for entry in pool):
            print(f"[tether] resumed with {steps} agent steps in the pool", flush=True)
        generation = state.get("journal_generation")
        return None if generation is None else int(generation)

    def _pool_again(self, items: list[Pooled]) -> int:
        """Pool restored items (of modules this configuration has) as replayed; returns their steps."""
        kept = [replace(item, replayed=True) for item in items if item.module_id in self.modules]
        for item in kept:
            self._pool.add(item)
        return sum(item.chunk.env_steps for item in kept)

    def _replay(self, entries: list[JournalEntry]) -> list[JournalEntry]:
        """Store again the batches the journal holds after the checkpoint: their marks,
        their counts and their chunks (trained whatever their staleness)."""
        m, steps = self.metrics, 0
        for entry in entries:
            if entry.batch is not None:
                self.dedup.mark_stored(entry.batch)
            m.env_steps_received += entry.env_steps
            m.agent_steps_received += entry.agent_steps
            steps += self._pool_again(entry.items)
        if entries:
            print(f"[tether] replayed {len(entries)} batches ({steps} agent steps to train) from the journal",
                  flush=True)
        return entries

    async def _between_updates(self) -> None:
        """Return once no update runs; the caller has set ``paused``, so none starts."""
        while self._update_task is not None:
            await asyncio.gather(self._update_task, return_exceptions=True)

    async def checkpoint_now(self) -> Path:
        """Write a checkpoint between two updates (the console's control): its pool, marks,
        weights and version agree, and the journal it supersedes is only then deleted."""
        was_paused, self.paused = self.paused, True
        try:
            await self._between_updates()
            state = self.checkpoint_state()
            return await asyncio.get_running_loop().run_in_executor(self._executor, self.write_checkpoint, state)
        finally:
            self.paused = was_paused
            self._maybe_start_update()

    async def close(self, checkpoint: bool = True) -> None:
        """Wait for a running update, write the final checkpoint and policies, release threads.
        No update starts from here on: one started after the running one would train data that
        the final checkpoint's pool no longer holds, into weights it labels with the older version."""
        self.paused = True
        await self._between_updates()
        loop = asyncio.get_running_loop()
        if checkpoint:
            state = self.checkpoint_state()
            await loop.run_in_executor(self._executor, self.write_checkpoint, state)
            await loop.run_in_executor(self._executor, self.save_policies)
        if self.journal is not None:
            await loop.run_in_executor(self._executor, self.journal.close)
        if self.tensorboard is not None:
            await loop.run_in_executor(self._executor, self.tensorboard.close)
        self._executor.shutdown(wait=True)
