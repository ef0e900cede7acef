"""Episode records: their JSON form, and their validation into numpy arrays.

One record is a chunk of one episode (an episode may span several messages)::

    {"obs": [o_0, ..., o_T], "actions": [a_0, ..., a_{T-1}],
     "rewards": [r_0, ...], "action_logp": [...], "action_dist_inputs": [[...], ...],
     "is_terminated": false, "is_truncated": false, "episode_id": "optional"}

``obs`` has one item more than the per-step lists: o_T is the observation
after the last action (the next chunk of a continuing episode starts with it).
A chunk that is neither terminated nor truncated is continued by the next chunk
with the same ``episode_id`` (or, without ids, by the first chunk of the same
connection's next message, as RLlib's v1 client does).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from collections.abc import Iterable, Iterator
from itertools import chain, groupby, islice
from typing import Any

import numpy as np

from .action_mask import ActionMask
from .distributions import dist_inputs_size
from .errors import ErrorCode, MessageError
from .messages import is_text
from .spaces import Box, Discrete, LeafSpace, MultiDiscrete, Space, is_composite
from .tensors import ATTACHMENT, TENSOR_DTYPES, TensorError, decode_tensor, is_tensor


#: A record's number of this magnitude or more rounds to an infinite float32 (§10.5): 2^128 - 2^103,
#: halfway between float32's largest finite value and 2^128 (a tie rounds to even: 2^128).
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def beyond_float32(value: float) -> bool:
    """Whether ``value`` (a finite float) rounds to an infinite float32, as a server reads a record's numbers."""
    return abs(value) >= FLOAT32_OVERFLOW


