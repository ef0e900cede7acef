"""Declarative policy mapping: which module an agent id is trained and served by.

Rules are plain JSON so every SDK evaluates them locally, without a round trip
to the server, and all of them agree::

    [{"agent_id": "good_0", "module": "runner"},                       # exact id
     {"pattern": "adversary_*", "module": "chaser"},                   # glob (fnmatch: * ? [..])
     {"pattern": "car_*", "choose_from": ["car_a", "car_b"]}]           # one of, per agent, per episode

The first rule that matches wins; an agent no rule matches is an error. A
"choose_from" rule picks ``choose_from[fnv1a32(episode_id + "\\x00" + agent_id) % n]``:
stable for an agent within an episode (like RLlib's ``random.choice`` keyed on
the episode), different across episodes, and identical in every language.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Container, Sequence

from .errors import ErrorCode, MessageError

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a hash (the mapping's language-neutral 'random' choice)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


class UnmappedAgentError(MessageError):
    """No rule matches an agent id."""

    def __init__(self, agent_id: str) -> None:
        super().__init__(ErrorCode.UNMAPPED_AGENT, f"no policy-mapping rule matches agent id {agent_id!r}")
        self.agent_id = agent_id


@dataclass(frozen=True)
class MappingRule:
    """One rule: an exact ``agent_id`` or a glob ``pattern``, and a module or a choice of modules."""

    agent_id: str | None = None
    pattern: str | None = None
    module: str | None = None
    choose_from: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.agent_id is None) == (self.pattern is None):
            raise ValueError("a mapping rule needs exactly one of 'agent_id' and 'pattern'")
        if (self.module is None) == (not self.choose_from):
            raise ValueError("a mapping rule needs exactly one of 'module' and 'choose_from'")
        object.__setattr__(self, "_regex", re.compile(fnmatch.translate(self.pattern)) if self.pattern else None)

    def matches(self, agent_id: str) -> bool:
        if self.agent_id is not None:
            return agent_id == self.agent_id
        return self._regex.match(agent_id) is not None  # type: ignore[attr-defined]

    def module_for(self, agent_id: str, episode_id: str) -> str:
        if self.module is not None:
            return self.module
        index = fnv1a32(f"{episode_id}\x00{agent_id}".encode()) % len(self.choose_from)
        return self.choose_from[index]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"agent_id": self.agent_id} if self.agent_id is not None else {"pattern": self.pattern}
        if self.module is not None:
            out["module"] = self.module
        else:
            out["choose_from"] = list(self.choose_from)
        return out


class PolicyMapping:
    """An ordered list of rules; ``module_for`` applies the first that matches."""

    def __init__(self, rules: Sequence[MappingRule]) -> None:
        self.rules = tuple(rules)

    @classmethod
    def from_json(cls, data: Any) -> "PolicyMapping":
        """Parse the JSON list form; raises ``MessageError`` (INVALID_FIELD) if malformed."""
        if not isinstance(data, list):
            raise MessageError(ErrorCode.INVALID_FIELD, "policy_mapping must be a list of rules")
        rules = []
        for i, item in enumerate(data):
            if not isinstance(item, dict) or set(item) - {"agent_id", "pattern", "module", "choose_from"}:
                raise MessageError(ErrorCode.INVALID_FIELD, f"policy_mapping[{i}] has unknown keys or is not an object")
            try:
                choose = item.get("choose_from") or ()
                if not isinstance(choose, (list, tuple)) or not all(isinstance(m, str) for m in choose):
                    raise ValueError("'choose_from' must be a list of module names")
                rules.append(MappingRule(item.get("agent_id"), item.get("pattern"), item.get("module"), tuple(choose)))
            except (ValueError, TypeError) as exc:
                raise MessageError(ErrorCode.INVALID_FIELD, f"policy_mapping[{i}]: {exc}") from None
        return cls(rules)

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.rules]

    def modules(self) -> set[str]:
        """Every module name a rule can produce."""
        out: set[str] = set()
        for r in self.rules:
            out.update([r.module] if r.module is not None else r.choose_from)
        return out

    def module_for(self, agent_id: str, episode_id: str = "") -> str:
        """The module for an agent that first appears in episode ``episode_id``."""
        for rule in self.rules:
            if rule.matches(agent_id):
                return rule.module_for(agent_id, episode_id)
        raise UnmappedAgentError(agent_id)


def read_agent_modules(answer: Any, asked: Sequence[str], described: Container[str]) -> dict[str, str]:
    """The module of each id in ``asked`` from the server's answer to MAP_AGENTS (§7.10, §7.11).

    ``answer`` is the message object; ``described`` the modules SET_CONFIG described. Raises
    ``MessageError``: ``INVALID_FIELD`` for another message than ``AGENT_MODULES {"modules": {...}}``;
    then, id by id in the order asked, the first whose entry is missing or not a string
    (``INVALID_FIELD``) or names a module not described (``UNKNOWN_MODULE``). Ids not asked about
    are ignored. Nothing of an answer refused is returned: a client keeps none of it.
    """
    modules = answer.get("modules") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or answer.get("type") != "AGENT_MODULES" or not isinstance(modules, dict):
        raise MessageError(ErrorCode.INVALID_FIELD, 'MAP_AGENTS was not answered with AGENT_MODULES {"modules": {...}}')
    for agent_id in asked:
        module_id = modules.get(agent_id)
        if not isinstance(module_id, str):
            raise MessageError(ErrorCode.INVALID_FIELD, f"AGENT_MODULES names no module for {agent_id!r}")
        if module_id not in described:
            raise MessageError(ErrorCode.UNKNOWN_MODULE, f"AGENT_MODULES maps {agent_id!r} to module {module_id!r}, "
                               f"which SET_CONFIG does not describe")
    return {agent_id: modules[agent_id] for agent_id in asked}
