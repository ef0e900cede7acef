"""Self-play on several ranks (docs/self_play.md, "On several ranks"): a finished game is judged into a
plain result and applied apart; two real ranks (gloo on loopback, two processes) apply every rank's
results in rank order and end with the same ratings and snapshot records; their trainers start from
rank 0's snapshots, draw their clients' opponents apart, and serve rank 0's export of a new snapshot
(or, when that export fails, keep the slot as it was on every rank); their lockstep loops apply the
held results once there are many and at the group's stop; a rank new to a resumed group takes rank
0's self-play record and slots, so the next snapshot is due on both."""

from __future__ import annotations

import asyncio
import os
import pickle
import types
from pathlib import Path

import torch

from tether.server.self_play import GameResult, SelfPlay, SelfPlayConfig

from . import gloo_ranks

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


def join(rank: int, port: int, timeout_s: float = 60):
    from tether.server.distributed.rank_group import RankGroup, RankPlace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), timeout_s)


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
    gloo_ranks.run_two_ranks(target, out)
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


def config(logdir: Path, snapshot_every: int = 1, **options):
    from tether.server.config import ServerConfig

    return ServerConfig(modules={"player": {"observation_space": BOX, "action_space": TWO}},
                        policy_mapping=[{"pattern": "p*", "module": "player"}],
                        self_play={**TABLE, "snapshot_every": snapshot_every, "latest_share": 0.0},
                        logdir=str(logdir), tensorboard=False, seed=7, device="cpu",
                        **{"train_batch_size": 64, "env_steps_per_sample": 16, **options})


def trainer_rank(rank: int, port: int, out: str) -> None:
    from tether.protocol.onnx_codec import decode_onnx
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    group = join(rank, port)
    cfg = config(Path(out) / f"r{rank}")
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


# -- the lockstep loop's own agreements -------------------------------------------------------------


def held_results_rank(rank: int, port: int, out: str) -> None:
    """A real trainer's lockstep loop, no data (so no update): rank 0 holds 3 results, rank 1 holds 2, and
    with MAX_HELD_RESULTS at 5 the first agreement applies them; then rank 0 holds one more and asks
    the group to stop, and the stop agreement applies it on both ranks."""
    from tether.server.distributed import lockstep_loop
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    lockstep_loop.MAX_HELD_RESULTS = 5
    group = join(rank, port, timeout_s=30)
    cfg = config(Path(out) / f"r{rank}", train_batch_size=10_000)
    trainer = Trainer(cfg, build_layout(cfg), group=group)
    play = trainer.self_play
    version = play.snapshots["player"][0].version
    won = 1.0 if rank == 0 else 0.0
    report: dict = {}

    async def until(done, what: str) -> None:
        for _ in range(1500):
            if done():
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"rank {rank}: {what} did not happen")

    async def main() -> None:
        for _ in range(3 if rank == 0 else 2):
            play.hold(GameResult(("player",), (("player@0", version, won),)))
        trainer.start()
        await until(lambda: play.games_rated == 5, "the held results' sync")
        report["max_held"] = (play.state(), play.pending, trainer.metrics.updates)
        if rank == 0:
            play.hold(GameResult(("player",), (("player@0", version, 0.5),)))
            trainer.request_stop("console")
        await asyncio.wait_for(trainer.stop_requested.wait(), 30)
        await trainer.close(checkpoint=False)
        report["stopped"] = (play.state(), play.pending, trainer.stop_reason)

    asyncio.run(main())
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
    group.close()


def test_held_results_are_applied_without_an_update_once_many_and_at_the_groups_stop(tmp_path: Path) -> None:
    first, second = run_two_ranks(held_results_rank, tmp_path)
    state, pending, updates = first["max_held"]
    assert second["max_held"] == (state, pending, updates) and pending == 0 and updates == 0
    assert state["games_rated"] == 5
    # Rank 0's results first, then rank 1's: the group's order on both ranks (Elo tells the orders apart).
    version = state["snapshots"]["player"][0]["version"]
    orders = []
    for scores in ([1.0] * 3 + [0.0] * 2, [0.0] * 2 + [1.0] * 3):
        alone = self_play(latest_share=0.0, snapshot_every=1)
        alone.take("player", version)
        alone.apply_results([GameResult(("player",), (("player@0", version, score),)) for score in scores])
        orders.append((alone.ratings, alone.state()["snapshots"]))
    assert (state["ratings"], state["snapshots"]) == orders[0] != orders[1]
    state, pending, reason = first["stopped"]
    assert pending == 0 and state["games_rated"] == 6 and reason == "console"
    assert second["stopped"][:2] == (state, 0) and second["stopped"][2] == "group"


