"""Schedules of the learning rate and the entropy coefficient over a run (``lr_schedule``,
``ent_coef_schedule``; the README's "Running a server").

"constant" keeps the configured value; "linear" multiplies it by the share of the run left, from 1
at the first update to 0 at ``max_env_steps``, as CleanRL's ``anneal_lr`` and ML-Agents'
``learning_rate_schedule: linear`` do. The share comes from the env steps the run had received before
the data waiting in the pool as the update starts (env_steps_before): 1 at the first update, about one
batch's share of the run at the last (CleanRL's lr/N). On several ranks the group's sums at the
agreement that starts the update, the same on every rank, so that every rank steps with the same
learning rate and their weights stay identical.
The configured value stays the base (the console's set_lr and set_ent_coef change it, checkpoints keep
it): the value an update trains with is the base times the schedule's factor."""

from __future__ import annotations

#: The schedules a module may name.
SCHEDULES = ("constant", "linear")


def check_schedule(name: str, schedule: str, max_env_steps: int | None) -> None:
    """Raise ValueError unless ``schedule`` (the option ``name``'s value) is known and can run:
    "linear" decays to 0 at ``max_env_steps``, which must then be set."""
    if schedule not in SCHEDULES:
        raise ValueError(f"{name} must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    if schedule == "linear" and not max_env_steps:
        raise ValueError(f"{name} = 'linear' decays to 0 at max_env_steps, which is not set")


def run_left(env_steps: float, max_env_steps: int | None) -> float:
    """The share of the run left after ``env_steps`` env steps of ``max_env_steps``, in [0, 1]
    (1 when the run has no budget)."""
    if not max_env_steps:
        return 1.0
    return min(1.0, max(0.0, 1.0 - env_steps / max_env_steps))


def env_steps_before(env_steps: int, agent_steps: int, pooled_agent_steps: int) -> float:
    """The env steps received before the data waiting in the pool: the pool counts agent steps (several
    agents may act in one env step, or one agent of several), so its share is taken at the run's ratio of
    env steps to agent steps received."""
    if agent_steps <= 0:
        return float(env_steps)
    return env_steps - pooled_agent_steps * env_steps / agent_steps


def scheduled(value: float, schedule: str, left: float) -> float:
    """``value`` as ``schedule`` makes it with ``left`` of the run to go."""
    return value * left if schedule == "linear" else value
