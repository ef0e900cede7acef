"""What TetherClient and MultiAgentClient share: the background link, the
sampler's random generator, and the one path by which experience leaves.

Experience is cut into immutable records on the engine thread and handed to
the link's I/O thread (``ServerLink``), which sends it; ``get_action`` never
waits for the network. New weights arrive as events and are swapped in at the
start of the client's next call. Against an on-policy server a client may
instead wait for the weights that answer each batch (``wait_for_weights``).
"""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tether.protocol.connection import from_another_run, run_id_of
from tether.protocol.env_params import EnvParams, EnvParamsError, draw_all, measure_value
from tether.protocol.errors import ErrorCode, InvalidInputError
from tether.protocol.action_mask import ActionMask
from tether.protocol.spaces import Box, flatten_observation, is_composite
from .observation_arena import ObservationArena
from .offline_link import OfflineLink
from .server_link import Batch, ServerLink

logger = logging.getLogger("tether.sdk")


def finite_observation(observation: Any, what: str = "observation", arena: ObservationArena | None = None) -> np.ndarray:
    """The observation as a float32 copy (the engine may reuse its buffer); a NaN or infinite value is
    refused here, by name, as in every SDK, instead of costing the whole batch at the server (§10.6).
    An image of bytes (uint8) stays bytes: every value is valid, and a byte box's model takes them as
    they are (copied out of ``arena``'s blocks when given)."""
    if type(observation) is np.ndarray:
        if observation.dtype.char == "B":  # (uint8)
            return arena.copy(observation) if arena is not None else observation.copy()
        obs = observation.astype(np.float32)
    else:
        obs = np.array(observation, dtype=np.float32)
    # A row of a game's size is looked at in Python: a float32 row's sum in double is finite exactly
    # when every value is, and one numpy call (tolist) costs a cold engine step less than two ufuncs.
    if not (math.isfinite(sum((obs if obs.ndim == 1 else obs.reshape(-1)).tolist())) if obs.size <= 256
            else np.isfinite(obs).all()):
        bad = int(np.flatnonzero(~np.isfinite(obs.ravel()))[0])
        raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"{what}[{bad}] is not finite ({obs.ravel()[bad]})")
    return obs


def observation_row(observation: Any, space: Any, mask: ActionMask | None, what: str = "observation",
                    arena: ObservationArena | None = None) -> np.ndarray:
    """**[1.4]** One observation of a Dict or Tuple space (its leaves by key or position, or already its
    flat row) as its flat row (§8.6), refused here, by name,
    as the server would refuse the batch: a missing or unknown leaf (OBS_LEAF_MISMATCH), one of
    another size (OBS_SHAPE_MISMATCH), a NaN (NON_FINITE_VALUE), a byte leaf's value that is not an
    integer 0-255 (OBS_DTYPE_MISMATCH), an action mask that is not 0/1 (INVALID_ACTION_MASK) or
    allows nothing (ACTION_MASK_EMPTY: no action could be sampled). Other spaces: finite_observation."""
    if not is_composite(space):
        return finite_observation(observation, what, arena)
    if isinstance(observation, np.ndarray):  # (already its flat row: checked all the same)
        row = observation.astype(np.float32).reshape(-1)
        if row.size != space.flat_dim:
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"{what} has {row.size} values; the flat row of "
                                    f"its Dict or Tuple space has {space.flat_dim} (or pass its leaves by name)")
    else:
        row = flatten_observation(space, observation)
    if not np.isfinite(row).all():
        bad = int(np.flatnonzero(~np.isfinite(row))[0])
        leaf = next(leaf for leaf in space.leaves if leaf.offset <= bad < leaf.offset + leaf.size)
        raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"{what} leaf {leaf.path!r} holds a NaN or infinite value")
    for leaf in space.leaves:
        if leaf.is_bytes:
            check_byte_values(row[leaf.offset:leaf.offset + leaf.size], leaf.space, f"{what} leaf {leaf.path!r}")
    if mask is not None:
        refusal = mask.why_not_actable(mask.of_rows(row[None])[0])
        if refusal is not None:
            raise InvalidInputError(refusal[0], f"{what}: {refusal[1]}")
    return row


