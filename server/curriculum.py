"""Environment parameters and curricula (docs/curriculum.md, protocol §19).

A run's ``[curriculum]`` table names parameters (a number or a sampler each), optional bounds, and
lessons: each lesson sets some parameters and, except the last, says when it is learned — the
mean of a measure over the last ``min_episodes`` episodes played in it reaches ``threshold``. The
measure is an episode's return (its agents' mean, or the agents of one ``module``) or a number the
client reports with the episode (``measure = "reported"``).

Every change (a lesson advances, a person changes a parameter or the lesson from the console) makes
a new parameter set with the next ``seq``; clients ask for it with every state request and draw
each episode's values from it. Records say which set and values their episode was played with;
values that set cannot give are refused, and only episodes of the current lesson count toward it.
"""

from __future__ import annotations

import math
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tether.protocol.env_params import (
    MAX_PARAMS,
    EnvParams,
    EnvParamsError,
    RecordEnvParams,
    allows,
    check_played_with,
    parse_name,
    parse_value,
)

from .metrics import FinishedEpisode

#: Parameter sets kept to check records against: a client may still play with a set a few changes old.
SETS_KEPT = 16
#: A run's first seq is drawn below this (§19.1): a record of an earlier run's set is then almost never
#: taken for one of this run's, and seqs stay far below 2**31 - 1.
FIRST_SEQ_LIMIT = 2**30
#: Lessons a curriculum may have, and the largest min_episodes (the measure's window).
MAX_LESSONS = 64
MAX_MIN_EPISODES = 100_000
MEASURES = ("return", "reported")


class CurriculumError(ValueError):
    """A change the curriculum refuses (an unknown parameter or lesson, a value of the wrong type or
    outside its bounds), with the reason."""


@dataclass(frozen=True)
class Lesson:
    """One lesson: its name, the parameters it sets, and when it is learned (None: the last lesson)."""

    name: str
    values: dict[str, Any]
    threshold: float | None
    min_episodes: int


@dataclass(frozen=True)
class CurriculumConfig:
    """The ``[curriculum]`` table, checked."""

    parameters: dict[str, Any]
    bounds: dict[str, tuple[float, float]]
    lessons: tuple[Lesson, ...]
    measure: str = "return"
    module: str | None = None
    #: Each episode's measure is clipped to this range before it counts (None: not clipped).
    measure_range: tuple[float, float] | None = None

    @staticmethod
    def from_json(table: Any, modules: Iterable[str] = ()) -> "CurriculumConfig":
        """Parse and check the table; ValueError names what is wrong."""
        if not isinstance(table, dict):
            raise ValueError("curriculum must be a table")
        unknown = set(table) - {"parameters", "bounds", "lessons", "measure", "module", "measure_range"}
        if unknown:
            raise ValueError(f"curriculum has unknown keys {sorted(unknown)}")
        measure = table.get("measure", "return")
        if measure not in MEASURES:
            raise ValueError(f"curriculum.measure must be one of {', '.join(MEASURES)}, got {measure!r}")
        measure_range = table.get("measure_range")
        if measure_range is not None:
            if not (isinstance(measure_range, list) and len(measure_range) == 2 and all(
                    not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in measure_range)
                    and measure_range[0] <= measure_range[1]):
                raise ValueError("curriculum.measure_range must be [low, high] with low <= high")
            measure_range = (float(measure_range[0]), float(measure_range[1]))
        module = table.get("module")
        modules = list(modules)
        if module is not None and module not in modules:
            raise ValueError(f"curriculum.module {module!r} is not a module ({', '.join(modules)})")
        raw = table.get("parameters", {})
        if not isinstance(raw, dict) or not 1 <= len(raw) <= MAX_PARAMS:
            raise ValueError(f"curriculum.parameters must name 1 to {MAX_PARAMS} parameters")
        try:
            parameters = {parse_name(n, "curriculum parameter name"): parse_value(v, f"curriculum.parameters.{n}")
                          for n, v in raw.items()}
        except EnvParamsError as exc:
            raise ValueError(str(exc)) from None
        bounds = {}
        for name, pair in dict(table.get("bounds", {})).items():
            if name not in parameters:
                raise ValueError(f"curriculum.bounds names {name!r}, which is not a parameter")
            if not (isinstance(pair, list) and len(pair) == 2 and all(
                    not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in pair)
                    and pair[0] <= pair[1]):
                raise ValueError(f"curriculum.bounds.{name} must be [low, high] with low <= high")
            bounds[name] = (float(pair[0]), float(pair[1]))
        lessons = []
        raw_lessons = table.get("lessons", [])
        if not isinstance(raw_lessons, list) or len(raw_lessons) > MAX_LESSONS:
            raise ValueError(f"curriculum.lessons must be a list of at most {MAX_LESSONS} lessons")
        for i, entry in enumerate(raw_lessons):
            lessons.append(_lesson(entry, i, i == len(raw_lessons) - 1, parameters))
        config = CurriculumConfig(parameters, bounds, tuple(lessons), measure, module, measure_range)
        for name, value in parameters.items():
            config.check_bounds(name, value)
        for lesson in lessons:
            for name, value in lesson.values.items():
                config.check_bounds(name, value, f"lesson {lesson.name!r}: ")
        return config

    def check_bounds(self, name: str, value: Any, where: str = "") -> None:
        """CurriculumError unless every value ``value`` can give lies within ``name``'s bounds."""
        if name not in self.bounds:
            return
        low, high = self.bounds[name]
        if isinstance(value, dict):
            kind = value["sampler"]
            if kind == "gaussian":
                raise CurriculumError(f"{where}{name} has bounds [{low:g}, {high:g}]: a gaussian can give any value; "
                                      "use a uniform or ranges")
            ends = ([value["low"], value["high"]] if kind == "uniform"
                    else [x for pair in value["ranges"] for x in pair])
        else:
            ends = [value]
        if not all(low <= x <= high for x in ends):
            raise CurriculumError(f"{where}{name} = {value!r} is outside its bounds [{low:g}, {high:g}]")


