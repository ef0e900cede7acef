"""Multi-agent protocol against a real server: modules, mapping, groups,
frozen modules, agents joining and leaving, server-side mapping, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tether.sdk import MultiAgentClient

from ..integration.server_process import REPO, RawClient, ServerProcess

REPO_CONFIGS = REPO / "examples" / "configs"

BOX3 = {"type": "Box", "shape": [3], "low": -10, "high": 10}
MODULES = {
    "chaser": {"observation_space": BOX3, "action_space": {"type": "Discrete", "n": 2}},
    "runner": {"observation_space": BOX3, "action_space": {"type": "Discrete", "n": 3}, "gamma": 0.5},
    "pairmod": {"observation_space": {"type": "Box", "shape": [6], "low": -10, "high": 10},
                "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}},
}
MAPPING = [{"pattern": "adversary_*", "module": "chaser"}, {"agent_id": "good_0", "module": "runner"},
           {"agent_id": "pair", "module": "pairmod"}]
GROUPS = {"pair": {"members": ["m_0", "m_1"], "reward": "sum"}}


def server_flags(*extra: str) -> list[str]:
    return ["--modules", json.dumps(MODULES), "--policy-mapping", json.dumps(MAPPING), "--groups", json.dumps(GROUPS),
            "--train-batch-size", "200", "--env-steps-per-sample", "50", *extra]


def play(client: MultiAgentClient, episodes: int, rng: np.random.Generator) -> None:
    """Adversaries act every step, good_0 every other step and leaves early, the pair acts as one."""
    for _ in range(episodes):
        eid = client.start_episode()
        for t in range(12):
            obs = {f"adversary_{i}": rng.normal(size=3) for i in range(2)}
            obs.update({"m_0": rng.normal(size=3), "m_1": rng.normal(size=3)})
            if t % 2 == 0 and t < 8:
                obs["good_0"] = rng.normal(size=3)
            actions = client.get_action(eid, obs)
            assert set(actions) == set(obs)
            assert actions["m_0"] in (0, 1) and actions["m_1"] in (0, 1)
            client.log_returns(eid, {a: 1.0 for a in obs})
            if t == 8:
                client.end_agents(eid, {"good_0": rng.normal(size=3)})
        client.end_episode(eid, {})


def test_modules_mapping_groups_and_frozen_module(tmp_path) -> None:
    with ServerProcess(tmp_path, *server_flags("--policies-to-train", "chaser,pairmod")) as server:
        # Every step must arrive (exact returns below): wait for room instead of dropping.
        client = MultiAgentClient("127.0.0.1", server.port, seed=0, when_queue_full="wait")
        assert set(client.policies) == {"chaser", "runner", "pairmod"}
        assert client.groups["pair"].members == ("m_0", "m_1")
        play(client, 30, np.random.default_rng(0))
        client.flush()
        sent, env_sent = client.agent_steps_sent, client.env_steps_sent
        seqs = dict(client.weights_seq_nos)
        # (a loaded machine's slow learner may ask the client to hold an episode back, §13.2: never sent)
        held_back = client.episodes_held_back
        client.close()
        summary = server.stop()
    assert summary["agent_steps"] == sent and held_back <= 3
    # One env step per environment step, however many agents act in it.
    assert summary["env_steps"] == (30 - held_back) * 12 == env_sent, held_back
    assert summary["modules_weights_seq_no"]["runner"] == 0, "runner is not in policies_to_train: frozen"
    assert summary["modules_weights_seq_no"]["chaser"] >= 2 and seqs["chaser"] >= 1
    # Per-module returns: adversaries get 12 per episode, good_0 4 (acts at t=0,2,4,6; rewards until it leaves),
    # the pair 24 (two members' rewards summed).
    assert summary["module_return_mean"]["chaser"] == pytest.approx(12.0)
    assert summary["module_return_mean"]["runner"] == pytest.approx(4.0)
    assert summary["module_return_mean"]["pairmod"] == pytest.approx(24.0)


def test_server_side_mapping_function_is_asked_once_per_new_agent(tmp_path) -> None:
    modules = {"red": MODULES["chaser"], "blue": MODULES["chaser"]}
    with ServerProcess(tmp_path, "--modules", json.dumps(modules), "--policy-mapping-fn",
                       "tests.multiagent.mapping_fns:by_prefix", "--train-batch-size", "100") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1)
        assert client.mapping is None
        requests = []
        original = client.link.request

        def counting(message):
            requests.append(message["type"])
            return original(message)

        client.link.request = counting
        eid = client.start_episode("ep-1")
        for t in range(20):
            obs = {"red_0": np.zeros(3), "blue_0": np.zeros(3)}
            if t >= 10:
                obs["red_1"] = np.ones(3)  # joins later
            client.get_action(eid, obs)
        assert requests.count("MAP_AGENTS") == 2  # once for the first two, once for red_1
        # Evaluation keeps the answers per evaluation episode id: one request per new agent.
        for _ in range(5):
            actions = client.compute_actions({"red_0": np.zeros(3), "blue_0": np.zeros(3)})
        assert set(actions) == {"red_0", "blue_0"}
        client.compute_actions({"red_0": np.zeros(3), "blue_2": np.zeros(3)})
        assert requests.count("MAP_AGENTS") == 4  # red_0 and blue_0 once, then blue_2 alone
        client.compute_actions({"red_0": np.zeros(3)}, episode_id="eval-2")
        assert requests.count("MAP_AGENTS") == 5  # another evaluation episode asks again
        raw = RawClient(server.port)
        reply = raw.request({"type": "MAP_AGENTS", "episode_id": "x", "agent_ids": ["red_9", "zed"]})
        assert reply == {"type": "AGENT_MODULES", "modules": {"red_9": "red", "zed": "blue"}}
        reply = raw.request({"type": "MAP_AGENTS", "episode_id": "x", "agent_ids": ["nobody_1"]})
        assert reply["code"] == "UNMAPPED_AGENT"
        raw.close()
        client.end_episode(eid, {})
        client.flush()
        client.close()
        summary = server.stop()
    assert summary["agent_steps"] == client.agent_steps_sent == 50


def test_agents_mapped_ahead_ask_once_and_act_without_asking_again(tmp_path) -> None:
    """map_agents: one MAP_AGENTS for the agents not mapped yet, whose answers the episode keeps, so
    that their first frames ask nothing; run_aec_env maps each game's seats in one request."""
    from mpe2 import simple_spread_v3

    from tether.multiagent.pettingzoo_adapter import run_aec_env

    spread = {"observation_space": {"type": "Box", "shape": [18], "low": "-inf", "high": "inf"},
              "action_space": {"type": "Discrete", "n": 5}}  # (simple_spread's, for the adapter below)
    with ServerProcess(tmp_path, "--modules", json.dumps({"red": spread, "blue": spread}), "--policy-mapping-fn",
                       "tests.multiagent.mapping_fns:by_prefix", "--train-batch-size", "100") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1)
        asked: list[list[str]] = []
        original = client.link.request

        def counting(message):
            if message["type"] == "MAP_AGENTS":
                asked.append(list(message["agent_ids"]))
            return original(message)

        client.link.request = counting
        eid = client.start_episode("ep-1")
        assert client.map_agents(eid, ["red_0", "blue_0", "red_1", "red_0"]) == {
            "red_0": "red", "blue_0": "blue", "red_1": "red"}
        assert asked == [["red_0", "blue_0", "red_1"]]  # (one request, each agent once)
        for agent in ("red_0", "blue_0", "red_1", "red_0"):  # (in turn, as a turn-based game's seats)
            client.get_action(eid, {agent: np.zeros(18)})
        assert len(asked) == 1
        # Only what the episode does not know yet is asked: an agent that acted, one mapped ahead, a new one.
        assert client.map_agents(eid, ("blue_0", "blue_7")) == {"blue_0": "blue", "blue_7": "blue"}
        assert asked[1:] == [["blue_7"]]
        client.get_action(eid, {"blue_7": np.zeros(18)})
        assert len(asked) == 2
        with pytest.raises(TypeError, match="agent ids are strings"):
            client.map_agents(eid, ["red_0", 3])
        with pytest.raises(KeyError):
            client.map_agents("no-such-episode", ["red_0"])
        client.end_episode(eid, {})
        with pytest.raises(KeyError, match="no running episode"):  # (ended, though its steps are not sent yet)
            client.map_agents(eid, ["red_0"])
        # Another episode asks again: the server's function may map it otherwise.
        other = client.start_episode()
        client.map_agents(other, ["red_0"])
        assert asked[2:] == [["red_0"]]
        client.end_episode(other, {})
        # The AEC adapter: one MAP_AGENTS per game for all three seats, none when they first act.
        del asked[:]
        held_back = client.episodes_held_back  # (the server's record_share may hold some games back, §13.2)
        returns = run_aec_env(client, simple_spread_v3.env(N=3, max_cycles=5, continuous_actions=False),
                              max_episodes=4, seed=0)
        assert len(returns) == 4 and asked == [["agent_0", "agent_1", "agent_2"]] * 4
        client.flush()
        client.close()
        summary = server.stop()
        games_sent = 4 - (client.episodes_held_back - held_back)
    assert summary["agent_steps"] == client.agent_steps_sent == 5 + games_sent * 5 * 3  # (5 cycles of 3 seats)


