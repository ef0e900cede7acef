"""Episode stitching across chunks, and atomic checkpoints."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
from tether.server.checkpoint import load_checkpoint, save_checkpoint
from tether.server.metrics import RETURN_LIMIT, EpisodeTracker, FinishedEpisode, Metrics, agent_type


def chunk(steps: int, done: bool, episode_id: str | None = None) -> MultiAgentRecord:
    c = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64), np.ones(steps, np.float32),
                     None, None, done, False, episode_id)
    return MultiAgentRecord(episode_id, done, False, [AgentChunk("default_agent", "m", 0, c)])


def totals(finished) -> list[tuple[float, int]]:
    return [(f.total_return, f.length) for f in finished]


def test_v1_chunks_without_ids_continue_per_connection() -> None:
    tracker = EpisodeTracker()
    assert totals(tracker.add("a", [chunk(5, True), chunk(3, False)])) == [(5.0, 5)]
    assert totals(tracker.add("b", [chunk(7, True)])) == [(7.0, 7)]  # other connection, own episode
    assert totals(tracker.add("a", [chunk(4, True)])) == [(7.0, 7)]  # 3 + 4 from the open episode


def test_interleaved_episode_ids() -> None:
    tracker = EpisodeTracker()
    assert tracker.add("a", [chunk(2, False, "x"), chunk(3, False, "y")]) == []
    assert totals(tracker.add("a", [chunk(1, True, "y"), chunk(1, True, "x")])) == [(4.0, 4), (3.0, 3)]
    tracker.add("a", [chunk(2, False, "z")])
    tracker.forget("a")
    assert totals(tracker.add("a", [chunk(1, True, "z")])) == [(1.0, 1)]


def test_multi_agent_returns_per_module_and_agent_type() -> None:
    def agent(aid: str, module: str, steps: int, reward: float, start: int = 0) -> AgentChunk:
        c = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64),
                         np.full(steps, reward, np.float32), None, None, False, False)
        return AgentChunk(aid, module, start, c)

    tracker, metrics = EpisodeTracker(), Metrics()
    rec = MultiAgentRecord("e", True, False, [agent("adversary_0", "chaser", 4, 1.0), agent("adversary_1", "chaser", 4, 2.0),
                                              agent("good_0", "runner", 2, -1.0, start=3)])
    (episode,) = tracker.add("c", [rec])
    assert episode.total_return == 10.0 and episode.length == 5
    metrics.add_episodes([episode])
    snap = metrics.snapshot()
    assert snap["module/chaser/return_mean"] == 6.0 and snap["module/runner/return_mean"] == -2.0
    assert snap["agent_type/adversary/return_mean"] == 6.0 and snap["episode/agent_return_mean"] == 10.0 / 3
    assert agent_type("car-12") == "car" and agent_type("pursuer") == "pursuer" and agent_type("cart_3#2") == "cart"
    # min/max and each agent's own episode length, per module and per agent type
    assert snap["module/chaser/return_min"] == 4.0 and snap["module/chaser/return_max"] == 8.0
    assert snap["agent_type/adversary/return_min"] == 4.0 and snap["agent_type/good/return_max"] == -2.0
    assert snap["module/chaser/length_mean"] == 4.0 and snap["module/runner/length_mean"] == 2.0
    assert snap["agent_type/good/length_mean"] == 2.0


def test_group_has_its_own_metrics_as_an_agent_type() -> None:
    steps = 3
    c = EpisodeChunk(np.zeros((steps + 1, 2), np.float32), np.zeros((steps, 2), np.int64),
                     np.full(steps, 2.0, np.float32), None, None, False, False)
    tracker, metrics = EpisodeTracker(groups={"pair": (2, "sum")}), Metrics()
    metrics.add_episodes(tracker.add("c", [MultiAgentRecord("e", True, False, [AgentChunk("pair", "team", 0, c)])]))
    snap = metrics.snapshot()
    assert snap["agent_type/pair/return_mean"] == 6.0 and snap["agent_type/pair/length_mean"] == 3.0
    assert snap["episode/agent_return_mean"] == 3.0  # the team's 6 shared by its 2 members


def test_agents_leaving_an_episode_that_goes_on_are_counted_when_they_leave_and_not_kept() -> None:
    """A game scene as one endless episode whose agents end and come back under new ids (Unity's layer)."""
    def agent(aid: str, steps: int, reward: float, done: bool, start: int = 0) -> AgentChunk:
        c = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64),
                         np.full(steps, reward, np.float32), None, None, done, False)
        return AgentChunk(aid, "pole", start, c)

    tracker, metrics = EpisodeTracker(groups={"pair": (2, "mean")}), Metrics()
    for life in range(1000):
        finished = tracker.add("c", [MultiAgentRecord("scene", False, False, [
            agent(f"cart#{life}", 10, 1.0, done=True, start=10 * life), agent("watcher", 10, 0.5, done=False, start=10 * life)])])
        metrics.add_episodes(finished)
        assert [f.complete for f in finished] == [False]
        assert tracker.open_size() == 1  # only the agent still in the scene
    snap = metrics.snapshot()
    assert snap["module/pole/return_mean"] == 10.0 and snap["module/pole/length_mean"] == 10.0
    assert snap["agent_type/cart/return_mean"] == 10.0  # "cart#7": a re-joined agent is of its name's type
    assert metrics.episodes_total == 0 and not metrics.returns  # the scene has not ended: no episode yet
    # The scene ends: its total counts every agent that took part, its entry only those still in it.
    (episode,) = tracker.add("c", [MultiAgentRecord("scene", True, False, [agent("pair", 1, 4.0, done=True, start=10000)])])
    assert episode.complete and set(episode.agents) == {"watcher", "pair"}
    # departed carts, the watcher, and the group's mean share times its 2 members
    assert episode.total_return == 1000 * 10.0 + 5000.0 + 4.0 * 2
    assert episode.agent_count == 1000 + 1 + 2 and episode.length == 10001
    assert tracker.open_size() == 0 and not tracker._departed
    metrics.add_episodes([episode])
    assert metrics.episodes_total == 1 and list(metrics.returns) == [episode.total_return]


