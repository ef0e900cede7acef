"""Records one episode's steps and cuts it into chunks for sending."""

from __future__ import annotations

from typing import Any

import numpy as np

from tether.protocol.env_params import record_env_params
from tether.protocol.episodes import beyond_float32, encode_episode, logged_runs, version_runs
from tether.protocol.errors import ErrorCode, InvalidInputError
from tether.protocol.spaces import Box, Dict, Tuple


def same_space(a: Any, b: Any) -> bool:
    """Whether steps recorded under space ``a`` fit space ``b``: the same kind, shape and bounds
    (of a Box's dtype only whether it is uint8, §8.1), as the C++ SDK's ``Space::operator==`` and the
    C# SDK's ``SameSpace``. Used when a reconnect's
    SET_CONFIG describes the spaces again (§6.5)."""
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, Box):
        return (a.shape == b.shape and a.is_bytes == b.is_bytes and bool(np.array_equal(a.low, b.low))
                and bool(np.array_equal(a.high, b.high)))
    if isinstance(a, (Dict, Tuple)):  # (leaf by leaf: a Box's arrays have no single truth value)
        return len(a.leaves) == len(b.leaves) and all(
            x.path == y.path and same_space(x.space, y.space) for x, y in zip(a.leaves, b.leaves))
    return bool(a == b)


