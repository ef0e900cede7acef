"""How many env steps a message covers: what the server counts toward max_env_steps and
the record share, apart from the agent steps it trains on."""

from __future__ import annotations

from typing import Any

from tether.protocol.multi_agent import MultiAgentRecord


def message_env_steps(message: dict[str, Any], records: list[MultiAgentRecord]) -> int:
    """Env steps a message covers (protocol 1.3 counting).

    A 1.3 message declares ``env_steps`` together with ``agent_steps``; the
    declared number is used, capped at the agent steps of its records (every
    env step has at least one decision). Without a declaration a single-agent
    record's steps are env steps, and a multi-agent record counts its longest
    agent entry: exact when some agent acts on every step, a lower bound when
    agents take turns (``start_step`` is where an agent first acted in the
    episode, not where this chunk starts, so it cannot date a later chunk).
    """
    agent_steps = sum(r.agent_steps for r in records)
    declared = message.get("env_steps")
    if "agent_steps" in message and isinstance(declared, int) and not isinstance(declared, bool) and declared >= 0:
        return min(declared, agent_steps)
    return sum(record_env_steps(r) for r in records)


def record_env_steps(record: MultiAgentRecord) -> int:
    """Env steps one record spans (see ``message_env_steps``)."""
    return max((a.chunk.env_steps for a in record.agents), default=0)
