"""Self-play on several ranks (docs/self_play.md, "On several ranks"): a finished game is judged into a
plain result and applied apart; two real ranks (gloo on loopback, two processes) apply every rank's
results in rank order and end with the same ratings and snapshot records; their trainers start from
rank 0's snapshots, draw their clients' opponents apart, and serve rank 0's export of a new snapshot
(or, when that export fails, keep the slot as it was on every rank)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import socket
import types
from pathlib import Path

import torch

from tether.server.self_play import GameResult, SelfPlay, SelfPlayConfig

TABLE = {"teams": ["p1", "p2"], "window": 2, "latest_share": 0.25}
GAMES = 40
BOX = {"type": "Box", "shape": [2], "low": -1, "high": 1}
TWO = {"type": "Discrete", "n": 2}


def self_play(seed: int | None = 0, **options) -> SelfPlay:
    return SelfPlay(SelfPlayConfig.from_json({**TABLE, **options}), ["player"], seed=seed)


def with_two_snapshots(play: SelfPlay) -> SelfPlay:
    play.take("player", 0)
    play.take("player", 3)
    return play


def play_games(play: SelfPlay, rank: int) -> None:
    """``GAMES`` local games judged and held: rank 0's learners win them all, rank 1's lose them all."""
    for game in range(GAMES):
        episode = f"e{game}"
        modules = {seat: play.module_for(f"conn-{rank}", episode, seat, "player") for seat in ("p1", "p2")}
        learner = next(seat for seat, m in modules.items() if m == "player")
        won = 1.0 if rank == 0 else -1.0
        returns = {seat: (m, won if seat == learner else -won) for seat, m in modules.items()}
        result = play.judge_part(f"conn-{rank}", episode, returns, ended=True)
        assert result is not None
        play.hold(result)


# -- judging and applying ---------------------------------------------------------------------------


def test_a_judged_game_is_applied_apart_and_skipped_once_its_slot_holds_another_snapshot() -> None:
    play = self_play(window=1, latest_share=0.0)
    slot = play.take("player", 0)
    results = []
    for episode in ("kept", "retaken"):
        modules = {seat: play.module_for("c", episode, seat, "player") for seat in ("p1", "p2")}
        learner = next(seat for seat, m in modules.items() if m == "player")
        returns = {seat: (m, 1.0 if seat == learner else -1.0) for seat, m in modules.items()}
        results.append(play.judge_part("c", episode, returns, ended=True))
    assert results[0] == GameResult(("player",), ((slot, 0, 1.0),)) == pickle.loads(pickle.dumps(results[0]))
    # Judged, not applied: nothing moved, no match is left open.
    assert play.ratings["player"] == 1200.0 and play.games_rated == 0 and play.open_matches() == 0
    play.apply_results(results[:1])
    assert play.games_rated == 1 and play.snapshots["player"][0].games == 1 and play.ratings["player"] > 1200.0
    rating = play.ratings["player"]
    play.take("player", 50)  # (the window of one: the slot now holds a newer snapshot than the one drawn)
    play.apply_results(results[1:])
    assert play.games_rated == 1 and play.snapshots["player"][0].games == 0 and play.ratings["player"] == rating
    # A game against the latest policy is counted, not rated; held results wait for take_results.
    latest = play.judge_part("c", "x", {}, ended=True)
    assert latest is None  # (nothing was drawn for that episode: not a game of this run)
    play.hold(GameResult(("player",), latest=True))
    assert play.pending == 1 and play.games_latest == 0
    play.apply_results(play.take_results())
    assert play.pending == 0 and play.take_results() == [] and play.games_latest == 1


def test_episode_part_alone_still_rates_at_once() -> None:
    play = self_play(latest_share=0.0)
    slot = play.take("player", 0)
    modules = {seat: play.module_for("c", "e", seat, "player") for seat in ("p1", "p2")}
    play.episode_part("c", "e", {seat: (m, 1.0 if m == "player" else -1.0) for seat, m in modules.items()},
                      ended=True)
    assert sorted(modules.values()) == ["player", slot]
    assert play.games_rated == 1 and play.pending == 0 and play.snapshots["player"][0].games == 1


# -- two real ranks ---------------------------------------------------------------------------------


def join(rank: int, port: int):
    from tether.server.distributed.rank_group import RankGroup, RankPlace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), 60)


def ratings_rank(rank: int, port: int, out: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tether.server.distributed.lockstep_loop import LockstepLearnerLoop

    group = join(rank, port)
    play = with_two_snapshots(self_play(seed=0 + rank))  # (as the trainer seeds each rank's draws)
    play_games(play, rank)
    held = list(play._pending)
    before = play.summary()
    # The lockstep loop's own step, on a stand-in loop: gather every rank's results, apply them in rank order.
    executor = ThreadPoolExecutor(1)
    stand_in = types.SimpleNamespace(self_play=play, group=group, _executor=executor)

    async def apply() -> None:
        await LockstepLearnerLoop._apply_the_groups_results(stand_in, asyncio.get_running_loop())

    asyncio.run(apply())
    executor.shutdown()
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(
        {"held": held, "before": before, "after": play.summary(), "state": play.state(), "pending": play.pending}))
    group.close()


def run_two_ranks(target, out: Path) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    ranks = [spawn.Process(target=target, args=(rank, port, str(out))) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0, f"rank exited with {process.exitcode}"
    return [pickle.loads((out / f"rank-{rank}.pkl").read_bytes()) for rank in (0, 1)]


def test_two_ranks_apply_every_ranks_games_in_rank_order_and_rate_alike(tmp_path: Path) -> None:
    first, second = run_two_ranks(ratings_rank, tmp_path)
    # Each rank drew its own opponents (seeded apart) and held its games without rating them.
    assert [r.against for r in first["held"]] != [r.against for r in second["held"]]
    assert first["before"]["games_rated"] == second["before"]["games_rated"] == 0
    # After the sync: the group's ratings and records, the same on both ranks, every game counted.
    assert first["after"] == second["after"] and first["state"] == second["state"]
    assert first["pending"] == second["pending"] == 0
    assert first["after"]["games_rated"] + first["after"]["games_against_latest"] == 2 * GAMES
    snapshots = first["after"]["modules"]["player"]["snapshots"]
    assert sum(s["games"] for s in snapshots) == first["after"]["games_rated"] > 0
    # Applied in rank order (Elo is not commutative: the other order rates otherwise).
    in_order, reversed_order = with_two_snapshots(self_play()), with_two_snapshots(self_play())
    for held in (first["held"], second["held"]):
        in_order.apply_results(held)
    for held in (second["held"], first["held"]):
        reversed_order.apply_results(held)
    assert in_order.summary() == first["after"]
    assert reversed_order.summary()["modules"] != first["after"]["modules"]


def trainer_rank(rank: int, port: int, out: str) -> None:
    from tether.protocol.onnx_codec import decode_onnx
    from tether.server.config import ServerConfig
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    group = join(rank, port)
    cfg = ServerConfig(modules={"player": {"observation_space": BOX, "action_space": TWO}},
                       policy_mapping=[{"pattern": "p*", "module": "player"}],
                       self_play={**TABLE, "snapshot_every": 1, "latest_share": 0.0},
                       logdir=str(Path(out) / f"r{rank}"), tensorboard=False, seed=7, device="cpu",
                       train_batch_size=64, env_steps_per_sample=16)
    trainer = Trainer(cfg, build_layout(cfg), group=group)

    def served(slot: str) -> bytes:  # (the model the rank's clients get)
        return decode_onnx(trainer.modules[slot].onnx_field)

    report: dict = {"state": trainer.self_play.state(), "first": served("player@0"),
                    "draws": [trainer.self_play.module_for("c", f"e{i}", "p1", "player") for i in range(30)]}

    def train_a_little() -> None:  # (the same on every rank, as an update would)
        with torch.no_grad():
            for p in trainer.modules["player"].learner.model.parameters():
                p.add_(0.25)

    async def snapshot() -> None:
        await trainer._take_snapshots(["player"])

    train_a_little()
    if rank == 1:  # (were rank 1 to export its own, clients of rank 1 would get these bytes)
        trainer.modules["player@1"].learner.export_onnx = lambda: b"rank 1's own export"
    asyncio.run(snapshot())
    report["taken"] = (trainer.self_play.state(), served("player@1"), trainer.modules["player@1"].weights_seq_no)
    report["rank_0_export"] = trainer.modules["player@1"].learner.export_onnx() if rank == 0 else None
    # Rank 0's export of the next snapshot fails: every rank keeps slot 0 as it was, its weights too.
    kept = {k: v.clone() for k, v in trainer.modules["player@0"].learner.model.state_dict().items()}
    train_a_little()
    if rank == 0:
        def fail() -> bytes:
            raise RuntimeError("export failed")
        trainer.modules["player@0"].learner.export_onnx = fail
    asyncio.run(snapshot())
    weights = trainer.modules["player@0"].learner.model.state_dict()
    report["failed"] = (trainer.self_play.state(), served("player@0"),
                        trainer.modules["player@0"].weights_seq_no, all(torch.equal(weights[k], kept[k]) for k in kept))
    asyncio.run(trainer.close(checkpoint=False))
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
    group.close()


def test_two_ranks_take_rank_0s_snapshots_and_draw_their_opponents_apart(tmp_path: Path) -> None:
    first, second = run_two_ranks(trainer_rank, tmp_path)
    # The first snapshot and the record start alike; each rank draws its own clients' games (seed + rank).
    assert first["state"] == second["state"] and first["first"] == second["first"]
    assert first["draws"] != second["draws"]
    # A snapshot: the same record everywhere, and rank 0's export served by both ranks.
    assert first["taken"] == second["taken"]
    assert first["taken"][1] == first["rank_0_export"]
    slots = first["taken"][0]["snapshots"]["player"]
    assert [s is not None for s in slots] == [True, True] and first["taken"][2] == 1
    # Rank 0's export failed: no rank took the snapshot; slot 0 kept its record, model and weights.
    assert first["failed"] == second["failed"]
    state, onnx_field, version, weights_kept = first["failed"]
    assert state["snapshots"] == first["taken"][0]["snapshots"] and state["next_slot"] == {"player": 0}
    assert onnx_field == first["first"] and version == 1 and weights_kept