def test_agents_mapped_ahead_are_asked_again_on_a_new_connection(tmp_path) -> None:
    """A server restarted with another mapping function: the answers an episode kept from the first one
    are dropped with the new connection's SET_CONFIG (the new server may map otherwise, §7.10)."""
    from ..integration.server_process import free_port, wait_until

    port = free_port()
    flags = ["--modules", json.dumps({"red": MODULES["chaser"], "blue": MODULES["chaser"]}), "--policy-mapping-fn"]
    first = ServerProcess(tmp_path, *flags, "tests.multiagent.mapping_fns:by_prefix", port=port, name="first").start()
    client = MultiAgentClient("127.0.0.1", port, seed=1, reconnect_timeout_s=60)
    second = None
    try:
        eid = client.start_episode()
        assert client.map_agents(eid, ["red_0", "blue_0"]) == {"red_0": "red", "blue_0": "blue"}
        first.stop()
        second = ServerProcess(tmp_path, *flags, "tests.multiagent.mapping_fns:swapped", port=port,
                               name="second").start()
        # (until the client took the new connection's SET_CONFIG in, the episode's answers stand)
        assert wait_until(lambda: client.map_agents(eid, ["red_0", "blue_0"]) == {"red_0": "blue", "blue_0": "red"},
                          60), client.map_agents(eid, ["red_0", "blue_0"])
        assert set(client.get_action(eid, {"red_0": np.zeros(3), "blue_0": np.zeros(3)})) == {"red_0", "blue_0"}
        client.end_episode(eid, {})
        client.close()
    finally:
        first.kill()
        if second is not None:
            second.kill()


