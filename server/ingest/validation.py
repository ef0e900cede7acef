"""Validates EPISODES messages against the module layout before anything is stored.

Per-agent arrays are checked by the protocol core; this adds what needs the
server's state: the policy mapping, the groups, and which agents already
finished in an ongoing episode. A message is all-or-nothing: the first
problem raises ``MessageError`` and no state changes.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.messages import is_text
from tether.protocol.multi_agent import MultiAgentRecord

from ..module_setup import ModuleLayout
from ..curriculum import Curriculum
from ..self_play import SelfPlay
from .record_decode import decode_record


class PendingRecords:
    """A validated message whose finished-agent state is not yet recorded."""

    __slots__ = ("_ingest", "records", "_done", "_owner", "_via")

    def __init__(self, ingest: "EpisodeIngest", records: list[MultiAgentRecord],
                 done: dict[tuple[Hashable, str | None], set[str]], owner: Hashable = None,
                 via: Hashable = None) -> None:
        self._ingest = ingest
        self.records = records
        self._done = done
        self._owner = owner
        self._via = via

    def commit(self) -> None:
        """Record which agents finished, and bind self-play's matches to the episodes' owner (only
        once the whole message is accepted)."""
        self._ingest._commit_done(self._done)
        self_play = self._ingest.self_play
        if self_play is not None:
            for record in self.records:
                if record.agents:
                    self_play.bind(self._owner, self._via, record.episode_id,
                                   {agent.agent_id: agent.module_id for agent in record.agents})


class EpisodeIngest:
    """Turns messages into validated multi-agent records (v1 records become one
    agent, ``default_agent``) and remembers per-episode agent state."""

    def __init__(
        self,
        layout: ModuleLayout,
        require_logp: bool,
        logp_check: Callable[[list[MultiAgentRecord], dict[str, int]], None] | None = None,
        self_play: SelfPlay | None = None,
        curriculum: Curriculum | None = None,
    ) -> None:
        self.layout = layout
        self.require_logp = require_logp
        #: Raises MessageError when behaviour logp cannot come from a served model (see logp_check.py).
        self.logp_check = logp_check
        #: Draws each episode's opponents on top of the policy mapping (server/self_play.py).
        self.self_play = self_play
        #: Checks the environment parameters a record says it was played with (§19.3).
        self.curriculum = curriculum
        # Keys are (owner, episode_id): the owner is the client_session when the
        # client gives one (state survives a reconnect), else the connection.
        #: (owner, episode_id) -> agents that terminated or were truncated.
        self._done: dict[tuple[Hashable, str | None], set[str]] = {}
        #: (owner, episode_id) -> {agent_id: module}, for a server-side mapping function.
        self._assigned: dict[tuple[Hashable, str], dict[str, str]] = {}

    # -- mapping ---------------------------------------------------------------

    def module_for(self, connection: Hashable, agent_id: str, episode_id: str, fallback: Hashable = None,
                   reported: str | None = None) -> str:
        """The module of an agent that first appears in ``episode_id``; raises MessageError.
        ``fallback``: another owner whose assignments (MAP_AGENTS on this connection) apply.
        ``reported``: the module a record names (the records' path, not MAP_AGENTS)."""
        layout = self.layout
        if layout.client_mapping is not None:
            return layout.client_mapping.module_for(agent_id, episode_id)
        assigned = self._assigned.setdefault((connection, episode_id), {})
        module = assigned.get(agent_id)
        if module is None and fallback is not None and fallback != connection:
            module = self._assigned.get((fallback, episode_id), {}).get(agent_id)
            if module is not None:
                assigned[agent_id] = module  # (kept under the owner: a continuation on another connection finds it)
        if module is None:
            try:
                module = layout.module_for(agent_id, episode_id)
            except Exception as exc:
                raise MessageError(ErrorCode.UNMAPPED_AGENT, f"mapping function failed for agent {agent_id!r}: {exc}") from None
            if module not in layout.specs:
                raise MessageError(
                    ErrorCode.UNKNOWN_MODULE, f"mapping function put agent {agent_id!r} on unknown module {module!r}"
                )
            if self.self_play is not None:
                if reported is None:  # MAP_AGENTS: the episode's opponents are drawn here, once per connection
                    module = self.self_play.module_for(connection, episode_id, agent_id, module)
                elif self.self_play.could_draw(agent_id, module, reported):
                    # Records of an episode nothing was drawn for on this owner or connection (it began
                    # before a reconnect or a restart): the module the client played stands if
                    # self-play could have drawn it.
                    module = reported
            assigned[agent_id] = module
        return module

    def assign(self, connection: Hashable, message: dict[str, Any]) -> dict[str, str]:
        """Answer a MAP_AGENTS request: the module of each agent id."""
        episode_id = message.get("episode_id")
        episode_id = "" if episode_id is None else episode_id
        agent_ids = message.get("agent_ids")
        if not isinstance(agent_ids, list) or not all(isinstance(a, str) for a in agent_ids):
            raise MessageError(ErrorCode.INVALID_FIELD, '"agent_ids" must be a list of strings')
        # Ids the server keeps (assignments) and names (logs): Unicode text only (§4.1).
        for a in agent_ids:
            if not is_text(a):
                raise MessageError(ErrorCode.INVALID_FIELD, f'"agent_ids": {a!r} is not Unicode text (a lone surrogate)')
        if isinstance(episode_id, str) and not is_text(episode_id):
            raise MessageError(ErrorCode.INVALID_FIELD, f'"episode_id" {episode_id!r} is not Unicode text (a lone surrogate)')
        for a in agent_ids:
            group = self.layout.group_of(a)
            if group is not None:
                raise MessageError(ErrorCode.GROUP_MEMBER_OUTSIDE_GROUP,
                                   f"{a!r} is a member of group {group!r}: ask for the group id instead")
        return {a: self.module_for(connection, a, str(episode_id)) for a in agent_ids}

    # -- episodes --------------------------------------------------------------

    def validate(
        self, connection: Hashable, message: dict[str, Any], via: Hashable = None, predecoded: list | None = None,
    ) -> "PendingRecords":
        """Validate a message's records (all-or-nothing) without changing any state: ``connection``
        owns the episode state (a client_session, or the connection), ``via`` is the connection it
        came on, ``predecoded`` holds, per record, the state-free part already done elsewhere. The
        pipeline then runs the behaviour-logp check (off the event loop for a large message) and
        calls ``commit``."""
        records = message.get("episodes")
        if not isinstance(records, list):
            raise MessageError(ErrorCode.INVALID_FIELD, '"episodes" must be a list of episode records')
        out: list[MultiAgentRecord] = []
        # Working copies of the finished-agent sets this message touches; kept only if all is valid.
        done: dict[tuple[Hashable, str | None], set[str]] = {}
        for index, record in enumerate(records):
            if predecoded is not None:
                if isinstance(predecoded[index], MessageError):
                    raise predecoded[index]
                multi_agent, decoded = predecoded[index]
            else:
                multi_agent, decoded = decode_record(record, index, self.layout.specs, self.layout.default_module(),
                                                     self.require_logp)
            if self.curriculum is not None:
                self.curriculum.check_record(decoded.env_params, f"episodes[{index}]")
            if multi_agent:
                key = (connection, decoded.episode_id)
                if key not in done:
                    done[key] = set(self._done.get(key, ()))
                self._check_agents(connection, decoded, index, done[key], via)
                if decoded.is_terminated or decoded.is_truncated:
                    done[key] = set()  # the episode is over: its id may start a new one
                    self._assigned.pop((connection, decoded.episode_id or ""), None)
                    if via is not None:  # (and what MAP_AGENTS answered on the connection)
                        self._assigned.pop((via, decoded.episode_id or ""), None)
            out.append(decoded)
        return PendingRecords(self, out, done, connection, via)

    def _commit_done(self, done: dict[tuple[Hashable, str | None], set[str]]) -> None:
        for key, agents in done.items():
            if agents:
                self._done[key] = agents
            else:
                self._done.pop(key, None)

    def _check_agents(
        self, connection: Hashable, record: MultiAgentRecord, index: int, done: set[str], via: Hashable = None
    ) -> None:
        for agent in record.agents:
            where = f"episodes[{index}].agents[{agent.agent_id!r}]"
            group = self.layout.group_of(agent.agent_id)
            if group is not None:
                raise MessageError(
                    ErrorCode.GROUP_MEMBER_OUTSIDE_GROUP,
                    f"{where}: {agent.agent_id!r} is a member of group {group!r} and must be reported as part of it",
                )
            try:
                expected = self.module_for(connection, agent.agent_id, record.episode_id or "", via, agent.module_id)
            except MessageError as exc:
                raise MessageError(exc.code, f"{where}: {exc.message}") from None
            if agent.module_id != expected:
                raise MessageError(
                    ErrorCode.MODULE_MISMATCH,
                    f"{where}: reported with module {agent.module_id!r} but the policy mapping gives {expected!r}",
                )
            if agent.agent_id in done:
                raise MessageError(
                    ErrorCode.AGENT_ALREADY_DONE,
                    f"{where}: agent {agent.agent_id!r} already terminated or was truncated in episode "
                    f"{record.episode_id!r} and cannot act again",
                )
            if agent.chunk.is_terminated or agent.chunk.is_truncated:
                done.add(agent.agent_id)

    def open_state_size(self) -> int:
        """Entries held for ongoing episodes (agents finished or assigned)."""
        return sum(len(v) for v in self._done.values()) + sum(len(v) for v in self._assigned.values())

    def forget(self, connection: Hashable) -> None:
        """Drop an owner's per-episode state (a closed connection, an expired client_session)."""
        for key in [k for k in self._done if k[0] == connection]:
            del self._done[key]
        for akey in [k for k in self._assigned if k[0] == connection]:
            del self._assigned[akey]
        if self.self_play is not None:
            self.self_play.forget(connection)

