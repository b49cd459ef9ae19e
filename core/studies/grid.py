"""A study's grid: axes (dotted paths into a train spec) whose product makes the cells.

An axis is a path such as `model.name`, `model.options.unit` (or `options.unit`),
`recipe.lr` or `dataset.train_limit`. Every cell x seed is validated as a train job spec
before anything is written; a bad cell is an `InvalidError` naming the cell and the field.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from core.errors import InvalidError
from core.kinds import TrainJobSpec

SECTIONS = ("model", "dataset", "recipe")


@dataclass(frozen=True)
class Expanded:
    """The cells of a grid in order, and each cell x seed's validated job spec."""

    cells: list[dict[str, Any]]
    jobs: list[tuple[int, int, TrainJobSpec]]  # (cell index, seed, spec), seed-major


def axis_path(axis: str) -> tuple[str, ...]:
    """The spec path of an axis; `options.X` is short for `model.options.X`."""
    parts = tuple(axis.split("."))
    if parts[0] == "options":
        parts = ("model", *parts)
    if parts[0] not in SECTIONS or len(parts) < 2 or not all(parts):
        raise InvalidError(
            f"grid axis {axis!r} must be a field path under model, dataset or recipe "
            "(e.g. model.name, options.unit, recipe.lr, dataset.train_limit)",
            field=("body", "grid", axis),
        )
    return parts


def cells(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the axes' values, the first axis varying slowest."""
    for axis, values in grid.items():
        axis_path(axis)
        if not values:
            raise InvalidError(f"grid axis {axis!r} has no values", field=("body", "grid", axis))
    axes = list(grid)
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*grid.values())]


def expand(
    base: dict[str, Any],
    grid: dict[str, list[Any]],
    seeds: list[int],
    *,
    name: str | None,
    tags: list[str],
    max_jobs: int,
) -> Expanded:
    """Every cell x seed as a validated train spec, or `InvalidError` for the first bad one."""
    found = cells(grid)
    total = len(found) * len(seeds)
    if total > max_jobs:
        raise InvalidError(
            f"the study has {len(found)} cells x {len(seeds)} seeds = {total} jobs, over the "
            f"limit of {max_jobs}; use fewer axis values or seeds (MAX_STUDY_JOBS)",
            field=("body", "grid"),
        )
    jobs = []
    for seed in seeds:
        for index, cell in enumerate(found):
            payload = payload_of(base, cell, seed, name=name, tags=tags)
            jobs.append((index, seed, _validated(payload, index, cell)))
    return Expanded(found, jobs)


def payload_of(
    base: dict[str, Any], cell: dict[str, Any], seed: int, *, name: str | None, tags: list[str]
) -> dict[str, Any]:
    """The train spec payload of one cell and seed: the base with the cell's values set."""
    payload = copy.deepcopy(base)
    for axis, value in cell.items():
        *parents, leaf = axis_path(axis)
        node = payload
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InvalidError(
                    f"grid axis {axis!r} goes through {part!r}, which is not an object",
                    field=("body", "grid", axis),
                )
            node = child
        node[leaf] = value
    payload.setdefault("recipe", {})["seed"] = seed
    label = ", ".join(f"{axis}={value}" for axis, value in cell.items())
    title = f"{name}: {label}, seed {seed}" if name else f"{label}, seed {seed}"
    payload["name"] = title[:200]
    payload["tags"] = tags
    return {"kind": "train", **payload}


def _validated(payload: dict[str, Any], index: int, cell: dict[str, Any]) -> TrainJobSpec:
    try:
        return TrainJobSpec.model_validate(payload)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(_in_payload(payload, problem["loc"]))
        message = str(problem["msg"]).removeprefix("Value error, ")
        label = ", ".join(f"{axis}={value!r}" for axis, value in cell.items())
        axis = next((a for a in cell if _overlaps(".".join(axis_path(a)), where)), None)
        field = (
            ("body", "grid", axis) if axis else ("body", "base", *filter(None, where.split(".")))
        )
        at = f"{where}: " if where else ""  # a check of the whole spec names no field
        raise InvalidError(f"cell {index} ({label}): {at}{message}", field=field) from None


def _overlaps(path: str, where: str) -> bool:
    """Whether an axis's path and an error's location name the same field, or one holds
    the other (a model-level error blames the axis that varies the model's name)."""
    return f"{path}.".startswith(f"{where}.") or f"{where}.".startswith(f"{path}.")


def _in_payload(payload: dict[str, Any], loc: tuple[int | str, ...]) -> list[str]:
    """A pydantic location without the union tags it adds (parts that are no key there)."""
    path: list[str] = []
    node: Any = payload
    for part in loc:
        if isinstance(node, dict) and part not in node and part == node.get("name"):
            continue  # the dataset union's tag
        path.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return path
