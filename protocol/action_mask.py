"""Action masks (**[1.4]**, §11.6 of docs/protocol.md): a leaf of a Dict observation that says, per
step, which discrete actions the game allows.

The mask holds one value per logit of the action distribution (``n`` for a Discrete action,
``sum(nvec)`` for a MultiDiscrete one), 1 for allowed and 0 for forbidden. The model applies it
inside its graph: every forbidden logit becomes ``MASKED_LOGIT``, so a client samples from the
model's output as always and gets only allowed actions, with their masked log-probability. The
server refuses a step whose mask is not 0/1 (INVALID_ACTION_MASK), allows nothing where an action
was taken (ACTION_MASK_EMPTY), or forbids the action taken (ACTION_MASKED).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ErrorCode, MessageError
from .spaces import Box, Discrete, Leaf, MultiDiscrete, Space, is_composite

#: The logit a forbidden action gets: exp(MASKED_LOGIT - m) is exactly 0 in float64 next to any
#: realistic allowed logit, and, unlike -inf, it keeps softmax and entropy finite.
MASKED_LOGIT = -1e9

#: The leaf that masks by convention (PettingZoo's classic games call it so).
DEFAULT_MASK_LEAF = "action_mask"


@dataclass(frozen=True)
class ActionMask:
    """Where a module's mask sits in its flat observation row, and the action's categoricals."""

    leaf: Leaf
    #: Per categorical (one for Discrete, one per entry of MultiDiscrete): (first logit, count).
    segments: tuple[tuple[int, int], ...]
    #: Added to a Discrete action to get its logit index (``-start``); 0 for MultiDiscrete.
    shift: int

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The masks of flat observation rows (N, obs_dim) -> (N, K)."""
        return rows[:, self.leaf.offset:self.leaf.offset + self.leaf.size]

    def allowed_indices(self, actions: np.ndarray) -> np.ndarray:
        """Logit index of each categorical's choice, (N, len(segments))."""
        actions = np.asarray(actions, dtype=np.int64).reshape(len(actions), -1)
        starts = np.array([first for first, _ in self.segments], dtype=np.int64)
        return actions + self.shift + starts

    def check(self, obs: np.ndarray, actions: np.ndarray, index: int) -> None:
        """Refuse (MessageError naming the step) a record whose masks or actions break §11.6.
        ``obs`` are the record's T+1 flat rows, ``actions`` its T actions (already in the space)."""
        masks = self.of_rows(obs)
        where = f"episodes[{index}]: "
        key = f'"obs.{self.leaf.path}"'
        bad = ~((masks == 0) | (masks == 1))
        if bad.any():
            step = int(np.argwhere(bad)[0][0])
            raise MessageError(ErrorCode.INVALID_ACTION_MASK,
                               f"{where}{key}[{step}] holds a value other than 0 and 1 (an action mask)")
        steps = len(actions)
        for number, (first, count) in enumerate(self.segments):
            empty = ~masks[:steps, first:first + count].any(axis=1)
            if empty.any():
                step = int(np.argmax(empty))
                entry = f" for entry {number}" if len(self.segments) > 1 else ""
                raise MessageError(ErrorCode.ACTION_MASK_EMPTY,
                                   f"{where}{key}[{step}] allows no action{entry}, but the step took one")
        chosen = np.take_along_axis(masks[:steps], self.allowed_indices(actions), axis=1)
        forbidden = ~(chosen == 1).all(axis=1)
        if forbidden.any():
            step = int(np.argmax(forbidden))
            raise MessageError(ErrorCode.ACTION_MASKED,
                               f"{where}actions[{step}] = {actions[step].tolist()} is forbidden by its mask {key}[{step}]")

    def why_not_actable(self, mask: np.ndarray) -> tuple[ErrorCode, str] | None:
        """Why one step's mask (K values) cannot be acted on, as (code, message), or None: what a
        client checks before sampling, so that it raises instead of sending an action the server
        would refuse (INVALID_ACTION_MASK, ACTION_MASK_EMPTY)."""
        mask = np.asarray(mask).reshape(-1)
        if not ((mask == 0) | (mask == 1)).all():
            return ErrorCode.INVALID_ACTION_MASK, f"the action mask '{self.leaf.path}' holds a value other than 0 and 1"
        for number, (first, count) in enumerate(self.segments):
            if not mask[first:first + count].any():
                entry = f" for entry {number}" if len(self.segments) > 1 else ""
                return ErrorCode.ACTION_MASK_EMPTY, f"the action mask '{self.leaf.path}' allows no action{entry}"
        return None


def resolve_action_mask(observation_space: Space, action_space: Space, name: str | None) -> ActionMask | None:
    """The module's mask: the leaf ``name`` (``""`` for none), or by default the top-level
    ``action_mask`` leaf of a Dict observation when there is one. Raises ValueError when the named
    leaf is missing, the action space cannot be masked, or the leaf's size does not fit it."""
    if name == "":
        return None
    leaf = observation_space.leaf(name or DEFAULT_MASK_LEAF) if is_composite(observation_space) else None
    if leaf is None:
        if name is None:
            return None
        raise ValueError(f"action_mask names the leaf {name!r}, but the observation space has no such leaf"
                         + ("" if is_composite(observation_space) else " (it is not a Dict or Tuple)"))
    segments: tuple[tuple[int, int], ...]
    if isinstance(action_space, Discrete):
        segments, shift = ((0, action_space.n),), -action_space.start
    elif isinstance(action_space, MultiDiscrete):
        firsts = np.concatenate([[0], np.cumsum(action_space.nvec)[:-1]])
        segments, shift = tuple((int(f), int(n)) for f, n in zip(firsts, action_space.nvec)), 0
    else:
        raise ValueError(f"the action mask {leaf.path!r} needs a Discrete or MultiDiscrete action space")
    logits = sum(count for _, count in segments)
    if not isinstance(leaf.space, Box) or leaf.size != logits:
        raise ValueError(f"the action mask {leaf.path!r} must be a Box of {logits} values (one per logit of "
                         f"the action distribution), got {leaf.space.to_json()}")
    return ActionMask(leaf, segments, shift)
