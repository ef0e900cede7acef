"""**[1.6]** Demonstration files (§18): whole recorded episodes as JSON Lines.

The first line is a header naming every module's spaces; each later line is one agent's whole
episode in the form of a single-agent record (§10.1) plus ``module``, ``agent_id`` and
``episode_id``. Writers (every SDK) append a line per finished episode; the server reads a file
back with ``read_demonstrations`` and trains from it (behavioural cloning, §13.7).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .episodes import EpisodeChunk, decode_episode, logged_runs
from .errors import MessageError
from .multi_agent import ModuleSpec
from .spaces import Box, Space, is_composite, leaf_arrays

FORMAT = "tether-demonstrations"
VERSION = 1
#: Record members (§10.1) an episode line does not carry; a reader ignores them (§18).
_NOT_READ = ("action_logp", "action_dist_inputs", "state_in", "weights_seq_no_runs")


class DemonstrationError(ValueError):
    """A demonstration file that cannot be used: ``line`` (1-based, 0 for the file as a whole)
    names where, and the message what."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@dataclass
class DemoEpisode:
    """One agent's whole episode of a demonstration file, validated against its module's spaces."""

    module: str
    agent_id: str
    episode_id: str
    chunk: EpisodeChunk


@dataclass
class Demonstrations:
    """A demonstration file read back: the header's modules and the episodes, in file order."""

    modules: dict[str, ModuleSpec]
    episodes: list[DemoEpisode] = field(default_factory=list)

    def steps(self, module: str) -> int:
        """How many steps the episodes of ``module`` hold."""
        return sum(e.chunk.env_steps for e in self.episodes if e.module == module)

    def of_module(self, module: str) -> list[DemoEpisode]:
        return [e for e in self.episodes if e.module == module]

    def cloning_data(self, module: str) -> tuple[np.ndarray, np.ndarray]:
        """Every step of ``module``'s episodes as (flat observation rows, actions): what behavioural
        cloning trains on (each step's observation and the action taken on it)."""
        episodes = self.of_module(module)
        if not episodes:
            raise DemonstrationError(0, f"the demonstrations hold no episode of module {module!r} "
                                        f"(they hold {sorted({e.module for e in self.episodes}) or 'none'})")
        obs = np.concatenate([e.chunk.obs[:-1].reshape(e.chunk.env_steps, -1) for e in episodes])
        actions = np.concatenate([e.chunk.actions for e in episodes])
        return obs, actions

    def returns(self, module: str, gamma: float) -> np.ndarray:
        """The discounted return from each step of ``module``'s episodes, in ``cloning_data``'s order
        (0 after the last step: a truncated episode's future is not known)."""
        out = []
        for e in self.of_module(module):
            rewards = e.chunk.rewards.astype(np.float64)
            ret = np.zeros_like(rewards)
            running = 0.0
            for t in range(len(rewards) - 1, -1, -1):
                running = rewards[t] + gamma * running
                ret[t] = running
            out.append(ret.astype(np.float32))
        return np.concatenate(out)

    def check_spaces(self, module: str, spec: ModuleSpec) -> None:
        """Refuse, by name, demonstrations of ``module`` that are not steps in ``spec``'s spaces. Spaces
        written alike are; others are when they are laid out alike (the same kinds, shapes and leaves; a
        byte box only for a byte box) and every recorded action lies in the module's action space, as
        for a client's steps (§10.6 check 14; observations are not held to bounds there either): a
        dataset of float64 boxes, or with other bounds, as third-party datasets often have. With a
        module's action mask, every episode is checked against it (checks 14b-14d), whatever the file
        declares: a forbidden action would be cloned at a logit of -1e9."""
        have = self.modules.get(module)
        if have is None:
            raise DemonstrationError(0, f"the demonstrations have no module {module!r} (they have "
                                        f"{sorted(self.modules) or 'none'})")
        for what in ("observation_space", "action_space"):
            recorded, wanted = getattr(have, what), getattr(spec, what)
            if recorded.to_json() == wanted.to_json():
                continue
            why = _layout_difference(recorded, wanted)
            if why is None and what == "action_space":
                why = self._action_outside(module, wanted)
            if why is not None:
                raise DemonstrationError(0, f"module {module!r}: the demonstrations' {what} "
                                            f"{json.dumps(recorded.to_json())} is not the module's "
                                            f"{json.dumps(wanted.to_json())}: {why}")
        mask = spec.action_mask
        if mask is not None:  # (the module's mask, whatever the file declares: a masked step cannot be cloned)
            for episode in self.of_module(module):
                try:
                    mask.check(episode.chunk.obs, episode.chunk.actions, 0)
                except MessageError as exc:
                    raise DemonstrationError(0, f"module {module!r}: episode {episode.episode_id!r} (agent "
                                                f"{episode.agent_id!r}) breaks the module's action mask: "
                                                f"{exc.code.value}: {exc.message.removeprefix('episodes[0]: ')}"
                                             ) from None

    def _action_outside(self, module: str, space: Space) -> str | None:
        """The first recorded action of ``module``'s episodes outside ``space`` (None: every one is in it).
        A Box action is always in it (§10.6 check 14: the record carries the raw sample, inside the
        bounds or not)."""
        if isinstance(space, Box):
            return None
        for episode in self.of_module(module):
            actions = np.asarray(episode.chunk.actions)
            outside = np.flatnonzero(~space.contains_batch(actions.reshape((len(actions), *space.shape))))  # type: ignore[union-attr]
            if len(outside):
                step = int(outside[0])
                return (f"episode {episode.episode_id!r} (agent {episode.agent_id!r}), step {step}: action "
                        f"{actions[step].tolist()!r:.200} is outside the module's action space")
        return None


