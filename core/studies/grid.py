"""A study's grid: axes (dotted paths into a train spec) whose product makes the cells.

An axis is a path such as `model.name`, `model.options.unit` (or `options.unit`),
`recipe.lr` or `dataset.train_limit`. Every cell x seed is validated as a train job spec
before anything is written; a bad cell is an `InvalidError` naming the cell and the field.
A study's size is checked from its axes' lengths before any cell is made, and the nets
its cells ask admission to count are bounded before any is counted.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from core import admission
from core.errors import InvalidError
from core.kinds import TrainJobSpec, train
from core.settings import Settings
from training.specs import TrainSpec

SECTIONS = ("model", "dataset", "recipe")
MAX_AXES = 16  # a grid of more axes than a train spec has fields to vary is a mistake
# A train spec nests three levels (the spec, model, options); copying and validating a far
# deeper body exhausts Python's recursion (a 500 at 500 levels), so it is refused first.
MAX_NESTING = 16


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
    check_axes(grid)
    axes = list(grid)
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*grid.values())]


def check_axes(grid: dict[str, list[Any]]) -> None:
    """`InvalidError` unless the grid has at most `MAX_AXES` axes, each a field path with
    values."""
    if len(grid) > MAX_AXES:
        raise InvalidError(
            f"the grid has {len(grid)} axes, over the limit of {MAX_AXES}; vary fewer fields "
            "(a field that keeps one value goes into base)",
            field=("body", "grid"),
        )
    for axis, values in grid.items():
        if axis_path(axis) == ("recipe", "seed"):
            raise InvalidError(
                "grid axis 'recipe.seed' would be replaced by each job's seed; give the "
                "study's seeds instead (seeds: a number or a list)",
                field=("body", "grid", axis),
            )
        if not values:
            raise InvalidError(f"grid axis {axis!r} has no values", field=("body", "grid", axis))


def check_size(grid: dict[str, list[Any]], seeds: list[int], *, max_jobs: int) -> None:
    """`InvalidError` when the grid's cells x seeds pass `max_jobs`, told from the axes'
    lengths: no cell is made (3 axes of 100 values would be a million)."""
    check_axes(grid)
    count = math.prod(len(values) for values in grid.values())
    total = count * len(seeds)
    if total > max_jobs:
        lengths = " x ".join(str(len(values)) for values in grid.values())
        raise InvalidError(
            f"the study has {count} cells ({lengths} axis values) x {len(seeds)} seeds = "
            f"{total} jobs, over the limit of {max_jobs}; use fewer axis values or seeds "
            "(MAX_STUDY_JOBS)",
            field=("body", "grid"),
        )


def check_nesting(base: dict[str, Any], grid: dict[str, list[Any]]) -> None:
    """`InvalidError` when the base or a grid value nests objects and lists deeper than
    `MAX_NESTING`."""
    if _nests_past(base, MAX_NESTING):
        raise InvalidError(
            f"the study's base nests objects and lists more than {MAX_NESTING} levels deep; "
            "a train spec needs three (the spec, model, options)",
            field=("body", "base"),
        )
    for axis, values in grid.items():
        if _nests_past(values, MAX_NESTING):
            raise InvalidError(
                f"grid axis {axis!r} has a value that nests objects and lists more than "
                f"{MAX_NESTING - 1} levels deep",
                field=("body", "grid", axis),
            )


def _nests_past(value: Any, limit: int) -> bool:
    """Whether objects and lists nest in `value` more than `limit` levels (walked without
    recursion, so any depth is safe to ask about)."""
    stack = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            if level >= limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return False


def expand(
    base: dict[str, Any],
    grid: dict[str, list[Any]],
    seeds: list[int],
    *,
    settings: Settings,
    name: str | None,
    tags: list[str],
    max_jobs: int,
    max_families: int | None = None,
) -> Expanded:
    """Every cell x seed as a train spec validated within the budgets of `settings`, or
    `InvalidError` for the first bad one.

    With `max_families`, the cells may ask admission to count at most that many net
    families (`admission.family`); None bounds nothing (a study run locally)."""
    check_size(grid, seeds, max_jobs=max_jobs)
    check_nesting(base, grid)
    found = cells(grid)
    if max_families is not None:
        payloads = [payload_of(base, cell, seeds[0], name=name, tags=tags) for cell in found]
        _check_families(payloads, found, max_families)
    jobs = []
    for seed in seeds:
        for index, cell in enumerate(found):
            payload = payload_of(base, cell, seed, name=name, tags=tags)
            jobs.append((index, seed, validated(settings, payload, index, cell)))
    return Expanded(found, jobs)


def _check_families(
    payloads: list[dict[str, Any]], found: list[dict[str, Any]], limit: int
) -> None:
    """`InvalidError` when the cells' nets fall into more than `limit` families. Each family
    costs admission seconds of counting on the meta device; its depths add nothing. A cell
    that is no valid spec is left to its own message."""
    families: set[Hashable] = set()
    seen: set[str] = set()
    for index, payload in enumerate(payloads):
        net = {"model": payload.get("model"), "dataset": payload.get("dataset")}
        text = json.dumps(net, sort_keys=True, default=repr)
        if text in seen:  # many cells share a net (a sweep of recipe.lr): checked once
            continue
        seen.add(text)
        family = _family(net)
        if family is None:
            continue
        families.add(family)
        if len(families) > limit:
            label = ", ".join(f"{axis}={_shown(value)}" for axis, value in found[index].items())
            raise InvalidError(
                f"the study's cells have more than {limit} net families, over "
                f"MAX_STUDY_NET_FAMILIES = {limit}: cell {index} ({label}) starts family "
                f"{len(families)}. A family is a net apart from its depth (its block, unit "
                "and options) on one data shape (image size, channels, classes); admission "
                "counts each on the meta device, seconds of CPU apiece. Vary fewer model "
                "options or dataset shapes, or split the study",
                field=("body", "grid"),
            )


def _family(net: dict[str, Any]) -> Hashable | None:
    """The net family admission counts for a cell's model and dataset; None when they are
    no valid spec."""
    try:
        spec = TrainSpec.model_validate(net)
    except ValueError:  # pydantic's ValidationError is one
        return None
    return admission.family(spec, admission.shape_of(spec.dataset))


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


def validated(
    settings: Settings, payload: dict[str, Any], index: int, cell: dict[str, Any]
) -> TrainJobSpec:
    """The cell's payload as a train job spec within `settings`' budgets, or `InvalidError`
    naming the cell and the field."""
    try:
        return train.KIND.parse(payload, settings)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(_in_payload(payload, problem["loc"]))
        message = str(problem["msg"]).removeprefix("Value error, ")
        label = ", ".join(f"{axis}={_shown(value)}" for axis, value in cell.items())
        axis = next((a for a in cell if _overlaps(".".join(axis_path(a)), where)), None)
        field = (
            ("body", "grid", axis) if axis else ("body", "base", *filter(None, where.split(".")))
        )
        at = f"{where}: " if where else ""  # a check of the whole spec names no field
        raise InvalidError(f"cell {index} ({label}): {at}{message}", field=field) from None


def _shown(value: Any) -> str:
    """A cell's value in a message, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


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
