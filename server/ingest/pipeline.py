"""The ingest pipeline: how one EPISODES message becomes training data, the same for
every transport.

1. dedup: a batch already stored (its client_session and batch_seq, §10) is answered
   as if new and not stored again (batch_dedup);
2. validate: the records against the module layout and each episode's agent state
   (validation; the state-free part may have been done in a decode worker);
3. behaviour-logp check: every step's action_logp must come from a model the server
   served (logp_check), on the event loop for a small message, in a thread for a large one;
4. pool: the trainer stores what is fresh enough to train on (``Trainer.submit``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..client_session import ClientSession
from .batch_dedup import batch_id
from .env_steps import message_env_steps
from .step_versions import UNVERIFIED_VERSION, claimed_versions, mark_unverified

if TYPE_CHECKING:
    from ..trainer import Trainer

#: Messages with up to this many observation values have their behaviour logp
#: checked on the event loop (a few ms at most); larger ones in a thread, beside it.
INLINE_LOGP_CHECK_VALUES = 65_536


def _obs_values(records: list) -> int:
    """Observation values in a message's records: what the logp check's forward pass costs."""
    return sum(agent.chunk.obs.size for record in records for agent in record.agents)


class IngestPipeline:
    """Stores EPISODES messages into one trainer: dedup, validate, behaviour-logp check, pool."""

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer
        self._logp_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tether-logp-check")

    async def store(self, session: ClientSession, message: dict, wants_state: bool, predecoded: list | None = None,
                    observer: Any = None) -> None:
        """Store one EPISODES (or EPISODES_AND_GET_STATE, ``wants_state``) message of ``session``;
        raises MessageError. ``predecoded``: its records as a decode worker left them;
        ``observer`` (the console, or None) is told of the stored batch."""
        trainer = self.trainer
        batch = batch_id(message)
        async with trainer.dedup.slot(batch) as duplicate:
            owner = trainer.owner(session.id, batch)  # a resend also re-attaches its session to this connection
            if duplicate:
                return
            versions = claimed_versions(message, session.last_sent, trainer.default_module, trainer.modules)
            pending = trainer.ingest.validate(owner, message, via=session.id, predecoded=predecoded)
            if trainer.ingest.logp_check is not None:
                versions = await self._check_behaviour_logp(pending.records, versions)
            pending.commit()
            records = pending.records
            if _obs_values(records) > INLINE_LOGP_CHECK_VALUES:  # (images: packed beside the loop, not on it)
                await asyncio.get_running_loop().run_in_executor(self._logp_executor, trainer.pack_records, records)
            env_steps = message_env_steps(message, records)
            if observer is not None:
                observer.batch(session.id, env_steps, versions, records)
            session.refused_stale += await trainer.submit(
                owner, records, versions, wait_for_update=wants_state and trainer.config.force_on_policy,
                env_steps=env_steps, source=f"#{session.id} {session.peer}", batch=batch)

    async def _check_behaviour_logp(self, records: list, versions: dict[str, int]) -> dict[str, int]:
        """Raise ACTION_LOGP_MISMATCH unless a served model explains every step; returns the
        versions the records are stored under."""
        trainer = self.trainer
        check = trainer.ingest.logp_check
        assert check is not None
        # Versions kept now: data claiming any other one (older than max_staleness, or not
        # served yet) is not checked, so it must not be trained on either, even if that
        # version is published while this message waits for room in the pool.
        # Without the check, the staleness rule alone decides (§13.2: a newer version is accepted).
        kept = {m: set(h.versions) for m, h in trainer.histories.items()}
        versions = {m: (v if m not in kept or v in kept[m] else UNVERIFIED_VERSION) for m, v in versions.items()}
        mark_unverified(records, kept)
        if _obs_values(records) <= INLINE_LOGP_CHECK_VALUES:
            # About 0.1 us an observation value with a small MLP: for a message this
            # small, less than a hop to another thread and back costs in GIL hand-offs.
            check(records, versions)
        else:
            # A large one: ONNX Runtime releases the GIL, so other clients' PINGs are
            # answered meanwhile (the check held the loop 80 ms per 80k steps).
            await asyncio.get_running_loop().run_in_executor(self._logp_executor, check, records, versions)
        return versions

    def close(self) -> None:
        self._logp_executor.shutdown(wait=False)
