"""MultiAgentClient: many agents, several modules, one connection.

The engine speaks of its own agents in PettingZoo-style dicts keyed by agent
id; the client maps each new agent to a module (locally from the server's
rules, or with one MAP_AGENTS request per new agent when the server maps with
a function), runs one batched ONNX call per module per step, hides agent
groups (members' observations concatenated, actions split back, rewards
combined) and sends each agent's steps to the server::

    client = MultiAgentClient("127.0.0.1", 5555)
    eid = client.start_episode()
    actions = client.get_action(eid, {"agent_0": obs0, "agent_1": obs1})   # agents acting now
    client.log_returns(eid, {"agent_0": 1.0, "agent_1": 0.0})
    client.end_agents(eid, {"agent_1": final_obs1})                          # agent_1 leaves
    client.end_episode(eid, {"agent_0": final_obs0})                         # episode over

Agents may join at any step and act at any rate: rewards logged for an agent
accumulate onto its last action until it acts again (ExternalEnv semantics).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .base_client import BaseClient, check_byte_values, finite_observation, finite_reward, observation_row
from .episode_recorder import EpisodeRecorder, same_space
from .policy import OnnxPolicy
from tether.protocol.logged_actions import checked_logged_action
from tether.protocol.distributions import deterministic, sample_for_record
from tether.protocol.env_params import record_env_params
from tether.protocol.errors import ErrorCode, InvalidInputError, MessageError, NotReadyError, TetherError
from tether.protocol.messages import MessageType
from tether.protocol.multi_agent import GroupSpec, ModuleSpec, value_obs_row
from tether.protocol.onnx_codec import decode_onnx
from tether.protocol.policy_mapping import PolicyMapping, read_agent_modules
from tether.protocol.spaces import is_composite
from .server_link import Batch
from .demonstrations import DemoWriter


def _structured(value: Any) -> bool:
    """An observation given by leaves (a Dict's mapping, a Tuple's tuple of arrays), not as one array."""
    # (a list stays one array, as before: a Tuple space's observation is a Python tuple)
    return isinstance(value, Mapping) or (isinstance(value, tuple) and any(not np.isscalar(v) for v in value))


@dataclass
class _Actor:
    """An agent (or a group acting as one) within an episode."""

    actor_id: str
    module_id: str
    start_step: int
    recorder: EpisodeRecorder


@dataclass
class _Episode:
    episode_id: str
    training_enabled: bool
    t: int = 0
    actors: dict[str, _Actor] = field(default_factory=dict)
    finished: list[_Actor] = field(default_factory=list)
    latest_obs: dict[str, np.ndarray] = field(default_factory=dict)
    #: The observations of the frame being checked, kept as the latest once it passed (get_action).
    frame_obs: dict[str, np.ndarray] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    #: Agents (group members included) that left; they cannot act again in this episode.
    ended: set[str] = field(default_factory=set)
    done: bool = False
    truncated: bool = False
    #: A training episode played without being recorded (the server's record_share, §13.2).
    held_back: bool = False
    #: **[1.7]** The parameter set's seq and the values drawn for the episode, and the reported measure (§19).
    env_params: tuple[int, dict[str, float]] | None = None
    measure: float | None = None
    #: The server's MAP_AGENTS answers for actors mapped ahead (map_agents) that have not acted yet.
    mapped: dict[str, str] = field(default_factory=dict)


class MultiAgentClient(BaseClient):
    """Connects to a Tether server with modules, mapping and groups (protocol 1.2).

    Network I/O runs on one background thread, as for ``TetherClient``; the
    arguments after ``verbose`` are described in ``BaseClient``
    (``offline_policy``: act with a server's offline policy file and no server, §20).
    """

    _multi_agent = True

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5555,
        client_name: str = "tether-python-multiagent",
        auth_token: str | None = None,
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
        self._episodes: dict[str, _Episode] = {}
        self._pending_steps = 0
        self._env_steps_since_cut = 0
        #: **[1.6]** The demonstration file written while playing (record_demonstrations), else None.
        self._demos: DemoWriter | None = None
        #: Episodes already running when the demonstration file was opened: never written (not whole).
        self._demo_partial: set[str] = set()
        self.modules: dict[str, ModuleSpec] = {}
        self.policies: dict[str, OnnxPolicy] = {}
        self.weights_seq_nos: dict[str, int] = {}
        #: Connections made so far; steps are stamped (connection, weights_seq_no) since
        #: numbers are comparable only within one server run (see TetherClient).
        self._connection = 0
        #: Per module, the connection its weights_seq_no was learned on (a model kept across a
        #: reconnect keeps its own, until the new connection sends another).
        self._seq_connections: dict[str, int] = {}
        #: Per module, the oldest stamp of the steps cut last (what their batch claims).
        self._cut_oldest: dict[str, tuple[int, int]] = {}
        self._io_seqs: dict[str, int] = {}  # the I/O thread's view, for its GET_STATE
        self._rules_checked: dict[str, Any] | None = None  # the SET_CONFIG whose rules were checked (I/O thread)
        self.mapping: PolicyMapping | None = None
        # compute_actions' MAP_AGENTS answers, for one evaluation episode id at a time
        self._eval_modules: dict[str, str] = {}
        self._eval_modules_episode: str | None = None
        #: **[1.5]** compute_actions' evaluation episode: each actor's state (a model with memory).
        self._evaluation_episode: str | None = None
        self._evaluation_actors: dict[str, EpisodeRecorder] = {}
        self.groups: dict[str, GroupSpec] = {}
        self._group_of: dict[str, str] = {}
        #: Env steps delivered to the server (get_action calls covered by delivered
        #: batches); ``agent_steps_sent`` counts the agents' decisions in them.
        self.env_steps_sent = 0
        super().__init__(host, port, client_name, auth_token, reconnect_timeout_s, seed, verbose, wait_for_weights,
                         connect_timeout_s, response_timeout_s, update_timeout_s, max_queued_steps,
                         max_queued_batches, when_queue_full, max_batch_attempts, offline_policy)

    # -- connection ------------------------------------------------------------

    def _state_request(self, initial: bool) -> dict[str, Any]:
        if initial:
            self._io_seqs.clear()  # a new connection sends every model again (its modules may be others)
            return {"type": MessageType.GET_STATE.value, "weights_seq_nos": {}}
        return {"type": MessageType.GET_STATE.value, "weights_seq_nos": dict(self._io_seqs)}

    def _prepare_state(self, config: dict[str, Any], state: dict[str, Any]) -> dict[str, tuple[int, OnnxPolicy | None]]:
        if "modules" not in config:
            raise TetherError("the server does not describe modules (it speaks RLlink < 1.2): use TetherClient")
        if config is not self._rules_checked:  # (once per SET_CONFIG; this runs at every SET_STATE)
            rules = config.get("policy_mapping")
            for module_id in sorted(PolicyMapping.from_json(rules).modules() if rules is not None else ()):
                if module_id not in config["modules"]:  # (refused at the handshake, as the C++ and C# clients do)
                    raise MessageError(ErrorCode.INVALID_FIELD, f"SET_CONFIG policy_mapping names module "
                                       f'{module_id!r}, which is not in "modules"')
            self._rules_checked = config
        prepared: dict[str, tuple[int, OnnxPolicy | None]] = {}
        for module_id, entry in (state.get("models") or {}).items():
            spec = ModuleSpec.from_json(module_id, config["modules"][module_id])
            policy = None
            if "onnx_file" in entry:
                policy = OnnxPolicy(decode_onnx(entry["onnx_file"]), spec.action_space, spec.onnx_input_name,
                                    spec.onnx_output_name, observation_space=spec.observation_space,
                                    recurrent_state=spec.recurrent_state)
            prepared[module_id] = (int(entry["weights_seq_no"]), policy)
            self._io_seqs[module_id] = int(entry["weights_seq_no"])
        return prepared

    def _on_connected(self) -> None:
        self._connection += 1
        config = self.server_config
        modules = {m: ModuleSpec.from_json(m, spec) for m, spec in config["modules"].items()}
        # Each module acts with its model until the new connection sends another (as TetherClient
        # does), unless its spaces changed (that model cannot serve them) or the server no longer
        # describes it: then it has none (NotReadyError) until one comes. Its steps recorded under
        # the old spaces, or with critic rows laid out for other agents, and not cut yet no longer
        # fit: they are dropped (§6.5), so that the other modules' steps still go (as in every SDK).
        if self._run_changed:
            # **[1.8]** Another server run (§6.5): every module's steps not cut yet were acted with
            # weights whose versions name other weights in this run; they go (counted), and recurrent
            # states start from zeros. Each model stays until this connection's replaces it.
            self._other_run_unsent_dropped += self._pending_unsent()
            for module_id in self.modules:
                self._drop_unsent_steps_of(module_id, reset_states=True)
            self._evaluation_episode, self._evaluation_actors = None, {}  # (evaluation states start from zeros too)
        for module_id, old in self.modules.items():
            new = modules.get(module_id)
            # (**[1.5]** a model with another recurrent state cannot continue the states kept: §12.4)
            spaces_changed = new is None or not (same_space(old.observation_space, new.observation_space)
                                                 and same_space(old.action_space, new.action_space)
                                                 and old.recurrent_state == new.recurrent_state)
            if new is None or spaces_changed or new.value_obs_agents != old.value_obs_agents:
                self._drop_unsent_steps_of(module_id, reset_states=spaces_changed)
            if spaces_changed:
                self.stop_demonstrations()  # (its header's spaces are no longer the episodes', §18)
                self._evaluation_episode, self._evaluation_actors = None, {}
                self.policies.pop(module_id, None)
                self.weights_seq_nos.pop(module_id, None)
                self._seq_connections.pop(module_id, None)
        self.modules = modules
        if self._demos is not None and not set(modules) <= set(self._demos.modules):
            self.stop_demonstrations()  # (a module its header does not name: its actors' steps cannot be written, §18)
        rules = config.get("policy_mapping")
        self.mapping = PolicyMapping.from_json(rules) if rules is not None else None
        self._eval_modules, self._eval_modules_episode = {}, None
        for episode in self._episodes.values():
            episode.mapped.clear()  # (this connection's server may map otherwise: asked again)
        self.groups = {g: GroupSpec.from_json(g, spec) for g, spec in (config.get("groups") or {}).items()}
        self._group_of = {member: g.group_id for g in self.groups.values() for member in g.members}

    def _drop_unsent_steps_of(self, module_id: str, reset_states: bool) -> None:
        """The steps of the module's actors not cut yet are let go (their episodes go on, each
        actor's next chunk starting from its next observation, with the same start_step);
        actors that left with steps not cut yet leave nothing to send. ``reset_states``: **[1.5]**
        their recurrent states start again from zeros (another model, §12.4); else they are kept."""
        for episode in self._episodes.values():
            for actor in episode.actors.values():
                if actor.module_id == module_id:
                    actor.recorder.drop_unsent()
                    if reset_states:
                        actor.recorder.state = None
            episode.finished = [actor for actor in episode.finished if actor.module_id != module_id]
        self._recount_pending()

    def _pending_unsent(self) -> int:
        """Recorded steps of training episodes not cut yet (those of actors that left included)."""
        return sum(a.recorder.pending_steps for e in self._episodes.values() if e.training_enabled
                   for a in (*e.actors.values(), *e.finished))

    def _recount_pending(self) -> None:
        self._pending_steps = self._pending_unsent()

    def _apply_state(self, prepared: dict[str, tuple[int, OnnxPolicy | None]]) -> None:
        for module_id, (seq, policy) in prepared.items():
            if policy is not None:
                self.policies[module_id] = policy
            self.weights_seq_nos[module_id] = seq
            self._seq_connections[module_id] = self._connection

    def _forget_episodes(self, episode_ids: set[str]) -> None:
        for episode_id in episode_ids:
            episode = self._episodes.get(episode_id)
            if episode is None:
                continue
            episode.training_enabled = False
            episode.finished.clear()
            for actor in episode.actors.values():
                actor.recorder.stop_training()
            if episode.done:
                del self._episodes[episode_id]
        self._recount_pending()

    def _count_sent(self, batch: Batch) -> None:
        super()._count_sent(batch)
        self.env_steps_sent += batch.env_steps

    # -- mapping ---------------------------------------------------------------

    def _modules_for(self, episode_id: str, actor_ids: list[str]) -> dict[str, str]:
        # By the server's rules (each module they name is described: checked at the handshake), or
        # one MAP_AGENTS, whose answer is checked against the modules described.
        if self.mapping is not None:
            return {a: self.mapping.module_for(a, episode_id) for a in actor_ids}
        answer = self.link.request({"type": MessageType.MAP_AGENTS.value, "episode_id": episode_id,
                                    "agent_ids": actor_ids})
        return read_agent_modules(answer, actor_ids, self.modules)

    def map_agents(self, episode_id: str, agent_ids: Iterable[str]) -> dict[str, str]:
        """The module each of ``agent_ids`` plays in the running episode ``episode_id``, by agent id.

        With the server's rules (SET_CONFIG's ``policy_mapping``) this is local. With a mapping function
        of the server's (``"policy_mapping": null``: self-play draws opponents per episode), the agents
        not mapped yet are asked about in one MAP_AGENTS, whose answers the episode keeps: their first
        frames then ask nothing. A game that knows an episode's agents (a turn-based game's seats) calls
        this once after ``start_episode`` and saves a round trip per agent that acts later. A group
        member stands for its group (the module is the group's). Raises ``KeyError`` for an episode not
        running (or ended), ``TypeError`` for an id that is not a string, and what a frame's mapping
        raises (``UnmappedAgentError`` when no rule matches, ``ServerError`` UNMAPPED_AGENT from the
        server, ``MessageError`` INVALID_FIELD / UNKNOWN_MODULE for an answer that maps not every agent
        or names a module SET_CONFIG does not describe, ``NotReadyError`` offline, a timeout); nothing
        is kept of a request that failed.
        """
        if self._events:
            self._sync()  # (a new connection's modules, mapping and groups first)
        episode = self._episodes.get(episode_id)
        if episode is None or episode.done:
            raise KeyError(f"no running episode {episode_id!r}")
        agents = list(agent_ids)
        for agent_id in agents:
            if not isinstance(agent_id, str):
                raise TypeError(f"agent ids are strings, got {agent_id!r}")
        actor_of = {a: self._group_of.get(a, a) for a in agents}
        unknown = list(dict.fromkeys(a for a in actor_of.values() if a not in episode.actors and a not in episode.mapped))
        if unknown:
            episode.mapped.update(self._modules_for(episode_id, unknown))
        return {a: episode.actors[actor].module_id if actor in episode.actors else episode.mapped[actor]
                for a, actor in actor_of.items()}

    def _eval_modules_for(self, episode_id: str, actor_ids: list[str]) -> dict[str, str]:
        # The server's answers are kept for the evaluation episode (§7.10), so that each
        # call does not wait on a round trip; bounded like any id-keyed cache.
        if self.mapping is not None:
            return self._modules_for(episode_id, actor_ids)
        if episode_id != self._eval_modules_episode or len(self._eval_modules) >= _MAX_REMEMBERED_MAPPINGS:
            self._eval_modules, self._eval_modules_episode = {}, episode_id
        unknown = [a for a in actor_ids if a not in self._eval_modules]
        if unknown:
            self._eval_modules.update(self._modules_for(episode_id, unknown))
        return {a: self._eval_modules[a] for a in actor_ids}

    # -- episodes --------------------------------------------------------------

    def start_episode(self, episode_id: str | None = None, training_enabled: bool = True) -> str:
        """Begin an episode; returns its id. Episodes may overlap."""
        episode_id = episode_id or uuid.uuid4().hex
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} is already running")
        recorded, held_back = self._recording(training_enabled)
        self._episodes[episode_id] = _Episode(episode_id, recorded, held_back=held_back,
                                              env_params=self._draw_episode_params())
        return episode_id

    def _episode_with_params(self, episode_id: str) -> _Episode:
        return self._episodes[episode_id]

    def _actor_observations(self, episode: _Episode, obs: Mapping[str, Any],
                            keep_latest: bool = True) -> dict[str, np.ndarray]:
        """Per actor (agent or group) observation; group members are joined in member order.
        ``keep_latest``: remember each agent's as its latest (the centralized critic's rows) now;
        else the caller does, once the frame passed every check (``_keep_latest``)."""
        out: dict[str, np.ndarray] = {}
        members_seen: dict[str, dict[str, np.ndarray]] = {}
        # Copies (the engine may reuse its buffers), all checked before any is kept: a NaN or
        # infinite value refuses the whole frame (InvalidInputError), as in every SDK.
        arrays = {agent_id: finite_observation(value, f"observation of {agent_id!r}", self._arena).ravel()
                  for agent_id, value in obs.items() if not _structured(value)}
        for agent_id, value in obs.items():
            group = self._group_of.get(agent_id)
            if agent_id not in arrays:
                if group is not None:
                    raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"observation of {agent_id!r}: a group's "
                                            f"members observe flat arrays (a Dict or Tuple observation is an agent's)")
                out[agent_id] = value  # (flattened by its module's space once the agent is mapped: _flat_rows)
            elif group is None:
                out[agent_id] = arrays[agent_id]
            else:
                members_seen.setdefault(group, {})[agent_id] = arrays[agent_id]
        for group_id, seen in members_seen.items():
            out[group_id] = self.groups[group_id].join_observations(seen)  # (ValueError if a member is missing)
        if keep_latest:
            episode.latest_obs.update(arrays)
        else:
            episode.frame_obs = arrays
        return out

    def _flat_rows(self, episode: _Episode, actor_obs: dict[str, Any], final: bool) -> None:
        """**[1.4]** Dict and Tuple observations (§8.6) as their modules' flat rows, checked (leaves,
        values, and before acting the action mask, §11.6); they become the agents' latest too."""
        for actor_id, value in actor_obs.items():
            actor = episode.actors.get(actor_id)
            spec = self.modules.get(actor.module_id) if actor is not None else None
            if spec is None:
                continue  # (an actor that never acted, or whose module the server no longer describes)
            row = _checked_row(actor_id, value, spec, final)
            if row is not value:
                actor_obs[actor_id] = row
                (episode.latest_obs if final else episode.frame_obs)[actor_id] = row

    def _value_obs(self, episode: _Episode, spec: ModuleSpec) -> np.ndarray | None:
        if not spec.value_obs_agents:
            return None
        return value_obs_row(spec.value_obs_agents, episode.latest_obs, spec.obs_dim)

    def _ensure_actors(self, episode: _Episode, actor_ids: list[str]) -> None:
        new = [a for a in actor_ids if a not in episode.actors]
        if not new:
            return
        mapped = {a: episode.mapped[a] for a in new if a in episode.mapped}
        unmapped = [a for a in new if a not in mapped]
        if unmapped:
            mapped.update(self._modules_for(episode.episode_id, unmapped))
        for actor_id in new:
            module_id = mapped[actor_id]
            episode.mapped.pop(actor_id, None)  # (the actor holds it from now on)
            episode.actors[actor_id] = _Actor(actor_id, module_id, episode.t,
                                              EpisodeRecorder(episode.episode_id, episode.training_enabled))

    def get_action(self, episode_id: str, observations: Mapping[str, Any],
                   logged_actions: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Actions for the agents that observe now (dict by agent id, group members included).

        Computes locally; waits for the network only to map a new agent with a
        server-side mapping function (MAP_AGENTS), or with ``wait_for_weights``.
        An agent that left the episode (or whose group left) cannot act again:
        ``ValueError``.

        **[1.6]** ``logged_actions``: the actors of this frame whose actions the policy did not choose
        (see ``log_action``), by actor id; they get their own action back.
        """
        return self._act(episode_id, observations, logged_actions or {})

    def log_action(self, episode_id: str, observations: Mapping[str, Any], actions: Mapping[str, Any]) -> dict[str, Any]:
        """**[1.6]** One frame in which the actors named in ``actions`` act as told — a human player, a
        scripted bot, another controller — and the other observing agents by the policy (RLlib's
        ``log_action``, for a multi-agent frame). Returns every agent's action (the given ones as given).

        ``actions`` is keyed by actor id: an agent id, or a group's id with the group's joint action
        (a member of a group cannot be logged alone). Logged steps are marked in the records (§10.1)
        and learned from as §13.7 says; a model with memory still advances each logged actor's
        state (§12.4). Refused, with nothing of the frame recorded: an actor not observing in the
        frame, a group member, an action outside its module's space or forbidden by its mask
        (``InvalidInputError``), and any logged action while the server is older than 1.6
        (``NotReadyError``).
        """
        return self._act(episode_id, observations, actions)

    def _act(self, episode_id: str, observations: Mapping[str, Any], logged_actions: Mapping[str, Any]) -> dict[str, Any]:
        """get_action's frame, with the actors of ``logged_actions`` (already keyed by actor) logged."""
        if logged_actions and not self.link.speaks(1, 6):
            raise NotReadyError(f"the server speaks protocol {self.link.server_info.get('protocol_version')}: "
                                "logged actions need 1.6 or later (an older server would train on them as the "
                                "policy's own samples)")
        if self._events:
            self._sync()
        episode = self._episodes[episode_id]
        if episode.ended:
            gone = [a for a in observations if a in episode.ended]
            if gone:
                raise ValueError(f"agents {gone} already left episode {episode_id!r} (an ended agent, or a member of "
                                 f"an ended group, cannot act again in the same episode)")
        # The cut comes first, as in every SDK (docs/parity.md): the actors about to act hold back their
        # latest step until this frame's observation (§10.7), and sending may bring new models this frame
        # acts with.
        if (episode.training_enabled or episode.held_back) and self._cadence_due(self._sendable_steps):
            self._send_batch(even_empty=True)
        elif episode.training_enabled and self._pending_steps >= self._batch_steps():
            if self._sendable_steps() >= self._batch_steps():
                self._send_batch()
        actor_obs = self._actor_observations(episode, observations, keep_latest=False)
        self._ensure_actors(episode, list(actor_obs))
        missing = {episode.actors[a].module_id for a in actor_obs} - set(self.policies)
        if missing:  # (before anything of the frame is recorded)
            raise NotReadyError(f"the server has sent no model for module(s) {sorted(missing)} yet")
        self._flat_rows(episode, actor_obs, final=False)
        for actor_id, obs in actor_obs.items():
            spec = self.modules[episode.actors[actor_id].module_id]
            if obs.size != spec.obs_dim:  # (a row of another size would cost the whole batch at the server)
                raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH,
                                        f"{actor_id!r}: the observation has {obs.size} values, module "
                                        f"{spec.module_id!r} needs {spec.obs_dim}")
            group = self.groups.get(actor_id)
            if group is None:
                continue
            values = int(np.prod(spec.action_space.shape)) if spec.action_space.shape else 1
            if values % len(group.members):  # (as the C++ and C# clients refuse it)
                raise InvalidInputError(ErrorCode.INVALID_FIELD,
                                        f"group {actor_id!r}: an action of {values} elements of module "
                                        f"{spec.module_id!r} does not split into {len(group.members)} equal parts")
        logged = self._checked_logged_actions(episode, actor_obs, logged_actions)
        # The frame passed every check: its observations become the agents' latest (critic rows).
        episode.latest_obs.update(episode.frame_obs)
        episode.frame_obs = {}
        for actor_id, obs in actor_obs.items():
            actor = episode.actors[actor_id]
            policy = self.policies[actor.module_id]
            state = self._state_of(actor.recorder, policy) if policy.state_shape is not None else None
            actor.recorder.observe(obs, self._value_obs(episode, self.modules[actor.module_id]), state)
        # One batched inference per module.
        by_module: dict[str, list[str]] = {}
        for actor_id in actor_obs:
            by_module.setdefault(episode.actors[actor_id].module_id, []).append(actor_id)
        actions: dict[str, Any] = {}
        for module_id, actor_ids in by_module.items():
            policy = self.policies[module_id]
            dist_rows = self._module_dists(episode, policy, actor_ids, actor_obs)
            for actor_id, dist in zip(actor_ids, dist_rows):
                if actor_id in logged:  # (no behaviour logp: the server does not use it, §13.7)
                    action, logp, env_action = logged[actor_id], 0.0, logged[actor_id]
                else:
                    action, logp, env_action = sample_for_record(policy.action_space, dist, self._rng,
                                                                 self._raw_box_samples)
                seq = self.weights_seq_nos.get(module_id)
                stamp = None if seq is None else (self._seq_connections.get(module_id, self._connection), seq)
                episode.actors[actor_id].recorder.act(action, logp, dist, stamp, actor_id in logged)
                if self._demos is not None and episode_id not in self._demo_partial:
                    self._demos._step(episode_id, actor_id, module_id, actor_obs[actor_id], action, actor_id in logged)
                if episode.training_enabled:
                    self._pending_steps += 1
                elif episode.held_back:
                    self._held_steps += 1
                self._split_action(actor_id, env_action, actions)
        if episode.training_enabled:
            self._env_steps_since_cut += 1
        episode.t += 1
        return actions

    @staticmethod
    def _module_dists(episode: _Episode, policy: OnnxPolicy, actor_ids: list[str],
                      actor_obs: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]:
        """One module's dist inputs for the frame's actors, in one run, each actor's state (**[1.5]**)
        fed and advanced (§12.4): a lone row (every step of a turn-based game) through the policy's
        bound one-row path, more rows as one batch."""
        if len(actor_ids) == 1:
            obs = actor_obs[actor_ids[0]]
            if policy.state_shape is None:
                return [policy.dist_inputs_one(obs)]
            recorder = episode.actors[actor_ids[0]].recorder
            dist, recorder.state = policy.step_own(obs, recorder.state)
            return [dist]
        batch = np.stack([actor_obs[a] for a in actor_ids])
        if policy.state_shape is None:
            return policy.dist_inputs(batch)
        recorders = [episode.actors[a].recorder for a in actor_ids]
        stacked = [np.concatenate([r.state[k] for r in recorders]) for k in range(len(recorders[0].state))]
        dist_rows, after = policy.step(batch, stacked)
        for i, recorder in enumerate(recorders):  # (row copies: each actor owns its state)
            recorder.state = [tensor[i:i + 1].copy() for tensor in after]
        return dist_rows

    def _checked_logged_actions(self, episode: Any, actor_obs: Mapping[str, np.ndarray],
                                logged_actions: Mapping[str, Any]) -> dict[str, Any]:
        """The frame's logged actions by actor, each checked against its module's space and mask."""
        out: dict[str, Any] = {}
        for actor_id, action in logged_actions.items():
            if actor_id not in actor_obs:
                group = self._group_of.get(actor_id)
                if group is not None:
                    raise InvalidInputError(ErrorCode.INVALID_FIELD, f"{actor_id!r} is a member of group {group!r}: "
                                            f"log the group's joint action under {group!r}")
                raise InvalidInputError(ErrorCode.INVALID_FIELD, f"{actor_id!r} has a logged action but no "
                                        f"observation in this frame")
            spec = self.modules[episode.actors[actor_id].module_id]
            out[actor_id] = checked_logged_action(spec.action_space, action, spec.action_mask, actor_obs[actor_id],
                                                  f"the logged action of {actor_id!r}")
        return out

    def _state_of(self, recorder: EpisodeRecorder, policy: OnnxPolicy) -> list[np.ndarray]:
        """The state an actor's next step starts from (§12.4): zeros at its first step; zeros again,
        with its steps not sent yet let go, when its module's model has a state of another shape."""
        if not policy.fits(recorder.state):
            if recorder.state is not None and recorder.training_enabled:
                recorder.drop_unsent()
                self._recount_pending()
            recorder.state = policy.initial_state()
        return recorder.state  # type: ignore[return-value]

    def _split_action(self, actor_id: str, action: Any, out: dict[str, Any]) -> None:
        group = self.groups.get(actor_id)
        if group is None:
            out[actor_id] = action
            return
        # (ValueError when it does not split into equal parts, as the C++ and C# clients refuse it)
        out.update(group.split_action(action, discrete=np.asarray(action).dtype.kind in "iu"))

    def log_returns(self, episode_id: str, rewards: Mapping[str, float]) -> None:
        """Add each agent's reward to its last action (group members' rewards combine). Never raises
        a server's error (the next get_action does, as in every SDK). A NaN or infinite reward, or
        one that would take its step's reward beyond float32 (§10.5), is refused
        (``InvalidInputError``, NON_FINITE_VALUE) and none of the call's rewards is added."""
        episode = self._episodes[episode_id]
        rewards = {agent_id: finite_reward(r, f"reward of {agent_id!r}") for agent_id, r in rewards.items()}
        shares: list[tuple[str, float]] = []
        for agent_id, reward in rewards.items():
            group = self._group_of.get(agent_id)
            if group is not None:  # (a mean divides each member's share)
                shares.append((group, self.groups[group].combine_rewards([reward])))
            else:
                shares.append((agent_id, reward))
        # All or nothing: no reward is added when one would take its step's reward beyond float32 (§10.5).
        added: dict[str, float] = {}
        for actor_id, reward in shares:
            added[actor_id] = added.get(actor_id, 0.0) + reward
        for actor_id, reward in added.items():
            actor = episode.actors.get(actor_id)
            if actor is not None:
                actor.recorder.check_reward(reward, f"the reward(s) of {actor_id!r}")
        for actor_id, reward in added.items():
            actor = episode.actors.get(actor_id)
            episode.returns[actor_id] = episode.returns.get(actor_id, 0.0) + reward
            if actor is not None:
                actor.recorder.add_reward(reward)
                if self._demos is not None:
                    try:
                        self._demos.add_reward(episode_id, actor_id, reward)
                    except InvalidInputError:  # (beyond float32: left out of the file, which the reader would refuse, as every SDK does)
                        pass

    def end_agents(self, episode_id: str, final_observations: Mapping[str, Any],
                   truncated: bool | Mapping[str, bool] = False) -> None:
        """Agents that leave the episode (terminated, or truncated when ``truncated`` says so).

        A group leaves as a whole: ending any member ends the group, and its
        members not named here end with their latest observation. An agent
        that left (or a member of a group that left) cannot act again in this
        episode.
        """
        if self._events:
            self._sync()
        episode = self._episodes[episode_id]
        final = dict(final_observations)
        for agent_id in list(final):
            group = self._group_of.get(agent_id)
            if group is not None:
                for member in self.groups[group].members:
                    if member not in final and member in episode.latest_obs:
                        final[member] = episode.latest_obs[member]
        actor_obs = self._actor_observations(episode, final)
        self._flat_rows(episode, actor_obs, final=True)
        for actor_id, obs in actor_obs.items():
            members = self.groups[actor_id].members if actor_id in self.groups else (actor_id,)
            episode.ended.update(members)
            actor = episode.actors.pop(actor_id, None)
            if actor is None:
                continue  # observed its end without ever acting: nothing to train on
            is_trunc = truncated if isinstance(truncated, bool) else any(truncated.get(a, False) for a in members)
            spec = self.modules.get(actor.module_id)  # (none: the server no longer describes it, nothing to send)
            actor.recorder.finish(obs, bool(is_trunc), self._value_obs(episode, spec) if spec is not None else None)
            if self._demos is not None:
                self._demos.end(episode_id, actor_id, obs, terminated=not is_trunc)
            if actor.recorder.pending_steps:
                episode.finished.append(actor)

    def retire_agent(self, episode_id: str, agent_id: str, final_observation: Any, truncated: bool = False) -> None:
        """A sub-agent's life ends (a hierarchy's lower level finished its task).

        Spawning needs no call: a new id passed to ``get_action`` joins the
        episode and is mapped to its module then. A level acts at its own rate
        simply by appearing in ``get_action`` only when it acts.
        """
        self.end_agents(episode_id, {agent_id: final_observation}, truncated)

    def record_demonstrations(self, path: str | Path) -> DemoWriter:
        """**[1.6]** Write every actor episode played from now on — steps sampled, logged (``log_action``)
        or both — to the demonstration file ``path`` (§18), one line per actor (agent, or group under its
        group id) as it leaves, in the spaces of the modules the server describes now; episodes already
        running are not written (they would not be whole). Returns the writer; ``stop_demonstrations``
        (or ``close``) closes it."""
        if not self.modules:
            raise NotReadyError("the server has not described its modules yet")
        self.stop_demonstrations()
        self._demos = DemoWriter(path, dict(self.modules))
        self._demo_partial = set(self._episodes)
        return self._demos

    def stop_demonstrations(self) -> None:
        """Close the demonstration file, if one is written (its running episodes written truncated)."""
        if self._demos is not None:
            self._demos.close()
            self._demos = None

    def close(self) -> None:
        """As ``BaseClient.close``; a demonstration file being written is closed too."""
        self.stop_demonstrations()
        super().close()

    def end_episode(self, episode_id: str, final_observations: Mapping[str, Any] | None = None,
                    truncated: bool = False) -> dict[str, float]:
        """End the episode: remaining agents end with ``final_observations``
        (their latest observation if absent). Returns each actor's total reward."""
        if self._events:
            self._sync()
        episode = self._episodes[episode_id]
        final = dict(final_observations or {})
        for actor_id in list(episode.actors):
            members = self.groups[actor_id].members if actor_id in self.groups else (actor_id,)
            for m in members:
                if m not in final:
                    final[m] = episode.latest_obs[m]
        self.end_agents(episode_id, final, truncated)
        episode.done, episode.truncated = True, truncated
        self._demo_partial.discard(episode_id)
        if not episode.training_enabled:
            del self._episodes[episode_id]  # a trained episode goes once its last record is sent
        return dict(episode.returns)

    # -- sending ---------------------------------------------------------------

    def _sendable_steps(self) -> int:
        held = 0
        for episode in self._episodes.values():
            for actor in episode.actors.values():
                r = actor.recorder
                if r.training_enabled and r.actions and len(r.obs) == len(r.actions):
                    held += 1
        return self._pending_steps - held

    def _collect_records(self) -> tuple[list[dict[str, Any]], int, int]:
        records: list[dict[str, Any]] = []
        oldest: dict[str, tuple[int, int]] = {}
        for episode_id in list(self._episodes):
            episode = self._episodes[episode_id]
            if not episode.training_enabled:
                continue
            agents: dict[str, Any] = {}
            for actor in [*episode.finished, *episode.actors.values()]:
                spec = self.modules.get(actor.module_id)
                cut = actor.recorder.cut(self._connection, tuple(s.input for s in spec.recurrent_state)
                                         if spec is not None else ())
                if cut is not None:
                    rec, version = cut
                    if version is not None:
                        oldest[actor.module_id] = min(version, oldest.get(actor.module_id, version))
                    rec.pop("episode_id", None)
                    rec["module"] = actor.module_id
                    rec["start_step"] = actor.start_step
                    agents[actor.actor_id] = rec
            episode.finished.clear()
            ending = episode.done
            if agents or ending:
                records.append({"episode_id": episode_id, "is_terminated": ending and not episode.truncated,
                                "is_truncated": ending and episode.truncated, "agents": agents})
                if episode.env_params is not None:
                    records[-1]["env_params"] = record_env_params(*episode.env_params,
                                                                  episode.measure if ending else None)
            if ending:
                del self._episodes[episode_id]
        self._recount_pending()
        self._cut_oldest = oldest
        env_steps, self._env_steps_since_cut = self._env_steps_since_cut, 0
        agent_steps = sum(len(a["actions"]) for r in records for a in r["agents"].values())
        return records, env_steps, agent_steps

    def _take_claim(self) -> dict[str, Any]:
        # Per module, the oldest version of its steps cut (agents that did not act this step
        # included, §7.6); a module without steps in the batch reports the version it holds.
        oldest = {module_id: stamp[1] for module_id, stamp in self._cut_oldest.items()}
        return {"weights_seq_nos": {**self.weights_seq_nos, **oldest}}

    def compute_actions(self, observations: Mapping[str, Any], episode_id: str = "") -> dict[str, Any]:
        """Greedy actions for evaluation; records nothing.

        **[1.5]** A module with memory remembers per episode (§12.4): ``episode_id`` names a running
        episode that is not recorded (whose actors' states this call advances, as ``get_action`` does) or
        an evaluation episode of the caller's (each actor's state starts from zeros at its first call; one
        evaluation episode is remembered at a time, so give each its own id). A running episode whose
        steps are recorded is refused (``ValueError``) when an actor's module has memory."""
        if self._events:
            self._sync()
        episode = _Episode(episode_id or "eval", False)
        actor_obs = self._actor_observations(episode, observations)
        modules = self._eval_modules_for(episode.episode_id, list(actor_obs))
        out: dict[str, Any] = {}
        rows: dict[str, np.ndarray] = {}
        for actor_id, obs in actor_obs.items():  # (all checked, as get_action checks them, before any acts)
            rows[actor_id] = _checked_row(actor_id, obs, self.modules[modules[actor_id]], final=False)
        running = self._episodes.get(episode_id)
        if running is not None and running.training_enabled and any(
                self.modules[modules[a]].recurrent_state for a in rows):
            raise ValueError(f"episode {episode_id!r} is being recorded: a greedy step would be missing from its "
                             f"record; use get_action, or compute_actions with another episode id")
        for actor_id, obs in rows.items():
            policy = self.policies.get(modules[actor_id])
            if policy is None:
                raise NotReadyError(f"the server has sent no model for module {modules[actor_id]!r} yet")
            if policy.state_shape is not None:
                recorder = self._evaluation_recorder(episode_id, actor_id)
                dist, recorder.state = policy.step_own(obs, self._state_of(recorder, policy))
            else:
                dist = policy.dist_inputs_one(obs)
            self._split_action(actor_id, deterministic(policy.action_space, dist), out)
        return out

    def _evaluation_recorder(self, episode_id: str, actor_id: str) -> EpisodeRecorder:
        """Where compute_actions keeps an actor's state: its running episode's, or the evaluation episode's."""
        running = self._episodes.get(episode_id)
        if running is not None and actor_id in running.actors:
            return running.actors[actor_id].recorder
        if self._evaluation_episode != episode_id:
            self._evaluation_episode, self._evaluation_actors = episode_id, {}
        return self._evaluation_actors.setdefault(actor_id, EpisodeRecorder(episode_id, False))


def _checked_row(actor_id: str, value: Any, spec: ModuleSpec, final: bool) -> Any:
    """An actor's observation as its module's flat row, checked: a flat array's byte values (it is
    returned as it is), or **[1.4]** a Dict or Tuple observation's leaves and, unless ``final``, its
    action mask (§8.6, §11.6)."""
    what = f"observation of {actor_id!r}"
    if not is_composite(spec.observation_space) and isinstance(value, np.ndarray):
        check_byte_values(value, spec.observation_space, what)
        return value
    return observation_row(value, spec.observation_space, None if final else spec.action_mask, what).reshape(-1)


_MAX_REMEMBERED_MAPPINGS = 65536

__all__ = ["MultiAgentClient"]
