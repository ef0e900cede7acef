"""Two real ranks (gloo on loopback, two processes) updating one module with memory and normalized
observations, where one rank holds a single window of the group's first update (so most of its
minibatches are empty) and no step of the second (it joins every sum with none): both end with
bit-identical weights and normalizer statistics, which the updates moved."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from tether.protocol import Discrete
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.spaces import box

from .gloo_ranks import run_two_ranks

#: Agent steps of each rank in each update (0: none).
STEPS = {0: [6, 0], 1: [400, 300]}
GRU = {"recurrent": {"type": "gru", "size": 8, "seq_len": 8, "burn_in": 2}}


def chunks(steps: int, seed: int) -> list[EpisodeChunk]:
    rng, out = np.random.default_rng(seed), []
    while steps > 0:
        t = min(50, steps)
        out.append(EpisodeChunk(rng.normal(2, 3, (t + 1, 3)).astype(np.float32), rng.integers(0, 2, t),
                                rng.normal(size=t).astype(np.float32), np.full(t, -0.69, np.float32), None, True,
                                False, state_in=np.zeros((1, 8), np.float32)))
        steps -= t
    return out


def rank_main(rank: int, port: int, out: str) -> None:
    from tether.server.distributed.data_parallel import DataParallel
    from tether.server.distributed.rank_group import RankGroup, RankPlace
    from tether.server.learner import PPOHyperparams, PPOLearner, build_batch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    group = RankGroup(RankPlace(rank=rank, world_size=2, local_rank=rank), torch.device("cpu"), 60)
    learner = PPOLearner(box(-10, 10, (3,)), Discrete(2), PPOHyperparams(
        model=GRU, normalize_observations=True, minibatch_size=64, num_epochs=2), seed=0)
    learner.data_parallel = DataParallel(group)
    for update, steps in enumerate(STEPS[rank]):
        batch = build_batch(chunks(steps, seed=10 * rank + update)) if steps else None
        learner.update(batch, sum(STEPS[r][update] for r in STEPS))
    torch.save(learner.model.state_dict(), Path(out) / f"rank-{rank}.pt")
    group.close()


def test_two_ranks_with_empty_minibatches_and_no_steps_end_alike(tmp_path: Path) -> None:
    run_two_ranks(rank_main, tmp_path)
    first, second = (torch.load(tmp_path / f"rank-{r}.pt") for r in (0, 1))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    # Every rank's observations were folded in: 7 rows of rank 0's chunk, 8 x 51 and 6 x 51 of rank 1's.
    assert float(first["count"]) == 7 + 408 + 306
    from tether.server.learner import PPOHyperparams, PPOLearner

    untrained = PPOLearner(box(-10, 10, (3,)), Discrete(2), PPOHyperparams(model=GRU, normalize_observations=True),
                           seed=0).model.state_dict()
    assert any(not torch.equal(first[k], untrained[k]) for k in first if k in untrained and "weight" in k)
