"""Turns a ServerConfig into modules, their hyperparameters, the policy
mapping and the groups: the multi-agent layout the server trains and serves.

Without ``modules`` in the config the server has one module,
``default_policy``, that every agent maps to; its spaces come from
``observation_space``/``action_space`` or the gymnasium ``env``.
"""

from __future__ import annotations

import dataclasses
import fnmatch

from dataclasses import dataclass, field
from typing import Any, Callable

from tether.protocol.action_mask import resolve_action_mask
from tether.protocol.episodes import MAX_RECURRENT_CHUNK_STEPS, StateSpec
from tether.protocol.multi_agent import DEFAULT_AGENT_ID, GroupSpec, ModuleSpec
from tether.protocol.policy_mapping import PolicyMapping
from tether.protocol.spaces import Box, Space, from_gymnasium, is_composite, space_from_json

from .config import PPO_OPTION_NAMES, ServerConfig
from .learner import PPOHyperparams
from .learner.model_config import parse_model_config
from .learner.schedule import check_schedule
from .self_play import SelfPlayConfig, snapshot_module_id

DEFAULT_MODULE_ID = "default_policy"

#: A server-side mapping function: (agent_id, episode_id) -> module id.
MappingFn = Callable[[str, str], str]


@dataclass
class ModuleLayout:
    """Everything about modules that the server decides once at start."""

    specs: dict[str, ModuleSpec]
    hyperparams: dict[str, PPOHyperparams]
    mapping: PolicyMapping | None
    mapping_fn: MappingFn | None = None
    groups: dict[str, GroupSpec] = field(default_factory=dict)
    #: module -> (checkpoint path, module id in it) whose trained weights it starts from.
    init_from: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Self-play (server/self_play.py): teams, and the snapshot modules added to ``specs``.
    self_play: SelfPlayConfig | None = None

    @property
    def client_mapping(self) -> PolicyMapping | None:
        """The rules clients evaluate themselves (SET_CONFIG); None when the server maps (a mapping
        function, or self-play, whose opponents the server draws per episode: §9.5, §9.8)."""
        return None if self.self_play is not None else self.mapping

    @property
    def trainable(self) -> list[str]:
        return [m for m, spec in self.specs.items() if spec.trainable]

    def group_of(self, agent_id: str) -> str | None:
        """The group an agent id belongs to as a member, if any."""
        for group in self.groups.values():
            if agent_id in group.members:
                return group.group_id
        return None

    def default_module(self) -> str | None:
        """The module a single-agent (v1) record's agent maps to, if any (decided once)."""
        if not hasattr(self, "_default_module"):
            try:
                module: str | None = self.module_for(DEFAULT_AGENT_ID, "")
            except Exception:  # no rule, or a mapping function that refuses default_agent
                module = None
            self._default_module = module if module in self.specs else None
        return self._default_module

    def module_for(self, agent_id: str, episode_id: str) -> str:
        if self.mapping is not None:
            return self.mapping.module_for(agent_id, episode_id)
        assert self.mapping_fn is not None
        return self.mapping_fn(agent_id, episode_id)


def _space(value: Any, what: str) -> Space:
    if value is None:
        raise ValueError(f"{what} is missing")
    return space_from_json(value)


def resolve_single_spaces(config: ServerConfig) -> tuple[Space, Space]:
    """Spaces from the config's JSON, else from the gymnasium env named in ``env``."""
    obs = space_from_json(config.observation_space) if config.observation_space else None
    act = space_from_json(config.action_space) if config.action_space else None
    if obs is None or act is None:
        if not config.env:
            raise ValueError("give observation_space and action_space, or env (a gymnasium env id)")
        import gymnasium as gym

        env = gym.make(config.env)
        obs = obs or from_gymnasium(env.observation_space)
        act = act or from_gymnasium(env.action_space)
        env.close()
    return obs, act


def import_mapping_fn(path: str) -> MappingFn:
    """Import 'package.module:function'."""
    import importlib

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy_mapping_fn must look like 'package.module:function', got {path!r}")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise ValueError(f"policy_mapping_fn {path!r} is not callable")
    return fn


