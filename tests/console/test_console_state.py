"""What the console keeps of episodes stays bounded, whatever clients send, and
every tick stays small: the steps of an episode are sent only when asked for."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tether.protocol import EpisodeChunk
from tether.protocol.multi_agent import AgentChunk, MultiAgentRecord
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
        assert state._open_values <= console_state.MAX_OPEN_VALUES
    assert state._open_values == 0 and not state._open  # all given back when it ended
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


def test_over_the_budget_the_oldest_episodes_keep_their_steps_and_the_younger_give_way(monkeypatch) -> None:
    """Over MAX_OPEN_VALUES, episodes that started later give their steps back to an older
    one (they still count their return and length): the oldest, which end first, are shown
    whole. All of the budget comes back as they end."""
    monkeypatch.setattr(console_state, "MAX_OPEN_VALUES", 10_000)
    state = ConsoleState(trainer=None)

    def send(episodes: list[str], steps: int, ending: bool = False) -> None:  # one batch, as an SDK cuts them
        state.batch(1, steps, {}, [MultiAgentRecord(episode, ending, False,
                                                    [agent(f"a{k}", steps, ending) for k in range(8)])
                                   for episode in episodes])
        assert state._open_values <= 10_000

    send(["e0", "e1", "e2", "e3"], 300)  # 8 agents x 300 steps x 2 values = 4,800 values each
    assert [sum(e["kept"] for e in state._open[(1, f"e{i}")].values()) for i in range(4)] == [2400, 2400, 200, 0]
    send(["e0"], 300)  # the oldest goes on: the younger ones give way
    assert sum(e["kept"] for e in state._open[(1, "e0")].values()) == 8 * 600
    assert all(e["rewards"] is None for i in (1, 2, 3) for e in state._open[(1, f"e{i}")].values())
    send(["e0", "e1", "e2", "e3"], 1, ending=True)
    assert state._open_values == 0 and not state._open and not state._keeping and not state._heard
    e3, e2, e1, e0 = list(state.episodes["pole"])[:4]
    steps = json.loads(state.episode_steps("pole", e0["id"]))["agent_steps"]
    assert len(steps) == 8 and all(len(s["rewards"]) == s["steps"] == 601 for s in steps.values())
    assert e1["agents_shown"] == e3["agents_shown"] == 0 and e1["return"] == 8 * 301 and e1["length"] == 301


def test_an_agent_that_kept_no_steps_is_not_among_those_shown(monkeypatch) -> None:
    monkeypatch.setattr(console_state, "MAX_OPEN_VALUES", 10_000)
    state = ConsoleState(trainer=None)
    records = [MultiAgentRecord(f"e{i}", False, False, [agent(f"a{k}", 300, False) for k in range(8)]) for i in range(3)]
    state.batch(1, 300, {}, records)  # e2 finds room for one agent's 200 steps (the budget then spent)
    state.batch(1, 1, {}, [MultiAgentRecord("e2", True, False, [agent(f"a{k}", 1, True) for k in range(8)])])
    e2 = state.episodes["pole"][0]
    assert e2["agents"] == 8 and e2["agents_shown"] == 1
    assert list(json.loads(state.episode_steps("pole", e2["id"]))["agent_steps"]) == ["a0"]


def test_episodes_not_heard_of_for_a_while_give_their_steps_back(monkeypatch) -> None:
    """An open episode that never ends (its ending batch dropped, its client gone quiet while
    connected) must not hold the budget for good: once not heard of for STALE_SECONDS it is
    the first to give its steps back, to any episode; one heard of lately is not stale."""
    monkeypatch.setattr(console_state, "MAX_OPEN_VALUES", 10_000)
    state = ConsoleState(trainer=None)
    now = [0.0]
    state.clock = lambda: now[0]
    state.batch(2, 600, {}, [MultiAgentRecord(f"lost{i}", False, False, [agent(f"a{k}", 600, False) for k in range(4)])
                             for i in range(3)])  # 3 x 4,800 values from a client that then goes quiet
    now[0] = console_state.STALE_SECONDS - 1
    state.batch(1, 10, {}, [MultiAgentRecord("early", True, False, [agent("solo", 10, True)])])
    assert state.episodes["pole"][0]["agents_shown"] == 0  # still fresh: the older episodes keep theirs
    now[0] = console_state.STALE_SECONDS + 1
    state.batch(1, 10, {}, [MultiAgentRecord("late", True, False, [agent("solo", 10, True)])])
    latest = json.loads(state.episode_steps("pole", state.episodes["pole"][0]["id"]))["agent_steps"]
    assert latest["solo"]["rewards"] == [1.0] * 10
    assert all(e["rewards"] is None for e in state._open[(2, "lost0")].values())


def test_episodes_sent_each_in_a_batch_of_its_own_are_not_stale(monkeypatch) -> None:
    """A client may send each episode (or each part of a frame) in its own batch: how many
    batches passed without an episode says nothing about whether it is still played."""
    monkeypatch.setattr(console_state, "MAX_OPEN_VALUES", 10_000)
    state = ConsoleState(trainer=None)
    for step in range(3):  # 12 episodes x 400 steps (800 values) a round, each in a batch of its own
        for i in range(12):
            state.batch(1, 400, {}, [MultiAgentRecord(f"e{i}", step == 2, False, [agent("a", 400, step == 2)])])
    ended = sorted(state.episodes["pole"], key=lambda e: e["id"])  # e0 ... e11 (they ended in that order)
    order = [e["agents_shown"] for e in ended]
    assert order.count(1) >= 3 and order == sorted(order, reverse=True), order  # the oldest, not a scatter
    for e in ended[:order.count(1)]:  # and whole
        assert len(json.loads(state.episode_steps("pole", e["id"]))["agent_steps"]["a"]["rewards"]) == 1200


def test_an_agent_that_could_not_keep_all_its_steps_keeps_no_later_ones() -> None:
    """What an agent shows is always its first steps: once the budget cut it short, steps
    arriving after room came back are not appended after a gap."""
    state = ConsoleState(trainer=None)

    def counted(aid: str, first: int, steps: int) -> AgentChunk:  # rewards are the step numbers
        chunk = EpisodeChunk(np.zeros((steps + 1, 1), np.float32), np.zeros(steps, np.int64),
                             np.arange(first, first + steps, dtype=np.float32), None, None, False, False)
        return AgentChunk(aid, "pole", 0, chunk)

    import pytest
    monkey = pytest.MonkeyPatch()
    monkey.setattr(console_state, "MAX_OPEN_VALUES", 1_000)
    try:
        state.batch(2, 400, {}, [MultiAgentRecord("old", False, False, [counted("x", 0, 400)])])  # 800 values
        state.batch(1, 200, {}, [MultiAgentRecord("young", False, False, [counted("y", 0, 200)])])  # 100 steps fit
        state.disconnected(2)  # room comes back
        state.batch(1, 200, {}, [MultiAgentRecord("young", True, False, [counted("y", 200, 200)])])
    finally:
        monkey.undo()
    rewards = json.loads(state.episode_steps("pole", state.episodes["pole"][0]["id"]))["agent_steps"]["y"]["rewards"]
    assert rewards == [float(k) for k in range(100)]


def test_an_episode_forgotten_for_silence_is_not_shown_when_it_comes_back(monkeypatch) -> None:
    """Past MAX_OPEN_EPISODES the one silent longest is forgotten; if it sends again, what
    follows is not shown as an episode of its own (its return and length would be a part's)."""
    monkeypatch.setattr(console_state, "MAX_OPEN_EPISODES", 2)
    state = ConsoleState(trainer=None)
    for episode in ("quiet", "b", "c"):  # "quiet" is forgotten when "c" opens
        state.batch(1, 10, {}, [MultiAgentRecord(episode, False, False, [agent("x", 10, False)])])
    assert (1, "quiet") not in state._open
    state.batch(1, 10, {}, [MultiAgentRecord("quiet", True, False, [agent("x", 10, True)])])
    assert "pole" not in state.episodes and (1, "quiet") not in state._open and not state._forgotten
    state.batch(1, 10, {}, [MultiAgentRecord("quiet", True, False, [agent("x", 10, True)])])  # an id used anew
    assert state.episodes["pole"][0]["length"] == 10


def test_a_clients_open_episodes_are_given_back_when_it_disconnects() -> None:
    state = ConsoleState(trainer=None)
    state.connected(1, ("127.0.0.1", 5000))
    state.connected(2, ("127.0.0.1", 5001))
    state.batch(1, 500, {}, [MultiAgentRecord("mine", False, False, [agent("a", 500, False)])])
    state.batch(2, 100, {}, [MultiAgentRecord("theirs", False, False, [agent("b", 100, False)])])
    state.disconnected(1)
    assert list(state._open) == [(2, "theirs")] and state._open_values == 100 * 2
    assert list(state._keeping) == list(state._heard) == [(2, "theirs")]


def test_wide_actions_keep_fewer_steps_and_encoding_waits_until_asked() -> None:
    """A kept agent holds at most MAX_AGENT_VALUES values (a Box(1000) agent: 7 steps, not
    2000 x 1000 numbers); nothing is encoded when an episode ends, only when its steps are
    asked for, and float actions come rounded like rewards."""
    state = ConsoleState(trainer=None)
    wide = EpisodeChunk(np.zeros((51, 1), np.float32), np.full((50, 1000), 1 / 3, np.float32),
                        np.ones(50, np.float32), None, None, True, False)
    state.batch(1, 50, {}, [MultiAgentRecord("w", True, False, [AgentChunk("arm", "pole", 0, wide)])])
    kept = state.episodes["pole"][0]
    steps = state._details[kept["id"]]
    assert steps._text is None  # not encoded on the event loop as the episode ended
    arm = json.loads(state.episode_steps("pole", kept["id"]))["agent_steps"]["arm"]
    per_step = 1 + 1000
    assert len(arm["actions"]) == len(arm["rewards"]) == console_state.MAX_AGENT_VALUES // per_step
    assert arm["steps"] == 50 and arm["actions"][0][:2] == [0.333333, 0.333333]
    assert steps._text is not None and steps._agents is None  # kept as text from then on


def test_asking_for_an_episode_that_is_not_kept_is_answered_with_the_reason() -> None:
    state = ConsoleState(trainer=None)
    state.batch(1, 3, {}, [MultiAgentRecord("x", True, False, [agent("solo", 3, True)])])
    kept = state.episodes["pole"][0]["id"]
    for module, episode_id in (("pole", kept + 1), ("nope", kept), ("pole", str(kept)), (["pole"], kept), ("pole", None),
                               ("pole", True)):  # (True == 1 in Python: not an id)
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
    elsewhere = Bound(None, "0.0.0.0", 80, None, saved_run={})
    elsewhere._names = {"0.0.0.0", "console-host"}  # (a machine whose fully qualified name is not localhost)
    assert allowed(elsewhere, "http://localhost", "localhost")  # a 0.0.0.0 console opened on this machine
    assert not allowed(elsewhere, "http://localhost", "rebound.example")
    loopback = Bound(None, "127.0.0.1", 80, None, saved_run={})
    assert allowed(loopback, "http://localhost", "127.0.0.1") and not allowed(loopback, "http://192.0.2.7", "192.0.2.7")
    assert Bound(None, "::1", 80, None, saved_run={}).url.startswith("http://[::1]:80/?token=")
    assert Bound(None, "127.0.0.1", 80, None, saved_run={}).url.startswith("http://127.0.0.1:80/?token=")


def test_a_read_only_console_does_not_take_true_for_episode_one() -> None:
    from tether.server.console.server import ConsoleServer

    saved = {"episodes": {"pole": [{"id": 1, "return": 3.0}]}, "episode_details": {"1": {"solo": {"steps": 3}}}}
    console = ConsoleServer(None, "127.0.0.1", 0, None, saved_run=saved)
    assert json.loads(asyncio.run(console._episode("pole", 1)))["agent_steps"] == {"solo": {"steps": 3}}
    assert "error" in json.loads(asyncio.run(console._episode("pole", True)))


def test_a_browsers_episode_request_is_encoded_off_the_event_loop(monkeypatch) -> None:
    from tether.server.console.server import ConsoleServer

    state = ConsoleState(trainer=None)
    state.batch(1, 3, {}, [MultiAgentRecord("x", True, False, [agent("solo", 3, True)])])
    threads = []
    encode = console_state.EpisodeSteps.text
    monkeypatch.setattr(console_state.EpisodeSteps, "text",
                        lambda self: threads.append(threading.current_thread()) or encode(self))
    console = ConsoleServer(state, "127.0.0.1", 0, None)
    answer = json.loads(asyncio.run(console._episode("pole", state.episodes["pole"][0]["id"])))
    assert answer["agent_steps"]["solo"]["rewards"] == [1.0] * 3
    assert threads and threading.main_thread() not in threads


def test_a_periodic_save_ending_after_the_final_one_does_not_undo_it(tmp_path: Path, monkeypatch) -> None:
    """The final console.json is written at stop; a periodic save taken earlier, still
    encoding in its thread, must not replace it when it ends."""
    from tether.server.console.server import ConsoleServer

    class Runs:
        taken = 0

        def saved_run(self) -> console_state.SavedRun:
            self.taken += 1
            return console_state.SavedRun({"run": self.taken}, [])

    encode = console_state.SavedRun.pieces

    def slow_first(run: console_state.SavedRun):
        if run.hello["run"] == 1:
            time.sleep(0.5)  # the periodic save's encoding, still running as the server stops
        return encode(run)

    monkeypatch.setattr(console_state.SavedRun, "pieces", slow_first)
    path = tmp_path / "console.json"
    console = ConsoleServer(Runs(), "127.0.0.1", 0, None, save_to=path)

    async def main() -> None:
        periodic = asyncio.ensure_future(console._save())
        await asyncio.sleep(0.05)
        await console._save()  # (the final one, as stop() writes it)
        await periodic

    asyncio.run(main())
    assert json.loads(path.read_text()) == {"run": 2, "episode_details": {}}


def test_ticks_go_on_while_the_log_is_saved(tmp_path: Path, monkeypatch) -> None:
    """A periodic console.json save (a large log being encoded and written in its thread)
    does not hold the once-a-second sampling and ticks up."""
    from tether.server.console import server as console_server
    from tether.server.console.server import ConsoleServer

    monkeypatch.setattr(console_server, "TICK_S", 0.05)
    monkeypatch.setattr(console_server, "SAVE_EVERY_TICKS", 2)

    class Run:
        last_error_seq = 0
        samples = 0

        def sample(self) -> dict:
            self.samples += 1
            return {}

        def saved_run(self) -> console_state.SavedRun:
            return console_state.SavedRun({"run": 1}, [])

    encode = console_state.SavedRun.pieces
    monkeypatch.setattr(console_state.SavedRun, "pieces", lambda run: time.sleep(1.5) or encode(run))
    run = Run()
    console = ConsoleServer(run, "127.0.0.1", 0, None, save_to=tmp_path / "console.json")

    async def main() -> None:
        ticker = asyncio.ensure_future(console._tick_forever())
        await asyncio.sleep(1.0)
        ticker.cancel()
        await console.stop()

    asyncio.run(main())
    assert run.samples >= 12, f"{run.samples} samples in 1 s of 50 ms ticks while the log was saved"
    assert json.loads((tmp_path / "console.json").read_text())["run"] == 1


def test_encoding_the_log_offers_the_event_loop_the_gil_often(tmp_path: Path, monkeypatch) -> None:
    """Encoding in a thread still holds the GIL while an encoding call runs: the log is
    written in pieces and an episode's steps encoded agent by agent, offering the GIL
    between them, so the event loop is never held for long. Measured as the writer's own
    CPU time between offers (not wall time, which the machine's load would decide); one
    json.dumps over 20 kept episodes of 16 agents x 8000 values held the loop ~45 ms."""
    state = ConsoleState(trainer=None)
    for episode in range(console_state.EPISODES_PER_MODULE):
        state.batch(1, 2000, {}, [MultiAgentRecord(
            f"e{episode}", True, False,
            [AgentChunk(f"a{k}", "pole", 0, EpisodeChunk(np.zeros((2001, 1), np.float32),
                                                          np.random.default_rng(k).normal(size=(2000, 3)).astype(np.float32),
                                                          np.full(2000, 1 / 3, np.float32), None, None, True, False))
             for k in range(16)])])
    run = console_state.SavedRun({"history": {}, "episodes": {}}, list(state._details.items()))
    path = tmp_path / "console.json"
    marks: list[float] = []
    offer = console_state._offer_gil
    monkeypatch.setattr(console_state, "_offer_gil", lambda: marks.append(time.thread_time()) or offer())

    def write() -> bool:
        marks.append(time.thread_time())
        written = console_state.RunLog(path).write(run)
        marks.append(time.thread_time())
        return written

    assert asyncio.run(asyncio.to_thread(write))
    assert len(json.loads(path.read_text())["episode_details"]) == 20
    longest = max(b - a for a, b in zip(marks, marks[1:]))
    print(f"longest CPU time between two offers of the GIL while writing 20 large episodes: {longest * 1e3:.1f} ms")
    # (~2 ms measured; 11 ms seen once on a loaded machine, a collection or a page fault counting as the
    # thread's CPU; one json.dumps of it all is ~45 ms)
    assert longest < 0.020, f"the writer held the GIL for up to {longest * 1e3:.1f} ms of its own CPU time"


def test_a_log_with_numbers_json_has_not_is_refused_with_the_reason(tmp_path: Path, capsys, monkeypatch) -> None:
    """json.loads takes NaN; the read-only console would then fail every browser's hello.
    `tether console` refuses such a log at once, naming what is wrong."""
    from tether.server.cli import main

    from tether.server.console import server as console_server

    class Served(Exception):
        pass

    def served(*args, **kwargs):  # (were a log served, the test would end here, not hang)
        raise Served()

    monkeypatch.setattr(console_server, "ConsoleServer", served)
    for text, why in (('{"type": "hello", "episodes": {"pole": [{"id": 1, "return": NaN}]}}', "NaN is not a JSON number"),
                      ('{"history": {"x": {"t": [0], "v": [1e999]}}}', "1e999 is not a finite number"),
                      ('{"episodes": [1]}', "episodes is not an object"),
                      ('{"episode_details": [1]}', "episode_details is not an object"),
                      ("[1, 2]", "not a JSON object")):
        (tmp_path / console_state.SAVED_RUN).write_text(text)
        assert main(["console", "--logdir", str(tmp_path), "--port", "0"]) == 2
        assert why in capsys.readouterr().err
    (tmp_path / console_state.SAVED_RUN).write_text('{"episodes": {}, "history": {}}')
    with pytest.raises(Served):  # a sound log is served
        main(["console", "--logdir", str(tmp_path), "--port", "0"])


def test_an_episode_the_encoder_cannot_take_is_listed_without_its_steps() -> None:
    """(The decoders give native arrays; an array in another byte order is what orjson refuses.)"""
    steps = console_state.EpisodeSteps({"ok": (np.ones(2), np.zeros(2, np.int64), 2),
                                        "odd": (np.ones(2), np.zeros(2, dtype=">i8"), 2)})
    assert json.loads(steps.text()) == {"ok": {"rewards": [1.0, 1.0], "actions": [0, 0], "steps": 2},
                                        "odd": {"rewards": [], "actions": [], "steps": 2}}


def test_a_rank_reporting_its_clients_keeps_their_counts_and_no_episode() -> None:
    """A rank > 0 of a group keeps only what rank 0's console shows of it: its clients."""
    state = ConsoleState(trainer=_Trainer(), clients_only=True)
    state.connected(7, ("10.0.0.9", 4242))
    for _ in range(3):
        state.batch(7, 5, {"pole": 2}, [MultiAgentRecord("e", True, False, [agent("a", 5, True)])])
    row = next(c for c in state.client_table() if c["id"] == 7)
    assert row["batches"] == 3 and row["env_steps"] == 15 and row["weights"] == {"pole": 2}
    assert not state._open and not state.actions and not state.episodes