@dataclass
class EpisodeChunk:
    """A validated episode chunk; arrays are owned copies."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    action_logp: np.ndarray | None
    action_dist_inputs: np.ndarray | None
    is_terminated: bool
    is_truncated: bool
    episode_id: str | None = None
    #: What a centralized critic sees (T+1 rows), when the module has one.
    value_obs: np.ndarray | None = None
    #: The weights version of each step (int64, T values) when the record carried
    #: ``weights_seq_no_runs`` (1.3); None: every step has the message's claim.
    step_versions: np.ndarray | None = None
    #: **[1.5]** A module with memory: its state before the first observation of the chunk as the
    #: record gave it, (state tensors, units) float32; None for a module without memory.
    state_in: np.ndarray | None = None
    #: The observations between that state and ``obs[0]`` when the chunk is a later part of a record
    #: the server cut (sample_pool.py): the learner advances ``state_in`` over them. None: no such part.
    state_prefix: np.ndarray | None = None
    #: **[1.6]** Per step, whether its action was logged (chosen outside the policy, §10.1): bool, T
    #: values; None: every step was sampled.
    logged: np.ndarray | None = None

    @property
    def env_steps(self) -> int:
        return int(self.rewards.shape[0])


def _fail(code: ErrorCode, index: int, text: str) -> MessageError:
    return MessageError(code, f"episodes[{index}]: {text}")


#: Items per ``struct`` call: bounds the argument tuple each call builds.
_PACK_CHUNK = 1 << 16

#: Lists of numbers with fewer items, and lists of rows with fewer numbers in
#: all, are converted and checked the plain way: for them the fixed cost of
#: packing and of the search for booleans (see ``_holds_only_numbers``) outweighs the gain.
_PACK_MIN_LIST = 256
_PACK_MIN_ROWS = 64


def _pack(items: Any, count: int) -> np.ndarray:
    """``count`` numbers from ``items`` as a float64 array. Raises ``struct.error``
    for an item that is no int, float or bool: struct, unlike numpy, never parses
    a string ("1e30") as a number, nor reads null as NaN."""
    out = np.empty(count, np.float64)
    items = iter(items)
    for start in range(0, count, _PACK_CHUNK):
        size = min(_PACK_CHUNK, count - start)
        struct.pack_into(f"{size}d", out.data, start * 8, *islice(items, size))
    return out


def _rows_as_array(value: list, dtype: type) -> tuple[np.ndarray, bool]:
    """``np.asarray(value, dtype)`` (the same result, the same errors), and whether
    every item is known to be an int, a float or a bool.

    The common cases, a list of numbers and a list of equal-length lists of numbers
    (obs rows, action_dist_inputs rows), take a faster way than numpy's list
    conversion, which dominates a server's ingest time: all but small ones are
    packed with ``struct`` (two to three times as fast for a flat list), which
    takes only ints, floats and bools; few rows are flattened with ``np.fromiter``.
    Anything else, or any doubt, takes ``np.asarray`` itself."""
    first = value[0] if value else None
    if type(first) in (float, int):
        if len(value) < _PACK_MIN_LIST:
            return np.asarray(value, dtype=dtype), False
        shape: tuple[int, ...] = (len(value),)
        items: Any = value
    elif type(first) is list and first and type(first[0]) in (float, int):
        width = len(first)
        shape = (len(value), width)
        items = chain.from_iterable(value)
        if len(value) * width < _PACK_MIN_ROWS:
            if set(map(type, value)) != {list} or set(map(len, value)) != {width}:
                return np.asarray(value, dtype=dtype), False
            try:
                flat: np.ndarray = np.fromiter(items, dtype, count=len(value) * width)
            except (TypeError, ValueError):  # a nested list or a non-number: asarray decides
                return np.asarray(value, dtype=dtype), False
            return flat.reshape(shape), False
        try:
            # Packing refuses what a dict or a string row would yield (keys, characters),
            # so only the lengths need checking; len() refuses a number as a row.
            if set(map(len, value)) != {width}:
                return np.asarray(value, dtype=dtype), False
        except TypeError:
            return np.asarray(value, dtype=dtype), False
    else:
        return np.asarray(value, dtype=dtype), False
    try:
        packed = _pack(items, len(value) * (shape[1] if len(shape) == 2 else 1))
    except (struct.error, OverflowError):  # a string, a null, a nested list, a huge integer: numpy decides
        return np.asarray(value, dtype=dtype), False
    return packed.reshape(shape).astype(dtype, copy=False), True


#: The types a JSON number or null parses to (null is read as NaN, §10.5). A bool
#: is an int to Python and numpy reads "1e30" as 1e30: neither is a number here.
_NUMBER_TYPES = frozenset({float, int, type(None)})


def _items(value: list, ndim: int) -> Any:
    """The scalars of a rectangular nested list ``ndim`` levels deep, in order."""
    items: Any = value
    for _ in range(ndim - 1):
        items = chain.from_iterable(items)
    return items


def _holds_only_numbers(value: list, array: np.ndarray, packed: bool) -> bool:
    """Whether ``value``, the nested list ``array`` was converted from, holds only
    numbers (and nulls). ``packed``: no item is a string or a null (see ``_rows_as_array``).

    Checking every item's type would cost a third of the conversion. A boolean
    converts to exactly 0 or 1, so only where the array holds 0 or 1 can one
    hide; a string (or a null) makes ``sum`` fail, which is cheaper, and packing
    has ruled both out already. Small lists, and lists where 0s and 1s abound
    (discrete actions, constant rewards), have every item's type checked."""
    if not packed and array.size < _PACK_MIN_LIST:
        return set(map(type, _items(value, array.ndim))) <= _NUMBER_TYPES
    flat = array.reshape(-1)
    maybe_bool = flat == 0
    maybe_bool |= flat == 1
    count = int(np.count_nonzero(maybe_bool))
    if count * 8 > flat.size:
        return set(map(type, _items(value, array.ndim))) <= _NUMBER_TYPES
    if not packed:
        try:
            sum(_items(value, array.ndim), 0.0)
        except (TypeError, OverflowError):  # a string, or a null (which is allowed): decide by type
            return set(map(type, _items(value, array.ndim))) <= _NUMBER_TYPES
    if count:
        for position in zip(*np.unravel_index(np.flatnonzero(maybe_bool), array.shape)):
            item: Any = value
            for i in position:
                item = item[i]
            if type(item) is bool:
                return False
    return True