def _lesson(entry: Any, index: int, last: bool, parameters: dict[str, Any]) -> Lesson:
    where = f"curriculum.lessons[{index}]"
    if not isinstance(entry, dict) or set(entry) - {"name", "values", "threshold", "min_episodes"}:
        raise ValueError(f"{where} must be a table of name, values, threshold, min_episodes")
    name = entry.get("name", f"lesson {index}")
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise ValueError(f"{where}.name must be text of 1 to 64 characters")
    values = {}
    for key, value in dict(entry.get("values", {})).items():
        if key not in parameters:
            raise ValueError(f"{where}.values names {key!r}, which is not a parameter ({', '.join(parameters)})")
        try:
            values[key] = parse_value(value, f"{where}.values.{key}")
        except EnvParamsError as exc:
            raise ValueError(str(exc)) from None
    threshold, min_episodes = entry.get("threshold"), entry.get("min_episodes", 100)
    if last:
        if threshold is not None:
            raise ValueError(f"{where} is the last lesson: it has no threshold")
    elif isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ValueError(f"{where}.threshold must be a number (every lesson but the last has one)")
    if type(min_episodes) is not int or not 1 <= min_episodes <= MAX_MIN_EPISODES:
        raise ValueError(f"{where}.min_episodes must be an integer from 1 to {MAX_MIN_EPISODES}")
    return Lesson(name, values, None if last else float(threshold), min_episodes)


