"""Which kind one episode record is, and its state-free decoding: the one place that tells a
multi-agent record (it has "agents") from a single-agent (v1) one, which becomes one agent,
``default_agent``. Imports the protocol core only: decode workers load it (see decode_pool)."""

from __future__ import annotations

from typing import Any

from tether.protocol.multi_agent import MultiAgentRecord, decode_multi_agent_record, decode_single_agent_record


def is_multi_agent(record: Any) -> bool:
    """Whether ``record`` is a multi-agent record (else a single-agent one)."""
    return isinstance(record, dict) and "agents" in record


def decode_record(record: Any, index: int, specs: dict[str, Any], default_module: str | None,
                  require_logp: bool) -> tuple[bool, MultiAgentRecord]:
    """(is multi-agent, the validated record) of ``episodes[index]``: what needs no server
    state (the policy mapping and finished agents are checked by EpisodeIngest). Raises MessageError."""
    if is_multi_agent(record):
        return True, decode_multi_agent_record(record, index, specs, require_logp)
    return False, decode_single_agent_record(record, index, specs, default_module, require_logp)