@pytest.mark.parametrize("answer, code, words", [
    ({"type": "AGENT_MODULES", "modules": {"red_0": "red"}}, "INVALID_FIELD", "names no module for 'blue_0'"),
    ({"type": "AGENT_MODULES", "modules": {"red_0": "red", "blue_0": 7}}, "INVALID_FIELD", "names no module"),
    ({"type": "AGENT_MODULES", "modules": {"red_0": "red", "blue_0": "ghost"}}, "UNKNOWN_MODULE",
     "module 'ghost', which SET_CONFIG does not describe"),
    ({"type": "AGENT_MODULES", "modules": ["red"]}, "INVALID_FIELD", "was not answered with AGENT_MODULES"),
])
def test_an_agent_modules_answer_that_does_not_map_every_agent_is_refused(tmp_path, answer, code, words) -> None:
    """A MAP_AGENTS answer that leaves an asked agent out, or names a module SET_CONFIG did not describe,
    is the peer's error (as the C++ and C# clients refuse it): the frame records nothing."""
    from tether.protocol.errors import MessageError

    modules = {"red": MODULES["chaser"], "blue": MODULES["chaser"]}
    with ServerProcess(tmp_path, "--modules", json.dumps(modules), "--policy-mapping-fn",
                       "tests.multiagent.mapping_fns:by_prefix", "--train-batch-size", "100") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=1)
        original = client.link.request
        client.link.request = lambda message: answer if message["type"] == "MAP_AGENTS" else original(message)
        eid = client.start_episode()
        with pytest.raises(MessageError, match=words) as refused:
            client.get_action(eid, {"red_0": np.zeros(3), "blue_0": np.zeros(3)})
        assert refused.value.code.value == code
        with pytest.raises(MessageError, match=words):
            client.map_agents(eid, ["red_0", "blue_0"])
        asked: list[list[str]] = []

        def counting(message):
            if message["type"] == "MAP_AGENTS":
                asked.append(list(message["agent_ids"]))
            return original(message)

        client.link.request = counting  # (the server's own answer maps them: nothing of the refused ones was kept)
        assert set(client.get_action(eid, {"red_0": np.zeros(3), "blue_0": np.zeros(3)})) == {"red_0", "blue_0"}
        assert asked == [["red_0", "blue_0"]]
        client.end_episode(eid, {})
        client.flush()
        client.close()
        summary = server.stop()
    assert summary["agent_steps"] == client.agent_steps_sent == 2


