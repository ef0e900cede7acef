"""**[1.6]** An action the policy did not choose (log_action, §10.1), checked as the server checks it."""

from __future__ import annotations

from typing import Any

import numpy as np

from .action_mask import ActionMask
from .errors import ErrorCode, InvalidInputError
from .spaces import Box, Discrete, LeafSpace


def checked_logged_action(space: LeafSpace, action: Any, mask: ActionMask | None = None,
                          obs_row: np.ndarray | None = None, what: str = "the logged action") -> Any:
    """``action`` as a record carries it (an int for Discrete, an int64 array for MultiDiscrete, a float32
    array for Box), refused here, by name, as the server would refuse the batch for it (§10.6 checks
    12-14 and 14d): a wrong shape or a value outside the space (ACTION_OUT_OF_SPACE), a NaN or infinite
    value (NON_FINITE_VALUE), an action its observation's mask forbids (ACTION_MASKED). A Box action may
    lie outside its bounds: a record carries actions as taken (§11.4)."""
    try:
        values = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidInputError(ErrorCode.ACTION_OUT_OF_SPACE, f"{what} {action!r} is not numbers") from None
    if values.shape != space.shape and not (values.size == 1 and space.shape == ()):
        raise InvalidInputError(ErrorCode.ACTION_OUT_OF_SPACE, f"{what} has shape {list(values.shape)}, the action "
                                f"space {space.to_json()} needs {list(space.shape)}")
    values = values.reshape(space.shape)
    with np.errstate(over="ignore"):  # (the server reads a Box action as float32: 1e39 would be an infinity)
        finite = np.isfinite(values.astype(np.float32) if isinstance(space, Box) else values).all()
    if not finite:
        raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"{what} {values.tolist()} is not finite"
                                + (" (as float32)" if isinstance(space, Box) else ""))
    if isinstance(space, Box):
        return values.astype(np.float32)
    if not bool(space.contains_batch(values[None])[0]):
        raise InvalidInputError(ErrorCode.ACTION_OUT_OF_SPACE, f"{what} {values.tolist()} is outside the action "
                                f"space {space.to_json()}")
    if mask is not None and obs_row is not None:
        allowed = mask.of_rows(np.asarray(obs_row, np.float32).reshape(1, -1))[0]
        chosen = mask.allowed_indices(values.reshape(1, -1))[0]
        if not (allowed[chosen] == 1).all():
            raise InvalidInputError(ErrorCode.ACTION_MASKED, f"{what} {values.tolist()} is not allowed by the "
                                    f"observation's action mask '{mask.leaf.path}'")
    return int(values) if isinstance(space, Discrete) else values.astype(np.int64)
