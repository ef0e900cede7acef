"""Tic-tac-toe learned by self-play alone (docs/self_play.md): a real ``tether serve`` with
examples/configs/tictactoe_selfplay.toml and one real client process (examples/selfplay_client.py)
that plays both seats; the server draws per game which seat learns and which snapshot plays the
other. The trained policy never met a random player, yet beats one far more often and loses far less
than a random player does against the same opponent, measured here; and the snapshots' ratings rise
over the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .server_process import REPO, ServerProcess

CLIENT = REPO / "examples" / "selfplay_client.py"


def evaluate(policy: str, games: int = 1000, seed: int = 11, *flags: str) -> dict:
    out = subprocess.run([sys.executable, str(CLIENT), "--game", "tictactoe_v3", "--evaluate", policy, "--games",
                          str(games), "--seed", str(seed), *flags], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_tictactoe_by_self_play_beats_a_random_player_it_never_met(tmp_path) -> None:
    # 60k env steps (30 updates, a snapshot every 5), measured with seeds 0 and 1: greedy against a
    # random legal player over 1,000 games in both seats, 875-880 wins and 61-112 losses; a random
    # player wins about 470 and loses about 410. Snapshot ratings: the first ~1150-1180, the latest
    # ~1410-1460. (After 150k env steps: 8 losses in 1,000 games, not yet none.)
    server = ServerProcess(tmp_path, "--config", str(REPO / "examples/configs/tictactoe_selfplay.toml"),
                           "--max-env-steps", "60000", "--seed", "0").start()
    client = subprocess.Popen([sys.executable, str(CLIENT), "--game", "tictactoe_v3", "--port", str(server.port),
                               "--seed", "1"], cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        summary = server.wait(timeout=600)
    finally:
        client.kill()
        server.kill()
    self_play = summary["self_play"]
    assert self_play["games_rated"] > 1000 and self_play["games_against_latest"] > 1000, self_play
    played = {m for m in summary["module_return_mean"] if m.startswith("player@")}
    assert len(played) >= 3, summary["module_return_mean"]  # several snapshots played, not only the first
    snapshots = sorted(self_play["modules"]["player"]["snapshots"], key=lambda s: s["version"])
    assert snapshots[0]["version"] == 0 and len(snapshots) >= 5, snapshots
    # The ratings rise over the run: the latest snapshot well above the untrained one, the learner above both.
    assert snapshots[-1]["rating"] > snapshots[0]["rating"] + 100, snapshots
    assert self_play["modules"]["player"]["rating"] > snapshots[-1]["rating"] - 50, self_play

    trained = evaluate(str(tmp_path / "server-run" / "policy-player.onnx"))
    baseline = evaluate("random")
    assert trained["illegal_moves"] == 0 and trained["games"] == 1000
    assert trained["wins"] > baseline["wins"] + 250, (trained, baseline)
    assert trained["losses"] < baseline["losses"] - 200, (trained, baseline)
    # Every game a random player can make against the greedy policy, enumerated: the exact loss chance.
    exact = evaluate(str(tmp_path / "server-run" / "policy-player.onnx"), 0, 0, "--exact")
    assert exact["loss"] < baseline["losses"] / baseline["games"] / 3, (exact, baseline)


def test_the_exact_evaluation_gives_random_tic_tac_toe_its_known_odds() -> None:
    # Uniformly random tic-tac-toe, as every game is enumerated with its chance: the first player wins
    # 58.49%, the second 28.81%, and 12.70% are drawn (the game's well-known odds). Any slip in the
    # enumeration (a branch counted twice, a seat's reward misread, a stale memo) moves these figures.
    exact = evaluate("random", 0, 0, "--exact")
    first, second = exact["seats"]["player_1"], exact["seats"]["player_2"]
    assert abs(first["win"] - 0.5849) < 5e-4 and abs(first["loss"] - 0.2881) < 5e-4, exact
    assert abs(second["win"] - first["loss"]) < 1e-9 and abs(second["draw"] - 0.1270) < 5e-4, exact