def agent_entry(module: str, steps: int = 2, obs_dim: int = 3, **overrides) -> dict:
    entry = {"module": module, "start_step": 0, "obs": [[0.0] * obs_dim] * (steps + 1), "actions": [0] * steps,
             "rewards": [1.0] * steps, "action_logp": [-0.7] * steps, "is_terminated": False, "is_truncated": False}
    entry.update(overrides)
    return entry


def message(agents: dict, episode_id: str = "bad", done: bool = False) -> dict:
    return {"type": "EPISODES_AND_GET_STATE", "episodes": [
        {"episode_id": episode_id, "is_terminated": done, "is_truncated": False, "agents": agents}]}


BAD = [
    ("unknown_module", message({"adversary_0": agent_entry("ghost")}), "UNKNOWN_MODULE"),
    ("unmapped_agent", message({"stranger": agent_entry("chaser")}), "UNMAPPED_AGENT"),
    ("module_mismatch", message({"adversary_0": agent_entry("runner")}), "MODULE_MISMATCH"),
    ("member_outside_group", message({"m_0": agent_entry("pairmod", obs_dim=6, actions=[[0, 1]] * 2)}),
     "GROUP_MEMBER_OUTSIDE_GROUP"),
    ("lengths_mismatch", message({"adversary_0": agent_entry("chaser", rewards=[1.0])}), "EPISODE_LENGTH_MISMATCH"),
    ("obs_does_not_fit_module", message({"good_0": agent_entry("runner", obs_dim=4)}), "OBS_SHAPE_MISMATCH"),
    ("action_outside_module_space", message({"adversary_0": agent_entry("chaser", actions=[0, 2])}),
     "ACTION_OUT_OF_SPACE"),
]


def test_bad_multi_agent_input_gets_distinct_errors_and_other_client_loses_nothing(tmp_path) -> None:
    with ServerProcess(tmp_path, *server_flags()) as server:
        good = MultiAgentClient("127.0.0.1", server.port, seed=2)
        rng = np.random.default_rng(2)
        raw = RawClient(server.port)
        codes = []
        for _, msg, code in BAD:
            play(good, 2, rng)  # the good client keeps training between bad messages
            reply = raw.request(msg)
            codes.append(reply.get("code"))
            assert reply["type"] == "ERROR" and reply["code"] == code and reply["message"], reply
        # An agent that terminated cannot act again in the same episode (even in a later message).
        first = message({"adversary_0": agent_entry("chaser", is_terminated=True)}, episode_id="again")
        assert raw.request(first)["type"] == "SET_STATE"
        again = raw.request(message({"adversary_0": agent_entry("chaser")}, episode_id="again"))
        assert again["code"] == "AGENT_ALREADY_DONE" and "adversary_0" in again["message"]
        play(good, 2, rng)
        good.flush()
        raw.close()
        sent = good.agent_steps_sent
        good.close()
        summary = server.stop()
    assert len(set(codes)) == len(codes)
    # Stored: everything the good client sent plus the one valid raw chunk (2 steps); nothing of the bad ones.
    assert summary["agent_steps"] == sent + 2


def test_aec_adapter_and_per_module_overrides(tmp_path) -> None:
    """An AEC game (agents act in turn) through run_aec_env; module options override the server's."""
    from mpe2 import simple_spread_v3

    from tether.multiagent.pettingzoo_adapter import run_aec_env
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout

    config = ServerConfig.from_toml(REPO_CONFIGS / "simple_spread.toml", gamma=0.9)
    config.modules["spread"]["gamma"] = 0.5
    layout = build_layout(config)
    assert layout.hyperparams["spread"].gamma == 0.5 and config.gamma == 0.9

    with ServerProcess(tmp_path, "--config", str(REPO_CONFIGS / "simple_spread.toml"), "--train-batch-size", "300",
                       "--env-steps-per-sample", "150") as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=3)
        returns = run_aec_env(client, simple_spread_v3.env(N=3, max_cycles=25, continuous_actions=False),
                              max_episodes=6, seed=0)
        client.flush()
        client.close()
        summary = server.stop()
    assert len(returns) == 6 and set(returns[0]) == {"agent_0", "agent_1", "agent_2"}
    assert summary["episodes"] == 6 and summary["agent_steps"] == client.agent_steps_sent == 6 * 25 * 3
    assert summary["modules_weights_seq_no"]["spread"] >= 1


