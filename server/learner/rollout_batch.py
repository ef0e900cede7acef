"""Turns validated episode chunks into one flat training batch."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from tether.protocol.episodes import EpisodeChunk

from .packed_observations import ObservationPacking


class RolloutBatch(NamedTuple):
    """Flat per-step arrays of many chunks, plus what GAE needs to split them."""

    obs: np.ndarray  # (N, obs_dim)
    next_obs_index: np.ndarray  # (N,) index into all_obs of o_{t+1}
    all_obs: np.ndarray  # (N + chunks, obs_dim): every chunk's T+1 observations
    actions: np.ndarray
    rewards: np.ndarray
    logp: np.ndarray
    terminated: np.ndarray  # (N,) true only at the last step of a terminated chunk
    chunk_ends: np.ndarray  # (N,) true at every chunk's last step
    # What a centralized critic sees, aligned with all_obs: each row is the
    # module's value_obs followed by the agent's own observation.
    all_value_obs: np.ndarray | None = None
    #: Index in all_obs of each chunk's first observation.
    chunk_rows: np.ndarray | None = None
    #: A module with memory: each chunk's recorded state (chunks, state tensors, units), and the
    #: observations to advance it over before the chunk's first (None where there are none).
    state_in: np.ndarray | None = None
    state_prefix: list[np.ndarray | None] | None = None
    #: **[1.6]** (N,) true at logged steps (§13.7), or None when every step was sampled.
    logged: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])


def build_batch(chunks: Sequence[EpisodeChunk], packing: ObservationPacking | None = None) -> RolloutBatch:
    """Concatenate chunks; observation arrays are flattened to (…, obs_dim).

    Chunks with ``value_obs`` (a centralized critic) get ``all_value_obs`` rows
    of ``value_obs`` then the chunk's own observation. ``packing``: the module's, when its
    composite rows were pooled packed (packed_observations.py): they are unpacked here.
    """
    if packing is None:
        all_obs = np.concatenate([c.obs.reshape(c.obs.shape[0], -1) for c in chunks])
    elif all(c.obs.dtype == np.uint8 for c in chunks):
        all_obs = packing.unpack(np.concatenate([c.obs for c in chunks]))
    else:  # (a journal written before packing, replayed beside packed chunks)
        all_obs = np.concatenate([packing.unpack(c.obs) for c in chunks])
    if all_obs.dtype != np.uint8:  # (a uint8 Box's observations stay bytes: a quarter of the memory)
        all_obs = all_obs.astype(np.float32, copy=False)
    step_index, next_index = [], []
    offset = 0
    for c in chunks:
        t = c.env_steps
        idx = np.arange(offset, offset + t)
        step_index.append(idx)
        next_index.append(idx + 1)
        offset += t + 1
    steps = np.concatenate(step_index)
    all_value_obs = None
    if chunks[0].value_obs is not None:
        shared = np.concatenate([c.value_obs for c in chunks]).astype(np.float32, copy=False)  # type: ignore[misc]
        # The own observation tells agents that share value_obs apart (MAPPO's
        # agent-specific global state).
        all_value_obs = np.concatenate([shared, all_obs], axis=1)
    terminated = np.zeros(steps.shape[0], dtype=bool)
    chunk_ends = np.zeros(steps.shape[0], dtype=bool)
    pos = 0
    for c in chunks:
        pos += c.env_steps
        chunk_ends[pos - 1] = True
        terminated[pos - 1] = c.is_terminated
    recurrent = chunks[0].state_in is not None
    if recurrent and any(c.state_in is None for c in chunks):
        raise ValueError("a batch of a module with memory needs every chunk's state_in")
    return RolloutBatch(
        obs=all_obs[steps],
        next_obs_index=np.concatenate(next_index),
        all_obs=all_obs,
        actions=np.concatenate([c.actions for c in chunks]),
        rewards=np.concatenate([c.rewards for c in chunks]).astype(np.float32, copy=False),
        # NaN marks steps sent without action_logp (off-policy EPISODES): the
        # learner fills them with the current policy's logp before updating.
        logp=np.concatenate(
            [c.action_logp if c.action_logp is not None else np.full(c.env_steps, np.nan, np.float32) for c in chunks]
        ).astype(np.float32, copy=False),
        terminated=terminated,
        chunk_ends=chunk_ends,
        all_value_obs=all_value_obs,
        chunk_rows=np.cumsum([0] + [c.env_steps + 1 for c in chunks[:-1]]),
        state_in=np.stack([c.state_in for c in chunks]) if recurrent else None,  # type: ignore[misc]
        state_prefix=[None if c.state_prefix is None else
                      (packing.unpack(c.state_prefix) if packing is not None else c.state_prefix)
                      .reshape(c.state_prefix.shape[0], -1)
                      for c in chunks] if recurrent else None,
        logged=None if all(c.logged is None for c in chunks) else np.concatenate(
            [c.logged if c.logged is not None else np.zeros(c.env_steps, bool) for c in chunks]),
    )
