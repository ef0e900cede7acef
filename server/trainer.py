"""The training side of one server, behind one facade: pools experience from all
clients, runs learner updates for every module, and serves the resulting weights.

``Trainer`` wires the parts and is what the rest of the server uses:

- its modules, one learner and served model each (module_runtime);
- what arrives: ``submit`` stores a validated message's records in the sample pool,
  the journal and the metrics; ``owner`` and ``forget_connection`` keep per-episode
  state per client (session_owners);
- the learner loop (learner_loop): updates in a worker thread, so clients keep
  being served while the learners work;
- when the run is done (stop_rule), and checkpoints and resumes (checkpoint_state).

Runs on the server's event loop.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Hashable

import torch

from tether.protocol.multi_agent import MultiAgentRecord
from tether.protocol.onnx_codec import encode_onnx

from . import checkpoint_state as checkpoints
from . import run_files
from .config import ServerConfig
from .data_guard import DataGuard
from .ingest.batch_dedup import BatchDedup, BatchId
from .ingest.env_steps import record_env_steps
from .ingest.logp_check import PolicyHistory, check_behaviour_logp
from .ingest.step_versions import step_versions
from .ingest.validation import EpisodeIngest
from .distributed import group_checkpoints
from .distributed.group_start import take_the_groups_weights
from .distributed.lockstep_loop import LockstepLearnerLoop
from .distributed.rank_directory import RankDirectory, advertised_host
from .distributed.rank_reports import RankReports
from .distributed.rank_group import RankGroup
from .learner_loop import LearnerLoop
from .metrics import EpisodeTracker, Metrics, TensorBoardWriter
from .module_runtime import ModuleRuntime, build_modules, resolve_device
from .module_setup import ModuleLayout
from .pool_journal import JournalEntry, PoolJournal, journal_files, read_journal
from .record_share import RecordShare
from .sample_pool import Admission, Pooled, SamplePool, part_of
from .curriculum import Curriculum, CurriculumConfig
from .self_play import SelfPlay
from .session_owners import SessionOwners
from .state_messages import offline_policy_object
from .stop_rule import StopRule
from .say import say


class Trainer:
    """The training side of one server: sample pool, one learner per module, weights, metrics."""

    def __init__(self, config: ServerConfig, layout: ModuleLayout, group: RankGroup | None = None) -> None:
        self.config = config
        #: The other ranks this one trains with (distributed/), None alone.
        self.group = group
        self.layout = layout
        #: Whether the offline policy file's want of mapping rules was said (once per run, §20).
        self._offline_policy_told = False
        torch.set_num_threads(max(1, config.torch_threads))
        self.device = resolve_device(config.device)
        self.modules: dict[str, ModuleRuntime] = build_modules(layout, config, self.device)
        checkpoints.init_from_trained(self.modules, layout.init_from)
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
        self.pool = SamplePool(config.train_batch_size, 2 * config.train_batch_size)
        #: Environment parameters and lessons (None without a curriculum table; server/curriculum.py).
        self.curriculum: Curriculum | None = (
            Curriculum(CurriculumConfig.from_json(config.curriculum, layout.specs),
                       env_steps=lambda: self.metrics.env_steps_received) if config.curriculum else None)
        #: Self-play's snapshots, matches and ratings (None without a self_play table).
        self.self_play: SelfPlay | None = None
        if layout.self_play is not None:
            self._first_snapshots()  # (before a resume, which restores the checkpoint's, and its first checkpoint)
        #: This run's id, sent in every PONG (§7.2): new for a new run, the checkpoint's for a resumed one.
        #: Weights versions of two runs are not comparable; a client drops the steps it acted with another's.
        self.run_id = uuid.uuid4().hex
        #: Every stored batch is written here before it is answered (see pool_journal).
        self.journal: PoolJournal | None = None
        #: Several ranks: the update and journal generation of the current checkpoint, and the generation of
        #: the one before it, since which the journal is kept (None: unknown, the whole journal is kept).
        self._checkpoint_at: tuple[int, int | None] | None = None
        self._previous_generation: int | None = None
        self._checkpoint_at_start = False
        #: Several ranks: every rank's client address and load (PONG ranks and redirect, §6.7), once listening.
        self.directory: RankDirectory | None = None
        try:
            self._resume_and_open_journal()
            if group is None:  # (several ranks: once the group's numbers are known, below)
                self._record_versions()  # (a new run's too: a file an earlier run left in this logdir is not ours)
            if self.self_play is not None and config.resume and not self.self_play.restored:
                self._first_snapshots()  # a checkpoint of a run without self-play: the first opponent is what it resumes
            if group is not None:
                self.run_id = take_the_groups_weights(group, self.modules, self.metrics, self.dedup, self.curriculum,
                                                      self.self_play, self.run_id)
                self.metrics.weights_seq_no = self.weights_seq_no  # (the group's, which may be above rank 0's own)
                self._record_versions()  # (the group's numbers, which may be above this rank's)
            if self._checkpoint_at_start:
                self.save_checkpoint()
        except Exception:  # (a checkpoint that cannot be resumed, a group that did not start, a first checkpoint)
            self.close_at_start()
            raise
        #: Per trainable module, the policies of the last max_staleness + 1 versions (behaviour-logp check).
        # Behaviour logps are checked for modules without memory (§13.6): a recurrent step's logp depends on
        # the state its SDK carried, computed over steps of earlier versions, which no one kept model reproduces.
        self.histories = {m: PolicyHistory(config.max_staleness + 1) for m, rt in self.modules.items()
                          if rt.spec.trainable and not rt.spec.recurrent_state}
        for module_id, history in self.histories.items():
            runtime = self.modules[module_id]
            history.add(runtime.weights_seq_no, runtime.learner.export_onnx(), runtime.spec.action_space,
                        runtime.spec.observation_space)
        self.metrics.self_play = self.self_play
        self.metrics.curriculum = self.curriculum
        self.ingest = EpisodeIngest(layout, require_logp=config.force_on_policy,
                                    logp_check=self._check_logp if config.verify_action_logp else None,
                                    self_play=self.self_play, curriculum=self.curriculum)
        self.owners = SessionOwners(config.session_state_ttl_s, self.ingest, self.episodes)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-learner")
        #: The share of new episodes clients are asked to record (SET_STATE record_share, §13.2).
        self.record_share = RecordShare(time.monotonic(), config.train_batch_size, config.env_steps_per_sample)
        #: Why the run ends, once it does: "stop_at_return" or "max_env_steps" (the run is done:
        #: clients are told TRAINING_DONE), "signal" or "console" (an operator stopped it: clients reconnect).
        self.stop_reason: str | None = None
        self.stop_requested = asyncio.Event()
        self.stop_rule = StopRule(config, self.metrics, self.request_stop)
        loop_args = (config, self.modules, self.default_module, self.pool, self.histories, self.metrics, self.guard,
                     self.stop_rule, self.record_share, self.dedup, self.tensorboard, self._executor)
        loop_kwargs: dict[str, Any] = {"checkpoint": self._checkpoint_in_learner_thread,
                                       "after_publish": self._take_snapshots if self.self_play is not None else None,
                                       "record_versions": self._record_versions}
        self.learner_loop: LearnerLoop = (
            LearnerLoop(*loop_args, **loop_kwargs) if group is None
            else LockstepLearnerLoop(*loop_args, group=group, on_stop=self._stop_now, self_play=self.self_play,
                                     **loop_kwargs))

    def close_at_start(self) -> None:
        """Close what a trainer that never served holds open (its journal, TensorBoard's files), when the
        start-up fails; ``close`` is for a trainer that served."""
        for closing in (self.journal, self.tensorboard):
            if closing is not None:
                try:
                    closing.close()
                except Exception as exc:
                    say(f"[tether] closing {type(closing).__name__} after a failed start failed: {exc!r:.300}")

    def join_the_directory(self, port: int) -> None:
        """Several ranks, once this rank listens: every rank's client address, for PONG (§6.7). A collective."""
        assert self.group is not None
        self.directory = RankDirectory.gather(
            self.group, advertised_host(self.config.host, self.config.advertise_host), port)
        if isinstance(self.learner_loop, LockstepLearnerLoop):
            self.learner_loop.directory = self.learner_loop.reports.directory = self.directory
            self.learner_loop.reports.curriculum = self.curriculum
            self.learner_loop.reports.on_curriculum_change = self.curriculum_changed

    @property
    def rank_reports(self) -> RankReports | None:
        """Several ranks: every rank's latest report (rank 0 keeps them; its console shows them)."""
        return self.learner_loop.reports if isinstance(self.learner_loop, LockstepLearnerLoop) else None

    def start(self) -> None:
        """The server listens: with several ranks, the agreements that start updates begin (the event loop runs)."""
        if isinstance(self.learner_loop, LockstepLearnerLoop):
            self.learner_loop.start_ticking()

    def _resume_and_open_journal(self) -> None:
        """With --resume: the checkpoint, then the journal's batches after it; with the journal on,
        a journal in this logdir (an earlier run's is deleted unless this run resumes it)."""
        config = self.config
        replay_dir = Path(config.resume).parent / "journal" if config.resume else None
        journal_from: int | None = None
        if config.resume:
            journal_from = 0
            chosen = group_checkpoints.groups_checkpoint(self.group, config.resume) if self.group is not None else config.resume
            if chosen is not None and Path(chosen).exists():
                journal_from, run_id = checkpoints.restore_checkpoint(
                    chosen, self.modules, self.metrics, self.dedup, self.pool, self.self_play, self.curriculum,
                    self.guard)
                if Path(config.resume).parent.resolve() == Path(config.logdir).resolve():
                    # (this folder's own checkpoint chain; another folder's is never touched)
                    if self.group is not None:
                        group_checkpoints.make_current(chosen, config.resume)
                    self._checkpoint_at = (self.metrics.updates, journal_from)
                self.run_id = run_id or self.run_id
                self.metrics.clients_refused = self.guard.refused_count
                run_files.skip_versions_served_after(Path(config.resume).parent / run_files.VERSIONS_FILE, self.modules)
                self.metrics.weights_seq_no = self.weights_seq_no
            else:  # a crash before the first checkpoint: only the journal, if any, to resume from
                print(f"[tether] --resume {config.resume}: no checkpoint there yet; starting fresh", flush=True)
            if config.pool_journal and journal_from is not None and replay_dir is not None:
                checkpoints.replay_journal(read_journal(replay_dir, journal_from), self.modules, self.metrics,
                                           self.dedup, self.pool)
            self._drop_the_refused_restored_data()
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
                # folder is never resumed with this run's journal). Written once the group's weights and
                # run_id are this rank's (several ranks), so that the group can go back to it.
                self._checkpoint_at_start = True

    def _drop_the_refused_restored_data(self) -> None:
        """The restored pool items of a client_session the checkpoint refuses are dropped now (the journal
        may hold batches stored before the refusal reached this rank). (Later refusals and strikes find
        restored items by the client_session each keeps.)"""
        dropped = self.guard.drop_refused(self.pool)
        if dropped:
            self.metrics.agent_steps_isolated += dropped
            say(f"[tether] {dropped} restored agent steps of refused clients (DATA_REFUSED) dropped")

    # -- self-play -------------------------------------------------------------

    def _first_snapshots(self) -> None:
        """A fresh self-play record whose first opponents are the modules' current policies. (Several
        ranks: each draws its own clients' opponents, seeded apart; rank 0's snapshots are taken by all
        in distributed/group_start.py.)"""
        layout = self.layout.self_play
        assert layout is not None
        seed = self.config.seed
        if seed is not None and self.group is not None:
            seed += self.group.rank
        self.self_play = SelfPlay(layout, list(layout.modules), seed)
        for module_id in layout.modules:
            self._snapshot(module_id, self.modules[self.self_play.next_slot_id(module_id)].copy_policy(
                self.modules[module_id]))

    def _snapshot(self, module_id: str, onnx_field: str) -> None:
        """Serve a new snapshot of ``module_id`` (its weights already copied into the next slot)."""
        assert self.self_play is not None
        slot_id = self.self_play.take(module_id, self.modules[module_id].weights_seq_no)
        self.modules[slot_id].publish(onnx_field)

    async def _take_snapshots(self, published: list[str]) -> None:
        """After an update: a snapshot of each self-play module whose turn it is (the copy and its
        ONNX export in the learner thread, the serving on the loop). Several ranks take the same
        snapshots, since they publish the same modules in the same updates: every rank copies the
        weights, rank 0 exports and every rank serves its bytes (the learner loop's ``export_once``)."""
        assert self.self_play is not None
        due = [m for m in published if self.self_play.updated(m)]
        if not due:
            return
        loop = asyncio.get_running_loop()
        for module_id in due:
            slot_id = self.self_play.next_slot_id(module_id)  # (on the loop: SelfPlay is the event loop's)
            try:
                onnx_field = await loop.run_in_executor(self._executor, self._copy_into_next_slot, module_id, slot_id)
            except Exception as exc:
                if self.group is not None:
                    raise  # (this rank could not take its part: it cannot follow the others, and stops)
                onnx_field, why = None, f"{exc!r:.300}"
            else:
                why = "the export failed" + (" on rank 0" if self.group is not None else "")
            if onnx_field is None:  # (the slot keeps its snapshot, weights and model; training goes on)
                say(f"[tether] self-play snapshot of module {module_id!r} failed: {why}")
                continue
            self._snapshot(module_id, onnx_field)

    def _copy_into_next_slot(self, module_id: str, slot_id: str) -> str | None:
        """In the learner thread: ``module_id``'s weights into its next snapshot slot ``slot_id``, and the
        model that slot is to serve (encoded for SET_STATE); None when the export failed, the slot's
        weights put back. (It touches no self-play state: that is the event loop's.)"""
        slot = self.modules[slot_id]
        before = slot.copy_weights(self.modules[module_id])
        try:
            exported = self.learner_loop.export_once(slot.learner.export_onnx)
        except Exception:
            slot.restore_weights(before)
            raise
        if exported is None:
            slot.restore_weights(before)
            return None
        return encode_onnx(exported)

    # -- weights ---------------------------------------------------------------

    @property
    def weights_seq_no(self) -> int:
        """The v1 client's view: the default module's version (else the first module's)."""
        return self.modules[self.served_module].weights_seq_no

    @property
    def served_module(self) -> str:
        """The module of the single-module SET_STATE: the default module, else the first."""
        return self.default_module or next(iter(self.modules))

    # -- samples ---------------------------------------------------------------

    def _check_logp(self, records: list[MultiAgentRecord], versions: dict[str, int]) -> None:
        check_behaviour_logp(records, versions, self.histories)

    def owner(self, connection: Hashable, batch: BatchId | None) -> Hashable:
        """Who owns episode state: the client_session when the batch names one
        (so it survives a reconnect), else the connection."""
        return self.owners.owner(connection, batch)

    def _note_curriculum(self, finished: list, suspect: bool) -> None:
        """Count ended episodes toward the lesson; a change is logged and goes to TensorBoard."""
        assert self.curriculum is not None
        before = self.curriculum.changes_made
        self.curriculum.note(finished, suspect)
        if self.curriculum.changes_made != before:
            self.curriculum_changed()

    def curriculum_changed(self) -> None:
        """After a change of the parameters or lesson: the new values to TensorBoard and the log."""
        assert self.curriculum is not None
        cause, details = self.curriculum.changes[-1]
        say(f"[tether] curriculum: {cause} -> set {details['set_seq']}, lesson {details['lesson']}", sys.stdout)
        if self.tensorboard is not None:
            try:
                self.tensorboard.write(self.curriculum.scalars(), self.metrics.env_steps_received)
            except Exception:  # the log must not take training down
                pass

    def forget_connection(self, connection: Hashable) -> None:
        """A connection closed: free its episode state now, and that of its
        client_sessions once no connection has used them for session_state_ttl_s."""
        self.owners.forget_connection(connection)

    def pack_records(self, records: list[MultiAgentRecord]) -> None:
        """Pack, in place, the observations of the records' trainable modules whose composite rows wait in
        the pool packed (packed_observations.py): for a large message, called beside the event loop before
        ``submit``, which packs whatever is not yet."""
        for record in records:
            for agent in record.agents:
                runtime = self.modules.get(agent.module_id)
                if runtime is not None and runtime.spec.trainable and runtime.learner.packing is not None:
                    agent.chunk = runtime.learner.packing.pack_chunk(agent.chunk)

    async def submit(
        self, connection: Hashable, records: list[MultiAgentRecord], seq_for: dict[str, int], wait_for_update: bool,
        env_steps: int | None = None, source: str = "", batch: BatchId | None = None,
    ) -> int:
        """Take a validated message's records. ``seq_for[module]`` is the weights
        version the data was computed with; ``env_steps`` the env steps the
        message covers (see ingest.env_steps.message_env_steps); ``source`` names the
        client in logs. Waits while the pool is full (backpressure). With
        ``wait_for_update`` (on-policy EPISODES_AND_GET_STATE) return only
        once any update that these samples started, or that was running, has
        published new weights. ``batch`` (exactly-once id) is marked stored as its data
        is pooled, and written with it to the journal; this returns only once the
        journal has it on disk, so an answer always follows a durable store.

        Returns the agent steps not stored because an update would take them
        only once older than ``max_staleness`` (or they are already): §13.2."""
        # Data restored by --resume may fill the pool beyond its room before any update ran.
        self.learner_loop.maybe_start()
        await self.pool.wait_for_room()
        self.guard.check(connection, source)  # a client whose data kept making updates non-finite: DATA_REFUSED
        self.guard.note(connection, source)
        m = self.metrics
        agent_steps = sum(r.agent_steps for r in records)
        if env_steps is None:
            env_steps = sum(record_env_steps(r) for r in records)
        m.env_steps_received += env_steps
        m.agent_steps_received += agent_steps
        finished = self.episodes.add(connection, records)
        if self.self_play is not None:
            for episode in finished:
                result = self.self_play.judge_part(connection, episode.episode_id, episode.agents, episode.complete)
                if result is None:
                    continue
                if self.group is None:
                    self.self_play.apply_results([result])
                else:  # (every rank applies every rank's results together, before the group's next update)
                    self.self_play.hold(result)
        suspect = self.guard.is_suspect(connection, source)
        if self.curriculum is not None and finished:
            self._note_curriculum(finished, suspect)
        m.add_episodes(finished, source, suspect)
        self.stop_rule.note(connection, records, finished, suspect)
        self.stop_rule.check_budget()
        pooled: list[Pooled] = []
        refused = 0
        admission = Admission(self.pool, self.learner_loop.training_modules, shared_updates=self.group is not None)
        for record in records:
            for agent in record.agents:
                runtime = self.modules[agent.module_id]
                if not runtime.spec.trainable:
                    continue  # frozen modules are served, not trained
                versions = step_versions(agent.chunk, seq_for.get(agent.module_id, runtime.weights_seq_no))
                # Only the steps an update takes while they are within max_staleness are stored: the
                # rest would be dropped after the answer.
                parts = admission.fresh_parts(agent.module_id, runtime.weights_seq_no - versions,
                                              self.config.max_staleness)
                refused += agent.chunk.env_steps - sum(end - start for start, end in parts)
                packing = runtime.learner.packing  # (a composite space's byte leaves wait as bytes)
                chunk = agent.chunk if packing is None or not parts else packing.pack_chunk(agent.chunk)  # (or are)
                for start, end in parts:
                    admission.append(agent.module_id, end - start)
                    pooled.append(Pooled(agent.module_id, part_of(chunk, start, end),
                                         int(versions[start:end].min()), source,
                                         client_session=batch.client_session if batch is not None else None))
                    self.pool.add(pooled[-1])
        m.samples_refused_stale += refused
        self.learner_loop.note_starving()
        self.record_share.note(sum(p.chunk.env_steps for p in pooled), refused, time.monotonic())
        if batch is not None:  # stored now: a resend after any stop, even before the answer, is a duplicate
            self.dedup.mark_stored(batch)
        written = (self.journal.append(JournalEntry(batch, pooled, env_steps, agent_steps))
                   if self.journal is not None else None)
        m.pool_steps_max = max(m.pool_steps_max, self.pool.steps)
        self.learner_loop.maybe_start()
        if written is not None:
            try:
                await asyncio.shield(written)
            except asyncio.CancelledError:
                # The connection is going away: still hold the batch's session (the caller's dedup
                # slot) until the batch is on disk, so a resend on another connection that is
                # answered as a duplicate is answered after a durable store too.
                await written
                raise
        if wait_for_update:
            await self.learner_loop.published()
        return refused

    @property
    def pool_steps(self) -> int:
        """Agent steps waiting for an update."""
        return self.pool.steps

    # -- updates ---------------------------------------------------------------

    @property
    def paused(self) -> bool:
        """Whether updates are held back (the console's pause); data keeps arriving into the bounded pool."""
        return self.learner_loop.paused

    def pause(self) -> None:
        """No new update starts until resume(); one in progress finishes."""
        self.learner_loop.pause()

    def resume(self) -> None:
        self.learner_loop.resume()

    def set_learning_rate(self, module_id: str, lr: float) -> None:
        """The learning rate of ``module_id`` from its next update on (kept in checkpoints)."""
        self.modules[module_id].learner.set_lr(lr)

    def set_entropy_coef(self, module_id: str, ent_coef: float) -> None:
        """The entropy coefficient of ``module_id`` from its next update on (kept in checkpoints)."""
        self.modules[module_id].learner.set_ent_coef(ent_coef)

    # -- the end of the run ------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """End the run (the first reason given is kept): "stop_at_return", "max_env_steps", "signal" or "console".
        With several ranks the group decides: the run ends at the ranks' next agreement (distributed/)."""
        if isinstance(self.learner_loop, LockstepLearnerLoop) and not self.learner_loop.stopped:
            self.learner_loop.wish_stop(reason)
            return
        self._stop_now(reason)

    def _stop_now(self, reason: str) -> None:
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

    # -- checkpoints and policies ---------------------------------------------

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
        """Write what ``checkpoint_state`` took, then delete the journal it makes redundant. With several
        ranks the checkpoint before it is kept (``checkpoint.prev.pt``), with the journal since then: the
        group may have to resume from it (group_checkpoints.py)."""
        path = Path(path or self.checkpoint_path)
        if self.group is None or path != self.checkpoint_path:
            return checkpoints.write_checkpoint(state, path, self.journal)
        updates = int(state["counters"]["updates"])
        current = self._checkpoint_at
        if current is None:  # (a file here is another run's, or another folder's: not ours to keep)
            group_checkpoints.previous_path(path).unlink(missing_ok=True)
            self._previous_generation = None
        elif not (path.exists() and current[0] == updates):  # (the same update again: replaced)
            if path.exists():
                group_checkpoints.keep_as_previous(path)
            self._previous_generation = current[1]
        written = checkpoints.write_checkpoint(state, path, self.journal,
                                               remove_journal_before=self._previous_generation or 0)
        self._checkpoint_at = (updates, state["journal_generation"])
        return written

    def _record_versions(self) -> None:
        """Write each module's version as served now to the logdir's versions.json (run_files.py)."""
        run_files.record_versions(self.config.logdir, self.modules)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds, taken at once: the pool's chunks (encoded when written)
        and a new journal generation, from which a resume replays what came after."""
        return checkpoints.checkpoint_state(self.modules, self.metrics, self.dedup, self.config, self.pool,
                                            self.journal, self.self_play, self.curriculum, self.run_id, self.guard)

    async def _checkpoint_in_learner_thread(self) -> Path:
        # Taken on the loop (the pool and the journal's generation agree), written beside it; the offline
        # policy file (§20) with it, so that a server that dies leaves the one of its last checkpoint.
        state, offline = self.checkpoint_state(), offline_policy_object(self)

        def write() -> Path:
            written = self.write_checkpoint(state)
            self.save_offline_policy(offline)
            return written

        return await asyncio.get_running_loop().run_in_executor(self._executor, write)

    def policy_path(self, module_id: str | None = None) -> Path:
        """Where the final ONNX policy of a module is written (policy.onnx for the default one)."""
        return run_files.policy_path(self.config.logdir, module_id or self.default_module or next(iter(self.modules)),
                                     self.default_module)

    def policy_modules(self) -> list[str]:
        """The modules whose policies ``save_policies`` writes: all but self-play slots not filled yet."""
        return [m for m in self.modules if self.self_play is None or self.self_play.holds(m)]

    def save_policies(self) -> None:
        """Write every module's current policy as a plain ONNX file in the logdir (run_files.py)."""
        run_files.write_policies(self.config.logdir, self.modules, self.policy_modules(), self.default_module)

    def save_offline_policy(self, offline: dict[str, Any] | None = None) -> Path | None:
        """Write ``offline_policy.json`` (§20) in the logdir: the configuration and models a client acts
        with where no server runs (ClientOptions offline_policy in every SDK), ``offline`` or what is
        served now. Written with every checkpoint. A failure is said and the run goes on (None)."""
        path = run_files.write_offline_policy(
            self.config.logdir, lambda: offline if offline is not None else offline_policy_object(self))
        if path is not None and not self._offline_policy_told and self.layout.client_mapping is None and len(self.modules) > 1:
            self._offline_policy_told = True
            say(f"[tether] {path} names no policy-mapping rules (this server maps agents itself: "
                "a mapping function or self-play): a multi-agent client cannot map agents with it offline")
        return path

    # -- lifecycle -------------------------------------------------------------

    async def checkpoint_now(self) -> Path:
        """Write a checkpoint between two updates (the console's control): its pool, marks,
        weights and version agree, and the journal it supersedes is only then deleted."""
        loop = self.learner_loop
        was_paused, loop.paused = loop.paused, True
        try:
            await loop.between_updates()
            return await self._checkpoint_in_learner_thread()
        finally:
            loop.paused = was_paused
            loop.maybe_start()

    async def close(self, checkpoint: bool = True) -> None:
        """Wait for a running update, write the final checkpoint and policies, release threads.
        No update starts from here on: one started after the running one would train data that
        the final checkpoint's pool no longer holds, into weights it labels with the older version."""
        self.learner_loop.paused = True
        self.learner_loop.stopped = True
        await self.learner_loop.between_updates()
        loop = asyncio.get_running_loop()
        if checkpoint:
            await self._checkpoint_in_learner_thread()
            await loop.run_in_executor(self._executor, self.save_policies)
        if self.journal is not None:
            await loop.run_in_executor(self._executor, self.journal.close)
        if self.tensorboard is not None:
            await loop.run_in_executor(self._executor, self.tensorboard.close)
        self._executor.shutdown(wait=True)