def test_an_ended_episode_id_may_start_again_even_in_the_same_message(tmp_path) -> None:
    ended = {"episode_id": "reuse", "is_terminated": True, "is_truncated": False,
             "agents": {"adversary_0": agent_entry("chaser", is_terminated=True)}}
    again = {"episode_id": "reuse", "is_terminated": False, "is_truncated": False,
             "agents": {"adversary_0": agent_entry("chaser")}}
    with ServerProcess(tmp_path, *server_flags()) as server:
        raw = RawClient(server.port)
        reply = raw.request({"type": "EPISODES_AND_GET_STATE", "episodes": [ended, again]})
        assert reply["type"] == "SET_STATE", reply
        # Within one episode, though, a finished agent stays finished.
        done_then_acts = {"episode_id": "x", "is_terminated": False, "is_truncated": False,
                          "agents": {"adversary_0": agent_entry("chaser", is_terminated=True)}}
        later = dict(done_then_acts, agents={"adversary_0": agent_entry("chaser")})
        reply = raw.request({"type": "EPISODES_AND_GET_STATE", "episodes": [done_then_acts, later]})
        assert reply["code"] == "AGENT_ALREADY_DONE"
        raw.close()
        summary = server.stop()
    assert summary["agent_steps"] == 4  # the first message only; nothing of the refused one


