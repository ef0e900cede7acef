"""Env steps and agent steps are counted apart; returns are reported per agent."""

from __future__ import annotations

import numpy as np

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.ingest.env_steps import message_env_steps
from tether.server.metrics import EpisodeTracker, Metrics


def agent(aid: str, steps: int, reward: float = 1.0, start: int = 0) -> AgentChunk:
    c = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64), np.full(steps, reward, np.float32),
                     None, None, False, False)
    return AgentChunk(aid, "m", start, c)


def test_env_steps_of_a_message() -> None:
    three_agents = [MultiAgentRecord("e", False, False, [agent("a", 10), agent("b", 10), agent("c", 4)])]
    single = [MultiAgentRecord(None, False, False, [agent("default_agent", 7)])]
    assert message_env_steps({}, single) == 7  # a single-agent record's steps are env steps
    assert message_env_steps({"env_steps": 24}, three_agents) == 10  # 1.2 meaning (agent steps): longest entry
    assert message_env_steps({"env_steps": 12, "agent_steps": 24}, three_agents) == 12  # 1.3: declared
    assert message_env_steps({"env_steps": 10**9, "agent_steps": 24}, three_agents) == 24  # capped at agent steps
    assert message_env_steps({"env_steps": "x", "agent_steps": 24}, three_agents) == 10


def test_per_agent_returns_with_a_group_and_the_progress_line() -> None:
    tracker = EpisodeTracker({"pair": (2, "sum"), "trio": (3, "mean")})
    metrics = Metrics()
    rec = MultiAgentRecord("e", True, False, [agent("solo", 4, 1.0), agent("pair", 4, 2.0), agent("trio", 4, 1.0)])
    (episode,) = tracker.add("c", [rec])
    # solo 4, pair 8 (two members' rewards summed), trio 4 per member (mean) -> 12 for three members.
    assert episode.agent_count == 6 and episode.total_return == 24.0
    metrics.add_episodes([episode])
    metrics.env_steps_received, metrics.agent_steps_received = 4, 12
    line = metrics.progress_line()
    assert "env steps        4 | agent steps       12" in line
    assert "return     4.0 per agent (team 24.0)" in line
