"""The learner loop, one update at a time, beside the event loop that keeps serving clients.

1. take a batch: once the pool holds ``train_batch_size`` agent steps (no update
   running, training not paused), the steps that grew too stale waiting are dropped
   and the rest is taken, split by module;
2. train each module on its part, in the learner thread: the rollout batch, GAE and
   the PPO epochs (learner/ppo.py), leaving out the data of a client that makes the
   update non-finite (learner/isolation.py);
3. export each trained module's policy to ONNX;
4. publish: its weights_seq_no grows by one and clients get the new model with their
   next SET_STATE; the behaviour-logp check keeps it in its history; on-policy clients
   waiting for new weights are answered;
5. report: the progress line, TensorBoard, and a checkpoint every ``checkpoint_every``
   updates.

Then the next update starts if the pool already holds another batch.
"""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from tether.protocol.onnx_codec import encode_onnx

from .config import ServerConfig
from .data_guard import DataGuard
from .ingest.batch_dedup import BatchDedup
from .ingest.logp_check import PolicyHistory, ServedPolicy
from .learner import IsolatedUpdate, update_isolating
from .learner.schedule import env_steps_before, run_left
from .metrics import Metrics, TensorBoardWriter
from .module_runtime import ModuleRuntime
from .record_share import RecordShare
from .sample_pool import Pooled, SamplePool
from .say import say
from .stop_rule import StopRule


