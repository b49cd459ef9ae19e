"""A search's space: spec paths (as a grid's axes) and the distribution each is drawn from.

A parameter is `{"type": "choice", "values": [...]}`, `{"type": "uniform", "low": a,
"high": b}`, `{"type": "loguniform", "low": a, "high": b}` or `{"type": "int", "low": a,
"high": b, "step": s, "log": false}`, as Ray Tune's `choice`, `uniform`, `loguniform` and
`randint` name them. Each becomes one of Optuna's distributions, so its samplers, pruners
and importance evaluators read the space as they read their own.
"""

from __future__ import annotations

import json
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from core.errors import InvalidError
from core.studies import grid

TYPES = ("choice", "uniform", "loguniform", "int")
MAX_CHOICES = 1000


def distributions(space: dict[str, dict[str, Any]]) -> dict[str, BaseDistribution]:
    """Each path's Optuna distribution, or `InvalidError` naming the bad parameter."""
    if not space:
        raise InvalidError(
            "a search needs a space: spec paths with a distribution each, e.g. "
            '{"recipe.lr": {"type": "loguniform", "low": 0.01, "high": 0.5}}',
            field=("body", "space"),
        )
    grid.check_axes({path: [None] for path in space})
    return {path: _distribution(path, param) for path, param in space.items()}


def _distribution(path: str, param: dict[str, Any]) -> BaseDistribution:
    where = ("body", "space", path)
    kind = param.get("type") if isinstance(param, dict) else None
    if kind not in TYPES:
        raise InvalidError(
            f"space parameter {path!r} needs a type, one of {', '.join(TYPES)}", field=where
        )
    assert isinstance(param, dict)
    allowed = {"choice": {"values"}, "int": {"low", "high", "step", "log"}}.get(
        kind, {"low", "high"}
    )
    if extra := sorted(set(param) - allowed - {"type"}):
        raise InvalidError(
            f"space parameter {path!r} ({kind}) takes {', '.join(sorted(allowed))}, "
            f"not {', '.join(extra)}",
            field=where,
        )
    if kind == "choice":
        return _choice(path, param.get("values"), where)
    low, high = param.get("low"), param.get("high")
    numbers = (int,) if kind == "int" else (int, float)
    if not all(isinstance(v, numbers) and not isinstance(v, bool) for v in (low, high)):
        what = "integers" if kind == "int" else "numbers"
        raise InvalidError(f"space parameter {path!r} needs low and high {what}", field=where)
    assert low is not None
    assert high is not None
    if low > high:
        raise InvalidError(f"space parameter {path!r} has low {low} above high {high}", field=where)
    log = kind == "loguniform" or bool(param.get("log", False))
    if log and low <= 0:
        raise InvalidError(
            f"space parameter {path!r} is drawn on a log scale, so low must be above 0 (got {low})",
            field=where,
        )
    if kind == "int":
        step = param.get("step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise InvalidError(f"space parameter {path!r} needs a step of 1 or more", field=where)
        if log and step != 1:
            raise InvalidError(
                f"space parameter {path!r}: a log-scale int takes no step", field=where
            )
        return IntDistribution(low, high, log=log, step=step)
    return FloatDistribution(float(low), float(high), log=log)


def _choice(path: str, values: Any, where: tuple[str, ...]) -> CategoricalDistribution:
    if not isinstance(values, list) or not values:
        raise InvalidError(
            f"space parameter {path!r} (choice) needs a non-empty list of values", field=where
        )
    if len(values) > MAX_CHOICES:
        raise InvalidError(
            f"space parameter {path!r} has {len(values)} choices, over {MAX_CHOICES}",
            field=where,
        )
    # Optuna keeps choices of None, bool, int, float and str; an object is kept as its JSON.
    return CategoricalDistribution([storable(value) for value in values])


def storable(value: Any) -> Any:
    """A choice as Optuna keeps it: None, a bool, number or string as itself, else its JSON."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True)


def spec_value(distribution: BaseDistribution, value: Any) -> Any:
    """A sampled value as it goes into the spec: a choice kept as JSON is an object again."""
    if isinstance(distribution, CategoricalDistribution) and isinstance(value, str):
        originals = [c for c in distribution.choices if isinstance(c, str)]
        if value in originals:
            try:
                decoded = json.loads(value)
            except ValueError:
                return value
            return decoded if isinstance(decoded, dict | list) else value
    return value