def build_layout(config: ServerConfig, mapping_fn: MappingFn | None = None) -> ModuleLayout:
    """Modules, hyperparameters, mapping and groups from the config; ValueError if inconsistent."""
    if mapping_fn is None and config.policy_mapping_fn:
        mapping_fn = import_mapping_fn(config.policy_mapping_fn)
    base = config.ppo_options()
    specs: dict[str, ModuleSpec] = {}
    hps: dict[str, PPOHyperparams] = {}
    init_from: dict[str, tuple[str, str]] = {}
    if not config.modules:
        obs, act = resolve_single_spaces(config)
        specs[DEFAULT_MODULE_ID] = ModuleSpec(DEFAULT_MODULE_ID, obs, act, config.onnx_input_name, config.onnx_output_name,
                                              action_mask_leaf=_mask_leaf(obs, act, config.action_mask, DEFAULT_MODULE_ID))
        hps[DEFAULT_MODULE_ID] = _hyperparams(base, {}, DEFAULT_MODULE_ID, config.max_env_steps)
        if config.init_from is not None:
            init_from[DEFAULT_MODULE_ID] = _init_from(config.init_from, DEFAULT_MODULE_ID)
        rules = config.policy_mapping or [{"pattern": "*", "module": DEFAULT_MODULE_ID}]
    elif config.init_from is not None:
        raise ValueError("init_from applies to a configuration without modules; with modules, give each module "
                         "its own init_from")
    else:
        for module_id, entry in config.modules.items():
            if not isinstance(entry, dict):
                raise ValueError(f"module {module_id!r} must be a table of options")
            unknown = set(entry) - {"observation_space", "action_space", "trainable", "value_obs_agents",
                                    "onnx_input_name", "onnx_output_name", "init_from", "action_mask",
                                    *PPO_OPTION_NAMES}
            if unknown:
                raise ValueError(f"module {module_id!r}: unknown option(s) {sorted(unknown)}")
            obs = _space(entry.get("observation_space"), f"module {module_id!r} observation_space")
            act = _space(entry.get("action_space"), f"module {module_id!r} action_space")
            specs[module_id] = ModuleSpec(
                module_id, obs, act,
                entry.get("onnx_input_name", config.onnx_input_name),
                entry.get("onnx_output_name", config.onnx_output_name),
                bool(entry.get("trainable", True)),
                _value_obs_agents(entry.get("value_obs_agents"), module_id),
                _mask_leaf(obs, act, entry.get("action_mask", config.action_mask), module_id),
            )
            hps[module_id] = _hyperparams(base, {k: v for k, v in entry.items() if k in PPO_OPTION_NAMES}, module_id,
                                          config.max_env_steps)
            if entry.get("init_from") is not None:
                init_from[module_id] = _init_from(entry["init_from"], module_id)
        rules = config.policy_mapping
    if config.policies_to_train is not None:
        unknown_train = set(config.policies_to_train) - set(specs)
        if unknown_train:
            raise ValueError(f"policies_to_train names unknown module(s) {sorted(unknown_train)}")
        specs = {m: _with_trainable(s, m in config.policies_to_train) for m, s in specs.items()}
    mapping = None
    if mapping_fn is None:
        if rules is None:
            raise ValueError("multi-agent configs need policy_mapping rules (or a mapping function)")
        mapping = PolicyMapping.from_json(rules)
        missing = mapping.modules() - set(specs)
        if missing:
            raise ValueError(f"policy_mapping names module(s) that do not exist: {sorted(missing)}")
    for module_id, spec in specs.items():
        composite = is_composite(spec.observation_space)
        clash = [leaf.path for leaf in spec.observation_space.leaves if leaf.path == spec.onnx_output_name] \
            if composite else []
        if clash:  # (one input per leaf, named by its path: the graph cannot have a second value of that name)
            raise ValueError(f"module {module_id!r}: the observation leaf {clash[0]!r} has the name of the model's "
                             f"output; rename the leaf (or the output, onnx_output_name)")
        if is_composite(spec.action_space):
            raise ValueError(f"module {module_id!r}: a Dict or Tuple action space is not supported (actions are Box, "
                             f"Discrete or MultiDiscrete)")
        network = parse_model_config(hps[module_id].model, spec.obs_dim, module_id, composite)  # a bad one fails here
        if network.recurrent is not None:
            names = {spec.onnx_output_name, *spec.onnx_input_names}
            state = tuple(StateSpec(f"state_in_{n}", f"state_out_{n}", network.recurrent.size)
                          for n in network.recurrent.state_names)
            taken = sorted(names & {n for s in state for n in (s.input, s.output)})
            if taken:
                raise ValueError(f"module {module_id!r}: the model's input or output {taken[0]!r} has the name of "
                                 f"a recurrent state tensor; rename it")
            specs[module_id] = spec = dataclasses.replace(spec, recurrent_state=state)
            if config.env_steps_per_sample > MAX_RECURRENT_CHUNK_STEPS:
                raise ValueError(f"module {module_id!r} has memory: its records hold at most "
                                 f"{MAX_RECURRENT_CHUNK_STEPS} steps (§10.1), so env_steps_per_sample "
                                 f"({config.env_steps_per_sample}) must not be larger")
        if hps[module_id].normalize_observations and network.encoder == "cnn" and not composite:
            raise ValueError(f"module {module_id!r}: normalize_observations applies to vector observations; the cnn "
                             f"encoder scales images by its 'scale'")
        if not hps[module_id].normalize_clip > 0:
            raise ValueError(f"module {module_id!r}: normalize_clip must be positive, got {hps[module_id].normalize_clip}")
        hp = hps[module_id]
        if not (hp.bc_coef >= 0 and hp.demo_coef >= 0 and hp.demo_decay_updates >= 0):
            raise ValueError(f"module {module_id!r}: bc_coef, demo_coef and demo_decay_updates must be >= 0 (a "
                             f"negative coefficient would push the policy away from the demonstrated actions), got "
                             f"{hp.bc_coef}, {hp.demo_coef}, {hp.demo_decay_updates}")
    _check_batch_fits_a_frame(specs, config)
    groups = {gid: GroupSpec.from_json(gid, g) for gid, g in (config.groups or {}).items()}
    _check_critic_agents_not_grouped(specs, groups)
    if mapping is not None:
        _check_critic_widths(specs, mapping)
    self_play = None
    if config.self_play is not None:
        self_play = _add_snapshot_modules(config.self_play, specs, hps, mapping)
    return ModuleLayout(specs, hps, mapping, mapping_fn, groups, init_from, self_play)