class NotNumbersError(ValueError):
    """A list that should hold numbers holds a string or a boolean."""


def numbers_array(value: list, dtype: type) -> np.ndarray:
    """A nested list of JSON numbers as an array of ``dtype`` (null reads as NaN).

    Raises ``NotNumbersError`` when an item is a string or a boolean (numpy would
    read "1e30" and true as numbers), and otherwise what ``np.asarray`` raises:
    ``ValueError`` for ragged lists or non-numbers, ``TypeError`` for objects."""
    if value and type(value[0]) in (float, int) and len(value) < _PACK_MIN_LIST:
        # The most common case, a short list of numbers, directly: every item's type is checked.
        array: np.ndarray = np.asarray(value, dtype=dtype)
        if not set(map(type, value)) <= _NUMBER_TYPES:
            raise NotNumbersError("holds a string or a boolean")
        return array
    array, packed = _rows_as_array(value, dtype)
    if not _holds_only_numbers(value, array, packed):
        raise NotNumbersError("holds a string or a boolean")
    return array


def _numeric(value: Any, dtype: type, index: int, key: str) -> np.ndarray:
    if not isinstance(value, list):
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{key}" must be a list, got {type(value).__name__}')
    try:
        return numbers_array(value, dtype)
    except NotNumbersError:
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{key}" must hold only numbers, not strings or booleans') from None
    except ValueError as exc:
        if "inhomogeneous" in str(exc) or "sequence" in str(exc):
            code = ErrorCode.OBS_SHAPE_MISMATCH if key == "obs" or key.startswith("obs.") else ErrorCode.INVALID_FIELD
            raise _fail(code, index, f'"{key}" items do not all have the same shape') from None
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{key}" must hold only numbers') from None
    except TypeError:
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{key}" must hold only numbers') from None


def _observations(value: Any, space: Space, index: int) -> np.ndarray:
    """A record's ``obs``: nested lists of numbers (every version), or **[1.4]** one tensor object
    (§10.9) of the space's element type: uint8 for a uint8 Box, float32 for every other space.
    **[1.4]** For a Dict or Tuple space, an object of its leaves (§8.6), each checked as ``obs`` of
    its own space and joined into flat float32 rows."""
    if is_composite(space):
        return _composite_observations(value, space, index)
    return _leaf_observations(value, space, index, "obs")


def _leaf_observations(value: Any, space: Space, index: int, key: str) -> np.ndarray:
    if not is_tensor(value):
        return _numeric(value, np.float32, index, key)
    try:
        obs = decode_tensor(value)
    except TensorError as exc:
        raise _fail(ErrorCode.INVALID_TENSOR, index, f'"{key}": {exc}') from None
    wanted = "uint8" if isinstance(space, Box) and space.is_bytes else "float32"
    if obs.dtype != TENSOR_DTYPES[wanted]:
        raise _fail(ErrorCode.OBS_DTYPE_MISMATCH, index,
                    f'"{key}" is a {value["dtype"]} tensor; the observation space takes {wanted}')
    return obs