class EpisodeRecorder:
    """Per-step lists of one episode, with ExternalEnv's reward semantics:
    rewards logged after an action accumulate onto that action until the
    next one; a reward logged before the first action has no action to go to
    and is dropped."""

    __slots__ = ("episode_id", "training_enabled", "obs", "actions", "rewards", "logp", "dist_inputs",
                 "terminated", "truncated", "total_return", "length", "value_obs", "versions", "held_back",
                 "state", "states", "logged", "env_params", "measure")

    def __init__(self, episode_id: str, training_enabled: bool, held_back: bool = False) -> None:
        self.episode_id = episode_id
        self.training_enabled = training_enabled
        #: A training episode the client plays without recording it (the server's record_share).
        self.held_back = held_back
        self.obs: list[Any] = []
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.logp: list[float] = []
        self.dist_inputs: list[Any] = []
        #: Per recorded action, a comparable stamp of the weights it was computed with
        #: (the client's choice; None: unknown).
        self.versions: list[Any] = []
        self.terminated = False
        self.truncated = False
        self.total_return = 0.0
        self.length = 0
        #: Centralized-critic inputs, one per observation, when the module has one.
        self.value_obs: list[Any] | None = None
        #: **[1.5]** A model with memory: the state the next step starts from (None: zeros, not
        #: made yet), and per recorded observation the state before it (a chunk's state_in).
        self.state: list[np.ndarray] | None = None
        self.states: list[list[np.ndarray]] = []
        #: **[1.6]** Per recorded action, whether it was logged (chosen outside the policy, §10.1).
        self.logged: list[bool] = []
        #: **[1.7]** The parameter set's seq and the values drawn for this episode (§19.1), and the
        #: measure the engine reported; every record says them.
        self.env_params: tuple[int, dict[str, float]] | None = None
        self.measure: float | None = None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def record_step(self, obs: np.ndarray, action: Any, logp: float, dist_inputs: np.ndarray,
                    version: Any = None, state_before: list[np.ndarray] | None = None, logged: bool = False) -> None:
        """One step (single-agent path); ``state_before``: the state the model was fed with ``obs``;
        ``logged``: **[1.6]** the action was chosen outside the policy (log_action)."""
        self.observe(obs, state_before=state_before)
        self.act(action, logp, dist_inputs, version, logged)

    def observe(self, obs: np.ndarray, value_obs: np.ndarray | None = None,
                state_before: list[np.ndarray] | None = None) -> None:
        """Record an observation ahead of the action taken on it (multi-agent path)."""
        if self.training_enabled:
            self.obs.append(obs)
            if state_before is not None:
                self.states.append(state_before)
            if value_obs is not None:
                if self.value_obs is None:
                    self.value_obs = []
                self.value_obs.append(value_obs)

    def act(self, action: Any, logp: float, dist_inputs: np.ndarray, version: Any = None, logged: bool = False) -> None:
        """Record the action taken on the last observed observation (``version``: the weights it came from;
        ``logged``: **[1.6]** chosen outside the policy)."""
        self.length += 1
        if self.training_enabled:
            self.actions.append(action)
            self.rewards.append(0.0)
            self.logp.append(logp)
            self.dist_inputs.append(dist_inputs)
            self.versions.append(version)
            self.logged.append(logged)

    def step_reward_after(self, reward: float) -> float | None:
        """The last recorded step's reward if ``reward`` were added (None: no step recorded yet)."""
        return self.rewards[-1] + reward if self.rewards else None

    def check_reward(self, reward: float, what: str = "reward") -> None:
        """Refuse (``InvalidInputError``, NON_FINITE_VALUE) a reward that would take the step's reward
        beyond float32 (§10.5): the server would refuse the whole batch that carried it."""
        after = self.step_reward_after(reward)
        if after is not None and beyond_float32(after):
            raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"{what} {reward!r} would make its step's reward "
                                    f"{after!r}, beyond float32 (§10.5); nothing was added")

    def add_reward(self, reward: float) -> None:
        """Add ``reward`` to the last step (and the return); refused as ``check_reward`` says."""
        self.check_reward(reward)
        self.total_return += reward
        if self.rewards:
            self.rewards[-1] += reward

    def finish(self, obs: np.ndarray, truncated: bool, value_obs: np.ndarray | None = None) -> None:
        if self.training_enabled:
            self.obs.append(obs)
            if self.states and self.state is not None:
                self.states.append(self.state)
            if value_obs is not None and self.value_obs is not None:
                self.value_obs.append(value_obs)
        self.truncated = truncated
        self.terminated = not truncated

    def stop_training(self) -> None:
        """Keep counting the episode's return, but record and send nothing more of it."""
        self.training_enabled = False
        self.drop_unsent()

    def drop_unsent(self) -> None:
        """Let go of the steps not cut yet, the held-back one included (a reconnect's SET_CONFIG
        gave them other spaces or another critic layout, §6.5): recording goes on, and the next
        chunk starts from the next observation recorded. The return keeps counting; a reward
        logged before the next action has no recorded action to go to."""
        for steps in (self.obs, self.actions, self.rewards, self.logp, self.dist_inputs, self.versions, self.states,
                      self.logged):
            steps.clear()
        self.value_obs = None

    @property
    def pending_steps(self) -> int:
        return len(self.actions)

    def cut(self, connection: int | None = None, state_inputs: tuple[str, ...] = ()
            ) -> tuple[dict[str, Any], Any] | None:
        """Take the steps that are complete as one episode record, with the
        oldest weights stamp any of them was computed with (None if none is
        known): a batch claims the oldest version of its steps. When all of
        them were acted with versions of ``connection`` (the current one), and
        not all with one, the record names each step's (``weights_seq_no_runs``).

        A step is complete once the observation after it is known; an action
        still waiting for its next observation stays for the next chunk, as do
        the observation the next chunk starts from.

        **[1.5]** With ``state_inputs`` (a model with memory's state input names) the record carries
        ``state_in``: the state before its first observation.
        """
        k = len(self.actions) if len(self.obs) == len(self.actions) + 1 else len(self.actions) - 1
        if k <= 0:
            return None
        done = self.done and k == len(self.actions)
        record = encode_episode(
            obs=self.obs[: k + 1],
            actions=self.actions[:k],
            rewards=self.rewards[:k],
            action_logp=self.logp[:k],
            action_dist_inputs=self.dist_inputs[:k],
            is_terminated=self.terminated if done else False,
            is_truncated=self.truncated if done else False,
            episode_id=self.episode_id,
        )
        if self.value_obs is not None:
            record["value_obs"] = self.value_obs[: k + 1]
            del self.value_obs[:k]
        if state_inputs and self.states:
            record["state_in"] = {name: self.states[0][i].ravel().tolist() for i, name in enumerate(state_inputs)}
        del self.states[:k]
        runs = logged_runs(self.logged[:k])
        if runs is not None:
            record["logged_runs"] = runs
        del self.logged[:k]
        if self.env_params is not None:
            record["env_params"] = record_env_params(*self.env_params, self.measure if done else None)
        stamps = self.versions[:k]
        known = [v for v in stamps if v is not None]
        oldest = min(known) if known else None
        if connection is not None and len(known) == k and all(c == connection for c, _ in known):
            # Versions of the server this batch goes to: each step's own (§10.1), when they differ.
            runs = version_runs([version for _, version in known])
            if runs is not None:
                record["weights_seq_no_runs"] = runs
        del self.versions[:k]
        del self.obs[:k]
        del self.actions[:k]
        del self.rewards[:k]
        del self.logp[:k]
        del self.dist_inputs[:k]
        return record, oldest
