"""Behaviour log-probabilities must come from a model the server served.

PPO trusts ``action_logp`` as the probability the behaviour policy gave the
action; one made-up value (-1000) makes the importance ratio overflow and can
destroy the policy. The server keeps, per module, the policies of its last
``max_staleness + 1`` versions (the only ones whose data it trains on) and
recomputes the logp of every recorded action with the version the data
claims. A step that no kept version explains is refused (ACTION_LOGP_MISMATCH).
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import onnxruntime as ort
import torch

from tether.protocol.distributions import log_probs
from tether.protocol.errors import ErrorCode, MessageError
from tether.protocol.episodes import EpisodeChunk
from tether.protocol.model_input import ModelFeeds
from tether.protocol.multi_agent import DEFAULT_AGENT_ID, MultiAgentRecord
from tether.protocol.spaces import Box, Discrete, Space

from ..learner.policy_model import PolicyModel

#: |claimed - recomputed| allowed per step: ``ABS + REL * |recomputed|``. ONNX
#: Runtime (float32) against torch (float32) differ by ~1e-5 on these models
#: (Box actions with a small std amplify it to ~1e-3); a wrong logp that passes
#: shifts the PPO ratio by at most e^0.05, inside the usual clip of 0.2.
LOGP_TOLERANCE_ABS = 0.05
LOGP_TOLERANCE_REL = 1e-3

#: A raw Box sample this many standard deviations from the claimed model's mean
#: cannot have been drawn from it (P(|z| > 20) is about 1e-88), however its logp
#: is reported: one such step (an action of 1e6 in a box of [-2, 2], with its
#: exact logp) made every update containing it non-finite.
MAX_BOX_Z = 20.0

#: Observations of at least this many values (images) make the forward pass the cost of ingest (a
#: Nature-CNN on 84x84x4 runs about 3-6k images/s on one core): of such a module, each message has a
#: random sample of ``SAMPLED_STEPS`` steps checked, not every step. A client cannot know which: one
#: that lies on a tenth of its steps is caught in 97% of its messages, and a lie that slips through
#: meets the learner's own guard (a non-finite update is undone, its data refused after a few, §13.2).
LARGE_OBSERVATION_VALUES = 4096
SAMPLED_STEPS = 32
_sampler = np.random.default_rng()


class ServedPolicy:
    """One served version, run with ONNX Runtime on the very model bytes clients
    got: about 4x faster than a torch forward pass for these MLPs, and it
    releases the GIL, so the check can run beside the event loop."""

    def __init__(self, onnx_bytes: bytes, action_space: Space, observation_space: Space | None = None) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        #: The model's inputs from stored rows (**[1.4]** one per leaf of a composite observation).
        self.feeds = ModelFeeds.of_session(self.session.get_inputs(), observation_space)
        self.action_space = action_space

    def dist_inputs(self, obs: np.ndarray) -> np.ndarray:
        feeds = {name: np.ascontiguousarray(x) for name, x in self.feeds.feed(obs, obs.shape[0]).items()}
        return self.session.run(None, feeds)[0].astype(np.float64)


class PolicyHistory:
    """The policies one module served (as ``ServedPolicy``), newest last."""

    def __init__(self, keep: int) -> None:
        self.keep = max(1, keep)
        # Replaced, never mutated: readers on other threads see a consistent tuple.
        self._versions: tuple[tuple[int, ServedPolicy], ...] = ()

    def add(self, version: int, onnx_bytes: bytes, action_space: Space, observation_space: Space | None = None) -> None:
        """Keep ``version``: ``onnx_bytes`` is the model as served."""
        self.add_served(version, ServedPolicy(onnx_bytes, action_space, observation_space))

    def add_served(self, version: int, policy: ServedPolicy) -> None:
        """Keep ``version``, already loaded (the learner thread loads it, off the event loop)."""
        self._versions = (*self._versions, (version, policy))[-self.keep :]

    @property
    def versions(self) -> list[int]:
        return [v for v, _ in self._versions]

    def model(self, version: int) -> ServedPolicy | None:
        return next((m for v, m in self._versions if v == version), None)

    def others(self, version: int) -> Iterable[tuple[int, ServedPolicy]]:
        return [(v, m) for v, m in reversed(self._versions) if v != version]


def _dist_inputs(model: PolicyModel | ServedPolicy, obs: np.ndarray) -> np.ndarray:
    if isinstance(model, ServedPolicy):
        return model.dist_inputs(obs)
    with torch.inference_mode():
        flat = torch.as_tensor(obs.reshape(obs.shape[0], -1), dtype=torch.float32)
        return model.dist_inputs(flat).numpy().astype(np.float64)


def _logp(model: PolicyModel | ServedPolicy, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log pi(a|o) with the formulas of §11, in float64 (the protocol core's one implementation)."""
    return log_probs(model.action_space, _dist_inputs(model, obs), actions)