def _composite_observations(value: Any, space: Any, index: int) -> np.ndarray:
    """Checks 4, 10, 11 and 11b leaf by leaf (in leaf order), then the flat rows (§8.6, §10.6 check 4c)."""
    leaves = space.leaves
    if not isinstance(value, dict):
        raise _fail(ErrorCode.INVALID_FIELD, index, '"obs" of a Dict or Tuple space must be an object with one '
                    f'member per leaf ({", ".join(leaf.path for leaf in leaves)})')
    wanted = [leaf.path for leaf in leaves]
    missing = [path for path in wanted if path not in value]
    extra = sorted(set(value) - set(wanted) - {ATTACHMENT})  # (the server's own member, bind_attachment)
    if missing or extra:
        what = "; ".join(part for part in (missing and f"missing {', '.join(missing)}",
                                           extra and f"unknown {', '.join(map(repr, extra))}") if part)
        raise _fail(ErrorCode.OBS_LEAF_MISMATCH, index, f'"obs" does not hold the space\'s leaves: {what}')
    rows = None
    flat = None
    for leaf in leaves:
        key = f"obs.{leaf.path}"
        obs = _leaf_observations(value[leaf.path], leaf.space, index, key)
        if rows is None:
            rows = obs.shape[0] if obs.ndim else 0
        if obs.ndim == 0 or obs.shape[0] != rows:
            raise _fail(ErrorCode.EPISODE_LENGTH_MISMATCH, index,
                        f'"{key}" has {obs.shape[0] if obs.ndim else 0} observations, "obs.{leaves[0].path}" {rows}')
        if obs.shape[1:] != leaf.space.shape:
            raise _fail(ErrorCode.OBS_SHAPE_MISMATCH, index, f'"{key}": observation shape {list(obs.shape[1:])} does '
                        f"not match the leaf's space {list(leaf.space.shape)}")
        _check_finite(obs, index, key)
        if leaf.is_bytes and obs.dtype != np.uint8:
            obs = _as_bytes(obs, index, key)
        if flat is None:  # (one array for the flat rows, each leaf converted straight into its columns)
            flat = np.empty((rows, space.flat_dim), np.float32)
        flat[:, leaf.offset:leaf.offset + leaf.size] = obs.reshape(rows, leaf.size)
    return flat if flat is not None else np.zeros((0, space.flat_dim), np.float32)


def _as_bytes(obs: np.ndarray, index: int, key: str = "obs") -> np.ndarray:
    """Observations of a uint8 Box written as JSON numbers: integers 0-255 only."""
    if obs.size and (obs.min() < 0 or obs.max() > 255 or not np.array_equal(obs, np.round(obs))):
        bad = int(np.argwhere(((obs < 0) | (obs > 255) | (obs != np.round(obs))).reshape(obs.shape[0], -1))[0][0])
        raise _fail(ErrorCode.OBS_DTYPE_MISMATCH, index,
                    f'"{key}"[{bad}] holds a value that is not an integer in [0, 255] (the space is a uint8 Box)')
    return obs.astype(np.uint8)


def _check_finite(arr: np.ndarray, index: int, key: str) -> None:
    # A finite sum proves every value finite (NaN and infinities carry into it), in one
    # reduction; summed as float64, float32 values cannot overflow it.
    if arr.dtype == np.float32 and math.isfinite(np.add.reduce(arr, axis=None, dtype=np.float64)):
        return
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = int(np.argwhere(~np.isfinite(arr.reshape(arr.shape[0], -1) if arr.ndim else arr.reshape(1)))[0][0])
        raise _fail(ErrorCode.NON_FINITE_VALUE, index, f'"{key}"[{bad}] is NaN or infinite')


def _flag(record: dict[str, Any], key: str, index: int) -> bool:
    value = record.get(key)
    if not isinstance(value, bool):
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{key}" must be true or false, got {value!r}')
    return value


#: **[1.5]** The most steps one chunk of a module with memory may hold (§10.6 check 19): the learner
#: runs its state along every chunk, one step after another.
MAX_RECURRENT_CHUNK_STEPS = 10_000


@dataclass(frozen=True)
class StateSpec:
    """**[1.5]** One tensor of a module's recurrent state (§12.1): the model's input and output names
    and its units."""

    input: str
    output: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "output": self.output, "size": self.size}


