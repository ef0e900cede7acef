"""Data-parallel PPO across ranks: each rank's steps, one gradient per minibatch for all.

An update of a module is planned from the global step count ``N`` (every rank's after its own
screen, agreed before the update): ``K = ceil(N / minibatch_size)`` minibatches per epoch on every
rank, each rank splitting its own steps (in a new random order) into ``K`` near-equal parts, some
empty where it holds fewer than ``K`` steps or none at all. Per minibatch, two sums over the ranks:

1. the advantages' count, sum and sum of squares (with ``norm_adv``), so every rank normalises with
   the statistics of the whole minibatch, as one learner would;
2. the gradients, each rank's weighted by its share of steps, with those step counts and a flag
   for a loss that was not finite: every rank divides the same sum by the same total, clips the
   same norm and takes the same optimizer step, so the weights stay bit-identical; a non-finite
   loss or gradient anywhere makes every rank undo the update together.

A rank with no steps for a module still makes every call (with zeros): no rank waits for a sum
another rank never joins, whatever the data's spread (the deadlock of learners that skip a module
they have no samples for).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch

from .rank_group import RankGroup


class DataParallel:
    """The sums one module's update makes with the other ranks."""

    def __init__(self, group: RankGroup) -> None:
        self.group = group

    @staticmethod
    def minibatch_count(global_steps: int, minibatch_size: int) -> int:
        """Minibatches per epoch on every rank: as one learner would take ``global_steps``."""
        return max(1, math.ceil(global_steps / minibatch_size))

    @staticmethod
    def parts(order: np.ndarray, count: int) -> list[np.ndarray]:
        """``order`` (this rank's steps, shuffled) in ``count`` near-equal parts, possibly empty."""
        return np.array_split(order, count)

    def sum_values(self, values: np.ndarray) -> np.ndarray:
        """``values`` (float64) summed over the ranks: the same result on every rank."""
        return self.group.agree(np.asarray(values, dtype=np.float64).ravel())

    def advantage_moments(self, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Mean and (unbiased) standard deviation of the advantages of the whole minibatch, and its size."""
        local = torch.stack([adv.sum(), (adv * adv).sum(), torch.tensor(float(adv.numel()), device=adv.device)]) \
            if adv.numel() else torch.zeros(3, device=adv.device, dtype=adv.dtype)
        total = self.group.sum_(local.to(torch.float64))
        n = int(total[2].item())
        mean = total[0] / max(n, 1)
        var = (total[1] - n * mean * mean) / max(n - 1, 1)
        return mean.to(adv.dtype), var.clamp_min(0).sqrt().to(adv.dtype), n

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter], steps: int, finite: bool) -> tuple[int, bool]:
        """Replace each parameter's gradient by the minibatch's over all ranks (this rank's weighted by
        its ``steps``; None counts as zeros); returns the minibatch's steps over all ranks and whether
        every rank's loss was finite."""
        params = list(parameters)
        device = params[0].device
        flat = [p.grad.reshape(-1) * steps if p.grad is not None and steps and finite
                else torch.zeros(p.numel(), device=device, dtype=p.dtype) for p in params]
        tail = torch.tensor([float(steps if finite else 0), 0.0 if finite else 1.0], device=device, dtype=params[0].dtype)
        buffer = self.group.sum_(torch.cat([*flat, tail]))
        total, not_finite = int(round(buffer[-2].item())), buffer[-1].item() > 0
        offset = 0
        for p in params:
            grad = buffer[offset:offset + p.numel()].view_as(p) / max(total, 1)
            p.grad = grad.clone()
            offset += p.numel()
        return total, not not_finite