def _box_z(model: PolicyModel | ServedPolicy, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Per step, the largest |z| of the action's elements under the model's Gaussian."""
    inputs = _dist_inputs(model, obs)
    k = inputs.shape[-1] // 2
    a = np.asarray(actions, np.float64).reshape(inputs.shape[0], -1)
    return (np.abs(a - inputs[:, :k]) / np.exp(inputs[:, k:])).max(-1)


def _beyond_tolerance(claimed: np.ndarray, recomputed: np.ndarray) -> np.ndarray:
    return np.abs(claimed - recomputed) > LOGP_TOLERANCE_ABS + LOGP_TOLERANCE_REL * np.abs(recomputed)


def _observations_at(items: list[tuple[int, str, EpisodeChunk]], rows: np.ndarray) -> np.ndarray:
    """The observations acted on at these (sorted, at least one) flat step indices of the chunks laid end
    to end, as rows."""
    parts = []
    start = 0
    for _, _, chunk in items:
        end = start + chunk.env_steps
        lo, hi = np.searchsorted(rows, (start, end))
        if hi > lo:
            parts.append(chunk.obs[rows[lo:hi] - start].reshape(hi - lo, -1))
        start = end
    return np.concatenate(parts)


def check_behaviour_logp(
    records: list[MultiAgentRecord], versions: dict[str, int], histories: dict[str, PolicyHistory]
) -> None:
    """Raise ACTION_LOGP_MISMATCH for the first step whose action_logp no kept
    version of its module can have produced. Chunks without logp, of modules
    without a history (frozen) or claiming a version the server no longer keeps
    (their data is refused as stale) are not checked, unless they name their
    steps' versions (weights_seq_no_runs): those steps are stored by their own
    versions, so they are checked whatever the message claims. **[1.6]** Logged
    steps are not checked: they have no behaviour logp (§13.6). One forward pass
    per module."""
    by_module: dict[str, list[tuple[int, str, EpisodeChunk]]] = {}
    for index, record in enumerate(records):
        for agent in record.agents:
            if agent.chunk.action_logp is not None:
                by_module.setdefault(agent.module_id, []).append((index, agent.agent_id, agent.chunk))
    for module, items in by_module.items():
        history = histories.get(module)
        claimed_version = versions.get(module)
        if history is None or claimed_version is None:
            continue
        # Only steps of a version kept now are checked (and stored): by their own versions when their
        # chunk names them (weights_seq_no_runs), else by the message's claim. A step passes when any
        # kept version explains its logp (the claimed one is tried first). The rest is refused as stale.
        kept = np.array(history.versions, np.int64)
        checked = np.concatenate([
            (np.isin(c.step_versions, kept) if c.step_versions is not None
             else np.full(c.env_steps, claimed_version in history.versions))
            & (True if c.logged is None else ~c.logged) for _, _, c in items])  # (1.6: logged steps have no logp)
        if not checked.any():
            continue
        if history.model(claimed_version) is None:
            claimed_version = history.versions[-1]
        model = history.model(claimed_version)
        actions = np.concatenate([c.actions for _, _, c in items])
        claimed = np.concatenate([c.action_logp for _, _, c in items]).astype(np.float64)  # type: ignore[misc]
        if int(np.prod(items[0][2].obs.shape[1:])) >= LARGE_OBSERVATION_VALUES and int(checked.sum()) > SAMPLED_STEPS:
            sample = np.zeros_like(checked)
            sample[_sampler.choice(np.flatnonzero(checked), SAMPLED_STEPS, replace=False)] = True
            checked = sample
        rows = np.flatnonzero(checked)  # (only these go through the model: the rest count as explained)
        obs = _observations_at(items, rows)  # (only the checked rows are gathered: images are large)
        recomputed = np.zeros_like(claimed)
        recomputed[rows] = _logp(model, obs, actions[rows])
        bad = _beyond_tolerance(claimed, recomputed) & checked
        for _, other in history.others(claimed_version) if bad.any() else ():
            again = np.zeros_like(claimed)
            again[rows] = _logp(other, obs, actions[rows])
            bad &= _beyond_tolerance(claimed, again)
        far = np.zeros_like(bad)
        if isinstance(model.action_space, Box):
            far[rows] = _box_z(model, obs, actions[rows]) > MAX_BOX_Z
            for _, other in history.others(claimed_version) if far.any() else ():
                far[rows] &= _box_z(other, obs, actions[rows]) > MAX_BOX_Z
            bad |= far
        if not bad.any():
            continue
        flat = int(np.argmax(bad))
        offset = 0
        for index, agent_id, chunk in items:
            if flat < offset + chunk.env_steps:
                break
            offset += chunk.env_steps
        t = flat - offset
        single = agent_id == DEFAULT_AGENT_ID and len(records[index].agents) == 1
        where = f"episodes[{index}]" + ("" if single else f".agents[{agent_id!r}]")
        if far[flat]:
            raise MessageError(
                ErrorCode.ACTION_LOGP_MISMATCH,
                f"{where}: actions[{t}] lies more than {MAX_BOX_Z:g} standard deviations from the mean of module "
                f"{module!r} at weights_seq_no {claimed_version}: no served model can have sampled it",
            )
        raise MessageError(
            ErrorCode.ACTION_LOGP_MISMATCH,
            f"{where}: action_logp[{t}] = {claimed[flat]:.6g} but module {module!r} at weights_seq_no "
            f"{claimed_version} gives {recomputed[flat]:.6g} for that action (tolerance "
            f"{LOGP_TOLERANCE_ABS} + {LOGP_TOLERANCE_REL} * |logp|); action_logp must be the log-probability "
            "of the recorded action under a model the server served",
        )