def fresh_rank_rank(rank: int, port: int, out: str) -> None:
    """Rank 0 resumes a checkpoint with self-play (3 updates, a second snapshot, a rated game); rank 1 is
    new to the group (no checkpoint, no journal): it starts from rank 0's self-play and snapshot slots,
    and the next update's snapshot is due on both ranks alike."""
    from tether.protocol.onnx_codec import decode_onnx
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    group = join(rank, port, timeout_s=30)
    logdir = Path(out) / f"r{rank}"
    cfg = config(logdir, snapshot_every=2, resume=str(logdir / "checkpoint.pt"))
    trainer = Trainer(cfg, build_layout(cfg), group=group)

    def weights(module: str) -> dict:
        return {k: v.clone() for k, v in trainer.modules[module].learner.model.state_dict().items()}

    def view() -> tuple:
        return (trainer.self_play.state(), trainer.metrics.updates,
                {s: (decode_onnx(trainer.modules[s].onnx_field), trainer.modules[s].weights_seq_no, weights(s))
                 for s in ("player@0", "player@1")}, weights("player"))

    report = {"started": view()}
    with torch.no_grad():
        for p in trainer.modules["player"].learner.model.parameters():
            p.add_(0.25)

    async def snapshot() -> None:
        await trainer._take_snapshots(["player"])

    asyncio.run(snapshot())
    report["snapshot"] = view()
    asyncio.run(trainer.close(checkpoint=False))
    (Path(out) / f"rank-{rank}.pkl").write_bytes(pickle.dumps(report))
    group.close()


def same(a, b) -> bool:
    """Equal, tensors by their bits."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_rank_new_to_the_group_takes_rank_0s_resumed_self_play_and_snapshots_in_step(tmp_path: Path) -> None:
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    # Rank 0's checkpoint, written by a trainer alone: 3 updates, a snapshot after the second, a game rated.
    cfg = config(tmp_path / "r0", snapshot_every=2)
    alone = Trainer(cfg, build_layout(cfg))
    with torch.no_grad():
        for p in alone.modules["player"].learner.model.parameters():
            p.add_(0.5)
    alone.modules["player"].weights_seq_no = 2

    async def updates() -> None:
        for _ in range(3):
            await alone._take_snapshots(["player"])

    asyncio.run(updates())
    alone.self_play.apply_results([GameResult(("player",), (("player@1", 2, 1.0),))])
    alone.metrics.updates = 3
    alone.save_checkpoint()
    saved = alone.self_play.state()
    asyncio.run(alone.close(checkpoint=False))
    assert saved["updates"] == {"player": 3} and saved["next_slot"] == {"player": 0} and saved["games_rated"] == 1

    first, second = run_two_ranks(fresh_rank_rank, tmp_path)
    # Both ranks start from rank 0's checkpoint: its self-play record, its slots' weights and models.
    assert first["started"][0] == saved and first["started"][1] == 3
    assert same(first["started"], second["started"])
    # Their update counts agree: the fourth update's snapshot is taken by both, with the same weights and model.
    assert same(first["snapshot"], second["snapshot"])
    state = first["snapshot"][0]
    assert state["updates"] == {"player": 4} and state["next_slot"] == {"player": 1}
    assert state["snapshots"]["player"][0]["version"] == 2 and state["games_rated"] == 1
    assert same(first["snapshot"][2]["player@0"][2], first["snapshot"][3])


def test_one_server_skips_a_snapshot_whose_export_fails_and_writes_the_models_it_served(tmp_path: Path) -> None:
    from tether.protocol.onnx_codec import decode_onnx
    from tether.server.module_setup import build_layout
    from tether.server.trainer import Trainer

    cfg = config(tmp_path)
    trainer = Trainer(cfg, build_layout(cfg))
    slot = trainer.modules["player@1"]
    kept = ({k: v.clone() for k, v in slot.learner.model.state_dict().items()}, slot.onnx_field, slot.weights_seq_no)

    def fail() -> bytes:
        raise RuntimeError("export failed")

    slot.learner.export_onnx = fail
    with torch.no_grad():
        for p in trainer.modules["player"].learner.model.parameters():
            p.add_(0.25)
    asyncio.run(trainer._take_snapshots(["player"]))  # (logged, not raised: training goes on)
    state = trainer.self_play.state()
    assert state["next_slot"] == {"player": 1} and state["snapshots"]["player"][1] is None
    assert all(torch.equal(slot.learner.model.state_dict()[k], v) for k, v in kept[0].items())
    assert (slot.onnx_field, slot.weights_seq_no) == kept[1:]
    del slot.learner.export_onnx  # (the export works again: the next update's snapshot is taken)
    asyncio.run(trainer._take_snapshots(["player"]))
    assert trainer.self_play.state()["next_slot"] == {"player": 0} and slot.weights_seq_no == kept[2] + 1
    trainer.save_policies()
    for module in ("player@0", "player@1"):
        assert (tmp_path / f"policy-{module}.onnx").read_bytes() == decode_onnx(trainer.modules[module].onnx_field)
    asyncio.run(trainer.close(checkpoint=False))