def _team_modules(self_play: SelfPlayConfig, mapping: PolicyMapping, specs: dict[str, ModuleSpec]) -> list[str]:
    """The trainable modules of the rules that a team's agents can match: a rule whose agent id a
    team's pattern matches, or whose pattern and a team's pattern match each other as text
    (``scout_*`` and ``scout_0``); a module of agents outside every team needs no snapshots."""
    named: set[str] = set()
    for rule in mapping.rules:
        ids = [rule.agent_id] if rule.agent_id is not None else [rule.pattern]
        if any(fnmatch.fnmatchcase(i, team) or (rule.pattern is not None and fnmatch.fnmatchcase(team, rule.pattern))
               for i in ids for team in self_play.teams):
            named.update([rule.module] if rule.module is not None else rule.choose_from)
    return [m for m in specs if m in named and specs[m].trainable]


def _add_snapshot_modules(table: Any, specs: dict[str, ModuleSpec], hps: dict[str, PPOHyperparams],
                          mapping: PolicyMapping | None) -> SelfPlayConfig:
    """Parse ``self_play`` and add each self-play module's snapshot slots to ``specs`` (frozen
    copies: same spaces and network, served under ``module@slot``); ValueError naming the problem."""
    self_play = SelfPlayConfig.from_json(table)
    if mapping is None:
        raise ValueError("self_play needs policy_mapping rules (the server draws opponents on top of them; a "
                         "policy_mapping_fn cannot be combined with it)")
    modules = list(dict.fromkeys(self_play.modules)) or _team_modules(self_play, mapping, specs)
    for module_id in modules:
        if module_id not in specs:
            raise ValueError(f"self_play.modules names module {module_id!r}, which does not exist")
        if not specs[module_id].trainable:
            raise ValueError(f"self_play.modules names module {module_id!r}, which is not trained: its snapshots "
                             "would all be the same policy")
    if not modules:
        raise ValueError("self_play: no trainable module to take snapshots of")
    self_play = dataclasses.replace(self_play, modules=tuple(modules))
    for module_id in modules:
        for slot in range(self_play.window):
            slot_id = snapshot_module_id(module_id, slot)
            if slot_id in specs:
                raise ValueError(f"module {slot_id!r} clashes with the id of a self-play snapshot of "
                                 f"{module_id!r}: rename it")
            specs[slot_id] = dataclasses.replace(specs[module_id], module_id=slot_id, trainable=False,
                                                 snapshot_of=module_id)
            hps[slot_id] = dataclasses.replace(hps[module_id], demos=None)
    return self_play


def _check_batch_fits_a_frame(specs: dict[str, ModuleSpec], config: ServerConfig) -> None:
    """A client cuts a batch every env_steps_per_sample steps; with images, that many observations
    can be larger than the largest message the server takes, and such a batch could never be
    delivered (the connection is closed under it, the client resends it, then gives it up). Refused
    at start, by the numbers: one agent per env step and observations as tensors (1 byte per byte-leaf
    value, 4 per float) are the least a batch can hold."""
    for module_id, spec in specs.items():
        space = spec.observation_space
        leaves = space.leaves if is_composite(space) else None
        has_images = any(leaf.is_bytes for leaf in leaves) if leaves is not None else (
            isinstance(space, Box) and space.is_bytes)
        if not has_images:
            continue  # (vector observations: a batch of them is far below the limit at any sensible size)
        per_step = (sum(leaf.size * (1 if leaf.is_bytes else 4) for leaf in leaves) if leaves is not None
                    else spec.obs_dim)
        least = (config.env_steps_per_sample + 1) * per_step
        if least > config.max_frame_bytes:
            raise ValueError(
                f"module {module_id!r}: a batch of env_steps_per_sample {config.env_steps_per_sample} steps holds at "
                f"least {least:,} bytes of observations ({per_step:,} per step), more than max_frame_bytes "
                f"{config.max_frame_bytes:,}: lower env_steps_per_sample (to {config.max_frame_bytes // per_step // 2:,} "
                "or fewer) or raise max_frame_bytes")