def check_byte_values(obs: np.ndarray, space: Any, what: str) -> None:
    """A uint8 Box (§8.1) takes integers 0-255 only: anything else is refused here, by name, as the
    server would refuse the whole batch for it (OBS_DTYPE_MISMATCH)."""
    if not (isinstance(space, Box) and space.is_bytes) or obs.dtype.char == "B" or obs.size == 0:
        return  # (the cheapest test first: most observations are floats of a float box)
    wrong = (obs < 0) | (obs > 255) | (obs != np.round(obs))
    if wrong.any():
        bad = int(np.flatnonzero(wrong.ravel())[0])
        raise InvalidInputError(ErrorCode.OBS_DTYPE_MISMATCH, f"{what}[{bad}] is {obs.ravel()[bad]}: the observation "
                                f"space is a uint8 Box (integers 0-255)")


def finite_reward(reward: Any, what: str = "reward") -> float:
    value = float(reward)
    if not math.isfinite(value):
        raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"{what} is not finite ({value})")
    return value


class BaseClient:
    """Shared machinery; see ``TetherClient`` and ``MultiAgentClient``.

    Args:
        seed: seeds the client's action sampler (one generator for the
            client's whole life, whatever models are swapped in).
        wait_for_weights: against an on-policy server, wait after every batch
            for the weights that answer it (strict on-policy, the engine blocks
            for the update). False: keep acting with the current model while
            the batch is in flight (the server's max_staleness bounds the lag).
            None (default): False, except against a plain RLlink v1 server
            (RLlib's, which has no max_staleness), where it is True.
        connect_timeout_s: limit of one TCP connect attempt.
        response_timeout_s: limit of every answer (PONG, SET_CONFIG, SET_STATE
            for GET_STATE, AGENT_MODULES).
        update_timeout_s: limit of the answer to EPISODES_AND_GET_STATE, and
            of the GET_STATE that acknowledges an off-policy EPISODES; both may
            wait for a learner update (the server's pool to have room).
        max_queued_steps: agent steps that may wait behind the batch in
            flight; beyond that the oldest waiting batches are dropped
            (``batches_dropped``). None: (max_staleness + 1) * train_batch_size
            of the server's SET_CONFIG (more would be too stale to train on), or
            2 * env_steps_per_sample when the server does not say.
        max_queued_batches: a hard cap on waiting batches (memory), same policy.
        when_queue_full: "drop_oldest" (default: get_action never waits; the
            server sees a partial episode where a batch was dropped) or "wait"
            (backpressure: the engine waits for room, so every step is
            delivered, at the server's pace).
        max_batch_attempts: connections a batch is sent on before it is given
            up (its connection lost before the answer every time, as with a
            batch that takes the server down), raised as
            ``TetherConnectionError``; the rest of its episodes is not sent.
        offline_policy: **[§20]** the path of an offline policy file (a server's
            ``offline_policy.json``): the client connects to no server and acts
            with the file's configuration and models; nothing is recorded for
            training or sent (demonstrations are still written). ``host``,
            ``port`` and the connection options are then unused.
    """

    def __init__(
        self,
        host: str,
        port: int,
        client_name: str,
        auth_token: str | None,
        reconnect_timeout_s: float,
        seed: int | None,
        verbose: bool,
        wait_for_weights: bool | None,
        connect_timeout_s: float,
        response_timeout_s: float,
        update_timeout_s: float,
        max_queued_steps: int | None,
        max_queued_batches: int,
        when_queue_full: str = "drop_oldest",
        max_batch_attempts: int = 5,
        offline_policy: str | Path | None = None,
    ) -> None:
        if when_queue_full not in ("drop_oldest", "wait"):
            raise ValueError(f"when_queue_full must be 'drop_oldest' or 'wait', got {when_queue_full!r}")
        self.when_queue_full = when_queue_full
        self._rng = random.Random(seed)
        #: Where recorded image observations are copied to (see observation_arena.py).
        self._arena = ObservationArena()
        #: Records carry raw Box samples (1.3); clipped ones for an older server (§11.4).
        self._raw_box_samples = True
        self.wait_for_weights = wait_for_weights
        #: PONG and SET_CONFIG of the connection whose state is applied.
        self.server_info: dict[str, Any] = {}
        self.server_config: dict[str, Any] = {}
        #: **[1.8]** The server run of that connection (PONG run_id; None: not named), and whether it
        #: is another run than the connection's before (§6.5).
        self._run_id: str | None = None
        self._run_changed = False
        #: **[1.8]** Recorded steps not cut yet that were let go at a reconnect to another server run.
        self._other_run_unsent_dropped = 0
        self._steps_per_sample = 500
        #: Agent steps delivered to the server (stored, or answered as a duplicate).
        self.agent_steps_sent = 0
        #: Training episodes played without being recorded, as the server's record_share asked (§13.2).
        self.episodes_held_back = 0
        #: Steps played in held-back episodes since the last cut: they count toward the batch cadence.
        self._held_steps = 0
        #: **[§20]** Whether the client acts from an offline policy file, with no server.
        offline_policy = offline_policy or None  # (an empty path is none, as in every SDK)
        self.offline = offline_policy is not None
        self.link: ServerLink = OfflineLink(offline_policy, self._state_request, self._prepare_state, verbose,
                                            multi_agent=self._multi_agent) \
            if offline_policy is not None else ServerLink(
                host, port, client_name, auth_token, reconnect_timeout_s, self._state_request, self._prepare_state,
                connect_timeout_s=connect_timeout_s, response_timeout_s=response_timeout_s,
                update_timeout_s=update_timeout_s, max_queued_steps=max_queued_steps,
                max_queued_batches=max_queued_batches, max_batch_attempts=max_batch_attempts, verbose=verbose,
            )
        #: **[1.7]** The environment parameter set the engine plays with now (§19); None until the server
        #: sends one. Swapped in on the engine thread, like a model.
        self.env_params: EnvParams | None = None
        self._env_params_callbacks: list[Callable[[EnvParams], None]] = []
        self._events = self.link.events
        try:
            self.link.start()
            self._sync()
        except BaseException as exc:
            self.link.close()
            if isinstance(self.link, OfflineLink):
                raise self.link.refusal(exc) from exc
            raise

    #: Whether the client speaks the multi-agent form (per-module configuration and models).
    _multi_agent = False
    #: Recorded agent steps not yet cut, and connections made so far (kept by each client).
    _pending_steps: int
    _connection: int

    # -- hooks of the two clients ------------------------------------------------------

    def _state_request(self, initial: bool) -> dict[str, Any]:
        """GET_STATE for the I/O thread (``initial``: right after a (re)connect)."""
        raise NotImplementedError

    def _prepare_state(self, config: dict[str, Any], state: dict[str, Any]) -> Any:
        """Decode the models of a SET_STATE (runs on the I/O thread)."""
        raise NotImplementedError

    def _on_connected(self) -> None:
        """A (new) connection's SET_CONFIG was applied to ``server_config``."""

    def _apply_state(self, prepared: Any) -> None:
        """Swap in what ``_prepare_state`` made (engine thread)."""
        raise NotImplementedError

    def _collect_records(self) -> tuple[list[dict[str, Any]], int, int]:
        """Cut the complete steps: (records, env_steps, agent_steps)."""
        raise NotImplementedError

    def _take_claim(self) -> dict[str, Any]:
        """The weights version(s) the cut steps were computed with; starts the next claim."""
        raise NotImplementedError

    def _forget_episodes(self, episode_ids: set[str]) -> None:
        """Episodes whose steps were dropped unsent: record none of their later steps."""

    def _count_sent(self, batch: Batch) -> None:
        self.agent_steps_sent += batch.agent_steps

    @property
    def other_run_steps_dropped(self) -> int:
        """**[1.8]** Agent steps not sent because they were acted with the weights of another server
        run (the server restarted without resuming, §6.5): those not cut yet when the engine learnt of
        the new run, and those of batches cut before it."""
        return self._other_run_unsent_dropped + self.link.other_run_steps_dropped

    @property
    def redirects(self) -> int:
        """**[1.9]** Redirects to another rank of a server group this client followed (§6.7)."""
        return self.link.redirects

    @property
    def server_address(self) -> str:
        """The address of the server (of a group: the rank) this client is, or was last, connected to
        (a handshake completed there); the given address before the first connection."""
        return self.link.connected_address

    # -- connection facts ------------------------------------------------------------

    @property
    def env_steps_per_sample(self) -> int:
        return self._steps_per_sample

    @property
    def force_on_policy(self) -> bool:
        return bool(self.server_config.get("force_on_policy", True))

    @property
    def reconnects(self) -> int:
        return self.link.reconnects

    @property
    def client_session(self) -> str:
        """This client's session id (protocol 1.3), kept across reconnects."""
        return self.link.client_session

    @property
    def record_share(self) -> float:
        """The share of new training episodes this client records, as the server last asked
        (SET_STATE record_share, §13.2; 1 until it asks for less)."""
        return self.link.record_share

    @property
    def training_done(self) -> dict[str, Any] | None:
        """None while training goes on; once the server said the run is done (TRAINING_DONE,
        §6.6), its summary (reason, env_steps, agent_steps_trained, updates, return_mean, ...).
        Not an error: actions keep coming from the last model; nothing is recorded or sent."""
        return self.link.training_done

    @property
    def steps_per_batch(self) -> int:
        """Training steps played per batch: env_steps_per_sample, or fewer while the server
        holds clients back and asks for smaller, fresher batches (SET_STATE steps_per_batch, §13.2)."""
        return self._batch_steps()

    @property
    def steps_refused_stale(self) -> int:
        """Agent steps the server did not store because an update would have taken them only
        once older than its max_staleness (it says so in its answers, §13.2): data collected
        faster than the server trains. Cumulative over reconnects."""
        return self.link.steps_refused_stale

    @property
    def batches_dropped(self) -> int:
        """Batches dropped unsent because the queue behind the batch in flight was full."""
        return self.link.batches_dropped

    @property
    def waits_for_weights(self) -> bool:
        """Whether a batch makes the engine wait for the weights that answer it."""
        if not self.force_on_policy or self.offline:
            return False
        if self.wait_for_weights is not None:
            return self.wait_for_weights
        return "protocol_version" not in self.server_info  # a plain RLlink v1 server (RLlib's)

    # -- events from the I/O thread --------------------------------------------------

    def _sync(self) -> None:
        """Apply what the I/O thread reported, in order; raise the first error
        (later ones are raised by the next calls; a fatal one by every call)."""
        errors: list[BaseException] = []
        params_changed = False
        for event in self.link.take_events():
            kind = event[0]
            if kind == "fatal":
                if errors:
                    break
                raise event[1]
            if kind == "connected":
                self.server_info, self.server_config = event[1], event[2]
                run_id = run_id_of(self.server_info)
                #: **[1.8]** Whether this connection reached another server run than the last one (§6.5).
                self._run_changed = from_another_run(self._run_id, run_id)
                self._run_id = run_id
                self._raw_box_samples = self.link.speaks_1_3
                self._steps_per_sample = int(self.server_config.get("env_steps_per_sample", 500))
                self._on_connected()
                self._apply_state(event[3])
            elif kind == "state":
                self._apply_state(event[1])
            elif kind == "env_params":  # (None: the server has no parameters, §19.2)
                params_changed |= event[1] is not self.env_params
                self.env_params = event[1]
            elif kind == "batch":
                batch = event[1]
                if batch.other_run:
                    pass  # (acted with another run's weights: not sent, counted by the link, §6.5)
                elif batch.error is not None:
                    errors.append(batch.error)
                    # The rest of a refused batch's episodes is not sent either: the
                    # server must not take a fragment for a whole episode.
                    self._forget_episodes({str(r.get("episode_id")) for r in batch.episodes})
                else:
                    self._count_sent(batch)
            elif kind == "error":
                errors.append(event[1])
            elif kind == "done":  # the end of training (§6.6): no error; the last model keeps acting
                logger.info("training is done: %s", event[1])
        if params_changed:  # once, every event applied, with the set held now (§19.2)
            for callback in list(self._env_params_callbacks):
                callback(self.env_params)
        if errors:
            self.link.put_back_errors(errors[1:])
            raise errors[0]

    # -- environment parameters (§19) ------------------------------------------------------

    def on_env_params_changed(self, callback: Callable[[EnvParams | None], None]) -> None:
        """Call ``callback(params)`` when parameter sets are swapped in: on the engine's thread, once per
        client call that swapped any in (``start_episode``, ``get_action``, ...), after all of that
        call's events are applied, with the set held then (None: a server without parameters, §19.2).
        An exception it raises comes out of that call. If the client already holds a set,
        ``callback`` is called with it at once. Callbacks add up."""
        self._env_params_callbacks.append(callback)
        if self.env_params is not None:
            callback(self.env_params)

    def _episode_with_params(self, episode_id: str) -> Any:
        """The episode's state object (it has ``env_params`` and ``measure``); KeyError if unknown."""
        raise NotImplementedError

    def _draw_episode_params(self) -> tuple[int, dict[str, float]] | None:
        """A new episode's values, drawn from the current set with the client's generator (§19.1)."""
        if self._events:
            self._sync()
        params = self.env_params
        return None if params is None else (params.seq, draw_all(params.values, self._rng.random))

    def episode_params(self, episode_id: str) -> dict[str, float]:
        """The values the episode plays with (§19.1): each parameter's number, or what its sampler gave
        when the episode started; empty when the server sent no parameters before it started."""
        drawn = self._episode_with_params(episode_id).env_params
        return {} if drawn is None else dict(drawn[1])

    def report_measure(self, episode_id: str, value: float) -> None:
        """Report the episode's measure for a curriculum that advances on reported values (§19.3): sent
        with the episode's last record; a later report replaces an earlier one. Report it before
        ``end_episode``: an ended episode is refused (``ValueError``), an unknown one is a ``KeyError``."""
        episode = self._episode_with_params(episode_id)
        if episode.done:
            raise ValueError(f"episode {episode_id!r} has ended: report its measure before end_episode")
        try:
            episode.measure = measure_value(value)
        except EnvParamsError as exc:
            raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, str(exc)) from None

    # -- the one sending path ----------------------------------------------------------

    def _recording(self, training_enabled: bool) -> tuple[bool, bool]:
        """How a new episode is played: (recorded, held back). A training episode is recorded with
        the probability record_share gives, else held back (played alike, never sent, §13.2); an
        evaluation episode, any episode once training is done, or any episode of an offline client (§20),
        is neither."""
        if not training_enabled or self.offline or self.link.training_done is not None:
            return False, False  # (nothing is sent once training is done either, §6.6)
        recorded = self._records_episode()
        return recorded, not recorded

    def _records_episode(self) -> bool:
        """Whether a new training episode is recorded: with the probability the server's
        record_share gives (§13.2); a held-back episode is played but never sent."""
        share = self.link.record_share
        if share >= 1.0 or self._rng.random() < share:
            return True
        self.episodes_held_back += 1
        return False

    def _batch_steps(self) -> int:
        """Steps per batch: env_steps_per_sample, or fewer when the server asks (SET_STATE steps_per_batch, §13.2)."""
        every = self.link.steps_per_batch
        return self._steps_per_sample if every is None else min(every, self._steps_per_sample)

    def _cadence_due(self, sendable: Callable[..., int], *args: Any) -> bool:
        """With held-back episodes, a batch is due every steps_per_batch steps played (§13.2):
        held-back steps plus recorded ones, waiting and sendable (``sendable(*args)``) alike. The
        sendable count walks every open episode, so it is asked for only when steps are held."""
        if self._held_steps == 0:
            return False
        need = self._batch_steps() - self._held_steps
        return self._pending_steps >= need and sendable(*args) >= need

    def _send_batch(self, even_empty: bool = False) -> None:
        """Cut the complete steps and hand them to the I/O thread; in strict
        on-policy mode, wait for the weights that answer them. ``even_empty``:
        send the batch when nothing was recorded too (held-back episodes), since
        its answer brings the current weights and record_share."""
        records, env_steps, agent_steps = self._collect_records()
        self._held_steps = 0
        if self.link.training_done is not None:  # nobody to send to (§6.6): the steps are let go
            self.link.batches_unsent_at_end += bool(records)
            return
        if not records and not even_empty:
            return
        batch = Batch(records, env_steps, agent_steps, self._take_claim(), connection=self._connection,
                      forms=self.link.observation_forms())
        waited = self.when_queue_full == "wait" and not self.link.has_room(agent_steps)
        if waited:
            # The steps are cut: they are queued whatever errors arrive meanwhile
            # (raised once the batch is queued), so backpressure never loses a batch.
            self.link.wait_for(lambda: self.link.has_room(agent_steps), until_error=False)
        gone = self.link.submit(batch)
        if gone:
            self._forget_episodes(gone)
        if waited:
            self._sync()
        if self.waits_for_weights:
            self.link.wait_for(lambda: batch.done)
            self._sync()

    def flush(self) -> None:
        """Send whatever experience is complete now and wait until the server
        has every batch (raises a refusal or timeout as it arrives)."""
        self._sync()
        self._send_batch()
        self.link.wait_for(self.link.idle)
        self._sync()

    def refresh_weights(self) -> None:
        """Ask for the current weights now (GET_STATE) and swap them in; waits
        for the answer. Raises errors the server sent for earlier batches."""
        self._sync()
        self.link.request(lambda: self._state_request(False))
        self._sync()

    def close(self) -> None:
        """Stop the I/O thread and close the connection. Experience not yet
        delivered is dropped: call ``flush()`` first to deliver it."""
        self.link.close()

    def __enter__(self) -> "BaseClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
