"""The ranks of one training run, on PyTorch distributed (torchrun's environment, c10d rendezvous).

``tether serve`` started by torchrun (``torchrun --nnodes N --nproc-per-node G -m tether.server.cli
serve ...``) finds ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in
its environment and joins the group; without them (or with ``WORLD_SIZE=1``) it runs alone.

Two process groups: the *control* group (always gloo, CPU tensors) carries the small agreements the
ranks make between updates (how many steps each holds, whether to stop); the *data* group carries
gradients, NCCL when the learner is on CUDA, else the same gloo group. Every collective is called
from one thread (the learner thread), in an order every rank follows, so that no rank waits for a
collective another rank never calls. A peer that dies makes the next collective fail (gloo: the
connection closes) or time out after ``timeout_s``: ``RankGroupError``, and the run stops.
"""

from __future__ import annotations

import datetime
import os
import pickle
import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch
import torch.distributed as dist

#: torchrun's variables a rank needs (c10d's env:// rendezvous reads the last two).
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankGroupError(RuntimeError):
    """A collective failed: a rank died, hung past the timeout, or the rendezvous did not complete."""


@dataclass(frozen=True)
class RankPlace:
    """Where this process sits in the group (torchrun's environment)."""

    rank: int
    world_size: int
    local_rank: int
    #: torchrun's restarts of the group so far (TORCHELASTIC_RESTART_COUNT; 0 the first time).
    attempt: int = 0

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> "RankPlace | None":
        """The place torchrun gave this process; None when it runs alone (no WORLD_SIZE, or 1)."""
        env = os.environ if environ is None else environ
        if int(env.get("WORLD_SIZE", "1") or "1") <= 1:
            return None
        missing = [name for name in TORCHRUN_VARIABLES if not env.get(name)]
        if missing:
            raise ValueError(f"WORLD_SIZE is {env['WORLD_SIZE']} but {', '.join(missing)} is not set: start the "
                             "ranks with torchrun (docs/scale-out.md)")
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]),
                   int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"))


class RankGroup:
    """One rank's handle on the group: agreements, gradient sums and broadcasts."""

    def __init__(self, place: RankPlace, device: torch.device, timeout_s: float,
                 start_timeout_s: float | None = None) -> None:
        self.place = place
        self.rank, self.world_size = place.rank, place.world_size
        self.device = device
        self.timeout_s = timeout_s
        #: How long a rank waits for the others at start-up (the rendezvous, ``meet``): a rank may load a
        #: large checkpoint or replay a long journal meanwhile.
        self.start_timeout_s = max(timeout_s, start_timeout_s or timeout_s)
        #: Seconds this rank spent in collectives so far (waiting for the others included).
        self.busy_s = 0.0
        timeout = datetime.timedelta(seconds=timeout_s)
        start_timeout = datetime.timedelta(seconds=self.start_timeout_s)
        nccl = device.type == "cuda"
        try:
            # torchrun's store outlives a restart of the group: the keys of each attempt go under their own
            # prefix, or a restarted rank would read a dead rank's address from the attempt before.
            store, _, _ = next(dist.rendezvous("env://", place.rank, place.world_size, timeout=start_timeout))
            store = dist.PrefixStore(f"tether/attempt-{place.attempt}", store)
            dist.init_process_group("nccl" if nccl else "gloo", store=store, timeout=timeout,
                                    rank=place.rank, world_size=place.world_size,
                                    **({"device_id": device} if nccl else {}))
            self._control = dist.new_group(backend="gloo", timeout=timeout) if nccl else dist.group.WORLD
            # (a gloo group of its own for start-up waits: every rank of a barrier waits by its group's
            # timeout, rank 0 by the barrier's, so the start-up one must be the group's)
            self._start = dist.new_group(backend="gloo", timeout=start_timeout)
        except Exception as exc:  # (RuntimeError, DistStoreError: a rendezvous that never completes)
            raise RankGroupError(f"rank {place.rank} could not join the group of {place.world_size}: {exc}") from exc

    @property
    def is_first(self) -> bool:
        """Rank 0: the one whose exports and weights every rank takes."""
        return self.rank == 0

    def meet(self, what: str) -> None:
        """Wait up to ``start_timeout_s`` for every rank to get here (a start-up step a rank may take long
        over, such as replaying its journal, which the collectives' own timeout is too short for)."""
        started = time.perf_counter()
        try:
            dist.monitored_barrier(group=self._start, timeout=datetime.timedelta(seconds=self.start_timeout_s),
                                   wait_all_ranks=True)
        except Exception as exc:
            raise RankGroupError(f"rank {self.rank}: the other ranks were not ready for {what} within "
                                 f"{self.start_timeout_s:g} s (--group-start-timeout-s): {str(exc)[:300]}") from exc
        finally:
            self.busy_s += time.perf_counter() - started

    def agree(self, values: Iterable[float], how: str = "sum") -> np.ndarray:
        """Sum (or maximum) of ``values`` over the ranks, in float64 on the control group."""
        tensor = torch.tensor(list(values), dtype=torch.float64)
        op = dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM
        self._call(dist.all_reduce, tensor, op=op, group=self._control)
        return tensor.numpy()

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks in place, on the data group (on the learner's device)."""
        self._call(dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_parameters(self, tensors: Iterable[torch.Tensor]) -> None:
        """Give every rank rank 0's ``tensors`` (weights, buffers), in place."""
        for tensor in tensors:
            self._call(dist.broadcast, tensor.data, src=0)

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (picklable; an ONNX export's bytes)."""
        if self.is_first:
            payload = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self._call(dist.broadcast, size, src=0, group=self._control)
        if not self.is_first:
            payload = torch.empty(int(size.item()), dtype=torch.uint8)
        self._call(dist.broadcast, payload, src=0, group=self._control)
        return value if self.is_first else pickle.loads(payload.numpy().tobytes())

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        gathered: list[Any] = [None] * self.world_size
        self._call(dist.all_gather_object, gathered, value, group=self._control)
        return gathered

    def close(self) -> None:
        """Leave the group (no collective afterwards)."""
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # (a group whose peers are gone: nothing left to release cleanly)
                pass

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            raise RankGroupError(f"rank {self.rank}: a collective with the other ranks failed (a rank stopped or "
                                 f"did not answer within {self.timeout_s:g} s): {str(exc)[:300]}") from exc
        finally:
            self.busy_s += time.perf_counter() - started