def _mask_leaf(obs: Space, act: Space, name: Any, module_id: str) -> str | None:
    """The leaf that masks the module's actions (§11.6): ``name``, or by default a Dict's
    ``action_mask`` leaf; ValueError naming the module when it cannot mask them."""
    if name is not None and not isinstance(name, str):
        raise ValueError(f"module {module_id!r}: action_mask must be a leaf path (a string), got {name!r}")
    try:
        mask = resolve_action_mask(obs, act, name)
    except ValueError as exc:
        raise ValueError(f"module {module_id!r}: {exc}") from None
    return None if mask is None else mask.leaf.path


def _init_from(value: Any, module_id: str) -> tuple[str, str]:
    """A module's init_from: 'checkpoint.pt' (the module of the same id in it) or 'checkpoint.pt#other'."""
    if not isinstance(value, str) or not value.strip("#"):
        raise ValueError(f"module {module_id!r}: init_from must be a checkpoint path, optionally '#module', "
                         f"got {value!r}")
    path, _, source = value.rpartition("#")
    if not path or "/" in source or "\\" in source:  # no '#module' (a '#' of the path itself)
        path, source = value, module_id
    return path, source or module_id


def _value_obs_agents(value: Any, module_id: str) -> tuple[str, ...]:
    """A module's value_obs_agents: a list of distinct, non-empty agent ids (a string would
    otherwise be read as its characters, and the critic would see zeros)."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) and a for a in value):
        raise ValueError(f"module {module_id!r}: value_obs_agents must be a list of agent ids (strings), "
                         f"got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError(f"module {module_id!r}: value_obs_agents lists an agent twice: {list(value)}")
    return tuple(value)


def _check_critic_agents_not_grouped(specs: dict[str, ModuleSpec], groups: dict[str, GroupSpec]) -> None:
    """A group member's observation is only part of its group's, and a client keeps no row of a
    group's own (§9.7): neither can be listed in value_obs_agents."""
    member_of = {m: gid for gid, g in groups.items() for m in g.members}
    for module_id, spec in specs.items():
        for agent_id in spec.value_obs_agents:
            if agent_id in groups:
                raise ValueError(f"module {module_id!r}: value_obs_agents lists group {agent_id!r}; list agents that "
                                 f"are not in a group (§9.7)")
            if agent_id in member_of:
                raise ValueError(f"module {module_id!r}: value_obs_agents lists {agent_id!r}, a member of group "
                                 f"{member_of[agent_id]!r}; list agents that are not in a group (§9.7)")


def _check_critic_widths(specs: dict[str, ModuleSpec], mapping: PolicyMapping) -> None:
    """The centralized critic's input is the listed agents' observations side by side, each as wide
    as the module's own (§9.7): a listed agent that the rules map to modules with other observation
    sizes is refused."""
    for module_id, spec in specs.items():
        for agent_id in spec.value_obs_agents:
            rule = next((r for r in mapping.rules if r.matches(agent_id)), None)
            if rule is None:  # (a typo: the critic would read zeros for it forever)
                raise ValueError(f"module {module_id!r}: value_obs_agents lists {agent_id!r}, which no "
                                 "policy_mapping rule maps (list agents of the run)")
            for other in [rule.module] if rule.module is not None else list(rule.choose_from):
                if other in specs and specs[other].obs_dim != spec.obs_dim:
                    raise ValueError(
                        f"module {module_id!r}: value_obs_agents lists {agent_id!r}, which maps to module {other!r} "
                        f"with {specs[other].obs_dim} observation values, but the critic takes {spec.obs_dim} per agent")


def _with_trainable(spec: ModuleSpec, trainable: bool) -> ModuleSpec:
    from dataclasses import replace

    return replace(spec, trainable=trainable)


def _hyperparams(base: dict[str, Any], overrides: dict[str, Any], module_id: str,
                 max_env_steps: int | None) -> PPOHyperparams:
    merged = dict(base, **overrides)
    merged["hidden_sizes"] = tuple(int(v) for v in merged["hidden_sizes"])
    for name in ("lr_schedule", "ent_coef_schedule"):
        try:
            check_schedule(name, merged[name], max_env_steps)
        except ValueError as exc:  # (named for the module only where its entry set it)
            raise ValueError(f"module {module_id!r}: {exc}" if name in overrides else str(exc)) from None
    return PPOHyperparams(**merged)
