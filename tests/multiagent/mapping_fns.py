"""A server-side policy-mapping function for tests (imported by path by the server)."""

from __future__ import annotations

CALLS: list[tuple[str, str]] = []


def by_prefix(agent_id: str, episode_id: str) -> str:
    """Agents named red_* play for 'red', everyone else for 'blue'."""
    CALLS.append((agent_id, episode_id))
    if agent_id.startswith("nobody"):
        raise KeyError(agent_id)
    return "red" if agent_id.startswith("red_") else "blue"


def swapped(agent_id: str, episode_id: str) -> str:
    """by_prefix the other way round: red_* play for 'blue', everyone else for 'red'."""
    return "blue" if agent_id.startswith("red_") else "red"