class LearnerLoop:
    """Starts an update whenever a batch is ready, trains, publishes and reports it."""

    def __init__(self, config: ServerConfig, modules: dict[str, ModuleRuntime], default_module: str | None,
                 pool: SamplePool, histories: dict[str, PolicyHistory], metrics: Metrics, guard: DataGuard,
                 stop_rule: StopRule, record_share: RecordShare, dedup: BatchDedup,
                 tensorboard: TensorBoardWriter | None, executor: ThreadPoolExecutor,
                 checkpoint: Callable[[], Awaitable[Any]],
                 after_publish: Callable[[list[str]], Awaitable[None]] | None = None,
                 record_versions: Callable[[], None] | None = None) -> None:
        self.config = config
        self.modules = modules
        self.default_module = default_module
        self.pool = pool
        self.histories = histories
        self.metrics = metrics
        self.guard = guard
        self.stop_rule = stop_rule
        self.record_share = record_share
        self.dedup = dedup
        self.tensorboard = tensorboard
        #: The learner thread: updates, and what is written after them.
        self._executor = executor
        #: Writes a checkpoint (its state taken on the event loop, written in the learner thread).
        self._checkpoint = checkpoint
        #: Awaited with the modules an update published, before its metrics and checkpoint (self-play snapshots).
        self._after_publish = after_publish
        #: Called once an update published, before any client is told: writes down the versions served.
        self._record_versions = record_versions
        #: Updates do not start while paused (the console's control); data keeps arriving into the bounded pool.
        self.paused = False
        #: Set once by the trainer's close: no update starts again, whoever resumes (a console
        #: checkpoint that finishes after close began restores ``paused``, not this).
        self.stopped = False
        #: Modules the running update trains, until it has published (each will add 1 to its version).
        self.training_modules: set[str] = set()
        self._task: asyncio.Task | None = None
        self._next_state: asyncio.Future | None = None
        #: The modules the running publish has served so far (one that raises part way serves the rest).
        self._published_ids: set[str] = set()

    # -- when an update starts -----------------------------------------------------

    @property
    def running(self) -> asyncio.Task | None:
        """The update running now (None between updates)."""
        return self._task

    def pause(self) -> None:
        """No new update starts until resume(); one in progress finishes."""
        self.paused = True
        self.note_starving()  # a paused learner does not wait for data

    def resume(self) -> None:
        self.paused = False
        self.maybe_start()

    async def between_updates(self) -> None:
        """Return once no update runs; the caller has set ``paused``, so none starts."""
        while self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def published(self) -> None:
        """Return once the running update, if any, has published new weights (or failed)."""
        if self._next_state is not None:
            await asyncio.shield(self._next_state)

    def note_starving(self) -> None:
        """Tell the record share whether the learner now waits for data."""
        starved = self._task is None and not self.paused and self.pool.steps < self.config.train_batch_size
        self.record_share.starving(starved, time.monotonic())

    def maybe_start(self) -> None:
        """Start an update if a batch is ready, none runs and training is not paused."""
        if self.paused or self.stopped or self._task is not None or self.pool.steps < self.config.train_batch_size:
            return
        by_module = self._take_batch()
        if by_module is None:
            return
        self.training_modules = set(by_module)
        self.record_share.starving(False, time.monotonic())
        loop = asyncio.get_running_loop()
        self._next_state = loop.create_future()
        self._task = loop.create_task(self._update(by_module))

    def set_run_left(self, env_steps: float) -> None:
        """Before an update: every module's share of the run left after ``env_steps``, the env steps
        received before the data waiting to be trained (the schedules' factor, learner/schedule.py: 1 at
        the first update, as CleanRL's, and about a batch's share at the last). Called on the event loop
        while no update runs."""
        left = run_left(env_steps, self.config.max_env_steps)
        for runtime in self.modules.values():
            runtime.learner.set_run_left(left)

    # -- one update ------------------------------------------------------------------

    def _take_batch(self) -> dict[str, list[Pooled]] | None:
        """The pool's next batch by module; None when too little is left once the samples that
        became too stale while waiting in the pool are dropped."""
        self._drop_stale()
        if self.pool.steps < self.config.train_batch_size:
            return None
        # (the schedules' factor: the env steps received before what the pool holds, none of it trained yet)
        self.set_run_left(env_steps_before(self.metrics.env_steps_received, self.metrics.agent_steps_received,
                                           self.pool.steps))
        by_module: dict[str, list[Pooled]] = {}
        for pooled in self.pool.take():
            by_module.setdefault(pooled.module_id, []).append(pooled)
        self.metrics.last_update_steps = sum(p.chunk.env_steps for items in by_module.values() for p in items)
        return by_module

    def _drop_stale(self) -> None:
        """Drop the pooled steps that grew older than ``max_staleness`` while they waited (not replayed ones)."""
        self.metrics.samples_dropped_stale += self.pool.drop(
            lambda p: p.replayed or self.modules[p.module_id].weights_seq_no - p.weights_seq_no <= self.config.max_staleness)

    async def _update(self, by_module: dict[str, list[Pooled]]) -> None:
        loop = asyncio.get_running_loop()
        results: dict[str, Any] = {}
        try:
            results = await loop.run_in_executor(self._executor, self.train, by_module)
        except Exception as exc:  # a failed update must not stop training for good
            steps = sum(p.chunk.env_steps for items in by_module.values() for p in items)
            say(f"[tether] learner update failed, {steps} steps dropped: {exc!r}")
        published: dict[str, dict] = {}
        self._published_ids = set()
        try:
            self.guard.tick()
            published = self._publish(by_module, results)
        except Exception as exc:  # (a bug: clients waiting on it must not wait for good)
            self._publish_failed(exc, results)
        self.training_modules = set()
        # Waiting clients get the new weights now; logging and checkpoints follow.
        future, self._next_state = self._next_state, None
        if future is not None and not future.done():
            future.set_result(self._served_version)
        try:
            if published and self._after_publish is not None:
                await self._after_publish(list(published))
            if published:
                await self._after_update(loop)
        except Exception as exc:
            say(f"[tether] writing metrics or checkpoint failed: {exc!r}")
        finally:
            self._task = None
        self.maybe_start()
        self.note_starving()

    def _publish_failed(self, exc: Exception, results: dict[str, Any]) -> None:
        """Publishing an update raised part way (a bug: its log lines cannot fail, say.py): a lone server
        says so, serves the weights of every module that trained and was not published yet (so that the
        learner's weights are always those of the version served, which a checkpoint records), writes
        down the versions it may serve, and trains on; LockstepLearnerLoop stops the rank, which could
        no longer follow the others."""
        say(f"[tether] publishing an update failed: {exc!r:.300}")
        for module_id, (_, stats, served) in results.items():
            if stats is None or module_id in self._published_ids:
                continue
            runtime = self.modules[module_id]
            try:
                self._serve(module_id, served)
            except Exception as serve_exc:  # (its weights may be served without the behaviour-logp check's copy)
                say(f"[tether] module {module_id!r}: serving v{runtime.weights_seq_no} failed part way: "
                    f"{serve_exc!r:.300}")
                continue
            say(f"[tether] module {module_id!r}: its trained weights are served as v{runtime.weights_seq_no} "
                f"(this update's counts and logs are lost)")
        self.metrics.weights_seq_no = self._served_version
        if self._record_versions is not None:
            try:
                self._record_versions()
            except Exception as record_exc:
                say(f"[tether] writing down the versions served failed: {record_exc!r:.300}")

    def train(self, by_module: dict[str, list[Pooled]]) -> dict[str, Any]:
        """Per module: (IsolatedUpdate, stats, ONNX bytes, the model); the last three None when
        nothing was trained. A client whose data makes the update non-finite is left out of
        it (learner/isolation.py), so its neighbours' data is still trained on. Runs in the
        learner thread."""
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
                    results[module_id] = (outcome, None, None)
                    continue
                trained = time.perf_counter()
                onnx_bytes = learner.export_onnx()
                # Encoded and loaded here, in the learner thread: for a CNN's megabytes the gzip alone
                # takes hundreds of milliseconds, which the event loop must not wait for.
                served = (encode_onnx(onnx_bytes), ServedPolicy(onnx_bytes, self.modules[module_id].spec.action_space,
                                                                self.modules[module_id].spec.observation_space))
            except Exception as exc:
                learner.load_state(before)
                say(f"[tether] update of module {module_id!r} failed: {exc!r:.300}")
                results[module_id] = (IsolatedUpdate(None, [], error=exc), None, None)
                continue
            # Seconds the update (its trials included) and the ONNX export took (the console's health panel, TensorBoard).
            stats = {**outcome.stats, "update_s": trained - started, "export_s": time.perf_counter() - trained,
                     "update_trials": float(outcome.trials)}
            results[module_id] = (outcome, stats, served)
        return results

    def export_once(self, export: Callable[[], bytes]) -> bytes | None:
        """The ONNX bytes of a model to serve that is not an update's (a self-play snapshot): here
        ``export()``'s, whose exception propagates. Called in the learner thread; several ranks
        serve rank 0's export (LockstepLearnerLoop), None when it failed."""
        return export()

    def _publish(self, by_module: dict[str, list[Pooled]], results: dict[str, Any]) -> dict[str, dict]:
        """Publish every module that trained; count and report the data left out. Returns the
        stats of the published modules."""
        m = self.metrics
        published = {}
        #: source -> why its data was left out of an update of this round.
        guilty: dict[str, str] = {}
        for module_id, (outcome, stats, served) in results.items():
            items = by_module[module_id]
            guilty.update((s, why) for s, why in outcome.guilty.items() if s not in guilty)
            kept = set(outcome.kept)
            blamed = [p for p in items if p.source in outcome.guilty]
            if blamed:
                m.agent_steps_isolated += sum(p.chunk.env_steps for p in blamed)
                say(f"[tether] update of module {module_id!r}: {sum(p.chunk.env_steps for p in blamed)} agent steps "
                    f"left out, from client(s) {_describe(outcome.guilty)}")
            if stats is None:
                unblamed = [p for p in items if p.source not in outcome.guilty]
                if not unblamed:
                    continue  # only the data of clients to blame: nothing else lost, nothing to publish
                m.updates_discarded += 1
                self.stop_rule.update_discarded()
                sources = sorted({p.source for p in unblamed if p.source})
                say(f"[tether] update of module {module_id!r} discarded ({outcome.error}); weights stay at "
                    f"v{self.modules[module_id].weights_seq_no}; {sum(p.chunk.env_steps for p in unblamed)} agent "
                    f"steps from client(s) {', '.join(sources) or 'unknown'}")
                continue
            unkept = [p for p in items if p.source not in kept]
            if unkept:
                m.updates_isolated += 1
                cleared = [p for p in unkept if p.source not in outcome.guilty]
                if cleared:  # the trials ran out before these clients were cleared: left out unblamed
                    m.agent_steps_isolated += sum(p.chunk.env_steps for p in cleared)
                    say(f"[tether] update of module {module_id!r}: {sum(p.chunk.env_steps for p in cleared)} agent "
                        f"steps of client(s) {', '.join(sorted({p.source for p in cleared}))} left out unblamed "
                        f"({outcome.trials} trial updates)")
            self._serve(module_id, served)
            m.module_updates[module_id] = stats
            m.agent_steps_trained += sum(p.chunk.env_steps for p in items if p.source in kept)
            published[module_id] = stats
        if guilty:
            # Their returns are not the run's: out of the windows before anything reports them.
            m.exclude(set(guilty))
            sessions = {p.source: p.client_session for items in by_module.values() for p in items
                        if p.source in guilty and p.client_session is not None}
            for source in self.guard.strike(guilty, sessions):
                say(f"[tether] client {source} refused (DATA_REFUSED): its data made "
                    f"{self.guard.strikes_to_refuse} updates non-finite")
            m.clients_refused = self.guard.refused_count
            m.agent_steps_isolated += self.guard.drop_refused(self.pool)
        if published:
            if self._record_versions is not None:
                self._record_versions()
            m.updates += 1
            m.weights_seq_no = self._served_version
            first = self.default_module if self.default_module in published else next(iter(published))
            m.learner = published[first]
            self._check_target()
        return published

    def _serve(self, module_id: str, served: tuple[str, ServedPolicy]) -> None:
        """Serve a module's trained weights as its next version (encoded model, loaded policy), which the
        behaviour-logp check then knows (else it would refuse that version's data as unverified)."""
        runtime = self.modules[module_id]
        runtime.publish(served[0])
        self._published_ids.add(module_id)
        if module_id in self.histories:
            self.histories[module_id].add_served(runtime.weights_seq_no, served[1])

    def _check_target(self) -> None:
        """After a published update: whether stop_at_return is reached."""
        self.stop_rule.check_target()

    async def _after_update(self, loop: asyncio.AbstractEventLoop) -> None:
        m = self.metrics
        m.batches_duplicate = self.dedup.duplicates
        if not self.config.quiet:
            say(m.progress_line(), sys.stdout)
        scalars = m.snapshot()
        if self.tensorboard is not None:
            # Metrics are a view of the run: their failure is logged and never skips the checkpoint below.
            try:
                await loop.run_in_executor(self._executor, self.tensorboard.write, scalars, m.env_steps_received)
            except Exception as exc:
                m.metrics_write_failures += 1
                say(f"[tether] writing TensorBoard metrics failed: {exc!r:.300}")
        every = self.config.checkpoint_every
        if every and m.updates % every == 0:
            await self._checkpoint()

    @property
    def _served_version(self) -> int:
        """The v1 client's view: the default module's version (else the first module's)."""
        return self.modules[self.default_module or next(iter(self.modules))].weights_seq_no


def _describe(guilty: dict[str, str]) -> str:
    """'#3 1.2.3.4:5 (why); …' for a log line."""
    return "; ".join(f"{source or 'unknown'} ({why})" for source, why in sorted(guilty.items()))
