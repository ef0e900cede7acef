"""Self-play on two ranks (docs/self_play.md, "On several ranks"), started by torchrun as a cluster
would start them: tic-tac-toe through the PettingZoo adapter (examples/selfplay_client.py), a real
client process on each rank, each rank drawing its own clients' opponents. Both ranks end with
bit-identical weights (snapshot slots included), the same self-play record (ratings, snapshots with
their versions, games and scores), counting the games of both ranks, and write the same snapshot
models (the ones they served, rank 0's exports)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .server_process import REPO
from .test_scale_out import Group, assert_same_weights, start_clients, stop_clients

CLIENT = REPO / "examples" / "selfplay_client.py"
#: examples/configs/tictactoe_selfplay.toml, small: an update every 500 agent steps, a snapshot after each.
CONFIG = """
env_steps_per_sample = 100
train_batch_size = 500
minibatch_size = 250
num_epochs = 2
hidden_sizes = [32, 32]
policy_mapping = [{ pattern = "player_*", module = "player" }]

[modules.player]
action_space = { type = "Discrete", n = 9 }

[modules.player.observation_space]
type = "Dict"
spaces.action_mask = { type = "Box", shape = [9], dtype = "int8", low = 0, high = 1 }
spaces.observation = { type = "Box", shape = [3, 3, 2], dtype = "int8", low = 0, high = 1 }

[self_play]
teams = ["player_1", "player_2"]
snapshot_every = 1
window = 3
latest_share = 0.3
"""


@pytest.mark.slow
def test_two_ranks_play_one_self_play_run_with_the_groups_ratings_and_rank_0s_snapshots(tmp_path: Path) -> None:
    config = tmp_path / "selfplay.toml"
    config.write_text(CONFIG)
    group = Group(tmp_path, "--config", str(config), "--max-env-steps", "5000", "--seed", "0")
    clients = []
    try:
        ports = group.wait_serving()
        clients = start_clients(*([sys.executable, str(CLIENT), "--game", "tictactoe_v3", "--port", str(port),
                                   "--seed", str(rank)] for rank, port in ports.items()))
        assert group.proc.wait(120) == 0, "\n".join(group.lines[-40:])
    finally:
        stop_clients(clients)
        group.stop()
    summaries = [group.rank_summary(0), group.rank_summary(1)]
    for rank, summary in enumerate(summaries):
        assert summary["group"]["failure"] is None and summary["episodes"] > 0, (rank, summary["group"])
        # Each rank's own clients met snapshots (its draws): their returns are counted on that rank.
        assert any(m.startswith("player@") for m in summary["module_return_mean"]), (rank, summary)
    assert summaries[0]["updates"] == summaries[1]["updates"] >= 3
    versions = assert_same_weights(group)  # (the snapshot slots' networks too: they are modules)
    assert versions["player"] == summaries[0]["updates"]
    # One self-play record for the group: in both checkpoints and both summaries alike.
    states = [group.checkpoint(rank)["self_play"] for rank in (0, 1)]
    assert states[0] == states[1], states
    self_play = summaries[0]["self_play"]
    assert self_play == summaries[1]["self_play"]
    snapshots = self_play["modules"]["player"]["snapshots"]
    assert len(snapshots) == 3 and len({s["version"] for s in snapshots}) == 3, snapshots
    assert self_play["games_rated"] > 0 and sum(s["games"] for s in snapshots) > 0, self_play
    # The games of both ranks (those held at the stop too, applied at the stop agreement): more than
    # either rank's clients finished, at most what both finished (a game whose opponent's slot took a
    # newer snapshot before it was applied is not counted).
    counted = self_play["games_rated"] + self_play["games_against_latest"]
    episodes = [summary["episodes"] for summary in summaries]
    assert max(episodes) < counted <= sum(episodes), (counted, episodes)
    # The snapshot models both ranks served and wrote: the same bytes.
    written = sorted(p.name for p in (group.logdir / "rank-0").glob("policy-player@*.onnx"))
    assert len(written) == 3, written
    for name in written:
        assert (group.logdir / "rank-0" / name).read_bytes() == (group.logdir / "rank-1" / name).read_bytes(), name
