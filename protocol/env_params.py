"""**[1.7]** Environment parameters (§19): the values a server asks the engines to play with, each a
number or a sampler an engine draws from once per episode, and what a record says it was played with.

Shared by the server (it sends parameter sets and checks records) and the Python SDK (it reads
sets, draws an episode's values and records them). Pure: no I/O, the uniform draws come from the
caller's generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import ErrorCode, MessageError
from .messages import is_text

#: At most this many parameters in one set, this long a name, this many ranges in one sampler.
MAX_PARAMS = 64
MAX_NAME_CHARS = 64
MAX_RANGES = 16
#: The largest magnitude a parameter value may have: every SDK holds values as 64-bit floats, and
#: sums of a sampler's bounds (a range's width) must stay finite.
MAX_MAGNITUDE = 1e300

SAMPLERS = ("uniform", "gaussian", "ranges")


class EnvParamsError(ValueError):
    """A parameter set, value or sampler that breaks §19.1's rules; the message names what."""


def _number(value: Any, what: str, limit: float | None = MAX_MAGNITUDE) -> float:
    """A JSON number (not a bool), finite as a 64-bit float and, unless ``limit`` is None, of
    magnitude at most ``limit`` (a drawn value has no limit: a gaussian's may exceed it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EnvParamsError(f"{what} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or (limit is not None and abs(number) > limit):
        raise EnvParamsError(f"{what} must be a finite number" + ("" if limit is None else
                                                                  f" of magnitude at most {limit:g}"))
    return number


def parse_value(value: Any, what: str = "value") -> float | dict[str, Any]:
    """A parameter's value (§19.1): a number, or a sampler object, returned normalised (numbers as
    floats). Raises EnvParamsError naming ``what``."""
    if not isinstance(value, dict):
        return _number(value, what)
    kind = value.get("sampler")
    if kind not in SAMPLERS:
        raise EnvParamsError(f'{what}: "sampler" must be one of {", ".join(SAMPLERS)}, got {str(kind)[:40]!r}')
    keys = {"uniform": {"low", "high"}, "gaussian": {"mean", "std"}, "ranges": {"ranges"}}[kind]
    extra = set(value) - keys - {"sampler"}
    if extra or keys - set(value):
        raise EnvParamsError(f'{what}: a {kind} sampler has exactly the members sampler, {", ".join(sorted(keys))}')
    if kind == "uniform":
        low, high = _number(value["low"], f"{what}.low"), _number(value["high"], f"{what}.high")
        if low > high:
            raise EnvParamsError(f"{what}: low {low:g} is above high {high:g}")
        return {"sampler": kind, "low": low, "high": high}
    if kind == "gaussian":
        mean, std = _number(value["mean"], f"{what}.mean"), _number(value["std"], f"{what}.std")
        if std < 0:
            raise EnvParamsError(f"{what}: std {std:g} is negative")
        return {"sampler": kind, "mean": mean, "std": std}
    ranges = value["ranges"]
    if not isinstance(ranges, list) or not 1 <= len(ranges) <= MAX_RANGES:
        raise EnvParamsError(f"{what}: ranges must be a list of 1 to {MAX_RANGES} [low, high] pairs")
    pairs = []
    for i, pair in enumerate(ranges):
        if not isinstance(pair, list) or len(pair) != 2:
            raise EnvParamsError(f"{what}.ranges[{i}] must be a [low, high] pair")
        low, high = _number(pair[0], f"{what}.ranges[{i}][0]"), _number(pair[1], f"{what}.ranges[{i}][1]")
        if low > high:
            raise EnvParamsError(f"{what}.ranges[{i}]: low {low:g} is above high {high:g}")
        pairs.append([low, high])
    return {"sampler": kind, "ranges": pairs}


def measure_value(value: Any) -> float:
    """An episode's measure (§19.3): a number of magnitude at most MAX_MAGNITUDE. The one rule the
    SDK (at report_measure) and the server (in a record) both apply; EnvParamsError otherwise."""
    return _number(value, "measure")


def parse_name(name: Any, what: str = "parameter name") -> str:
    """A parameter's name: 1 to MAX_NAME_CHARS characters of Unicode text."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or not is_text(name):
        raise EnvParamsError(f"{what} must be text of 1 to {MAX_NAME_CHARS} characters, got {str(name)[:80]!r}")
    return name


@dataclass(frozen=True)
class EnvParams:
    """One parameter set as SET_STATE's ``env_params`` carries it (§19.1)."""

    seq: int
    lesson: int
    values: dict[str, float | dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "lesson": self.lesson, "values": dict(self.values)}


