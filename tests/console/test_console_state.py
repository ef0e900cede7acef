"""What the console keeps of episodes stays bounded, whatever clients send, and
every tick stays small: the steps of an episode are sent only when asked for."""

from __future__ import annotations

import json
import time

import numpy as np

from tether.sdk.protocol import EpisodeChunk
from tether.sdk.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.console import state as console_state
from tether.server.console.state import ConsoleState


def agent(aid: str, steps: int, done: bool, module: str = "pole") -> AgentChunk:
    chunk = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.arange(steps, dtype=np.int64) % 2,
                         np.ones(steps, np.float32), None, None, done, False)
    return AgentChunk(aid, module, 0, chunk)


class _Trainer:
    """What ConsoleState.tick reads from a trainer: no modules, never paused."""

    modules: dict = {}
    paused = False


def test_agents_leaving_an_endless_episode_are_shown_when_they_leave_and_not_kept() -> None:
    state = ConsoleState(trainer=None)
    for life in range(500):
        state.batch(1, 3, {}, [MultiAgentRecord("scene", False, False, [agent(f"cart#{life}", 3, True),
                                                                       agent("watcher", 3, False)])])
        assert list(state._open[(1, "scene")]) == ["watcher"]  # only the agent still in the scene
    latest = state.episodes["pole"][0]
    assert latest["agents"] == 1 and latest["return"] == 3.0 and latest["length"] == 3
    answer = json.loads(state.episode_steps("pole", latest["id"]))
    assert list(answer["agent_steps"]) == ["cart#499"] and answer["agent_steps"]["cart#499"]["rewards"] == [1.0] * 3
    assert len(state._details) == console_state.EPISODES_PER_MODULE  # steps of episodes no longer listed are gone


def test_a_huge_episode_keeps_a_bounded_sample_of_its_steps_and_ticks_stay_small() -> None:
    state = ConsoleState(trainer=_Trainer())
    agents = 300
    for part in range(3):  # 300 agents x 3 chunks of 1000 steps: 900,000 steps in one episode
        last = part == 2
        state.batch(1, 1000, {}, [MultiAgentRecord("arena", last, False,
                                                   [agent(f"a{k}", 1000, last) for k in range(agents)])])
        assert state._open_steps <= console_state.MAX_OPEN_STEPS
    assert state._open_steps == 0 and not state._open  # all given back when it ended
    summary = state.episodes["pole"][0]
    assert summary["agents"] == agents and summary["agents_shown"] == console_state.MAX_DETAIL_AGENTS
    assert summary["length"] == 3000 and summary["return"] == 900_000.0
    started = time.perf_counter()
    tick = json.dumps(state.tick({}, 0))
    tick_s = time.perf_counter() - started
    assert len(tick) < 4096, len(tick)  # the summary, not 900k steps
    steps = json.loads(state.episode_steps("pole", summary["id"]))["agent_steps"]
    assert len(steps) == console_state.MAX_DETAIL_AGENTS
    assert all(len(s["rewards"]) == len(s["actions"]) == console_state.MAX_EPISODE_STEPS and s["steps"] == 3000
               for s in steps.values())
    print(f"tick of a 900k-step episode: {len(tick)} bytes in {tick_s * 1e3:.2f} ms")


def test_open_episodes_together_keep_at_most_max_open_steps(monkeypatch) -> None:
    monkeypatch.setattr(console_state, "MAX_OPEN_STEPS", 5_000)
    state = ConsoleState(trainer=None)
    for episode in range(40):  # 40 open episodes of 8 agents sending 500 steps each: 160,000 steps
        state.batch(1, 500, {}, [MultiAgentRecord(f"e{episode}", False, False,
                                                  [agent(f"a{k}", 500, False) for k in range(8)])])
    assert state._open_steps == 5_000
    for episode in range(40):  # they end; the budget comes back, and later episodes keep steps again
        state.batch(1, 1, {}, [MultiAgentRecord(f"e{episode}", True, False, [agent("a0", 1, True)])])
    assert state._open_steps == 0
    state.batch(1, 10, {}, [MultiAgentRecord("late", True, False, [agent("solo", 10, True)])])
    latest = state.episodes["pole"][0]
    assert json.loads(state.episode_steps("pole", latest["id"]))["agent_steps"]["solo"]["rewards"] == [1.0] * 10


def test_asking_for_an_episode_that_is_not_kept_is_answered_with_the_reason() -> None:
    state = ConsoleState(trainer=None)
    state.batch(1, 3, {}, [MultiAgentRecord("x", True, False, [agent("solo", 3, True)])])
    kept = state.episodes["pole"][0]["id"]
    for module, episode_id in (("pole", kept + 1), ("nope", kept), ("pole", str(kept)), (["pole"], kept), ("pole", None)):
        answer = json.loads(state.episode_steps(module, episode_id))
        assert answer["type"] == "episode" and "no episode" in answer["error"] and "agent_steps" not in answer
    assert json.loads(state.episode_steps("pole", kept))["agent_steps"]["solo"]["steps"] == 3


def test_the_feed_accepts_only_its_own_page_by_origin() -> None:
    """Which pages may open the feed (docs/console.md, Access): on a console bound beyond
    loopback, a name that is neither an IP address nor this machine's is refused (DNS
    rebinding); a page on the scheme's default port is matched by that port."""
    import socket

    from websockets.datastructures import Headers
    from websockets.http11 import Request

    from tether.server.console.server import ConsoleServer

    class Bound(ConsoleServer):
        port = 80  # as if bound to port 80, without binding it

    def allowed(console: ConsoleServer, origin: str, host: str) -> bool:
        return console._same_origin(Request("/feed", Headers([("Host", host), ("Origin", origin)])))

    wide = Bound(None, "0.0.0.0", 80, None, saved_run={})
    name = socket.gethostname()
    assert allowed(wide, "http://192.0.2.7", "192.0.2.7")  # port 80 implied on both sides
    assert allowed(wide, "http://192.0.2.7:80", "192.0.2.7:80")
    assert allowed(wide, f"http://{name}", name)
    assert not allowed(wide, "http://rebound.example", "rebound.example")  # a DNS-rebound name
    assert not allowed(wide, "http://192.0.2.7:8080", "192.0.2.7")  # another port: another site
    assert not allowed(wide, "https://192.0.2.7", "192.0.2.7")  # https implies 443
    assert not allowed(wide, "http://192.0.2.8", "192.0.2.7")  # the page is not where the request went
    assert not allowed(wide, "http://[", "192.0.2.7") and not allowed(wide, "http://192.0.2.7", "[")
    loopback = Bound(None, "127.0.0.1", 80, None, saved_run={})
    assert allowed(loopback, "http://localhost", "127.0.0.1") and not allowed(loopback, "http://192.0.2.7", "192.0.2.7")
