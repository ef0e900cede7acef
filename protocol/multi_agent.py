"""Multi-agent configuration and episode records (protocol 1.2).

SET_CONFIG of a 1.2 server describes its modules, the policy mapping and the
agent groups::

    "modules": {"shared": {"observation_space": {...}, "action_space": {...},
                           "onnx_input_names": ["obs"], "onnx_output_names": ["action_dist_inputs"],
                           "trainable": true, "value_obs_agents": ["agent_0", "agent_1"]}},
    "policy_mapping": [{"pattern": "*", "module": "shared"}],   # or null: ask with MAP_AGENTS
    "groups": {"team": {"members": ["agent_0", "agent_1"], "reward": "sum"}}

A multi-agent episode record carries one entry per agent that acted in the
chunk; each entry follows the single-agent chunk rules (obs has one item
more than the per-step lists) and names its module::

    {"episode_id": "e1", "is_terminated": false, "is_truncated": false, "env_steps": 25,
     "agents": {"agent_0": {"module": "shared", "start_step": 0, "obs": [...], "actions": [...],
                            "rewards": [...], "action_logp": [...], "action_dist_inputs": [...],
                            "value_obs": [...], "is_terminated": false, "is_truncated": false}}}

A group appears under its group id with the members' observations and
actions concatenated (in member order) and the members' rewards combined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence, cast

import numpy as np

from .action_mask import ActionMask, resolve_action_mask
from .episodes import EpisodeChunk, StateSpec, decode_episode, numbers_array
from .env_params import RecordEnvParams, decode_record_env_params
from .errors import ErrorCode, MessageError
from .messages import is_text
from .spaces import Box, Discrete, LeafSpace, MultiDiscrete, Space, box, is_composite, space_from_json

#: The agent id a single-agent (v1) episode record stands for.
DEFAULT_AGENT_ID = "default_agent"


@dataclass(frozen=True)
class ModuleSpec:
    """What clients know about one module: its spaces and ONNX names."""

    module_id: str
    observation_space: Space
    #: Box, Discrete or MultiDiscrete: a composite action space is refused (§8.6).
    action_space: LeafSpace
    onnx_input_name: str = "obs"
    onnx_output_name: str = "action_dist_inputs"
    trainable: bool = True
    #: Agents whose observations, concatenated in this order, a centralized
    #: critic sees; empty for a critic that sees the agent's own observation.
    value_obs_agents: tuple[str, ...] = ()
    #: **[1.4]** The leaf of a composite observation that masks actions (§11.6); None for none.
    action_mask_leaf: str | None = None
    #: **[1.5]** The model's recurrent state, one entry per state tensor (§12.1); empty without memory.
    recurrent_state: tuple[StateSpec, ...] = ()
    #: A self-play snapshot of this module (§9.8): informative, clients act with it like any module.
    snapshot_of: str | None = None

    @property
    def action_mask(self) -> ActionMask | None:
        """The module's mask layout, from ``action_mask_leaf``."""
        if self.action_mask_leaf is None:
            return None
        cached = self.__dict__.get("_mask")
        if cached is None:
            cached = resolve_action_mask(self.observation_space, self.action_space, self.action_mask_leaf)
            object.__setattr__(self, "_mask", cached)
        return cached

    @property
    def onnx_input_names(self) -> list[str]:
        """The model's inputs (§12.1): one per leaf, named by its path, for a composite observation."""
        if is_composite(self.observation_space):
            return [leaf.path for leaf in self.observation_space.leaves]
        return [self.onnx_input_name]

    @cached_property  # (read for every actor of every frame: once found, a plain attribute)
    def obs_dim(self) -> int:
        return int(np.prod(self.observation_space.shape)) if self.observation_space.shape else 1

    @property
    def value_obs_dim(self) -> int | None:
        return self.obs_dim * len(self.value_obs_agents) if self.value_obs_agents else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "observation_space": self.observation_space.to_json(),
            "action_space": self.action_space.to_json(),
            "onnx_input_names": self.onnx_input_names,
            "onnx_output_names": [self.onnx_output_name],
            "trainable": self.trainable,
        }
        if self.value_obs_agents:
            out["value_obs_agents"] = list(self.value_obs_agents)
        if self.action_mask_leaf is not None:
            out["action_mask"] = self.action_mask_leaf
        if self.recurrent_state:
            out["recurrent_state"] = [state.to_json() for state in self.recurrent_state]
        if self.snapshot_of is not None:
            out["snapshot_of"] = self.snapshot_of
        return out

    @classmethod
    def from_json(cls, module_id: str, data: Any) -> "ModuleSpec":
        if not isinstance(data, dict):
            raise MessageError(ErrorCode.INVALID_FIELD, f"module {module_id!r} must be a JSON object")
        action_space = space_from_json(data.get("action_space"))
        if is_composite(action_space):
            raise MessageError(ErrorCode.INVALID_FIELD, f"module {module_id!r}: a Dict or Tuple action space is not "
                               "supported (actions are Box, Discrete or MultiDiscrete, §8.6)")
        spec = cls(
            module_id=module_id,
            observation_space=space_from_json(data.get("observation_space")),
            action_space=cast(LeafSpace, action_space),
            onnx_input_name=str((data.get("onnx_input_names") or ["obs"])[0]),
            onnx_output_name=str((data.get("onnx_output_names") or ["action_dist_inputs"])[0]),
            trainable=bool(data.get("trainable", True)),
            value_obs_agents=value_obs_agents_from_json(data.get("value_obs_agents"), module_id),
            action_mask_leaf=data.get("action_mask"),
            recurrent_state=recurrent_state_from_json(data.get("recurrent_state"), module_id),
            snapshot_of=data["snapshot_of"] if isinstance(data.get("snapshot_of"), str) else None,
        )
        if spec.action_mask_leaf is not None:
            try:
                if not isinstance(spec.action_mask_leaf, str):
                    raise ValueError(f"action_mask must be a leaf path, got {spec.action_mask_leaf!r}")
                spec.action_mask  # noqa: B018 - resolves (and checks) the leaf now, not at the first step
            except ValueError as exc:
                raise MessageError(ErrorCode.INVALID_FIELD, f"module {module_id!r}: {exc}") from None
        return spec