def _state_in(value: Any, state: tuple[StateSpec, ...], index: int, steps: int) -> np.ndarray | None:
    """Check 19 (§10.6): a record's ``state_in`` against the module's recurrent state."""
    if not state:
        if value is not None:
            raise _fail(ErrorCode.INVALID_STATE, index, '"state_in" is only for a module with a recurrent state')
        return None
    names = [spec.input for spec in state]
    if value is None:
        raise _fail(ErrorCode.MISSING_STATE, index, f'the module keeps a recurrent state: the record needs "state_in" '
                    f'with {", ".join(names)} (protocol 1.5)')
    if steps > MAX_RECURRENT_CHUNK_STEPS:
        raise _fail(ErrorCode.SEQUENCE_TOO_LONG, index, f"a chunk of a module with a recurrent state holds at most "
                    f"{MAX_RECURRENT_CHUNK_STEPS} steps, this one {steps}")
    if not isinstance(value, dict) or sorted(value) != sorted(names):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise _fail(ErrorCode.INVALID_STATE, index, f'"state_in" must be an object with exactly {", ".join(names)}; '
                    f"got {got}")
    out = np.empty((len(state), state[0].size), np.float32)
    for i, spec in enumerate(state):
        key = f"state_in.{spec.input}"
        try:
            array = _numeric(value[spec.input], np.float32, index, key)
        except MessageError as exc:  # (a tensor object, strings, booleans, ragged lists: not a state)
            raise MessageError(ErrorCode.INVALID_STATE, exc.message) from None
        if array.shape != (spec.size,):
            raise _fail(ErrorCode.INVALID_STATE, index, f'"{key}" has shape {list(array.shape)}, the state '
                        f"{[spec.size]}")
        _check_finite(array.reshape(1, -1), index, key)
        out[i] = array
    return out


