"""How ``action_dist_inputs`` define an action distribution, per action space.

This is part of the protocol: a client samples an action and reports its
``action_logp``; the server recomputes log-probabilities from the same inputs
with the same formulas. Conformance vectors pin these numbers.

- Discrete(n): inputs are n logits of a categorical distribution.
- MultiDiscrete(nvec): inputs are the logits of each entry, concatenated
  (sum(nvec) numbers); the entries are independent.
- Box(shape): inputs are the mean then the log standard deviation of a
  diagonal Gaussian (2 * prod(shape) numbers). The record carries the raw
  (unclipped) sample and its Gaussian log-density; only the engine gets the
  sample clipped into the box (``to_env_action``). Recording the clipped value
  with the density of the clipped value biases the policy gradient (protocol
  1.3, §11.4).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from .spaces import Box, Discrete, LeafSpace as Space, MultiDiscrete

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def dist_inputs_size(space: Space) -> int:
    """Number of action_dist_inputs a model must output for this action space."""
    if isinstance(space, Discrete):
        return space.n
    if isinstance(space, MultiDiscrete):
        return int(sum(space.nvec))
    return 2 * space.flat_dim


def _categorical_sample(logits: list[float], rng: random.Random) -> tuple[int, float]:
    top = max(logits)
    exps = []
    total = 0.0
    for v in logits:  # (summed in order, as every SDK does: Python 3.12's sum() compensates)
        e = math.exp(v - top)
        exps.append(e)
        total += e
    threshold = rng.random() * total
    acc = 0.0
    for i, e in enumerate(exps):
        acc += e
        if threshold < acc:
            choice = i
            break
    else:
        # Rounding left the threshold past the sum: the last action that has any probability
        # (never a masked one, whose probability is exactly 0: §11.4, §11.6).
        choice = max(i for i, e in enumerate(exps) if e > 0)
    return choice, logits[choice] - top - math.log(total)


def log_prob(space: Space, dist_inputs: Any, action: Any) -> float:
    """Log-probability (or density) of ``action`` given one step's dist inputs."""
    return float(log_probs(space, np.asarray(dist_inputs, dtype=np.float64).reshape(1, -1), [action])[0])


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def log_probs(space: Space, dist_inputs: np.ndarray, actions: Any) -> np.ndarray:
    """§11's log-probabilities (densities for a Box) of ``actions`` (one per row) given rows of
    dist inputs ``[N, K]``, in float64: the one numpy implementation of the formulas, used by
    clients and by the server's behaviour-logp check (the learner's torch one is checked against
    the same vectors)."""
    inputs = np.asarray(dist_inputs, dtype=np.float64).reshape(len(dist_inputs), -1)
    rows = np.arange(inputs.shape[0])
    if isinstance(space, Box):
        k = space.flat_dim
        mean, log_std = inputs[:, :k], inputs[:, k:]
        z = (np.asarray(actions, np.float64).reshape(len(rows), -1) - mean) / np.exp(log_std)
        return (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(-1)
    acts = np.asarray(actions, np.int64).reshape(len(rows), -1)
    if isinstance(space, Discrete):
        return _log_softmax(inputs)[rows, acts[:, 0] - space.start]
    total = np.zeros(len(rows))
    offset = 0
    for i, n in enumerate(space.nvec):
        total += _log_softmax(inputs[:, offset : offset + n])[rows, acts[:, i]]
        offset += n
    return total


def sample(space: Space, dist_inputs: np.ndarray, rng: random.Random) -> tuple[Any, float]:
    """Draw an action from one step's dist inputs; returns (action, logp).

    This is the action a record carries. Discrete actions come back as ``int``,
    MultiDiscrete and Box as numpy arrays; a Box action is the raw Gaussian
    sample, which may lie outside the box: pass it through ``to_env_action``
    before the engine executes it.
    """
    if isinstance(space, Discrete):
        index, logp = _categorical_sample(dist_inputs.tolist(), rng)
        return index + space.start, logp
    if isinstance(space, MultiDiscrete):
        inputs = dist_inputs.tolist()
        actions, total, offset = [], 0.0, 0
        for n in space.nvec:
            a, lp = _categorical_sample(inputs[offset : offset + n], rng)
            actions.append(a)
            total += lp
            offset += n
        return np.asarray(actions, dtype=np.int64), total
    k = space.flat_dim
    flat = np.asarray(dist_inputs, dtype=np.float64).ravel()
    mean, log_std = flat[:k], flat[k:]
    noise = np.array([rng.gauss(0.0, 1.0) for _ in range(k)])
    # The density is taken at the float32 value that is recorded and sent.
    action = (mean + np.exp(log_std) * noise).astype(np.float32)
    z = (action.astype(np.float64) - mean) / np.exp(log_std)
    logp = float(np.sum(-0.5 * z * z - log_std - _LOG_SQRT_2PI))
    return action.reshape(space.shape), logp


def sample_for_record(space: Space, dist_inputs: np.ndarray, rng: random.Random,
                      raw_box_samples: bool = True) -> tuple[Any, float, Any]:
    """Draw an action: (the action a record carries, its logp, the action the engine executes).

    ``raw_box_samples`` is what protocol 1.3 requires; a peer older than 1.3
    refuses a Box action outside the box, so for it the record carries the
    clipped action with the density at the clipped value (the 1.2 rule, §11.4).
    """
    if space.__class__ is Discrete:  # (the common case, without the dispatch of sample and to_env_action)
        index, logp = _categorical_sample(dist_inputs.tolist(), rng)
        return index + space.start, logp, index + space.start
    action, logp = sample(space, dist_inputs, rng)
    env_action = to_env_action(space, action)
    if isinstance(space, Box) and not raw_box_samples:
        return env_action, log_prob(space, dist_inputs, env_action), env_action
    return action, logp, env_action


def to_env_action(space: Space, action: Any) -> Any:
    """The action the engine executes for a recorded one: a Box sample clipped
    into the box (as float32 in the space's shape); other spaces unchanged."""
    if isinstance(space, Box):
        flat = np.asarray(action, dtype=np.float64).ravel()
        return np.clip(flat, space.low.ravel(), space.high.ravel()).reshape(space.shape).astype(np.float32)
    return action


def deterministic(space: Space, dist_inputs: np.ndarray) -> Any:
    """The distribution's mode: argmax per categorical, the (clipped) mean for a Box."""
    if isinstance(space, Discrete):
        return int(np.argmax(dist_inputs)) + space.start
    if isinstance(space, MultiDiscrete):
        out, offset = [], 0
        for n in space.nvec:
            out.append(int(np.argmax(dist_inputs[offset : offset + n])))
            offset += n
        return np.asarray(out, dtype=np.int64)
    k = space.flat_dim
    mean = np.asarray(dist_inputs, dtype=np.float64).ravel()[:k]
    return np.clip(mean, space.low.ravel(), space.high.ravel()).reshape(space.shape).astype(np.float32)
