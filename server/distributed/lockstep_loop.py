"""The learner loop of one rank among several: updates the ranks take together, in lock step.

Every ``TICK_S`` (and right after an update) the ranks make one agreement, a sum over the control
group of what each holds: its pool's steps per module, its env steps received, its wishes (stop,
done, pause, a report, self-play results held, refusals to tell) and, after an update, its view for the group's stop
rule. From that one sum every rank decides the same thing:

* **stop** when any rank was asked to (a signal, the console) or the run is done: the group's env
  steps reached ``max_env_steps``, or the group's stop rule saw ``stop_at_return`` reached. That rule
  reads the sum of the ranks' views (stop_rule.TargetView: each rank's share of the group's window of
  returns, stop_rule.window_shares of the returns each rank held at the agreement before, and its
  active clients below the target on their own, each judged as one of the group's active clients),
  judged alike by every rank at the agreement after each update, which stops the group when the
  rule is met: the group's episodes decide, not each rank's on its own (a rank whose clients play
  slowly would hold the group back until a whole window of its own episodes came in);
* **tell** every rank of the client_sessions any rank refused (DATA_REFUSED) since the last time, when
  some rank did (a gather): a client refused by one rank is refused by all, whichever it reconnects to;
* **update** when the ranks together hold ``train_batch_size`` agent steps and no rank is paused:
  each rank takes what its pool holds (at most ``train_batch_size``), screens it locally
  (learner/isolation.py's screen: a client whose steps no update can train on is left out and
  blamed, on its own rank), and the ranks agree on each module's step count; every module with
  steps on some rank is then updated by every rank, in the configuration's module order, data
  parallel (data_parallel.py), so that no rank waits in a sum another rank does not join;
* else wait for the next tick.

Rank 0 exports each trained module's ONNX and every rank serves those very bytes: one model per
version across the group (a self-play snapshot's too: ``export_once``). A version's number is the
same on every rank, since they publish the same modules in the same updates. A failed collective (a
rank died, or hung past the group's timeout) stops this rank with a message naming it; torchrun then
stops the others, and a restart resumes every rank from its checkpoint (docs/scale-out.md).

Self-play (server/self_play.py): each rank judges the games its own clients finish and holds the
results; right before each update the group decides on (and at the agreement that stops the group, or
once the ranks hold ``MAX_HELD_RESULTS`` between them, as while paused), every rank gathers every
rank's results and applies them in rank order, so the ratings and game counts are the group's and the
same on every rank (and in every rank's final checkpoint). Only the games that end after the stop
agreement, while the ranks close, are not rated.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from tether.protocol.onnx_codec import encode_onnx

from ..ingest.logp_check import ServedPolicy
from ..learner import IsolatedUpdate, NonFiniteUpdate, screen_sources
from ..learner.schedule import env_steps_before
from ..learner_loop import LearnerLoop
from ..sample_pool import Pooled
from ..say import say
from ..self_play import SelfPlay
from ..stop_rule import TargetView, window_shares
from .rank_group import RankGroup, RankGroupError
from .rank_reports import RankReports

#: Seconds between two agreements while the ranks wait for data (a sum of a few numbers on loopback
#: takes well under a millisecond; between machines, about a round trip).
TICK_S = 0.02
#: Wishes a rank brings to the agreement (after its per-module counts, env steps and agent steps).
_WISHES = ("stop", "done", "paused", "report", "results", "refusals")
#: Self-play results the ranks may hold between them before they are applied without waiting for an update.
MAX_HELD_RESULTS = 10_000


class LockstepLearnerLoop(LearnerLoop):
    """A LearnerLoop whose updates start when every rank agrees, and which trains data parallel."""

    def __init__(self, *args: Any, group: RankGroup, on_stop: Any, self_play: SelfPlay | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        #: The run's self-play (None without it): its game results are applied by the group together.
        self.self_play = self_play
        if self._after_publish is not None:
            self._after_publish = self._stopping_on_failure(self._after_publish)
        #: Called with the reason once the group agreed to stop (the trainer's stop).
        self._on_stop = on_stop
        self._order = list(self.modules)
        #: What this rank was asked: "signal"/"console" (stop) or "max_env_steps"/"stop_at_return" (done).
        self._wish: str | None = None
        #: Why the group failed, once a collective did (None while it works).
        self.failure: str | None = None
        #: Why this rank's part of an update failed (set in the learner thread, acted on in the event loop).
        self._update_failure: str | None = None
        #: The group's env steps at the last agreement, and its agreements so far.
        self.group_env_steps = 0
        self.agreements = 0
        #: Seconds this rank's updates spent in collectives with the others (the plan, the sums, the models).
        self.update_comm_s = 0.0
        self._runner: asyncio.Task | None = None
        #: The group's addresses and loads (the trainer's, set once the rank listens), told each agreement's loads.
        self.directory: Any = None
        #: Every rank's report, gathered when rank 0 asks in an agreement (rank_reports.py).
        self.reports = RankReports(group.rank, group.world_size, self.metrics, self.pool)
        #: An update was published since the group's stop rule last judged (it judges at the next agreement).
        self._judge_due = False
        #: From the last agreement: the returns each rank holds (window_shares); from the last judgement:
        #: the group's active clients (TargetView).
        self._held = [0] * group.world_size
        self._group_clients = 0
        #: Local views taken for agreements so far, and the last whose agreement has decided (published()).
        self._views = 0
        self._decided_views = 0
        self._decision: asyncio.Future | None = None

    # -- what the trainer calls ------------------------------------------------------

    def start_ticking(self) -> None:
        """Start the agreements (on the event loop, once the server listens)."""
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def published(self) -> None:
        """Return once the update that this rank's data stored so far can start has published (on-policy
        clients, force_on_policy): updates start at an agreement, so this waits for the first agreement
        whose view holds that data to decide, then for the update it started, if any."""
        wanted = self._views + 1  # (the next view taken holds what was pooled before this call)
        while (self._next_state is None and self._decided_views < wanted and not self.stopped
               and self._runner is not None and not self._runner.done()):
            if self._decision is None:
                self._decision = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._decision)
        await super().published()

    def _decided(self, view: int) -> None:
        """An agreement on ``view`` decided (an update started, or none): on-policy waiters look again."""
        self._decided_views = view
        decision, self._decision = self._decision, None
        if decision is not None and not decision.done():
            decision.set_result(None)

    def maybe_start(self) -> None:
        """Updates start at an agreement of all ranks, not when this rank's pool fills."""

    def wish_stop(self, reason: str) -> None:
        """This rank was asked to end the run: the group stops at the next agreement."""
        if reason == "stop_at_return":
            return  # (the group's rule, judged alike by every rank, stopped the group at that agreement)
        if self._wish is None:
            self._wish = reason

    async def between_updates(self) -> None:
        await super().between_updates()
        if self._runner is not None and self.stopped:
            await asyncio.gather(self._runner, return_exceptions=True)

    # -- the agreements ------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await self._agree_and_update(loop)
        except Exception as exc:  # (anything unexpected: this rank can no longer follow the others)
            self._fail(f"rank {self.group.rank}: the learner loop failed ({exc!r:.300})")
        finally:
            self._decided(self._views)  # (no agreement decides any more: on-policy waiters go)

    async def _agree_and_update(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self.stopped:  # (stopped without an agreement: the trainer closes; the others time out)
            self._drop_stale()
            try:
                # (judging: an update was published since the last judgement, at the same agreement on every rank)
                judging, self._judge_due = self._judge_due, False
                self._views += 1
                view_no = self._views
                total = await loop.run_in_executor(self._executor, self.group.agree, self._local_view(judging))
            except RankGroupError as exc:
                self._fail(str(exc))
                return
            self.agreements += 1
            n = len(self._order)
            counts, env_steps, agent_steps = total[:n], int(total[n]), int(total[n + 1])
            wishes = dict(zip(_WISHES, total[n + 2:n + 2 + len(_WISHES)]))
            loads_at = n + 2 + len(_WISHES)
            held_at = loads_at + self.group.world_size
            self._held = [int(n) for n in total[held_at:held_at + self.group.world_size]]
            reached = False
            if judging:  # (every rank judges the same sums at the same agreement, and decides alike)
                view = TargetView.from_list(total[held_at + self.group.world_size:])
                self._group_clients = int(view.clients_active)
                reached = self.stop_rule.judge_target(view)
            if self.directory is not None:
                self.directory.agreed(list(total[loads_at:loads_at + self.group.world_size]))
            if wishes["report"]:  # (every rank saw rank 0 ask: every rank takes part in the gather)
                try:
                    gathered = await loop.run_in_executor(self._executor, self.group.gather_objects,
                                                          self.reports.report())
                except RankGroupError as exc:
                    self._fail(str(exc))
                    return
                if self.group.is_first:
                    self.reports.take(gathered)
                if self.reports.curriculum is not None:  # (rank 0's, its lesson moved by every rank's episodes)
                    try:
                        snapshot = await loop.run_in_executor(
                            self._executor, self.group.broadcast_object,
                            self.reports.curriculum.snapshot() if self.group.is_first else None)
                    except RankGroupError as exc:
                        self._fail(str(exc))
                        return
                    if not self.group.is_first:
                        self.reports.follow(snapshot)
            self.group_env_steps = env_steps
            if wishes["refusals"]:  # (every rank read the same count: every rank takes part in the gather)
                try:
                    await self._adopt_the_groups_refusals(loop)
                except RankGroupError as exc:
                    self._fail(str(exc))
                    return
            reason = self._stop_reason(wishes, env_steps, reached)
            if reason is not None:
                if wishes["results"]:  # (every rank saw the stop and the count: the results held so far are the group's)
                    try:
                        await self._apply_the_groups_results(loop)
                    except RankGroupError as exc:
                        self._fail(str(exc))
                        return
                self.stopped = True
                self._decided(view_no)
                self._on_stop(reason)
                return
            update = not wishes["paused"] and counts.sum() >= self.config.train_batch_size
            # (a gather only when some rank holds results: every rank read the same count in the sum)
            if wishes["results"] and (update or wishes["results"] >= MAX_HELD_RESULTS):
                try:
                    await self._apply_the_groups_results(loop)
                except RankGroupError as exc:
                    self._fail(str(exc))
                    return
            if update:
                by_module: dict[str, list[Pooled]] = {}
                for pooled in self.pool.take():
                    by_module.setdefault(pooled.module_id, []).append(pooled)
                self.metrics.last_update_steps = sum(p.chunk.env_steps for items in by_module.values() for p in items)
                # Until the ranks agree which modules they train (the first sum of train()), admission counts
                # every trainable module as updating (another rank's take may hold a module this rank's view
                # did not: steps stored since): refusing a little fresh data for a moment is safe, letting
                # data in that an unforeseen version would make too stale is not.
                self.training_modules = {m for m, rt in self.modules.items() if rt.spec.trainable}
                # (the group's sums, less what the pools hold: every rank trains with the same schedule)
                self.set_run_left(env_steps_before(env_steps, agent_steps, int(counts.sum())))
                self._next_state = loop.create_future()
                self._decided(view_no)
                self._task = loop.create_task(self._update(by_module))
                await asyncio.gather(self._task, return_exceptions=True)
                if self._update_failure is not None:
                    self._fail(self._update_failure)
                    return
            else:
                self._decided(view_no)
                slept_from = loop.time()
                await asyncio.sleep(TICK_S)
                self.reports.note_lag(loop.time() - slept_from - TICK_S)

    def _local_view(self, judging: bool = False) -> list[float]:
        by_module = dict.fromkeys(self._order, 0)
        for pooled in self.pool.items():
            by_module[pooled.module_id] += pooled.chunk.env_steps
        wish = self._wish
        done = wish in ("max_env_steps",)
        # Each rank's connected clients, in its own slot of the sum (the loads PONG's redirects use, §6.7).
        loads = [0.0] * self.group.world_size
        loads[self.group.rank] = float(self.metrics.clients_connected)
        # The returns each rank holds, in its slot (the next judgement's window_shares), and, when the group's
        # stop rule judges at this agreement, this rank's share of its view (zeros else: a view costs a walk
        # of the client table).
        held = [0.0] * self.group.world_size
        held[self.group.rank] = float(len(self.metrics.returns))
        view = TargetView()
        if judging:
            share = window_shares(self._held, self.config.metrics_window)[self.group.rank]
            view = self.stop_rule.target_view(share, self._group_clients)
        return [*by_module.values(), float(self.metrics.env_steps_received), float(self.metrics.agent_steps_received),
                float(wish is not None and not done), float(done), float(self.paused),
                float(self.reports.due()),
                float(self.self_play.pending if self.self_play is not None else 0), float(self.guard.untold),
                *loads, *held, *view.to_list()]

    def _publish_failed(self, exc: Exception, results: dict[str, Any]) -> None:
        # (on this rank alone: it can no longer follow the others' versions nor their judgements, so it
        # stops, and the group with it)
        if self._update_failure is None:
            self._update_failure = f"rank {self.group.rank}: publishing an update failed ({exc!r:.300})"

    def _check_target(self) -> None:
        self._judge_due = True  # (the group's rule judges at the next agreement, on every rank's view)

    def _stop_reason(self, wishes: dict[str, float], env_steps: int, reached: bool) -> str | None:
        if wishes["stop"]:
            # (another rank's signal or console: "group" here, also on a rank that only reached its budget at
            # this agreement, so that no rank ends its clients' run while the others are interrupted)
            return self._wish if self._wish not in (None, "max_env_steps") else "group"
        budget = self.config.max_env_steps
        if wishes["done"] or (budget and env_steps >= budget):
            return "max_env_steps"
        # The group's stop rule saw the target, on the group's episodes and with every active client of
        # every rank at it on its own: made-up returns on one rank cannot end the run for all.
        if self.config.stop_at_return is not None and reached:
            return "stop_at_return"
        return None

    async def _apply_the_groups_results(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every rank's held self-play results, applied by every rank in rank order (a collective: every
        rank calls it at the same agreement). Taken and applied on the event loop, which owns the
        ratings; gathered in the learner thread."""
        assert self.self_play is not None
        gathered = await loop.run_in_executor(self._executor, self.group.gather_objects,
                                              self.self_play.take_results())
        for results in gathered:
            self.self_play.apply_results(results)

    async def _adopt_the_groups_refusals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Every rank counts the strikes any rank made against a client_session since the last time, refuses
        the client_sessions any rank refused or that those strikes bring to the limit (DATA_REFUSED, §13.2),
        and drops what its pool holds of them, as the rank that refused them did. A collective."""
        gathered = await loop.run_in_executor(self._executor, self.group.gather_objects, self.guard.take_untold())
        for rank, told in enumerate(gathered):
            if rank != self.group.rank:
                for name in self.guard.adopt(told):
                    say(f"[tether] rank {self.group.rank}: client_session {name[1]!r} refused (DATA_REFUSED) with "
                        f"rank {rank}'s word: its data made {self.guard.strikes_to_refuse} of the group's updates "
                        "non-finite")
        m = self.metrics
        m.clients_refused = self.guard.refused_count
        dropped = self.guard.drop_refused(self.pool)
        if dropped:
            m.agent_steps_isolated += dropped
            say(f"[tether] rank {self.group.rank}: {dropped} pooled agent steps of clients another rank refused "
                "(DATA_REFUSED) dropped")

    def export_once(self, export: Any) -> bytes | None:
        """Rank 0's ``export()`` on every rank (one model per version across the group); None on every
        rank when it failed there, so that no rank waits for bytes that never come. A collective."""
        exported = None
        if self.group.is_first:
            try:
                exported = export()
            except Exception as exc:
                say(f"[tether] rank 0: an export for every rank failed: {exc!r:.300}")
        return self.group.broadcast_object(exported)

    def _stopping_on_failure(self, after_publish: Any) -> Any:
        """``after_publish`` (self-play snapshots, whose copies and export every rank makes together), whose
        failure stops this rank: a rank that skipped its part can no longer follow the others."""
        async def guarded(published: list[str]) -> None:
            try:
                await after_publish(published)
            except Exception as exc:
                self._update_failure = (str(exc) if isinstance(exc, RankGroupError) else
                                        f"rank {self.group.rank}: its part after an update failed ({exc!r:.300})")
                raise
        return guarded

    def _fail(self, why: str) -> None:
        self.failure = why
        self.stopped = True
        self._decided(self._views)  # (nothing will decide any more: waiters go)
        say(f"[tether] {why}; this rank stops (torchrun restarts the group from its checkpoints when allowed "
            "to: --max-restarts)")
        self._on_stop("rank_failed")

    # -- one update, every rank ----------------------------------------------------------

    def train(self, by_module: dict[str, list[Pooled]]) -> dict[str, Any]:
        """Per module with steps on any rank: (IsolatedUpdate, stats, served), as LearnerLoop.train, trained
        by every rank together. Runs in the learner thread, where every collective is called."""
        busy = self.group.busy_s
        try:
            return self._train_together(by_module)
        except Exception as exc:
            # Whatever failed here (a collective, or this rank's own part: memory, an export), the ranks can
            # no longer take the same steps: this rank stops, which makes the others' next collective fail.
            self._update_failure = (str(exc) if isinstance(exc, RankGroupError) else
                                    f"rank {self.group.rank}: its part of an update failed ({exc!r:.300})")
            raise
        finally:
            for runtime in self.modules.values():
                runtime.learner.pinned_bases = None  # (the console's values again from the next update)
            self.update_comm_s += self.group.busy_s - busy

    def _train_together(self, by_module: dict[str, list[Pooled]]) -> dict[str, Any]:
        # The settings the console changes live (on rank 0, whose console it is) go to every rank first.
        live = self.group.broadcast_object(
            {m: (rt.learner.hp.lr, rt.learner.hp.ent_coef) for m, rt in self.modules.items()}
            if self.group.is_first else None)
        for module_id, (lr, ent_coef) in live.items():
            learner = self.modules[module_id].learner
            if not self.group.is_first:  # (rank 0's own may have changed since it read them: the console's)
                learner.set_lr(lr)
                learner.set_ent_coef(ent_coef)
            learner.pinned_bases = (lr, ent_coef)  # (what every rank trains this update with)
        screened: dict[str, list[Pooled]] = {}
        guilty: dict[str, dict] = {}
        for module_id in self._order:
            items = by_module.get(module_id, [])
            runtime = self.modules[module_id]
            if not items or not runtime.spec.trainable:
                screened[module_id] = []
                continue
            guilty[module_id] = screen_sources(runtime.learner, [(p.source, p.chunk) for p in items])
            screened[module_id] = [p for p in items if p.source not in guilty[module_id]]
        counts = self.group.agree(sum(p.chunk.env_steps for p in screened[m]) for m in self._order)
        # Exactly the modules every rank now updates and publishes (each rank takes at most train_batch_size
        # of its pool, so a module pooled on some rank may not be in this update at all): one reference swap,
        # which the event loop's admission reads whole.
        self.training_modules = {m for m, n in zip(self._order, counts) if n > 0}
        results: dict[str, Any] = {}
        for module_id, global_steps in zip(self._order, counts):
            if global_steps == 0:
                if guilty.get(module_id):
                    results[module_id] = (IsolatedUpdate(None, [], guilty[module_id]), None, None)
                continue
            by_module.setdefault(module_id, [])
            results[module_id] = self._train_module(module_id, screened[module_id], guilty.get(module_id, {}),
                                                    int(global_steps))
        return results

    def _train_module(self, module_id: str, items: list[Pooled], guilty: dict, global_steps: int) -> tuple:
        runtime = self.modules[module_id]
        learner = runtime.learner
        kept = sorted({p.source for p in items}, key=str)
        started = time.perf_counter()
        try:
            stats = learner.update(learner.batch_of([p.chunk for p in items]) if items else None, global_steps)
        except NonFiniteUpdate as exc:  # (every rank raised it, from the same sums: the update is undone everywhere)
            return IsolatedUpdate(None, [], guilty, error=exc, trials=1), None, None
        trained = time.perf_counter()
        onnx_bytes = self.group.broadcast_object(learner.export_onnx() if self.group.is_first else None)
        served = (encode_onnx(onnx_bytes), ServedPolicy(onnx_bytes, runtime.spec.action_space,
                                                        runtime.spec.observation_space))
        stats = {**stats, "global_steps": float(global_steps), "update_trials": 1.0, "update_s": trained - started,
                 "export_s": time.perf_counter() - trained}
        return IsolatedUpdate(stats, kept, guilty, trials=1), stats, served