def value_obs_agents_from_json(value: Any, module_id: str) -> tuple[str, ...]:
    """A module's ``value_obs_agents`` (§9.1, §9.7): an array of agent ids; absent or null, none. Anything
    else is refused (``INVALID_FIELD``): a string is not split into one-letter agent ids."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(agent, str) for agent in value):
        raise MessageError(ErrorCode.INVALID_FIELD, f"module {module_id!r}: value_obs_agents must be an array of "
                           f"agent ids (strings), got {json.dumps(value)[:80]}")
    return tuple(value)


def recurrent_state_from_json(value: Any, module_id: str) -> tuple[StateSpec, ...]:
    """**[1.5]** A module's ``recurrent_state`` (§9.1): an array of {input, output, size}, one per state
    tensor, all of one size, names distinct; absent or null for a module without memory."""
    if value is None:
        return ()
    where = f"module {module_id!r}: recurrent_state"
    if not isinstance(value, list) or not value:
        raise MessageError(ErrorCode.INVALID_FIELD, f"{where} must be a non-empty array")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("input"), str) or not isinstance(
                item.get("output"), str) or not item["input"] or not item["output"]:
            raise MessageError(ErrorCode.INVALID_FIELD, f"{where}: each entry needs input and output names")
        size = item.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_STATE_SIZE:
            raise MessageError(ErrorCode.INVALID_FIELD, f"{where}: size must be an integer from 1 to "
                               f"{MAX_STATE_SIZE}, got {size!r}")
        out.append(StateSpec(item["input"], item["output"], size))
    names = [s.input for s in out] + [s.output for s in out]
    if len(set(names)) != len(names) or len({s.size for s in out}) != 1:
        raise MessageError(ErrorCode.INVALID_FIELD, f"{where}: names must be distinct and sizes equal")
    return tuple(out)


#: **[1.5]** The most units a state tensor may have (§9.1).
MAX_STATE_SIZE = 4096


@dataclass(frozen=True)
class GroupSpec:
    """Agents that act as one: observations and actions concatenated in member order."""

    group_id: str
    members: tuple[str, ...]
    reward: str = "sum"

    def __post_init__(self) -> None:
        if len(self.members) < 1 or len(set(self.members)) != len(self.members):
            raise ValueError(f"group {self.group_id!r} needs distinct members")
        if self.reward not in ("sum", "mean"):
            raise ValueError(f"group {self.group_id!r}: reward must be 'sum' or 'mean'")

    def to_json(self) -> dict[str, Any]:
        return {"members": list(self.members), "reward": self.reward}

    @classmethod
    def from_json(cls, group_id: str, data: Any) -> "GroupSpec":
        try:
            return cls(group_id, tuple(str(m) for m in data["members"]), str(data.get("reward", "sum")))
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(ErrorCode.INVALID_FIELD, f"group {group_id!r}: {exc}") from None

    def combine_rewards(self, rewards: list[float]) -> float:
        """The group's reward for the members' rewards received between two group actions."""
        total = float(sum(rewards))
        return total / len(self.members) if self.reward == "mean" else total

    def join_observations(self, member_obs: Mapping[str, Any]) -> np.ndarray:
        """The group's observation: each member's observation flattened (row-major),
        concatenated in member order. ValueError if a member's observation is missing."""
        missing = [m for m in self.members if m not in member_obs]
        if missing:
            raise ValueError(f"group {self.group_id!r} acts as one agent: observations of {missing} are missing")
        return np.concatenate([np.asarray(member_obs[m], dtype=np.float32).ravel() for m in self.members])

    def split_action(self, action: Any, discrete: bool) -> dict[str, Any]:
        """Each member's part of the group's flattened action, in member order: equal
        consecutive parts; a one-element part of a discrete action is a bare int."""
        flat = np.asarray(action).ravel()
        if len(flat) % len(self.members):
            raise ValueError(f"group {self.group_id!r}: an action of {len(flat)} elements does not split into "
                             f"{len(self.members)} equal parts")
        share = len(flat) // len(self.members)
        parts = {m: flat[i * share:(i + 1) * share] for i, m in enumerate(self.members)}
        return {m: int(p[0]) if discrete and share == 1 else p for m, p in parts.items()}


