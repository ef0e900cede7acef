"""**[1.6]** Writing demonstration files (§18): every episode an engine plays, whole, one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from tether.protocol.demonstrations import episode_line, header
from tether.protocol.episodes import beyond_float32
from tether.protocol.errors import ErrorCode, InvalidInputError
from tether.protocol.logged_actions import checked_logged_action
from tether.protocol.multi_agent import ModuleSpec
from tether.protocol.spaces import Box, Space


class _Running:
    """One actor's episode so far."""

    __slots__ = ("module", "obs", "actions", "rewards", "logged")

    def __init__(self, module: str) -> None:
        self.module = module
        self.obs: list[Any] = []
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.logged: list[bool] = []


class DemoWriter:
    """Appends whole episodes to a demonstration file, one line per actor episode as it ends.

    Use it on its own, with no server (a scripted controller, a designer's play)::

        writer = DemoWriter("expert.jsonl", {"default_policy": (observation_space, action_space)})
        writer.step("ep1", "default_agent", "default_policy", obs, action, logged=True)
        writer.add_reward("ep1", "default_agent", 1.0)
        ...
        writer.end("ep1", "default_agent", final_obs, terminated=True)
        writer.close()

    or let a client write every episode it plays (``TetherClient.record_demonstrations``).
    Rewards follow the clients' semantics: a reward goes to the actor's latest step, and one given
    before its first step is dropped. Each line is flushed as written, so a crash loses only the
    episodes still running; ``close`` writes those as truncated.
    """

    def __init__(self, path: str | Path, modules: Mapping[str, ModuleSpec | tuple[Space, Space]]) -> None:
        """``modules``: each module's spaces (a ModuleSpec, or (observation space, action space)),
        written in the header; a file that exists is replaced."""
        self.modules: dict[str, ModuleSpec] = {
            m: spec if isinstance(spec, ModuleSpec) else ModuleSpec(m, spec[0], spec[1])  # type: ignore[arg-type]
            for m, spec in modules.items()}
        self.path = Path(path)
        self._file = self.path.open("w", encoding="utf-8", newline="\n")
        self._write(header(self.modules))
        self._running: dict[tuple[str, str], _Running] = {}
        #: Episode lines written so far.
        self.episodes_written = 0

    def step(self, episode_id: str, agent_id: str, module: str, obs: Any, action: Any, logged: bool = False) -> None:
        """One step of an actor: the observation it acted on (the module's flat row) and the action taken
        (``logged``: not chosen by the policy). Refused, with nothing kept (``InvalidInputError``): an
        observation of another size or not finite, an action the server's reader would refuse (outside
        the action space, not finite, forbidden by the observation's action mask)."""
        if module not in self.modules:
            raise ValueError(f"module {module!r} is not one of the writer's ({sorted(self.modules)})")
        spec = self.modules[module]
        row = self._checked_row(spec, obs, "the observation")
        checked = checked_logged_action(spec.action_space, action, spec.action_mask, row, "the action")
        if isinstance(spec.action_space, Box):  # (as given, not rounded to float32)
            checked = np.asarray(action, np.float64).reshape(spec.action_space.shape)
        self._step(episode_id, agent_id, module, obs, checked, logged)

    def _step(self, episode_id: str, agent_id: str, module: str, obs: Any, action: Any, logged: bool) -> None:
        """``step`` for the clients, whose observations and actions are checked already."""
        key = (episode_id, agent_id)
        running = self._running.get(key)
        if running is None:
            if module not in self.modules:
                raise ValueError(f"module {module!r} is not one of the writer's ({sorted(self.modules)})")
            running = self._running[key] = _Running(module)
        running.obs.append(np.array(obs, copy=True))
        running.actions.append(action.copy() if isinstance(action, np.ndarray) else action)
        running.rewards.append(0.0)
        running.logged.append(bool(logged))

    def add_reward(self, episode_id: str, agent_id: str, reward: float) -> None:
        """A reward for the actor's latest step (dropped before its first). One that would make the step's
        total not finite as float32, as a file holds it, is refused (``InvalidInputError``
        NON_FINITE_VALUE) and adds nothing: the reader would refuse the line."""
        running = self._running.get((episode_id, agent_id))
        if running is not None and running.rewards:
            total = running.rewards[-1] + float(reward)
            if beyond_float32(total):
                raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"the reward {reward!r} makes the step's total "
                                        f"{total!r}, beyond float32 (a demonstration file's numbers)")
            running.rewards[-1] = total

    def end(self, episode_id: str, agent_id: str, final_obs: Any, terminated: bool = True) -> None:
        """The actor's episode is over (``terminated``, else truncated): its line is written and flushed.
        An actor that took no step writes nothing."""
        running = self._running.get((episode_id, agent_id))
        if running is None or not running.actions:
            self._running.pop((episode_id, agent_id), None)
            return
        spec = self.modules[running.module]
        self._checked_row(spec, final_obs, "the final observation")  # (refused: the episode goes on)
        del self._running[(episode_id, agent_id)]
        self._write(episode_line(running.module, agent_id, episode_id, spec.observation_space,
                                 [*running.obs, np.asarray(final_obs)], running.actions, running.rewards,
                                 terminated, running.logged))
        self.episodes_written += 1

    def running(self, episode_id: str) -> list[str]:
        """The actors of ``episode_id`` with steps not written yet."""
        return [agent for (episode, agent) in self._running if episode == episode_id]

    def close(self) -> None:
        """Write the episodes still running as truncated (at their latest observation), and close the file."""
        if self._file.closed:
            return
        for (episode_id, agent_id), running in list(self._running.items()):
            if len(running.obs) > 1:  # (the last step has no next observation: the episode ends before it)
                last = running.obs.pop()
                running.actions.pop()
                running.rewards.pop()
                running.logged.pop()
                self._running[(episode_id, agent_id)] = running
                self.end(episode_id, agent_id, last, terminated=False)
        self._running.clear()
        self._file.close()

    def __enter__(self) -> "DemoWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _checked_row(spec: ModuleSpec, obs: Any, what: str) -> np.ndarray:
        try:
            row = np.asarray(obs, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"DemoWriter: {what} is not a row of numbers") from None
        if row.size != spec.obs_dim:
            raise InvalidInputError(ErrorCode.OBS_SHAPE_MISMATCH, f"DemoWriter: {what} has {row.size} values, module "
                                    f"{spec.module_id!r} needs {spec.obs_dim}")
        if not np.isfinite(row.astype(np.float32)).all():
            raise InvalidInputError(ErrorCode.NON_FINITE_VALUE, f"DemoWriter: {what} is not finite (as float32)")
        return row

    def _write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()
