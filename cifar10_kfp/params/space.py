"""The search space of a study: a JSON object of ``TrainConfig`` field -> distribution.

    {"lr": {"type": "float", "low": 0.05, "high": 1.0, "log": true},
     "label_smoothing": {"type": "float", "low": 0.0, "high": 0.3},
     "batch_size": {"type": "categorical", "choices": [128, 256, 512]}}

``type`` is ``float`` (a float field), ``int`` (an int field) or ``categorical`` (any searchable
field; each choice must be a value of the field). Only ``TrainConfig`` fields that change what
is learned may be searched: not ``preset`` (pick one), not ``eval_split`` (trials are scored on
the validation split), not ``epochs`` (``trial_epochs`` sets a
trial's length) and not the runtime fields (device, threads, checkpoints...). Every error is a
``ValueError`` that starts with ``search_space.<field>`` and says what to change. ``check``
(given by ``cifar10_kfp.params``) builds the training config at each end of a range and at each
choice, so a range the trainer would refuse (``lr`` low 0) is refused here, before anything runs.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import optuna

SEARCH_TYPES = ("float", "int", "categorical")
MAX_DIMENSIONS = 32
MAX_CHOICES = 64
_KEYS = {"float": {"type", "low", "high", "log"}, "int": {"type", "low", "high", "log"},
         "categorical": {"type", "choices"}}  # fmt: skip


@dataclass(frozen=True)
class Dimension:
    """One searched field: a float or int range (``log`` for a log scale) or a list of choices."""

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple = ()

    def suggest(self, trial: optuna.Trial) -> typing.Any:
        """The value of this field for an Optuna ``trial``."""
        # keywords only: Optuna 5 refuses positional arguments to suggest_*
        if self.kind in ("float", "int"):
            # parse_dimension set both ends, as float or int by kind: the conversions change no value
            assert self.low is not None and self.high is not None
            if self.kind == "float":
                return trial.suggest_float(
                    name=self.name, low=float(self.low), high=float(self.high), log=self.log
                )
            return trial.suggest_int(name=self.name, low=int(self.low), high=int(self.high), log=self.log)
        return trial.suggest_categorical(name=self.name, choices=list(self.choices))

    def size(self) -> int | None:
        """How many values this dimension has; None for a float range (uncountably many)."""
        if self.kind == "categorical":
            return len(self.choices)
        if self.kind == "int":
            assert self.low is not None and self.high is not None
            return int(self.high) - int(self.low) + 1
        return None

    def corners(self) -> list:
        """The values that bound this dimension: both ends of a range, or every choice."""
        return [self.low, self.high] if self.kind != "categorical" else list(self.choices)

    def to_json(self) -> dict:
        if self.kind == "categorical":
            return {"type": self.kind, "choices": list(self.choices)}
        return {"type": self.kind, "low": self.low, "high": self.high, "log": self.log}


def searchable_fields() -> dict[str, type]:
    """``TrainConfig`` fields a study may search, with their Python types."""
    from cifar10_kfp.train.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    skipped = set(TrainConfig.RUNTIME_FIELDS) | {"preset", "epochs", "eval_split"}
    return {name: kind for name, kind in hints.items() if name not in skipped and not name.isupper()}


def _refuse(name: str, problem: str) -> ValueError:
    return ValueError(f"search_space.{name}: {problem}")


def _number(name: str, key: str, value, kind: str):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _refuse(name, f"{key}={value!r} must be a finite number")
    if kind == "int":
        if isinstance(value, float) and not value.is_integer():
            raise _refuse(name, f"{key}={value!r} must be an integer for type 'int'")
        return int(value)
    return float(value)


def parse_dimension(name: str, spec, field_types: Mapping[str, type]) -> Dimension:
    """One field's distribution, checked against the field's type."""
    if name not in field_types:
        raise _refuse(name, f"not a searchable training field: use one of {', '.join(sorted(field_types))}")
    if not isinstance(spec, Mapping) or spec.get("type") not in SEARCH_TYPES:
        raise _refuse(name, f'expected an object with "type": one of {", ".join(SEARCH_TYPES)}, got {spec!r}')
    kind = spec["type"]
    extra = sorted(set(spec) - _KEYS[kind])
    if extra:
        raise _refuse(
            name, f"unknown key(s) {', '.join(extra)} for type {kind!r}: use {', '.join(sorted(_KEYS[kind]))}"
        )
    field_type = field_types[name]
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
            raise _refuse(name, f"choices must be a list of 1..{MAX_CHOICES} values, got {choices!r}")
        if len({json.dumps(c, sort_keys=True) for c in choices}) != len(choices):
            raise _refuse(name, f"choices {choices!r} repeat a value")
        if any(isinstance(c, (dict, list)) for c in choices):
            raise _refuse(name, "choices must be numbers, strings or booleans (Optuna stores them as such)")
        return Dimension(name, kind, choices=tuple(choices))
    if field_type is not (float if kind == "float" else int):
        raise _refuse(name, f"type {kind!r} does not fit the field ({field_type.__name__}): use "
                            f"{'categorical' if field_type not in (int, float) else field_type.__name__!r}")  # fmt: skip
    if "low" not in spec or "high" not in spec:
        raise _refuse(name, "a range needs both low and high")
    low, high = _number(name, "low", spec["low"], kind), _number(name, "high", spec["high"], kind)
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise _refuse(name, f"log={log!r} must be true or false")
    if not low < high:
        raise _refuse(name, f"low={low!r} must be below high={high!r}")
    if log and low <= 0:
        raise _refuse(name, f"a log scale needs low > 0, got low={low!r}")
    return Dimension(name, kind, low, high, log)


def parse_search_space(
    text: str | Mapping, check: Callable[[dict], object] | None = None
) -> dict[str, Dimension]:
    """Parse and validate a search space (JSON text or a mapping); ``check(overrides)`` raises on a bad config."""
    if isinstance(text, str):
        try:
            raw = json.loads(text) if text.strip() else None
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"search_space is not valid JSON ({exc.msg} at char {exc.pos}): {text!r}"
            ) from None
    else:
        raw = text
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(
            f"search_space must be a non-empty JSON object of field -> distribution, got {text!r}"
        )
    if len(raw) > MAX_DIMENSIONS:
        raise ValueError(f"search_space has {len(raw)} fields: use at most {MAX_DIMENSIONS}")
    field_types = searchable_fields()
    space = {name: parse_dimension(name, spec, field_types) for name, spec in raw.items()}
    if check is not None:
        for dim in space.values():
            for value in dim.corners():
                try:
                    check({dim.name: value})
                except (ValueError, TypeError) as exc:
                    raise _refuse(dim.name, f"{value!r} is not a valid value: {exc}") from None
    return space


def candidate_count(space: Mapping[str, Dimension]) -> int | None:
    """How many configurations a discrete space holds (choices and int ranges); None if it has a float range."""
    count = 1
    for dim in space.values():
        size = dim.size()
        if size is None:
            return None
        count *= size
    return count


def space_json(space: Mapping[str, Dimension]) -> str:
    """The normalised JSON text of a parsed space (keys sorted)."""
    return json.dumps({name: dim.to_json() for name, dim in space.items()}, sort_keys=True)
