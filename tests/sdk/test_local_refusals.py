"""docs/parity.md: what no record may carry is refused at the call, by every SDK, before it is
recorded: a NaN or infinite observation or reward raises InvalidInputError (code NON_FINITE_VALUE)
and the episode goes on as if the call had not been made; the server never sees it (it would refuse
the whole batch). A module whose model has not come raises NotReadyError."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tether.sdk import InvalidInputError, MultiAgentClient, TetherClient

from .scripted_server import play_steps
from .test_record_share import share_server, sent_steps


def test_a_non_finite_observation_or_reward_is_refused_at_the_call_and_never_sent() -> None:
    with share_server(lambda n: None) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        eid = client.start_episode()
        play_steps(client, eid, range(4))
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(InvalidInputError, match=r"observation\[1\] is not finite") as refused:
                client.get_action(eid, [0.0, bad, 0.0])
            assert refused.value.code == "NON_FINITE_VALUE"
            with pytest.raises(InvalidInputError, match="reward is not finite"):
                client.log_returns(eid, bad)
        with pytest.raises(InvalidInputError, match=r"final observation\[2\]"):
            client.end_episode(eid, [0.0, 0.0, math.nan])
        assert client.end_episode(eid, np.zeros(3, np.float32)) == 4.0  # the episode was still open, unharmed
        client.flush()
        batches = server.messages("EPISODES_AND_GET_STATE")
        client.close()
    assert sent_steps(server) == 4
    for batch in batches:
        for record in batch["episodes"]:
            assert all(math.isfinite(v) for row in record["obs"] for v in row)
            assert all(math.isfinite(r) for r in record["rewards"])


def test_a_multi_agent_frame_with_one_bad_observation_records_nothing_of_it() -> None:
    with share_server(lambda n: None, multi_agent=True) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=2, wait_for_weights=True)
        eid = client.start_episode()
        client.get_action(eid, {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)})
        with pytest.raises(InvalidInputError, match="observation of 'b'"):
            client.get_action(eid, {"a": np.full(3, 7.0, np.float32), "b": [0.0, math.nan, 0.0]})
        with pytest.raises(InvalidInputError, match="reward of 'a'"):
            client.log_returns(eid, {"b": 1.0, "a": math.inf})
        client.log_returns(eid, {"a": 1.0, "b": 1.0})
        client.get_action(eid, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
        client.end_episode(eid, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
        client.flush()
        records = [r for b in server.messages("EPISODES_AND_GET_STATE") for r in b["episodes"] if r["agents"]]
        client.close()
    a = [row for r in records for row in r["agents"]["a"]["obs"]]
    assert [0.0, 0.0, 0.0] in a and [7.0, 7.0, 7.0] not in a, a  # nothing of the refused frame
    assert sum(len(r["agents"]["b"]["rewards"]) for r in records) == 2
    assert sum(sum(r["agents"]["b"]["rewards"]) for r in records) == 1.0  # the refused call added nothing


def test_a_reward_that_would_take_a_step_beyond_float32_is_refused_and_adds_nothing() -> None:
    """§10.5: a step's reward never goes out beyond float32 (the server would refuse the whole batch).
    Single agent: the call is refused and the return unchanged; multi-agent: one such reward and the
    call adds none of its rewards, to any agent."""
    with share_server(lambda n: None) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        eid = client.start_episode()
        client.get_action(eid, np.zeros(3, np.float32))
        client.log_returns(eid, 3e38)
        with pytest.raises(InvalidInputError, match="beyond float32") as refused:
            client.log_returns(eid, 1e38)
        assert refused.value.code == "NON_FINITE_VALUE"
        client.log_returns(eid, -1e38)
        assert math.isclose(client.end_episode(eid, np.zeros(3, np.float32)), 3e38 - 1e38)
        client.flush()
        rewards = [r for b in server.messages("EPISODES_AND_GET_STATE") for rec in b["episodes"] for r in rec["rewards"]]
        client.close()
    assert len(rewards) == 1 and math.isclose(rewards[0], 3e38 - 1e38), rewards
    with share_server(lambda n: None, multi_agent=True) as server:
        client = MultiAgentClient("127.0.0.1", server.port, seed=2, wait_for_weights=True)
        eid = client.start_episode()
        client.get_action(eid, {"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float32)})
        client.log_returns(eid, {"a": 3e38, "b": 1.0})
        with pytest.raises(InvalidInputError, match="'a'.*beyond float32"):
            client.log_returns(eid, {"b": 2.0, "a": 1e38})
        returns = client.end_episode(eid, {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)})
        client.flush()
        records = [r for b in server.messages("EPISODES_AND_GET_STATE") for r in b["episodes"] if r["agents"]]
        client.close()
    assert returns == {"a": 3e38, "b": 1.0}  # b's 2.0 of the refused call was not added either
    assert [r for rec in records for r in rec["agents"]["b"]["rewards"]] == [1.0]


def test_an_episode_not_recorded_is_not_limited_and_its_demonstration_line_leaves_the_reward_out(tmp_path) -> None:
    """§10.5 limits only steps that will be sent: in an episode not recorded for training the reward
    is taken (it counts in the return), and the demonstration file, whose numbers are float32 too,
    leaves out the reward that would take its step beyond them (the file stays readable)."""
    from tether.protocol.demonstrations import read_demonstrations

    with share_server(lambda n: None) as server:
        client = TetherClient("127.0.0.1", server.port, seed=1, wait_for_weights=True)
        client.record_demonstrations(tmp_path / "d.jsonl")
        eid = client.start_episode(training_enabled=False)
        client.get_action(eid, np.zeros(3, np.float32))
        client.log_returns(eid, 3e38)
        client.log_returns(eid, 1e38)  # not refused: nothing of this episode is sent
        client.get_action(eid, np.zeros(3, np.float32))
        client.log_returns(eid, 1.0)
        assert math.isclose(client.end_episode(eid, np.zeros(3, np.float32)), 4e38)
        client.close()
    episodes = list(read_demonstrations(tmp_path / "d.jsonl").episodes)
    assert len(episodes) == 1 and list(episodes[0].chunk.rewards) == [np.float32(3e38), 1.0]


@pytest.mark.parametrize("size", [1, 16, 256, 257, 4096])
def test_every_non_finite_value_is_found_wherever_it_is_and_large_finite_values_pass(size: int) -> None:
    """The check adds a row of a game's size up in double (exact: a float32 row's sum is finite when
    every value is) and looks at a larger one value by value: both find NaN and both infinities at any
    place, in any layout, and let float32's largest values through, however many."""
    from tether.sdk.base_client import finite_observation

    big = np.full(size, np.finfo(np.float32).max, np.float32)
    big[::2] *= -1
    np.testing.assert_array_equal(finite_observation(big), big)
    for at in {0, size // 2, size - 1}:
        for bad in (math.nan, math.inf, -math.inf):
            row = np.zeros(size, np.float64)
            row[at] = bad
            for layout in (row, row.astype(np.float32), row.reshape(1, -1), row.tolist()):
                with pytest.raises(InvalidInputError, match=rf"observation\[{at}\] is not finite") as refused:
                    finite_observation(layout)
                assert refused.value.code == "NON_FINITE_VALUE"
    with pytest.raises(InvalidInputError, match=r"observation\[0\] is not finite"), np.errstate(over="ignore"):
        finite_observation(np.float64(1e300))  # (beyond float32: infinite once narrowed, as the record would be)
    assert finite_observation(2.5).shape == () and finite_observation([]).size == 0