def value_obs_row(value_obs_agents: Sequence[str], latest_obs: Mapping[str, Any], obs_dim: int) -> np.ndarray:
    """A centralized critic's input (protocol 1.2, §9.7): each listed agent's latest
    observation in the episode, flattened, in list order; zeros for one not observed yet."""
    return np.concatenate([
        np.asarray(latest_obs[a], dtype=np.float32).ravel() if a in latest_obs else np.zeros(obs_dim, np.float32)
        for a in value_obs_agents
    ])


def group_spaces(member_obs: list[Space], member_actions: list[Space]) -> tuple[Space, Space]:
    """The group's spaces: members' Box observations concatenated; Discrete and
    MultiDiscrete actions as one MultiDiscrete, Box actions as one Box."""
    lows = [np.ravel(s.low) for s in member_obs if isinstance(s, Box)]
    highs = [np.ravel(s.high) for s in member_obs if isinstance(s, Box)]
    if len(lows) != len(member_obs):
        raise ValueError("group members need Box observation spaces")
    obs = box(np.concatenate(lows), np.concatenate(highs))
    if all(isinstance(a, (Discrete, MultiDiscrete)) for a in member_actions):
        nvec: list[int] = []
        for a in member_actions:
            if isinstance(a, Discrete):
                if a.start != 0:
                    raise ValueError("grouped Discrete actions must start at 0")
                nvec.append(a.n)
            else:
                nvec.extend(a.nvec)  # type: ignore[union-attr]
        return obs, MultiDiscrete(tuple(nvec))
    if all(isinstance(a, Box) for a in member_actions):
        return obs, box(np.concatenate([np.ravel(a.low) for a in member_actions]),  # type: ignore[union-attr]
                        np.concatenate([np.ravel(a.high) for a in member_actions]))  # type: ignore[union-attr]
    raise ValueError("group members' action spaces must be all discrete or all Box")


@dataclass
class AgentChunk:
    """One agent's validated steps within a multi-agent record."""

    agent_id: str
    module_id: str
    start_step: int
    chunk: EpisodeChunk


@dataclass
class MultiAgentRecord:
    """A validated multi-agent episode chunk."""

    episode_id: str | None
    is_terminated: bool
    is_truncated: bool
    agents: list[AgentChunk] = field(default_factory=list)
    #: **[1.7]** The environment parameters the episode was played with (§19.3), if the record says.
    env_params: RecordEnvParams | None = None

    @property
    def agent_steps(self) -> int:
        return sum(a.chunk.env_steps for a in self.agents)