def test_a_closing_record_of_an_episode_no_agent_acted_in_is_no_episode() -> None:
    """§10.7: a record without agents ends an episode; when the tracker saw no step of it (the engine
    ended it before any agent acted), there is no return or length to count: a 0 would pull the return
    windows, and --stop-at-return, toward 0. A closing record after steps still finishes its episode."""
    tracker, metrics = EpisodeTracker(), Metrics()
    assert tracker.add("c", [MultiAgentRecord("empty", True, False, [])]) == []
    assert tracker.open_size() == 0 and not tracker._open
    seen = chunk(3, False, "seen")
    seen.agents[0].chunk.is_terminated = True  # (the agent left; the episode goes on)
    assert [f.complete for f in tracker.add("c", [MultiAgentRecord("seen", False, False, seen.agents)])] == [False]
    (closed,) = tracker.add("c", [MultiAgentRecord("seen", False, True, [])])
    assert closed.complete and (closed.total_return, closed.length) == (3.0, 3)
    metrics.add_episodes([closed])
    assert list(metrics.returns) == [3.0]


def test_returns_no_update_can_train_on_stay_out_of_the_metrics() -> None:
    """A return of 2**64 or more (rewards of 3e38 or 1e20), or one not finite, is counted
    as excluded and never reaches a window: the reported return stays one an episode can have."""
    tracker, metrics = EpisodeTracker(), Metrics()
    for i, reward in enumerate((1.0, 3e38, 1e20, 2.0)):
        c = EpisodeChunk(np.zeros((21, 1), np.float32), np.zeros(20, np.int64), np.full(20, reward, np.float32),
                         None, None, True, False)
        metrics.add_episodes(tracker.add("c", [MultiAgentRecord(f"e{i}", True, False,
                                                                [AgentChunk("default_agent", "m", 0, c)])]))
    snap = metrics.snapshot()
    assert list(metrics.returns) == [20.0, 40.0] and snap["episode/return_max"] == 40.0
    assert snap["module/m/return_max"] == 40.0 and metrics.episodes_total == 4 and metrics.episodes_excluded == 2
    assert RETURN_LIMIT == 2.0**64


def test_a_sources_returns_are_taken_out_of_every_window() -> None:
    """Once a client's data is found to make an update non-finite, the returns it reported
    leave every window (with their lengths), and its later ones never enter."""
    metrics = Metrics(window=10)

    def episode(ret: float, module: str, agent: str = "runner_0") -> FinishedEpisode:
        return FinishedEpisode(ret, 5, {agent: (module, ret)}, agent_lengths={agent: 5})

    metrics.add_episodes([episode(1.0, "m"), episode(2.0, "m")], source="#1 honest")
    metrics.add_episodes([episode(9e18, "m"), episode(8e18, "evil_module", "bot_0")], source="#2 evil")
    metrics.add_episodes([episode(3.0, "m")], source="#1 honest")
    assert metrics.exclude({"#2 evil"}) == 2
    snap = metrics.snapshot()
    assert list(metrics.returns) == [1.0, 2.0, 3.0] and len(metrics.lengths) == 3
    assert snap["episode/return_max"] == 3.0 and snap["module/m/return_max"] == 3.0
    assert "module/evil_module/return_mean" not in snap and "agent_type/bot/return_mean" not in snap
    assert list(metrics.agent_type_returns["runner"]) == [1.0, 2.0, 3.0]
    metrics.add_episodes([episode(7e18, "m")], source="#2 evil", suspect=True)
    assert list(metrics.returns) == [1.0, 2.0, 3.0] and metrics.episodes_excluded == 3 and metrics.episodes_total == 6


def test_checkpoint_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"x": torch.ones(2)})

    def broken_save(obj, f):
        f.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError):
        save_checkpoint(path, {"x": torch.zeros(2)})
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(2))  # the old file is intact
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temp file left behind