def _layout_difference(recorded: Space, wanted: Space) -> str | None:
    """Why values of ``recorded`` cannot be read as values of ``wanted`` (None: laid out alike)."""
    if is_composite(recorded) or is_composite(wanted):
        if not (is_composite(recorded) and is_composite(wanted)):
            return "one is a Dict or Tuple and the other is not"
        paths = [leaf.path for leaf in recorded.leaves], [leaf.path for leaf in wanted.leaves]
        if paths[0] != paths[1]:
            return f"their leaves differ ({paths[0]} and {paths[1]})"
        for mine, theirs in zip(recorded.leaves, wanted.leaves):
            why = _layout_difference(mine.space, theirs.space)
            if why is not None:
                return f"leaf {mine.path!r}: {why}"
        return None
    if type(recorded) is not type(wanted):
        return f"a {type(recorded).__name__} is not a {type(wanted).__name__}"
    if tuple(recorded.shape) != tuple(wanted.shape):
        return f"shape {list(recorded.shape)} is not {list(wanted.shape)}"
    if isinstance(recorded, Box) and isinstance(wanted, Box) and recorded.is_bytes != wanted.is_bytes:
        return f"dtype {recorded.dtype} is not {wanted.dtype} (byte boxes are encoded as bytes)"
    return None


def header(modules: Mapping[str, ModuleSpec]) -> dict[str, Any]:
    """The first line of a file holding episodes of ``modules``."""
    entries = {}
    for module_id, spec in modules.items():
        entry: dict[str, Any] = {"observation_space": spec.observation_space.to_json(),
                                 "action_space": spec.action_space.to_json()}
        if spec.action_mask_leaf is not None:
            entry["action_mask"] = spec.action_mask_leaf
        entries[module_id] = entry
    return {"format": FORMAT, "version": VERSION, "modules": entries}