def decode_episode(
    record: Any,
    index: int,
    observation_space: Space,
    action_space: LeafSpace,
    require_logp: bool,
    action_mask: ActionMask | None = None,
    state: tuple[StateSpec, ...] = (),
) -> EpisodeChunk:
    """Validate one episode record against the spaces (and **[1.4]** the module's action mask,
    §11.6, and **[1.5]** its recurrent ``state``, §10.6 check 19); raise ``MessageError`` if bad."""
    if not isinstance(record, dict):
        raise _fail(ErrorCode.INVALID_FIELD, index, "an episode must be a JSON object")
    for key in ("obs", "actions", "rewards"):
        if key not in record:
            raise _fail(ErrorCode.INVALID_FIELD, index, f'missing "{key}"')
    terminated = _flag(record, "is_terminated", index)
    truncated = _flag(record, "is_truncated", index)

    obs = _observations(record["obs"], observation_space, index)
    actions_dtype = np.float32 if isinstance(action_space, Box) else np.float64
    actions = _numeric(record["actions"], actions_dtype, index, "actions")
    rewards = _numeric(record["rewards"], np.float32, index, "rewards")
    steps = rewards.shape[0]
    if steps < 1:
        raise _fail(ErrorCode.EPISODE_LENGTH_MISMATCH, index, "an episode chunk needs at least one step")
    if obs.shape[0] != steps + 1 or actions.shape[0] != steps:
        raise _fail(
            ErrorCode.EPISODE_LENGTH_MISMATCH,
            index,
            f"needs len(obs) == len(actions) + 1 == len(rewards) + 1, got obs={obs.shape[0]}, "
            f"actions={actions.shape[0]}, rewards={steps}",
        )
    if rewards.ndim != 1:
        raise _fail(ErrorCode.INVALID_FIELD, index, '"rewards" must be a flat list of numbers')
    if obs.shape[1:] != observation_space.shape:
        raise _fail(
            ErrorCode.OBS_SHAPE_MISMATCH,
            index,
            f"observation shape {list(obs.shape[1:])} does not match the space's {list(observation_space.shape)}",
        )
    _check_finite(obs, index, "obs")
    _check_finite(rewards, index, "rewards")
    if isinstance(observation_space, Box) and observation_space.is_bytes and obs.dtype != np.uint8:
        obs = _as_bytes(obs, index)  # (check 11b: JSON numbers in a uint8 Box)

    if actions.shape[1:] != action_space.shape:
        raise _fail(
            ErrorCode.ACTION_OUT_OF_SPACE,
            index,
            f"action shape {list(actions.shape[1:])} does not match the space's {list(action_space.shape)}",
        )
    _check_finite(actions, index, "actions")
    # A Box action is the raw Gaussian sample (protocol 1.3, §11.4): any finite
    # value is valid, the engine executed it clipped. Discrete values must be in the space.
    inside = np.ones(actions.shape[0], bool) if isinstance(action_space, Box) else action_space.contains_batch(actions)
    if not inside.all():
        bad = int(np.argmin(inside))
        raise _fail(
            ErrorCode.ACTION_OUT_OF_SPACE,
            index,
            f"actions[{bad}] = {actions[bad].tolist()} is outside the action space {action_space.to_json()}",
        )
    if isinstance(action_space, (Discrete, MultiDiscrete)):
        actions = actions.astype(np.int64)
    if action_mask is not None:
        action_mask.check(obs, actions, index)  # (checks 14b-14d)

    logp = None
    if "action_logp" in record:
        logp = _numeric(record["action_logp"], np.float32, index, "action_logp")
        if logp.shape != (steps,):
            raise _fail(
                ErrorCode.EPISODE_LENGTH_MISMATCH, index, f"action_logp has {logp.shape[0]} items, expected {steps}"
            )
        _check_finite(logp, index, "action_logp")
    elif require_logp:
        raise _fail(ErrorCode.MISSING_ACTION_LOGP, index, "on-policy training needs \"action_logp\" for every step")

    dist_inputs = None
    if "action_dist_inputs" in record:
        dist_inputs = _numeric(record["action_dist_inputs"], np.float32, index, "action_dist_inputs")
        expected = (steps, dist_inputs_size(action_space))
        if dist_inputs.shape != expected:
            raise _fail(
                ErrorCode.EPISODE_LENGTH_MISMATCH,
                index,
                f"action_dist_inputs has shape {list(dist_inputs.shape)}, expected {list(expected)}",
            )
        _check_finite(dist_inputs, index, "action_dist_inputs")

    episode_id = record.get("episode_id")
    if episode_id is not None and not isinstance(episode_id, (str, int)):
        raise _fail(ErrorCode.INVALID_FIELD, index, '"episode_id" must be a string')
    if isinstance(episode_id, str) and not is_text(episode_id):
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"episode_id" {episode_id!r} is not Unicode text (a lone surrogate)')
    runs = record.get("weights_seq_no_runs")
    step_versions = None if runs is None else _step_versions(runs, steps, index)
    state_in = _state_in(record.get("state_in"), state, index, steps)
    logged = _logged_steps(record.get("logged_runs"), steps, index)
    return EpisodeChunk(
        obs=obs,
        actions=actions,
        rewards=rewards,
        action_logp=logp,
        action_dist_inputs=dist_inputs,
        is_terminated=terminated,
        is_truncated=truncated,
        episode_id=None if episode_id is None else str(episode_id),
        step_versions=step_versions,
        state_in=state_in,
        logged=logged,
    )


#: The largest weights version a run may name (§10.1): every SDK holds it in 32 bits.
MAX_RUN_VERSION = 2**31 - 1


def _run_pairs(runs: Any, index: int, field: str, first: str) -> list[list[int]]:
    """``runs`` of a ``[first, steps]`` run field, INVALID_FIELD unless a list of pairs of integers, not
    a bool, not 4.0, not "4" (§10.6 checks 18a, 20a)."""
    if not isinstance(runs, list) or not all(
            isinstance(r, list) and len(r) == 2 and type(r[0]) is int and type(r[1]) is int for r in runs):
        raise _fail(ErrorCode.INVALID_FIELD, index, f'"{field}" must be a list of [{first}, steps] integer pairs')
    return runs


def _bad_run(index: int, field: str, first: int, count: int, rule: str) -> MessageError:
    return _fail(ErrorCode.INVALID_FIELD, index, f'"{field}" has [{first}, {count}]: {rule}')