def test_the_adapter_refuses_a_group_module_whose_spaces_are_not_the_members_joined(tmp_path) -> None:
    """The two-step game's members each observe Box(4) and act in Discrete(2): the group module
    must observe Box(8) and act in MultiDiscrete([2, 2]) (§9.6). A module declared otherwise is
    refused by the adapter before any step, naming the group, the module and both spaces."""
    from tether.multiagent.envs.two_step_game import TwoStepGame
    from tether.multiagent.pettingzoo_adapter import run_parallel_env

    wrong = {"team": {"observation_space": {"type": "Box", "shape": [6], "low": 0, "high": 1},
                      "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}}}
    with ServerProcess(tmp_path, "--config", str(REPO_CONFIGS / "two_step_game.toml"),
                       "--modules", json.dumps(wrong)) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=3)
        with pytest.raises(ValueError, match=r"group 'team': module 'team' has the observation space .*\[6\].*"
                                             r"joined are .*\[8\]"):
            run_parallel_env(client, TwoStepGame(), max_episodes=1)
        client.close()
        summary = server.stop()
    assert summary["agent_steps"] == 0
    # (The example's own config passes the check: test_grouped_two_step_game_reaches_the_optimum.)


def test_group_space_check_accepts_byte_groups_and_float32_bounds_and_checks_every_choice() -> None:
    """check_group_spaces on its own (the client's parsed config, an env's member spaces): a group of
    uint8 camera members served by a uint8 box; bounds written as decimals that float32 rounds; every
    module a choose_from rule can pick; nothing to check with a server-side mapping."""
    from types import SimpleNamespace

    from gymnasium import spaces as gym

    from tether.multiagent.pettingzoo_adapter import check_group_spaces
    from tether.protocol.multi_agent import GroupSpec, ModuleSpec
    from tether.protocol.policy_mapping import PolicyMapping

    class Members:
        possible_agents = ["m_0", "m_1"]

        def __init__(self, observation):
            self.observation = observation

        def observation_space(self, agent):
            return self.observation

        def action_space(self, agent):
            return gym.Discrete(2)

    def client(observation_space: dict, mapping: list | None, modules=("pm",)):
        spec = {"observation_space": observation_space, "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}}
        return SimpleNamespace(
            mapping=None if mapping is None else PolicyMapping.from_json(mapping),
            groups={"pair": GroupSpec.from_json("pair", {"members": ["m_0", "m_1"]})},
            modules={m: ModuleSpec.from_json(m, spec) for m in modules})

    to_pm = [{"agent_id": "pair", "module": "pm"}]
    cameras = Members(gym.Box(0, 255, (2, 2, 1), np.uint8))
    byte_group = {"type": "Box", "shape": [8], "dtype": "uint8", "low": 0, "high": 255}
    check_group_spaces(client(byte_group, to_pm), cameras)  # accepted
    check_group_spaces(client({**byte_group, "dtype": "float32"}, to_pm), cameras)  # floats 0-255: accepted
    with pytest.raises(ValueError, match="'pm' has the observation space"):
        check_group_spaces(client(byte_group, to_pm), Members(gym.Box(0.0, 255.0, (4,), np.float32)))
    decimals = Members(gym.Box(-0.1, 0.1, (4,), np.float32))
    check_group_spaces(client({"type": "Box", "shape": [8], "low": -0.1, "high": 0.1}, to_pm), decimals)
    with pytest.raises(ValueError, match="'pm' has the observation space"):
        check_group_spaces(client({"type": "Box", "shape": [8], "low": -0.2, "high": 0.1}, to_pm), decimals)
    # A choose_from rule: every module it can pick is checked (here one of them observes 6 values).
    wrong = client({"type": "Box", "shape": [8], "low": -0.1, "high": 0.1},
                   [{"agent_id": "pair", "choose_from": ["pm", "pm2"]}], modules=("pm",))
    wrong.modules["pm2"] = ModuleSpec.from_json("pm2", {
        "observation_space": {"type": "Box", "shape": [6], "low": -0.1, "high": 0.1},
        "action_space": {"type": "MultiDiscrete", "nvec": [2, 2]}})
    with pytest.raises(ValueError, match="module 'pm2'"):
        check_group_spaces(wrong, decimals)
    # The server maps (no rules): the module is not known here, nothing is refused.
    check_group_spaces(client({"type": "Box", "shape": [6], "low": 0, "high": 1}, None), decimals)


def test_both_adapter_loops_reset_the_env_with_each_episodes_parameters(tmp_path) -> None:
    """Environment parameters (protocol §19) reach a PettingZoo env as gymnasium's run_env gives them:
    ``env.reset(options={"env_params": values})``, each episode with its own draw of a sampler."""
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper

    from tether.multiagent.pettingzoo_adapter import run_aec_env, run_parallel_env

    seen: list[dict | None] = []

    class AecResets(BaseWrapper):
        def reset(self, seed=None, options=None):
            seen.append(options)
            super().reset(seed=seed, options=options)

    class ParallelResets(BaseParallelWrapper):
        def reset(self, seed=None, options=None):
            seen.append(options)
            return super().reset(seed=seed, options=options)

    curriculum = {"parameters": {"level": 3, "wind": {"sampler": "uniform", "low": 0, "high": 1}}}
    with ServerProcess(tmp_path, "--config", str(REPO_CONFIGS / "simple_spread.toml"),
                       "--curriculum", json.dumps(curriculum)) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=3)
        run_aec_env(client, AecResets(simple_spread_v3.env(N=3, max_cycles=5, continuous_actions=False)),
                    max_episodes=3, seed=0)
        run_parallel_env(client, ParallelResets(simple_spread_v3.parallel_env(N=3, max_cycles=5)), max_episodes=3,
                         seed=0)
        client.close()
    assert len(seen) == 6 and all(options is not None for options in seen), seen
    values = [options["env_params"] for options in seen]  # type: ignore[index]
    assert all(v["level"] == 3 and 0 <= v["wind"] < 1 for v in values), values
    assert len({v["wind"] for v in values}) == 6, values  # drawn per episode


def test_an_env_whose_reset_fails_leaves_no_episode_open(tmp_path) -> None:
    from mpe2 import simple_spread_v3
    from pettingzoo.utils.wrappers import BaseWrapper

    from tether.multiagent.pettingzoo_adapter import run_aec_env

    class BrokenReset(BaseWrapper):
        def reset(self, seed=None, options=None):
            raise RuntimeError("no level file")

    with ServerProcess(tmp_path, "--config", str(REPO_CONFIGS / "simple_spread.toml")) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=3)
        with pytest.raises(RuntimeError, match="no level file"):
            run_aec_env(client, BrokenReset(simple_spread_v3.env(N=3, max_cycles=5)), max_episodes=1)
        assert client._episodes == {} or all(e.done for e in client._episodes.values()), client._episodes
        # The client goes on: a working env plays its episode.
        assert len(run_aec_env(client, simple_spread_v3.env(N=3, max_cycles=5), max_episodes=1)) == 1
        # Ending the episode fails too: the reset's error is still the one raised, the other told in a note.
        def link_down(*args, **kwargs):
            raise ConnectionError("link down")

        end_episode, client.end_episode = client.end_episode, link_down
        with pytest.raises(RuntimeError, match="no level file") as raised:
            run_aec_env(client, BrokenReset(simple_spread_v3.env(N=3, max_cycles=5)), max_episodes=1)
        assert any("link down" in note for note in raised.value.__notes__), raised.value.__notes__
        client.end_episode = end_episode
        client.close()