def decode_multi_agent_record(
    record: Any, index: int, modules: dict[str, ModuleSpec], require_logp: bool
) -> MultiAgentRecord:
    """Validate the per-agent arrays of one record against each agent's module.

    Policy mapping, groups and per-episode agent state need the server's
    state; the server checks them after this (see server/ingest/validation.py).
    """
    where = f"episodes[{index}]"
    if not isinstance(record, dict):
        raise MessageError(ErrorCode.INVALID_FIELD, f"{where}: an episode must be a JSON object")
    if not isinstance(record.get("agents"), dict):
        raise MessageError(ErrorCode.INVALID_FIELD, f'{where}: "agents" must be an object keyed by agent id')
    flags = []
    for key in ("is_terminated", "is_truncated"):
        value = record.get(key, False)
        if not isinstance(value, bool):
            raise MessageError(ErrorCode.INVALID_FIELD, f'{where}: "{key}" must be true or false')
        flags.append(value)
    episode_id = record.get("episode_id")
    # Ids are kept and named (state keys, metric names, logs): Unicode text only (§4.1).
    if isinstance(episode_id, str) and not is_text(episode_id):
        raise MessageError(ErrorCode.INVALID_FIELD, f'{where}: "episode_id" {episode_id!r} is not Unicode text (a lone surrogate)')
    out = MultiAgentRecord(None if episode_id is None else str(episode_id), flags[0], flags[1],
                           env_params=decode_record_env_params(record.get("env_params"), where))
    for agent_id, entry in record["agents"].items():
        if not is_text(agent_id):
            raise MessageError(ErrorCode.INVALID_FIELD, f"{where}: agent id {agent_id!r} is not Unicode text (a lone surrogate)")
        if not isinstance(entry, dict):
            raise MessageError(ErrorCode.INVALID_FIELD, f"{where}.agents[{agent_id!r}] must be an object")
        module_id = entry.get("module")
        if isinstance(module_id, str) and not is_text(module_id):
            raise MessageError(ErrorCode.INVALID_FIELD,
                               f"{where}.agents[{agent_id!r}]: module {module_id!r} is not Unicode text (a lone surrogate)")
        spec = modules.get(module_id) if isinstance(module_id, str) else None
        if spec is None:
            raise MessageError(
                ErrorCode.UNKNOWN_MODULE,
                f"{where}.agents[{agent_id!r}]: module {module_id!r} does not exist (modules: {sorted(modules)})",
            )
        try:
            chunk = decode_episode(entry, index, spec.observation_space, spec.action_space, require_logp,
                                   spec.action_mask, spec.recurrent_state)
        except MessageError as exc:
            raise MessageError(exc.code, f"{exc.message.replace(where, where + '.agents[' + repr(agent_id) + ']', 1)}") from None
        if spec.value_obs_dim is not None:
            value_obs = entry.get("value_obs")
            try:
                arr = numbers_array(value_obs, np.float32) if isinstance(value_obs, list) else None
            except (ValueError, TypeError):
                arr = None  # ragged rows, strings or booleans: reported as a shape mismatch below
            if arr is None or arr.shape != (chunk.obs.shape[0], spec.value_obs_dim):
                raise MessageError(
                    ErrorCode.OBS_SHAPE_MISMATCH,
                    f"{where}.agents[{agent_id!r}]: module {module_id!r} has a centralized critic: \"value_obs\" "
                    f"must be {chunk.obs.shape[0]} rows of {spec.value_obs_dim} numbers",
                )
            if not np.isfinite(arr).all():
                raise MessageError(ErrorCode.NON_FINITE_VALUE, f"{where}.agents[{agent_id!r}]: value_obs is not finite")
            chunk.value_obs = arr
        if (flags[0] or flags[1]) and not (chunk.is_terminated or chunk.is_truncated):
            # The record ends the episode: an entry that says nothing of its own end ends with it
            # (terminated wins), so its last observation is not bootstrapped as if play went on (§10.7).
            chunk.is_terminated, chunk.is_truncated = flags[0], not flags[0]
        chunk.episode_id = f"{out.episode_id}\x00{agent_id}"
        start = entry.get("start_step", 0)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise MessageError(ErrorCode.INVALID_FIELD, f"{where}.agents[{agent_id!r}]: start_step must be an integer >= 0")
        out.agents.append(AgentChunk(str(agent_id), module_id, start, chunk))  # type: ignore[arg-type]
    return out


def decode_single_agent_record(record: Any, index: int, modules: Mapping[str, ModuleSpec], default_module: str | None,
                               require_logp: bool) -> MultiAgentRecord:
    """Validate a single-agent (v1) record (§10.6) as a chunk of the agent ``"default_agent"``
    of the default module. Refused before any other check when there is no default module
    (UNMAPPED_AGENT), or when the default module has a centralized critic (OBS_SHAPE_MISMATCH):
    such a record has no value_obs, and one of them must not fail every module's update."""
    if default_module is None:
        raise MessageError(
            ErrorCode.UNMAPPED_AGENT,
            f"episodes[{index}] is a single-agent record but no policy-mapping rule matches {DEFAULT_AGENT_ID!r}",
        )
    spec = modules[default_module]
    if spec.value_obs_dim is not None:
        raise MessageError(
            ErrorCode.OBS_SHAPE_MISMATCH,
            f"episodes[{index}] is a single-agent record, but the default module {default_module!r} has a centralized "
            f"critic (value_obs_agents): send a multi-agent record whose entry has value_obs",
        )
    chunk = decode_episode(record, index, spec.observation_space, spec.action_space, require_logp, spec.action_mask,
                           spec.recurrent_state)
    return MultiAgentRecord(chunk.episode_id, chunk.is_terminated, chunk.is_truncated,
                            [AgentChunk(DEFAULT_AGENT_ID, default_module, 0, chunk)],
                            decode_record_env_params(record.get("env_params"), f"episodes[{index}]"))