def _step_versions(runs: Any, steps: int, index: int) -> np.ndarray:
    """``weights_seq_no_runs`` ([version, count] pairs covering the chunk) as one version per step (§10.6 check 18)."""
    runs = _run_pairs(runs, index, "weights_seq_no_runs", "version")
    for version, count in runs:
        if not 0 <= version <= MAX_RUN_VERSION or count < 1:
            raise _bad_run(index, "weights_seq_no_runs", version, count,
                           f"a version is 0..{MAX_RUN_VERSION}, a run has at least 1 step")
    total = sum(count for _, count in runs)
    if total != steps:
        raise _fail(ErrorCode.EPISODE_LENGTH_MISMATCH, index,
                    f'"weights_seq_no_runs" covers {total} steps, the chunk has {steps}')
    return np.repeat(np.array([v for v, _ in runs], np.int64), [c for _, c in runs])


def _logged_steps(runs: Any, steps: int, index: int) -> np.ndarray | None:
    """**[1.6]** ``logged_runs`` ([start, count] pairs in step order) as a per-step mask (§10.6 check 20);
    None when no step is logged."""
    if runs is None:
        return None
    runs = _run_pairs(runs, index, "logged_runs", "start")
    end = 0
    for start, count in runs:
        if start < end or count < 1:
            raise _bad_run(index, "logged_runs", start, count,
                           "runs are in step order, apart, and have at least 1 step")
        end = start + count
    if end > steps:
        raise _fail(ErrorCode.EPISODE_LENGTH_MISMATCH, index,
                    f'"logged_runs" reaches step {end - 1}, the chunk has {steps} steps')
    if not runs:
        return None
    mask = np.zeros(steps, bool)
    for start, count in runs:
        mask[start:start + count] = True
    return mask


def _step_runs(values: Iterable[Any]) -> Iterator[tuple[int, Any, int]]:
    """(start, value, count) of each run of equal consecutive ``values``, in step order."""
    start = 0
    for value, run in groupby(values):
        count = sum(1 for _ in run)
        yield start, value, count
        start += count


def logged_runs(logged: Iterable[bool]) -> list[list[int]] | None:
    """**[1.6]** ``logged_runs`` for steps with these flags (True: logged), adjacent steps as one run;
    None when no step is logged (the field is then left out, §10.1)."""
    return [[start, count] for start, flag, count in _step_runs(map(bool, logged)) if flag] or None


def version_runs(versions: list[Any]) -> list[list[int]] | None:
    """``weights_seq_no_runs`` for steps acted with ``versions`` (one per step), or None
    when it is not sent: one version only, or a step whose version is unknown (§10.1)."""
    if not versions or any(type(v) is not int for v in versions) or min(versions) == max(versions):
        return None
    return [[version, count] for _, version, count in _step_runs(versions)]


def decode_episodes(
    message: dict[str, Any],
    observation_space: Space,
    action_space: LeafSpace,
    require_logp: bool,
) -> list[EpisodeChunk]:
    """Validate every record of an EPISODES(_AND_GET_STATE) message.

    All-or-nothing: the first bad record raises, and nothing of the message is kept.
    """
    records = message.get("episodes")
    if not isinstance(records, list):
        raise MessageError(ErrorCode.INVALID_FIELD, '"episodes" must be a list of episode records')
    return [decode_episode(r, i, observation_space, action_space, require_logp) for i, r in enumerate(records)]


def encode_episode(
    obs: list[Any],
    actions: list[Any],
    rewards: list[float],
    action_logp: list[float] | None,
    action_dist_inputs: list[Any] | None,
    is_terminated: bool,
    is_truncated: bool,
    episode_id: str | None = None,
) -> dict[str, Any]:
    """Build one episode record (the inverse of ``decode_episode``)."""
    record: dict[str, Any] = {"obs": obs, "actions": actions, "rewards": rewards}
    if action_logp is not None:
        record["action_logp"] = action_logp
    if action_dist_inputs is not None:
        record["action_dist_inputs"] = action_dist_inputs
    record["is_terminated"] = is_terminated
    record["is_truncated"] = is_truncated
    if episode_id is not None:
        record["episode_id"] = episode_id
    return record