class Curriculum:
    """The run's parameter sets, lesson and measure (see the module docstring)."""

    def __init__(self, config: CurriculumConfig, env_steps: Callable[[], int] = lambda: 0,
                 first_seq: int | None = None) -> None:
        self.config = config
        #: The run's env steps received so far: each change says when it was made.
        self._env_steps = env_steps
        self.lesson = 0
        # (the seq before the first set's: random per run unless given, §19.1)
        self.seq = (secrets.randbelow(FIRST_SEQ_LIMIT) + 1 if first_seq is None else first_seq) - 1
        self._sets: deque[EnvParams] = deque(maxlen=SETS_KEPT)
        self._window: deque[float] = deque(maxlen=self._lesson().min_episodes if config.lessons else 1)
        #: Episodes counted toward the current lesson, and every episode counted.
        self.lesson_episodes = 0
        self.episodes = 0
        #: Changes made, newest last, for the console's event log: (kind, details).
        self.changes: list[tuple[str, dict[str, Any]]] = []
        self.changes_made = 0
        #: Several ranks: a rank > 0 follows rank 0's curriculum (``adopt``) and hands the measures of its
        #: episodes to rank 0 (``take_forwarded``) instead of counting them itself.
        self.follower = False
        self._forwarded: list[tuple[int, float]] = []
        #: Several ranks: measures a follower handed on so far, and those rank 0 counted from other ranks.
        self.forwarded = 0
        self.counted_from_other_ranks = 0
        self._publish(self._lesson_values(), "start")

    # -- sets --------------------------------------------------------------------------

    @property
    def current(self) -> EnvParams:
        """The set served now (``seq``'s: a follower may learn of older sets after it)."""
        for held in reversed(self._sets):
            if held.seq == self.seq:
                return held
        return self._sets[-1]

    def set_for(self, seq: Any) -> EnvParams | None:
        """The set with this seq if it is still kept."""
        return next((s for s in self._sets if s.seq == seq), None)

    def _lesson(self) -> Lesson:
        return self.config.lessons[self.lesson]

    def _lesson_values(self) -> dict[str, Any]:
        values = dict(self.config.parameters)
        if self.config.lessons:
            values.update(self._lesson().values)
        return values

    def _publish(self, values: dict[str, Any], cause: str, **details: Any) -> None:
        self.seq += 1
        self._sets.append(EnvParams(self.seq, self.lesson, values))
        # ("set_seq": the console's event log numbers its entries "seq")
        self.changes.append((cause, {"set_seq": self.seq, "lesson": self.lesson, "env_steps": self._env_steps(),
                                     **details}))
        self.changes_made += 1
        del self.changes[:-100]

    # -- what the clients send -----------------------------------------------------------

    def check_record(self, played: RecordEnvParams | None, where: str) -> None:
        """A record's env_params against the set it names (§19.3): MessageError when that set is kept
        and cannot give its values. A set no longer kept (or from before a restart) is not checked."""
        if played is None:
            return
        held = self.set_for(played.seq)
        if held is not None:
            check_played_with(played, held, where)

    def note(self, finished: Iterable[FinishedEpisode], suspect: bool = False) -> bool:
        """Count the episodes that ended, by the env_params of the record that ended each; a
        ``suspect`` client's (its data made updates non-finite) do not count. Returns whether the
        lesson advanced."""
        advanced = False
        for episode in finished:
            record = episode.env_params
            if not episode.complete or record is None or suspect:
                continue
            held = self.set_for(record.seq)
            if held is None or held.lesson != self.lesson:
                continue  # played in another lesson (or with a set the server no longer knows)
            value = self._measure(episode, record)
            if value is None:
                continue
            if self.follower:
                self.forwarded += 1
                self._forwarded.append((self.lesson, value))
                del self._forwarded[:-10_000]  # (bounded: rank 0 takes them about once a second)
                continue
            self.episodes += 1
            self.lesson_episodes += 1
            self._window.append(value)
            advanced |= self._maybe_advance()
        return advanced

    def _measure(self, episode: FinishedEpisode, record: RecordEnvParams) -> float | None:
        if self.config.measure == "reported":
            value = record.measure
        elif self.config.module is None:  # every agent's, those that left before the end too
            value = episode.total_return / max(1, episode.agent_count)
        else:
            returns = [r for m, r in episode.agents.values() if m == self.config.module]
            value = sum(returns) / len(returns) if returns else None
        if value is None or not math.isfinite(value):
            return None
        if self.config.measure_range is not None:
            value = min(max(value, self.config.measure_range[0]), self.config.measure_range[1])
        return value

    # -- several ranks (server/distributed/rank_reports.py) ---------------------------------

    def take_forwarded(self) -> list[tuple[int, float]]:
        """A rank > 0: the (lesson, measure) of its episodes counted since the last call, for rank 0."""
        taken, self._forwarded = self._forwarded, []
        return taken

    def note_forwarded(self, measures: Iterable[Any]) -> bool:
        """Rank 0: another rank's measures, counted as its own episodes of the lesson they were played in
        are; returns whether the lesson advanced."""
        advanced = False
        for lesson, value in measures:
            if int(lesson) != self.lesson or not math.isfinite(float(value)):
                continue
            self.counted_from_other_ranks += 1
            self.episodes += 1
            self.lesson_episodes += 1
            self._window.append(float(value))
            advanced |= self._maybe_advance()
        return advanced

    def snapshot(self) -> dict[str, Any]:
        """Rank 0's set, lesson and measure, as every other rank adopts them."""
        return {"seq": self.seq, "lesson": self.lesson, "values": dict(self.current.values),
                "sets": [(s.seq, s.lesson, dict(s.values)) for s in self._sets],
                "window": list(self._window), "lesson_episodes": self.lesson_episodes, "episodes": self.episodes}

    def adopt(self, snapshot: dict[str, Any], replace: bool = False) -> bool:
        """A rank > 0: serve rank 0's set under rank 0's seq, and know every set rank 0 keeps (records may
        name any of them); ``replace`` (at the group's start) forgets this rank's own sets first: their
        seqs may be rank 0's numbers for other values. Returns whether the set served changed."""
        changed = int(snapshot["seq"]) != self.seq or replace
        if replace:
            self._sets.clear()
        known = {s.seq for s in self._sets}
        for seq, lesson, values in snapshot.get("sets", [(snapshot["seq"], snapshot["lesson"], snapshot["values"])]):
            if int(seq) not in known:
                self._sets.append(EnvParams(int(seq), int(lesson), dict(values)))
        self.lesson = int(snapshot["lesson"])
        if changed:
            self.seq = int(snapshot["seq"])
            self.changes.append(("rank 0", {"set_seq": self.seq, "lesson": self.lesson,
                                            "env_steps": self._env_steps()}))
            self.changes_made += 1
            del self.changes[:-100]
        self._window = deque(snapshot["window"], maxlen=self._lesson().min_episodes if self.config.lessons else 1)
        self.lesson_episodes, self.episodes = int(snapshot["lesson_episodes"]), int(snapshot["episodes"])
        return changed

    @property
    def measure_mean(self) -> float | None:
        return sum(self._window) / len(self._window) if self._window else None

    def _maybe_advance(self) -> bool:
        if not self.config.lessons or self.lesson == len(self.config.lessons) - 1:
            return False
        lesson = self._lesson()
        mean = self.measure_mean
        if len(self._window) < lesson.min_episodes or mean is None or mean < lesson.threshold:
            return False
        self._enter(self.lesson + 1, "lesson", measure=mean)
        return True

    def _enter(self, lesson: int, cause: str, **details: Any) -> None:
        self.lesson = lesson
        self.lesson_episodes = 0
        self._window = deque(maxlen=self._lesson().min_episodes)
        self._publish(self._lesson_values(), cause, lesson_name=self._lesson().name, **details)

    # -- what a person changes (the console) -----------------------------------------------

    def set_lesson(self, lesson: Any) -> None:
        """Go to lesson ``lesson`` (an index). CurriculumError: not a lesson."""
        count = len(self.config.lessons)
        if type(lesson) is not int or not 0 <= lesson < count:
            raise CurriculumError(f"no lesson {str(lesson)[:40]!r}: lessons are 0 to {count - 1}" if count
                                  else "this curriculum has no lessons")
        self._enter(lesson, "set_lesson")

    def set_param(self, name: Any, value: Any) -> Any:
        """Give parameter ``name`` a new value (a number or a sampler) until the lesson next changes.
        Returns the value as sent. CurriculumError: an unknown name, a bad value or one outside bounds."""
        if not isinstance(name, str) or name not in self.config.parameters:
            raise CurriculumError(f"no parameter {str(name)[:80]!r}; parameters: {', '.join(self.config.parameters)}")
        try:
            parsed = parse_value(value, name)
        except EnvParamsError as exc:
            raise CurriculumError(str(exc)) from None
        self.config.check_bounds(name, parsed)
        values = dict(self.current.values)
        values[name] = parsed
        self._publish(values, "set_param", name=name, value=parsed)
        return parsed

    # -- reporting and checkpoints --------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        lesson = self.config.lessons[self.lesson] if self.config.lessons else None
        return {
            "seq": self.seq, "lesson": self.lesson, "lesson_name": lesson.name if lesson else None,
            "lessons": len(self.config.lessons), "values": dict(self.current.values),
            "measure": self.config.measure, "measure_mean": self.measure_mean,
            "threshold": lesson.threshold if lesson else None,
            "min_episodes": lesson.min_episodes if lesson else None,
            "lesson_episodes": self.lesson_episodes, "episodes": self.episodes,
            "changes": [{"cause": cause, **details} for cause, details in self.changes[-20:]],
            **({"forwarded": self.forwarded} if self.follower else {}),
            **({"counted_from_other_ranks": self.counted_from_other_ranks} if self.counted_from_other_ranks else {}),
        }

    def scalars(self) -> dict[str, float]:
        """TensorBoard's curriculum/* values: the lesson, the measure's mean, each number parameter
        (a sampler as its centre: a uniform's or gaussian's mean, the ranges' midpoint)."""
        out = {"curriculum/lesson": float(self.lesson), "curriculum/seq": float(self.seq)}
        if self.measure_mean is not None:
            out["curriculum/measure"] = float(self.measure_mean)
        for name, value in self.current.values.items():
            out[f"curriculum/param/{name}"] = _centre(value)
            if isinstance(value, dict):  # (a change of a sampler's spread shows too)
                spread = _spread(value)
                out[f"curriculum/param_low/{name}"], out[f"curriculum/param_high/{name}"] = spread
        return out

    def state(self) -> dict[str, Any]:
        return {"seq": self.seq, "lesson": self.lesson, "values": dict(self.current.values),
                "window": list(self._window), "lesson_episodes": self.lesson_episodes, "episodes": self.episodes}

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume: the lesson, the values in force (those this configuration still has and allows;
        the rest from the configuration) as a new set with the next seq, and the measure."""
        lesson = int(state["lesson"]) if self.config.lessons else 0
        if not 0 <= lesson < max(1, len(self.config.lessons)):
            raise ValueError(f"the checkpoint's curriculum is at lesson {lesson}, this one has "
                             f"{len(self.config.lessons)} lessons")
        self.lesson = lesson
        values = self._lesson_values()
        for name, value in state["values"].items():
            if name not in values:
                continue
            try:
                parsed = parse_value(value, name)
                self.config.check_bounds(name, parsed)
            except (EnvParamsError, CurriculumError):
                continue  # (this configuration's bounds refuse it: its own value stands)
            values[name] = parsed
        self.seq = min(int(state["seq"]), FIRST_SEQ_LIMIT * 2)
        self._sets.clear()
        self._window = deque((float(x) for x in state["window"]),
                             maxlen=self._lesson().min_episodes if self.config.lessons else 1)
        self.lesson_episodes = int(state["lesson_episodes"])
        self.episodes = int(state["episodes"])
        self._publish(values, "resume")


def _spread(value: dict[str, Any]) -> tuple[float, float]:
    """A sampler's lowest and highest likely value: a uniform's ends, a gaussian's mean -/+ 2 std,
    the ranges' lowest and highest ends."""
    if value["sampler"] == "uniform":
        return float(value["low"]), float(value["high"])
    if value["sampler"] == "gaussian":
        return float(value["mean"] - 2 * value["std"]), float(value["mean"] + 2 * value["std"])
    ends = [x for pair in value["ranges"] for x in pair]
    return float(min(ends)), float(max(ends))


def _centre(value: Any) -> float:
    if not isinstance(value, dict):
        return float(value)
    if value["sampler"] == "gaussian":
        return float(value["mean"])
    low, high = _spread(value)
    return (low + high) / 2


__all__ = ["Curriculum", "CurriculumConfig", "CurriculumError", "Lesson", "allows"]