def parse_env_params(body: Any) -> EnvParams:
    """SET_STATE's ``env_params`` (§19.2). Raises EnvParamsError: a client ignores such a set."""
    if not isinstance(body, dict):
        raise EnvParamsError("env_params must be an object")
    seq, lesson, values = body.get("seq"), body.get("lesson"), body.get("values")
    if type(seq) is not int or seq < 1:
        raise EnvParamsError("env_params.seq must be an integer >= 1")
    if type(lesson) is not int or lesson < 0:
        raise EnvParamsError("env_params.lesson must be an integer >= 0")
    if not isinstance(values, dict) or len(values) > MAX_PARAMS:
        raise EnvParamsError(f"env_params.values must be an object of at most {MAX_PARAMS} parameters")
    return EnvParams(seq, lesson, {parse_name(name): parse_value(value, f"env_params.values[{name!r}]")
                                   for name, value in values.items()})


def draw(value: float | Mapping[str, Any], uniform: Callable[[], float]) -> float:
    """An episode's value of one parameter (§19.1): a number is itself; a sampler takes one uniform
    draw in [0, 1) from ``uniform`` (two for gaussian: the first for the radius, the second for
    the angle of Box-Muller's transform)."""
    if not isinstance(value, Mapping):
        return float(value)
    kind = value["sampler"]
    if kind == "uniform":
        u = uniform()
        return value["low"] + u * (value["high"] - value["low"])
    if kind == "gaussian":
        u1, u2 = uniform(), uniform()
        return value["mean"] + value["std"] * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
    ranges = value["ranges"]
    u = uniform()
    width = sum(high - low for low, high in ranges)
    if width == 0:  # every pair a point: each as often
        return ranges[min(int(u * len(ranges)), len(ranges) - 1)][0]
    x = u * width
    for low, high in ranges:
        if x < high - low:
            return low + x
        x -= high - low
    return ranges[-1][1]  # (x reached the total width: rounding)


def draw_all(values: Mapping[str, float | Mapping[str, Any]], uniform: Callable[[], float]) -> dict[str, float]:
    """An episode's values of a whole set, drawn in the set's order of names (sorted by code point)."""
    return {name: draw(values[name], uniform) for name in sorted(values)}


def allows(value: float | Mapping[str, Any], x: float) -> bool:
    """Whether ``x`` is a value ``value`` can give (§19.3): the number itself, a point of a uniform's
    or a range's closed interval, any finite number for a gaussian."""
    if not isinstance(value, Mapping):
        return x == value
    kind = value["sampler"]
    if kind == "uniform":
        return value["low"] <= x <= value["high"]
    if kind == "gaussian":
        return True
    return any(low <= x <= high for low, high in value["ranges"])


@dataclass(frozen=True)
class RecordEnvParams:
    """A record's ``env_params`` (§19.3): the set its episode was played with, the values drawn, and
    the measure the client reported for the episode, if any."""

    seq: int
    values: dict[str, float]
    measure: float | None = None


def decode_record_env_params(body: Any, where: str) -> RecordEnvParams | None:
    """A record's ``env_params`` (§10.6 check 21): None when absent, else its parts; INVALID_FIELD
    (as MessageError) naming ``where`` when it breaks §19.3's form."""
    if body is None:
        return None
    try:
        if not isinstance(body, dict) or set(body) - {"seq", "values", "measure"}:
            raise EnvParamsError("must be an object with seq, values and optionally measure")
        seq, values = body.get("seq"), body.get("values")
        if type(seq) is not int or seq < 1:
            raise EnvParamsError("seq must be an integer >= 1")
        if not isinstance(values, dict) or len(values) > MAX_PARAMS:
            raise EnvParamsError(f"values must be an object of at most {MAX_PARAMS} numbers")
        drawn = {parse_name(name): _number(value, f"values[{name!r}]", limit=None) for name, value in values.items()}
        measure = body.get("measure")
        measure = None if measure is None else measure_value(measure)
    except EnvParamsError as exc:
        raise MessageError(ErrorCode.INVALID_FIELD, f'{where}: "env_params" {exc}') from None
    return RecordEnvParams(seq, drawn, measure)


def check_played_with(record: RecordEnvParams, held: EnvParams, where: str) -> None:
    """A record's values against the set its ``seq`` names (§19.3): the same names, each value one
    that set can give. INVALID_FIELD (as MessageError) naming the first that is not."""
    if set(record.values) != set(held.values):
        raise MessageError(ErrorCode.INVALID_FIELD,
                           f'{where}: "env_params" of set {held.seq} must have the values {sorted(held.values)}, '
                           f'got {sorted(record.values)}')
    for name, x in record.values.items():
        if not allows(held.values[name], x):
            raise MessageError(ErrorCode.INVALID_FIELD,
                               f'{where}: "env_params" value {name!r} = {x!r} is not one set {held.seq} gives '
                               f'({held.values[name]!r})')


def record_env_params(seq: int, values: Mapping[str, float], measure: float | None = None) -> dict[str, Any]:
    """The record member for an episode played with ``values`` of set ``seq`` (§19.3)."""
    body: dict[str, Any] = {"seq": seq, "values": dict(values)}
    if measure is not None:
        body["measure"] = measure
    return body
