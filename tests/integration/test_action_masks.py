"""Action masks and Dict observations against a real server (§8.6, §11.6): PettingZoo's
tictactoe_v3, whose observation is Dict(action_mask, observation), against a random legal opponent.

Bad masks and leaves get their own codes from the server, and the Python SDK refuses them before
anything is sent; a masked policy makes no illegal move, and it learns to win more often than a
random player, measured in the same test."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from multiagent.versus_random import random_win_rate
from tether.protocol.errors import InvalidInputError
from tether.sdk import TetherClient

from .server_process import REPO, RawClient, ServerProcess

SPACE = json.loads(subprocess.run([sys.executable, str(REPO / "examples" / "tictactoe_client.py"), "--print-space"],
                                  capture_output=True, text=True, check=True, cwd=REPO).stdout)
NINE = '{"type": "Discrete", "n": 9}'
EMPTY_BOARD = np.zeros((3, 3, 2), np.int8)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("masks"), "--observation-space", json.dumps(SPACE), "--action-space",
                       NINE, "--train-batch-size", "200", "--seed", "0") as running:
        yield running


def record(masks: list, actions: list, **extra) -> dict:
    boards = [EMPTY_BOARD.tolist()] * len(masks)
    return {"obs": {"observation": boards, "action_mask": masks, **extra}, "actions": actions,
            "rewards": [0.0] * len(actions), "action_logp": [-np.log(9)] * len(actions),
            "is_terminated": True, "is_truncated": False}


ALL = [1] * 9
BAD = [
    ("masked_action", record([[0] + [1] * 8, ALL], [0]), "ACTION_MASKED"),
    ("mask_allows_nothing", record([[0] * 9, ALL], [0]), "ACTION_MASK_EMPTY"),
    ("mask_value_2", record([[2] + [1] * 8, ALL], [0]), "INVALID_ACTION_MASK"),
    ("mask_of_wrong_size", record([[1] * 8, [1] * 8], [0]), "OBS_SHAPE_MISMATCH"),
    ("leaf_missing", {**record([ALL, ALL], [0]), "obs": {"action_mask": [ALL, ALL]}}, "OBS_LEAF_MISMATCH"),
    ("leaf_unknown", record([ALL, ALL], [0], score=[[0], [1]]), "OBS_LEAF_MISMATCH"),
    ("flat_rows_instead_of_leaves", {**record([ALL, ALL], [0]), "obs": [[0] * 27] * 2}, "INVALID_FIELD"),
    ("leaf_of_wrong_dtype", {**record([ALL, ALL], [0]),
                             "obs": {"observation": [EMPTY_BOARD.tolist()] * 2,
                                     "action_mask": {"dtype": "uint8", "shape": [2, 9], "b64": "AQEBAQEBAQEBAQEBAQEBAQEB"}}},
     "OBS_DTYPE_MISMATCH"),
]


@pytest.mark.parametrize("name, bad, code", BAD, ids=[b[0] for b in BAD])
def test_each_bad_mask_or_leaf_gets_its_own_code(server, name: str, bad: dict, code: str) -> None:
    client = RawClient(server.port)
    try:
        client.request({"type": "PING", "protocol_version": "1.4"})
        answer = client.request({"type": "EPISODES_AND_GET_STATE", "episodes": [bad]})
        assert answer["type"] == "ERROR" and answer["code"] == code, answer
        # (one allowed action: its masked log-probability is 0 under any model, which the server checks)
        good = client.request({"type": "EPISODES_AND_GET_STATE",
                               "episodes": [{**record([[0, 1] + [0] * 7, ALL], [1]), "action_logp": [0.0]}]})
        assert good["type"] == "SET_STATE", good  # the connection goes on; a valid masked record is stored
    finally:
        client.close()


def test_the_sdk_refuses_bad_observations_before_sending(tmp_path) -> None:
    # (its own server: the shared one may ask to record only a share of episodes by now)
    with ServerProcess(tmp_path, "--observation-space", json.dumps(SPACE), "--action-space", NINE,
                       "--seed", "0") as server:
        _refuses_and_follows_masks(server.port)


def _refuses_and_follows_masks(port: int) -> None:
    client = TetherClient("127.0.0.1", port, client_name="mask-checks")
    try:
        episode = client.start_episode()
        for observation, code in [
            ({"observation": EMPTY_BOARD}, "OBS_LEAF_MISMATCH"),
            ({"observation": EMPTY_BOARD, "action_mask": np.ones(9), "extra": [1]}, "OBS_LEAF_MISMATCH"),
            ({"observation": EMPTY_BOARD, "action_mask": np.ones(8)}, "OBS_SHAPE_MISMATCH"),
            ({"observation": EMPTY_BOARD, "action_mask": np.zeros(9)}, "ACTION_MASK_EMPTY"),
            ({"observation": EMPTY_BOARD, "action_mask": np.full(9, 0.5)}, "INVALID_ACTION_MASK"),
            ({"observation": np.full((3, 3, 2), np.nan), "action_mask": np.ones(9)}, "NON_FINITE_VALUE"),
        ]:
            with pytest.raises(InvalidInputError) as info:
                client.get_action(episode, observation)
            assert info.value.code == code, (observation, info.value)
        # Sampled actions follow the mask, every time; the final observation may allow nothing.
        for _ in range(200):
            allowed = np.zeros(9, np.int8)
            allowed[np.random.default_rng().choice(9, 2, replace=False)] = 1
            action = client.get_action(episode, {"observation": EMPTY_BOARD, "action_mask": allowed})
            assert allowed[action] == 1
            client.log_returns(episode, 0.0)
        client.end_episode(episode, {"observation": EMPTY_BOARD, "action_mask": np.zeros(9, np.int8)})
        client.flush()  # (raises the server's error, had it refused the batch)
        assert client.env_steps_sent == 200, (client.record_share, client.steps_refused_stale, client.batches_dropped)
    finally:
        client.close()


@pytest.mark.slow
def test_masked_ppo_learns_tictactoe_against_a_random_player(tmp_path) -> None:
    random_rate = random_win_rate("tictactoe_v3", games=1000, seed=5)  # about 0.59
    with ServerProcess(tmp_path, "--observation-space", json.dumps(SPACE), "--action-space", NINE,
                       "--max-env-steps", "30000", "--seed", "0") as server:
        out = subprocess.run([sys.executable, str(REPO / "examples" / "tictactoe_client.py"), "--port",
                              str(server.port), "--seed", "1", "--eval-games", "1000"], cwd=REPO, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    played = json.loads(out.stdout.strip().splitlines()[-1])
    assert played["training_done"], played
    assert played["training"]["games"] >= 1000 and played["training"]["illegal_moves"] == 0, played
    assert played["greedy"]["games"] == 1000 and played["greedy"]["illegal_moves"] == 0, played
    assert played["greedy"]["win_rate"] >= random_rate + 0.2, (played, random_rate)


def test_the_multi_agent_client_takes_dict_observations_and_masks(tmp_path) -> None:
    """Two seats of one masked module, a third agent of a flat module, in one frame: Dict
    observations are flattened per module, masks are followed, and the server stores every step."""
    from tether.sdk import MultiAgentClient

    modules = {"board": {"observation_space": SPACE, "action_space": {"type": "Discrete", "n": 9}},
               "flat": {"observation_space": {"type": "Box", "shape": [2]}, "action_space": {"type": "Discrete", "n": 2}}}
    rules = [{"pattern": "player_*", "module": "board"}, {"pattern": "*", "module": "flat"}]
    rng = np.random.default_rng(0)
    with ServerProcess(tmp_path, "--modules", json.dumps(modules), "--policy-mapping", json.dumps(rules),
                       "--seed", "0") as server:
        client = MultiAgentClient("127.0.0.1", server.port, client_name="ma-masks")
        try:
            episode = client.start_episode()
            for _ in range(50):
                masks = {seat: (rng.random(9) < 0.3).astype(np.int8) for seat in ("player_1", "player_2")}
                for mask in masks.values():
                    mask[rng.integers(9)] = 1
                actions = client.get_action(episode, {
                    **{seat: {"observation": EMPTY_BOARD, "action_mask": mask} for seat, mask in masks.items()},
                    "referee": [0.5, -0.5]})
                assert all(masks[seat][actions[seat]] == 1 for seat in masks), (masks, actions)
                client.log_returns(episode, {"player_1": 1.0, "player_2": -1.0, "referee": 0.0})
            with pytest.raises(InvalidInputError) as info:
                client.get_action(episode, {"player_1": {"observation": EMPTY_BOARD, "action_mask": np.zeros(9)}})
            assert info.value.code == "ACTION_MASK_EMPTY"
            # Greedy actions (compute_actions) take Dict observations and follow masks alike, and
            # refuse what get_action refuses.
            only_4 = np.zeros(9, np.int8)
            only_4[4] = 1
            greedy = client.compute_actions({"player_1": {"observation": EMPTY_BOARD, "action_mask": only_4},
                                             "referee": [0.5, -0.5]})
            assert greedy["player_1"] == 4 and greedy["referee"] in (0, 1), greedy
            for mask, code in ((np.zeros(9), "ACTION_MASK_EMPTY"), (np.full(9, 2), "INVALID_ACTION_MASK")):
                with pytest.raises(InvalidInputError) as info:
                    client.compute_actions({"player_1": {"observation": EMPTY_BOARD, "action_mask": mask}})
                assert info.value.code == code
            client.end_episode(episode, {seat: {"observation": EMPTY_BOARD, "action_mask": np.zeros(9, np.int8)}
                                         for seat in ("player_1", "player_2")} | {"referee": [0.0, 0.0]})
            client.flush()  # (raises the server's error, had it refused a batch)
        finally:
            client.close()
        summary = server.stop()
    assert summary["agent_steps"] == 150, summary


CAMERA_AND_PADDLE = {"type": "Dict", "spaces": {
    "camera": {"type": "Box", "shape": [4, 4, 1], "dtype": "uint8", "low": 0, "high": 255},
    "paddle": {"type": "Box", "shape": [2], "low": -1, "high": 1}}}


def test_byte_leaves_flat_rows_finals_and_a_restart_with_a_dict_space(tmp_path) -> None:
    """The Python SDK with a camera-and-vector Dict (no mask): a byte leaf's bad value, a flat row of
    the wrong width and a final observation without a leaf are refused at the call; a flat row of
    the right width is taken; and the client goes on across a server restart with the same space."""
    from .server_process import free_port

    port = free_port()
    flags = ("--observation-space", json.dumps(CAMERA_AND_PADDLE), "--action-space", '{"type": "Discrete", "n": 3}',
             "--seed", "0")
    camera = np.zeros((4, 4, 1), np.uint8)
    with ServerProcess(tmp_path, *flags, port=port, name="first"):
        client = TetherClient("127.0.0.1", port, client_name="dict-restart", reconnect_timeout_s=60)
        episode = client.start_episode()
        for observation, code in [
            ({"camera": np.full((4, 4, 1), 300.0), "paddle": [0, 0]}, "OBS_DTYPE_MISMATCH"),
            ({"camera": np.full((4, 4, 1), 0.5), "paddle": [0, 0]}, "OBS_DTYPE_MISMATCH"),
            (np.zeros(17, np.float32), "OBS_SHAPE_MISMATCH"),
            ((camera, [0, 0]), "OBS_LEAF_MISMATCH"),  # (a Dict's leaves go by key)
        ]:
            with pytest.raises(InvalidInputError) as info:
                client.get_action(episode, observation)
            assert info.value.code == code, (code, info.value)
        assert client.get_action(episode, np.zeros(18, np.float32)) in range(3)  # (its flat row, checked alike)
        client.log_returns(episode, 1.0)
        with pytest.raises(InvalidInputError) as info:
            client.end_episode(episode, {"camera": camera})
        assert info.value.code == "OBS_LEAF_MISMATCH"
        client.get_action(episode, {"camera": camera, "paddle": [0.5, -0.5]})
    with ServerProcess(tmp_path, *flags, port=port, name="second"):
        for _ in range(100):  # across the restart: the same space, so nothing is dropped or refused
            client.log_returns(episode, 1.0)
            client.get_action(episode, {"camera": camera, "paddle": [0.5, -0.5]})
        client.end_episode(episode, {"camera": camera, "paddle": [0.0, 0.0]})
        client.flush()
        assert client.reconnects >= 1
        client.close()
