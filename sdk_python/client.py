"""TetherClient: an engine-side client in the shape of RLlib's ExternalEnv.

The engine keeps its own loop and calls::

    client = TetherClient("127.0.0.1", 5555)
    eid = client.start_episode()
    action = client.get_action(eid, obs)        # local ONNX inference, microseconds
    client.log_returns(eid, reward)
    client.end_episode(eid, final_obs)          # or truncated=True at a time limit

``get_action`` never waits for the network: every ``env_steps_per_sample``
steps (the server's SET_CONFIG) the complete steps are handed to the client's
one background I/O thread, which sends them and receives new weights; a new
model is swapped in between two calls. ``wait_for_weights=True`` makes each
batch wait for the weights that answer it (strict on-policy). Lost connections
are re-established with backoff and an unanswered batch is sent again with
the same ``client_session`` and ``batch_seq``, so a server restart costs no
data and a 1.3 server stores every batch once.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np

from .base_client import BaseClient, check_byte_values, finite_observation, finite_reward, observation_row
from .episode_recorder import EpisodeRecorder, same_space
from .policy import OnnxPolicy
from tether.protocol.action_mask import ActionMask, resolve_action_mask
from tether.protocol.distributions import deterministic, sample_for_record
from tether.protocol.logged_actions import checked_logged_action
from tether.protocol.episodes import StateSpec
from tether.protocol.multi_agent import recurrent_state_from_json
from tether.protocol.errors import ErrorCode, InvalidInputError, MessageError, NotReadyError, TetherConnectionError  # noqa: F401
from tether.protocol.messages import MessageType
from tether.protocol.onnx_codec import decode_onnx
from tether.protocol.spaces import Space, from_gymnasium, space_from_json
from .server_link import Batch
from .demonstrations import DemoWriter
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.policy_mapping import PolicyMapping

#: The module a single-agent client's demonstrations are written for when the server names none (v1, 1.1).
DEFAULT_DEMO_MODULE = "default_policy"


class TetherClient(BaseClient):
    """Connects to a Tether (or any RLlink v1) server and acts locally.

    Args:
        host, port: the server's address.
        client_name: shown in the server's logs.
        auth_token: sent in PING when the server requires one.
        observation_space, action_space: gymnasium or Tether spaces; needed only
            when the server does not describe them (RLlib's own v1 server).
        reconnect_timeout_s: how long to keep retrying a lost server before
            raising ``TetherConnectionError``.
        seed: seed for action sampling.
        wait_for_weights, connect_timeout_s, response_timeout_s,
        update_timeout_s, max_queued_steps, max_queued_batches,
        when_queue_full, max_batch_attempts, offline_policy: see ``BaseClient``
        (``TetherClient(offline_policy="run/offline_policy.json")`` acts with no server).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5555,
        client_name: str = "tether-python",
        auth_token: str | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        reconnect_timeout_s: float = 60.0,
        seed: int | None = None,
        verbose: bool = False,
        wait_for_weights: bool | None = None,
        connect_timeout_s: float = 10.0,
        response_timeout_s: float = 60.0,
        update_timeout_s: float = 600.0,
        max_queued_steps: int | None = None,
        max_queued_batches: int = 64,
        when_queue_full: str = "drop_oldest",
        max_batch_attempts: int = 5,
        offline_policy: str | Path | None = None,
    ) -> None:
        self._user_obs_space: Space | None = from_gymnasium(observation_space) if observation_space is not None else None
        self._user_action_space: Space | None = from_gymnasium(action_space) if action_space is not None else None
        self._episodes: dict[str, EpisodeRecorder] = {}
        self._finished: list[EpisodeRecorder] = []
        self._pending_steps = 0
        self.policy: OnnxPolicy | None = None
        self.weights_seq_no: int | None = None
        #: Connections made so far: weights numbers are comparable only within one (a
        #: server restarted without resuming counts from 0 again), so steps are stamped
        #: (connection, weights_seq_no) and the earliest connection's oldest version is claimed.
        self._connection = 0
        #: The oldest stamp of the steps cut last (what their batch claims).
        self._cut_oldest: tuple[int, int] | None = None
        self._io_seq: int | None = None  # the I/O thread's view, for its GET_STATE
        self.observation_space: Space | None = None
        self.action_space: Space | None = None
        self._action_mask: ActionMask | None = None
        self._recurrent_state: tuple[StateSpec, ...] = ()
        #: compute_action's evaluation episode (a model with memory's state), one at a time.
        self._evaluation: EpisodeRecorder | None = None
        #: Env steps delivered to the server.
        self.env_steps_sent = 0
        #: **[1.6]** The demonstration file written while playing (record_demonstrations), else None.
        self._demos: DemoWriter | None = None
        #: Episodes already running when the demonstration file was opened: never written (not whole).
        self._demo_partial: set[str] = set()
        self._demo_module = DEFAULT_DEMO_MODULE
        super().__init__(host, port, client_name, auth_token, reconnect_timeout_s, seed, verbose, wait_for_weights,
                         connect_timeout_s, response_timeout_s, update_timeout_s, max_queued_steps,
                         max_queued_batches, when_queue_full, max_batch_attempts, offline_policy)

    # -- state (prepared on the I/O thread, applied on the engine thread) -------------------

    def _state_request(self, initial: bool) -> dict[str, Any]:
        if initial:
            return {"type": MessageType.GET_STATE.value}
        return {"type": MessageType.GET_STATE.value, "weights_seq_no": self._io_seq}

    def _prepare_state(self, config: dict[str, Any], state: dict[str, Any]) -> tuple[Any, OnnxPolicy | None]:
        seq = state.get("weights_seq_no")
        policy = None
        if "onnx_file" in state:
            action_space = space_from_json(config["action_space"]) if "action_space" in config else self._user_action_space
            names_in = config.get("onnx_input_names") or [None]
            names_out = config.get("onnx_output_names") or [None]
            obs_space = space_from_json(config["observation_space"]) if "observation_space" in config else None
            policy = OnnxPolicy(decode_onnx(state["onnx_file"]), action_space, names_in[0], names_out[0],
                                observation_space=obs_space or self._user_obs_space,
                                recurrent_state=recurrent_state_from_json(config.get("recurrent_state"), "default"))
        if isinstance(seq, int):
            self._io_seq = seq
        return seq, policy

    def _on_connected(self) -> None:
        self._connection += 1
        config = self.server_config
        spaces = (self.observation_space, self.action_space)
        self.observation_space = (
            space_from_json(config["observation_space"]) if "observation_space" in config else self._user_obs_space
        )
        self.action_space = space_from_json(config["action_space"]) if "action_space" in config else self._user_action_space
        #: **[1.4]** The leaf that masks actions (§11.6), checked before sampling.
        try:
            self._action_mask = (resolve_action_mask(self.observation_space, self.action_space, config["action_mask"])
                                 if config.get("action_mask") else None)
        except (ValueError, TypeError) as exc:  # (a server's action_mask that cannot mask its spaces, §9.1)
            raise MessageError(ErrorCode.INVALID_FIELD, f"SET_CONFIG action_mask: {exc}") from None
        recurrent = self._recurrent_state
        #: **[1.5]** The default module's recurrent state (§12.1); empty without memory.
        self._recurrent_state = recurrent_state_from_json(config.get("recurrent_state"), "default")
        if any(old is not None and new is not None and not same_space(old, new)
               for old, new in zip(spaces, (self.observation_space, self.action_space))) or (
                self._connection > 1 and recurrent != self._recurrent_state):
            # A new connection's server describes other spaces (§6.5): the model cannot serve them
            # (NotReadyError until this connection's arrives) and the steps not cut yet do not fit
            # them. They are dropped, as every SDK does; the open episodes go on, each one's next
            # chunk starting from its next observation, and the ended ones not cut yet send nothing.
            self.stop_demonstrations()  # (its header's spaces are no longer the episodes', §18)
            self.policy = None
            self.weights_seq_no = None
            self._evaluation = None
            dropped = self._drop_unsent_steps()
            if self._run_changed:  # (**[1.8]** another run as well: its steps count as another run's, §6.5)
                self._other_run_unsent_dropped += dropped
        elif self._run_changed:
            # **[1.8]** Another server run (§6.5): the steps not cut yet were acted with weights whose
            # versions name other weights in this run. They are dropped and counted; the model stays
            # until this connection's replaces it (it comes with the connection).
            self._other_run_unsent_dropped += self._drop_unsent_steps()
            self._evaluation = None  # (its state came from another run's model: the next evaluation starts from zeros)

    def _drop_unsent_steps(self) -> int:
        """Let go of every training episode's steps not cut yet (the open episodes go on, each
        one's next chunk starting from its next observation; the ended ones send nothing) and
        start recurrent states from zeros; returns how many steps went."""
        dropped = sum(e.pending_steps for e in self._finished) + sum(
            e.pending_steps for e in self._episodes.values() if e.training_enabled)
        self._finished.clear()
        for episode in self._episodes.values():
            episode.state = None  # (a state of another model: the next step starts from zeros)
            if episode.training_enabled:
                episode.drop_unsent()
        self._pending_steps = 0
        return dropped

    def _apply_state(self, prepared: tuple[Any, OnnxPolicy | None]) -> None:
        seq, policy = prepared
        if policy is not None:
            self.policy = policy
            if self.action_space is None:
                self.action_space = policy.action_space
        if isinstance(seq, int):
            self.weights_seq_no = seq

    def _forget_episodes(self, episode_ids: set[str]) -> None:
        for episode_id in episode_ids:
            episode = self._episodes.get(episode_id)
            if episode is not None:
                episode.stop_training()
        self._pending_steps = sum(e.pending_steps for e in self._episodes.values() if e.training_enabled)

    def _count_sent(self, batch: Batch) -> None:
        super()._count_sent(batch)
        self.env_steps_sent += batch.env_steps

    # -- ExternalEnv API -----------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Begin an episode; returns its id. Episodes may overlap."""
        if self._events:
            self._sync()
        episode_id = episode_id or uuid.uuid4().hex
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} is already running")
        recorded, held_back = self._recording(training_enabled)
        recorder = EpisodeRecorder(episode_id, recorded, held_back=held_back)
        recorder.env_params = self._draw_episode_params()
        self._episodes[episode_id] = recorder
        return episode_id

    def _episode_with_params(self, episode_id: str) -> EpisodeRecorder:
        return self._episodes[episode_id]

    def get_action(self, episode_id: str, observation: Any) -> Any:
        """Record an observation and return the policy's sampled action for it.

        Computes locally and returns without waiting for the network (unless
        ``wait_for_weights`` is set and a batch just completed). Raises, once,
        an error the server sent for an earlier batch.
        """
        return self._act(episode_id, observation, False, None)

    def log_action(self, episode_id: str, observation: Any, action: Any) -> None:
        """**[1.6]** Record a step whose action the policy did not choose (a human player, a scripted bot,
        another controller: RLlib's ``log_action``), marked as logged (§10.1); mixes freely with
        ``get_action`` in one episode, and rewards logged after it go to it.

        The server learns from it without taking it for a sample of its policy (§13.7). The model is
        still evaluated on the observation (a model with memory advances its state, §12.4). Refused,
        with nothing recorded: an action outside the action space or forbidden by the observation's
        action mask (``InvalidInputError``), and any logged action while the server is older than 1.6
        (``NotReadyError``: it would train on the step as a sample of its policy).
        """
        self._act(episode_id, observation, True, action)

    def _act(self, episode_id: str, observation: Any, logged: bool, logged_action: Any) -> Any:
        """get_action's step, or (``logged``) log_action's with ``logged_action``, checked here before
        anything is sent or recorded."""
        if self._events:
            self._sync()
        if logged:
            if not self.link.speaks(1, 6):
                raise NotReadyError(f"the server speaks protocol {self.link.server_info.get('protocol_version')}: "
                                    "logged actions need 1.6 or later (an older server would train on them as the "
                                    "policy's own samples)")
            space = self.action_space
            if space is None:
                raise NotReadyError("the server has sent no action space yet")
            obs = observation_row(observation, self.observation_space, self._action_mask, arena=self._arena)
            logged_action = checked_logged_action(space, logged_action, self._action_mask, obs)
            episode = self._episodes[episode_id]
        else:  # (an unknown episode is refused before its observation is looked at)
            episode = self._episodes[episode_id]
            obs = observation_row(observation, self.observation_space, self._action_mask, arena=self._arena)
        self._check_size(obs)
        sent = False
        # (the held-back cadence is looked at only while steps are held back: the common step skips a call)
        if episode.training_enabled and (self._held_steps and self._cadence_due(self._sendable_steps, episode) or (
                self._pending_steps >= self._batch_steps()
                and self._sendable_steps(episode) >= self._batch_steps())):
            episode.obs.append(obs)  # lets the cut include the step that led here
            try:
                sent = True
                self._send_batch(even_empty=True)
            finally:
                # (a dropped episode's steps are gone already, and so are those of a new connection's
                # other spaces, this observation included)
                if episode.training_enabled and episode.obs and episode.obs[-1] is obs:
                    episode.obs.pop()
        elif episode.held_back and self._cadence_due(self._sendable_steps, episode):
            sent = True
            self._send_batch(even_empty=True)
        policy = self.policy
        if policy is None:
            raise NotReadyError("the server has sent no model yet")
        if sent:
            self._check_size(obs)  # (sending may have applied a new connection with other spaces: nothing is recorded)
            if logged:  # (and its server may be older, or its action space another)
                if not self.link.speaks(1, 6):
                    raise NotReadyError("the server this client reconnected to is older than protocol 1.6: logged "
                                        "actions need 1.6 or later")
                logged_action = checked_logged_action(policy.action_space, logged_action, self._action_mask, obs)
        state = None
        if policy.state_shape is not None:
            state = self._state_of(episode, policy)
            dist, episode.state = policy.step_own(obs, state)
        else:
            dist = policy.dist_inputs_one(obs)
        if not logged:
            action, logp, env_action = sample_for_record(policy.action_space, dist, self._rng, self._raw_box_samples)
        else:  # (no behaviour logp: the server does not use it at a logged step, §13.7)
            action, logp, env_action = logged_action, 0.0, logged_action
        stamp = (self._connection, self.weights_seq_no) if isinstance(self.weights_seq_no, int) else None
        episode.record_step(obs, action, logp, dist, stamp, state, logged)
        if self._demos is not None and episode_id not in self._demo_partial:
            self._demos._step(episode_id, "default_agent", self._demo_module, obs, action, logged)
        if episode.training_enabled:
            self._pending_steps += 1
        elif episode.held_back:
            self._held_steps += 1
        return env_action

    def _state_of(self, episode: EpisodeRecorder, policy: OnnxPolicy) -> list[np.ndarray]:
        """The state the episode's next step starts from (§12.1): zeros at its first step; kept when a new
        model has a state of the same shape; zeros again, and its steps not sent yet let go (their states
        belong to another model), when the shape changed."""
        if not policy.fits(episode.state):
            if episode.state is not None and episode.training_enabled:
                self._pending_steps -= episode.pending_steps
                episode.drop_unsent()
            episode.state = policy.initial_state()
        return episode.state  # type: ignore[return-value]

    def _check_size(self, obs: np.ndarray) -> None:
        space = self.observation_space
        if space is not None and obs.size != space.flat_dim:
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"the observation has {obs.size} values, "
                                    f"the observation space needs {space.flat_dim}")
        check_byte_values(obs, space, "observation")

    def compute_action(self, observation: Any, episode_id: str = "") -> Any:
        """The deterministic (greedy) action for an observation; records nothing.

        **[1.5]** A model with memory remembers per episode (§12.4): ``episode_id`` names a running episode
        that is not recorded (started with ``training_enabled=False``, or held back), whose state this call
        advances as ``get_action`` does, or an evaluation episode of the caller's (its state starts from
        zeros at its first call; one evaluation episode is remembered at a time, so give each its own id).
        A running episode whose steps are recorded is refused (``ValueError``): a step it did not record
        would break the states the server recomputes from its records."""
        if self._events:
            self._sync()
        policy = self.policy
        if policy is None:
            raise NotReadyError("the server has sent no model yet")
        obs = observation_row(observation, self.observation_space, self._action_mask)
        self._check_size(obs)
        if policy.state_shape is None:
            return policy.act_deterministic(obs)
        episode = self._episodes.get(episode_id)
        if episode is not None and episode.training_enabled:
            raise ValueError(f"episode {episode_id!r} is being recorded: a greedy step would be missing from its "
                             f"record; use get_action, or compute_action with another episode id")
        if episode is None:
            if self._evaluation is None or self._evaluation.episode_id != episode_id:
                self._evaluation = EpisodeRecorder(episode_id, False)
            episode = self._evaluation
        dist, episode.state = policy.step_own(obs, self._state_of(episode, policy))
        return deterministic(policy.action_space, dist)

    def log_returns(self, episode_id: str, reward: float, info: dict | None = None) -> None:
        """Add reward to the episode's last action (rewards accumulate until the next action).
        A NaN or infinite reward, or one that would take the step's reward beyond float32 (§10.5),
        is refused (``InvalidInputError``, NON_FINITE_VALUE) and nothing is added."""
        value = finite_reward(reward)
        self._episodes[episode_id].add_reward(value)
        if self._demos is not None:
            try:
                self._demos.add_reward(episode_id, "default_agent", value)
            except InvalidInputError:  # (beyond float32: left out of the file, which the reader would refuse, as every SDK does)
                pass

    def record_demonstrations(self, path: str | Path) -> DemoWriter:
        """**[1.6]** Write every episode played from now on — its steps sampled, logged (``log_action``) or
        both — to the demonstration file ``path`` (§18), one line as each ends, in the spaces of the
        server's default module; episodes already running are not written (they would not be whole).
        Returns the writer; ``stop_demonstrations`` (or ``close``) closes it."""
        if self.observation_space is None or self.action_space is None:
            raise NotReadyError("the server has not described its spaces yet")
        self.stop_demonstrations()
        config = self.server_config
        module = DEFAULT_DEMO_MODULE
        if config.get("policy_mapping"):
            module = PolicyMapping.from_json(config["policy_mapping"]).module_for("default_agent")
        spec = ModuleSpec(module, self.observation_space, self.action_space,  # type: ignore[arg-type]
                          action_mask_leaf=config.get("action_mask") or None)
        self._demo_module = module
        self._demos = DemoWriter(path, {module: spec})
        self._demo_partial = set(self._episodes)
        return self._demos

    def close(self) -> None:
        """As ``BaseClient.close``; a demonstration file being written is closed too."""
        self.stop_demonstrations()
        super().close()

    def stop_demonstrations(self) -> None:
        """Close the demonstration file, if one is written (its running episodes written truncated)."""
        if self._demos is not None:
            self._demos.close()
            self._demos = None

    def end_episode(self, episode_id: str, observation: Any, truncated: bool = False) -> float:
        """Finish an episode with its last observation; returns its total reward.

        ``truncated=True`` marks an end by time limit (the value is bootstrapped);
        otherwise the episode terminated.
        """
        if self._events:
            self._sync()
        # (refused before the episode ends; a final observation's mask may allow nothing: no action follows it)
        final = observation_row(observation, self.observation_space, None, "final observation")
        self._check_size(final)
        episode = self._episodes.pop(episode_id)
        episode.finish(final, truncated)
        if self._demos is not None:
            self._demos.end(episode_id, "default_agent", final, terminated=not truncated)
        self._demo_partial.discard(episode_id)
        if episode.training_enabled and episode.pending_steps:
            self._finished.append(episode)
        return episode.total_return

    # -- cutting -------------------------------------------------------------------

    def _sendable_steps(self, current: EpisodeRecorder) -> int:
        """Steps a send would carry now: every other open episode holds back its
        last action until its next observation. RLlib's server waits for a full
        ``env_steps_per_sample`` batch, so sending fewer would stall it."""
        held = sum(
            1
            for e in self._episodes.values()
            if e is not current and e.training_enabled and e.actions and len(e.obs) == len(e.actions)
        )
        return self._pending_steps - held

    def _collect_records(self) -> tuple[list[dict[str, Any]], int, int]:
        records = []
        versions: list[tuple[int, int]] = []
        cut_from = [*self._finished, *(e for e in self._episodes.values() if e.training_enabled)]
        self._finished.clear()
        for episode in cut_from:
            cut = episode.cut(self._connection, tuple(spec.input for spec in self._recurrent_state))
            if cut is not None:
                records.append(cut[0])
                if cut[1] is not None:
                    versions.append(cut[1])
        self._cut_oldest = min(versions) if versions else None
        self._pending_steps = sum(e.pending_steps for e in self._episodes.values() if e.training_enabled)
        steps = sum(len(r["actions"]) for r in records)
        return records, steps, steps

    def _take_claim(self) -> dict[str, Any]:
        # The oldest version of the steps cut, held-back steps of other episodes included (§7.6).
        claim = self._cut_oldest[1] if self._cut_oldest is not None else self.weights_seq_no
        return {"weights_seq_no": claim}