def episode_line(module: str, agent_id: str, episode_id: str, observation_space: Space, obs: list[Any],
                 actions: list[Any], rewards: list[float], terminated: bool, logged: Iterable[bool]) -> dict[str, Any]:
    """One episode line: ``obs`` its T+1 observations (flat rows for a Dict or Tuple space, written as
    one member per leaf), ``actions`` and ``rewards`` its T steps', ``logged`` per step."""
    if is_composite(observation_space):
        rows = np.stack([np.asarray(o, dtype=np.float32).reshape(-1) for o in obs])
        wire_obs: Any = {path: values.tolist() for path, values in leaf_arrays(observation_space, rows).items()}
    else:
        wire_obs = [np.asarray(o).tolist() for o in obs]
    line: dict[str, Any] = {
        "module": module, "agent_id": agent_id, "episode_id": episode_id, "obs": wire_obs,
        "actions": [a.tolist() if isinstance(a, np.ndarray) else a for a in actions],
        "rewards": [float(r) for r in rewards], "is_terminated": bool(terminated), "is_truncated": not terminated,
    }
    runs = logged_runs(list(logged))
    if runs is not None:
        line["logged_runs"] = runs
    return line


def parse_demonstrations(text: str) -> Demonstrations:
    """A demonstration file's text, checked line by line (§18); raises DemonstrationError naming the line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # (the last line's LF)
    if not lines:
        raise DemonstrationError(1, "the file is empty: a demonstration file starts with its header line")
    head = _json_line(lines[0], 1)
    if head.get("format") != FORMAT or head.get("version") != VERSION:
        raise DemonstrationError(1, f'not a demonstration file header: needs "format": "{FORMAT}" and '
                                    f'"version": {VERSION}, got {head.get("format")!r} and {head.get("version")!r}')
    entries = head.get("modules")
    if not isinstance(entries, dict):
        raise DemonstrationError(1, '"modules" must be an object: module id -> {observation_space, action_space}')
    modules: dict[str, ModuleSpec] = {}
    for module_id, entry in entries.items():
        try:
            modules[module_id] = ModuleSpec.from_json(module_id, entry)
        except (MessageError, ValueError) as exc:
            raise DemonstrationError(1, f"module {module_id!r}: {getattr(exc, 'message', exc)}") from None
    out = Demonstrations(modules)
    for number, text_line in enumerate(lines[1:], start=2):
        out.episodes.append(episode_from_line(_json_line(text_line, number), number, modules))
    return out


def read_demonstrations(path: str | Path) -> Demonstrations:
    """A demonstration file from disk (see ``parse_demonstrations``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DemonstrationError(0, f"cannot read the demonstration file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise DemonstrationError(line, "not UTF-8 text (a corrupt file?)") from None
    return parse_demonstrations(text)


def _json_line(text: str, number: int) -> dict[str, Any]:
    if not text.strip():
        raise DemonstrationError(number, "a blank line (every line is one JSON object)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DemonstrationError(number, f"not a JSON object (a truncated or corrupt line?): {exc.msg}") from None
    if not isinstance(value, dict):
        raise DemonstrationError(number, f"not a JSON object but {type(value).__name__}")
    return value


def episode_from_line(line: dict[str, Any], number: int, modules: Mapping[str, ModuleSpec]) -> DemoEpisode:
    """One episode line (a parsed JSON object, line ``number``) checked against its module's spaces (§18)."""
    module = line.get("module")
    spec = modules.get(module) if isinstance(module, str) else None
    if spec is None:
        raise DemonstrationError(number, f'"module" {module!r} is not a module of the header ({sorted(modules)})')
    for key in ("agent_id", "episode_id"):
        if not isinstance(line.get(key), str):
            raise DemonstrationError(number, f'"{key}" must be a string')
    # (§18: checks 1-14d and 20 only; the members of checks 15-19 are not a demonstration's and are ignored)
    record = {k: v for k, v in line.items() if k not in _NOT_READ}
    try:
        chunk = decode_episode(record, 0, spec.observation_space, spec.action_space, False, spec.action_mask)
    except MessageError as exc:
        raise DemonstrationError(number, exc.message.removeprefix("episodes[0]: ")) from None
    if not (chunk.is_terminated or chunk.is_truncated):
        raise DemonstrationError(number, "an episode line needs is_terminated or is_truncated true (whole episodes only)")
    return DemoEpisode(str(module), line["agent_id"], line["episode_id"], chunk)
