"""A study's results: each cell aggregated over its seeds, beside the papers' number.

Every statistic is computed from the jobs' own rows: final and best test error from the
job summary columns, final training error from the last `train/error` metric point.
`std` is the sample standard deviation (n - 1); it is None with fewer than two seeds.
`median_ci` and `mean_ci` are 95% bootstrap intervals (`significance.interval`).

`claims` tests the orderings a preset's paper states between its cells on the seeds
(Holm-adjusted across them), `comparisons` any two cells or every cell against one, and
`plan` says how many seeds more each cell needs to settle the claims left open.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import math
import statistics
import uuid
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db.tables import Job, Metric, Study
from core.errors import InvalidError
from core.studies import presets, significance

ERRORS = ("final_train_error", "final_test_error", "best_test_error")
STATS = ("median", "mean", "std", "min", "max")
INTERVALS = ("median_ci", "mean_ci")
CONFIDENCE = 0.95
LEVEL = 0.05  # a claim's verdict: its Holm-adjusted one-sided p at most this
POWER = 0.8  # the planner's chance of settling an open claim with the seeds it asks for
MAX_PAIRED_CELLS = 20  # every pair of more cells is too many comparisons: name a reference
TRAIN_ERROR = "train/error"


def stats(values: list[float]) -> dict[str, float | None]:
    """median, mean, std, min and max of `values` (all None when there are none)."""
    if not values:
        return dict.fromkeys(STATS)
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values),
        "max": max(values),
    }


def cells(*, session: Session, study: Study) -> list[dict[str, Any]]:
    """Per cell: its values, seeds done and failed, each error's statistics, params, MACs,
    the papers' number and our median's difference to it."""
    rows = list(session.scalars(select(Job).where(Job.study_id == study.id)))
    train_errors = _final_metric(session, [job.id for job in rows if job.status == "succeeded"])
    by_cell: defaultdict[int, list[Job]] = defaultdict(list)
    for job in rows:
        by_cell[job.cell or 0].append(job)
    return [
        _cell(index, cell, by_cell[index], train_errors, study.metric)
        for index, cell in enumerate(study.cells)
    ]


def _cell(
    index: int,
    cell: dict[str, Any],
    jobs: list[Job],
    train_errors: dict[uuid.UUID, float],
    metric: str,
) -> dict[str, Any]:
    done = sorted((job for job in jobs if job.status == "succeeded"), key=_seed)
    values: dict[str, list[float | None]] = {
        "final_train_error": [train_errors.get(job.id) for job in done],
        "final_test_error": [job.final_test_error for job in done],
        "best_test_error": [job.best_test_error for job in done],
    }
    samples = {
        name: [v for v in found if v is not None and math.isfinite(v)]
        for name, found in values.items()
    }
    errors = {name: {**stats(found), **intervals(found)} for name, found in samples.items()}
    paper, ours = cell.get("paper"), errors[metric]["median"]
    return {
        "cell": index,
        "values": cell["values"],
        "jobs": len(jobs),
        "seeds_done": sorted(_seed(job) for job in done),
        "failed": sum(job.status == "failed" for job in jobs),
        "cancelled": sum(job.status == "cancelled" for job in jobs),
        **errors,
        "params": done[0].params if done else None,
        "macs": done[0].macs if done else None,
        "paper": paper,
        "difference": ours - paper if ours is not None and paper is not None else None,
        **ran_on(jobs),
        "samples": samples,  # each error's values, by seed: what `claims` tests
    }


def intervals(values: list[float]) -> dict[str, list[float] | None]:
    """The median's and the mean's `CONFIDENCE` bootstrap intervals, [low, high] (None
    under 2 values)."""
    found = {
        f"{stat}_ci": significance.interval(values, stat, CONFIDENCE) for stat in ("median", "mean")
    }
    return {key: None if ci is None else list(ci) for key, ci in found.items()}


def ran_on(jobs: list[Job]) -> dict[str, Any]:
    """The data digests and environments of a cell's jobs (those that loaded their data),
    and a warning where its seeds ran on different ones: they are then not one measurement."""
    digests = sorted({job.data_digest for job in jobs if job.data_digest})
    environments = sorted({environment_label(job.environment) for job in jobs if job.environment})
    warnings = [
        f"its jobs ran on {len(found)} different {what}"
        for found, what in ((digests, "data digests"), (environments, "environments"))
        if len(found) > 1
    ]
    return {"data_digests": digests, "environments": environments, "warnings": warnings}


def environment_label(environment: dict[str, Any]) -> str:
    """An environment in one line: the service's commit, torch, CUDA, cuDNN and the device."""
    commit = (environment.get("git_commit") or "")[:12] or "-"
    return (
        f"service {environment.get('service')} ({commit}), torch {environment.get('torch')}, "
        f"CUDA {environment.get('cuda') or '-'}, cuDNN {environment.get('cudnn') or '-'}, "
        f"{environment.get('device')} ({environment.get('device_type')})"
    )


def _seed(job: Job) -> int:
    return int(job.spec["recipe"]["seed"])


def _final_metric(session: Session, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, float]:
    """Each job's last `train/error` point."""
    if not job_ids:
        return {}
    last = (
        select(Metric.job_id, func.max(Metric.step).label("step"))
        .where(Metric.job_id.in_(job_ids), Metric.name == TRAIN_ERROR)
        .group_by(Metric.job_id)
        .subquery()
    )
    query = select(Metric.job_id, Metric.value).join(
        last, (Metric.job_id == last.c.job_id) & (Metric.step == last.c.step)
    )
    return {
        job_id: value for job_id, value in session.execute(query.where(Metric.name == TRAIN_ERROR))
    }


def axes_of(study: Study) -> list[str]:
    """The paths a study's cells vary: its grid's axes, or a search's space."""
    return list(study.spec["grid"] or study.spec.get("search", {}).get("space", {}))


def table(study: Study, results: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The results as a header and rows: a cell's axis values, then the statistics."""
    axes = axes_of(study)
    header = [
        *axes,
        "seeds",
        "failed",
        *(f"{error}_{stat}" for error in ERRORS for stat in STATS),
        "params",
        "macs",
        f"paper_{study.metric}",
        "difference",
        *(f"{error}_{ci}_{end}" for error in ERRORS for ci in INTERVALS for end in ENDS),
    ]
    rows = [
        [
            *(row["values"][axis] for axis in axes),
            len(row["seeds_done"]),
            row["failed"],
            *(row[error][stat] for error in ERRORS for stat in STATS),
            row["params"],
            row["macs"],
            row["paper"],
            row["difference"],
            *_interval_ends(row),
        ]
        for row in results
    ]
    return header, rows


ENDS = ("low", "high")


def _interval_ends(row: dict[str, Any]) -> list[float | None]:
    """Each error's intervals' low and high ends, as the table's last columns."""
    return [
        None if row[error].get(ci) is None else row[error][ci][ENDS.index(end)]
        for error in ERRORS
        for ci in INTERVALS
        for end in ENDS
    ]


def as_csv(study: Study, results: list[dict[str, Any]]) -> str:
    """The results table as CSV (errors as fractions)."""
    header, rows = table(study, results)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows([["" if value is None else value for value in row] for row in rows])
    return out.getvalue()


def as_markdown(study: Study, results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table the way the papers print them: errors in %,
    median over seeds (with min-max), the papers' number and our difference."""
    axes = axes_of(study)
    metric = study.metric
    lines = [
        "| "
        + " | ".join(
            [
                *axes,
                "seeds",
                *(e.replace("_", " ") for e in ERRORS),
                "paper",
                "ours - paper",
                "median 95% CI",
            ]
        )
        + " |",
        "|" + "---|" * (len(axes) + len(ERRORS) + 4),
    ]
    for row in results:
        cells = [cell_label({axis: row["values"][axis]}) for axis in axes]
        cells.append(f"{len(row['seeds_done'])}/{row['jobs']}")
        cells += [_percent_range(row[error]) for error in ERRORS]
        cells.append(_percent(row["paper"]))
        cells.append(_signed(row["difference"]))
        cells.append(_percent_interval(row[metric].get("median_ci")))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Errors in %, median over seeds (min-max); the papers' number is {metric}, and so "
        f"is the median's {CONFIDENCE:.0%} bootstrap interval."
    )
    for row in results:
        for warning in row.get("warnings", []):
            lines.append(f"Cell {row['cell']} ({cell_label(row['values'])}): {warning}.")
    found = claims(study, results)
    if found:
        lines += ["", *claims_markdown(found)]
    return "\n".join(lines) + "\n"


def _percent_interval(found: list[float] | None) -> str:
    return "-" if found is None else f"{_percent(found[0])}-{_percent(found[1])}"


def cell_label(values: dict[str, Any]) -> str:
    """A cell's values in a few words: `resnet20, 0.1`; an object's as `key=value` pairs."""
    return ", ".join(_value_text(value) for value in values.values())


def _value_text(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{key}={item}" for key, item in value.items())
    return str(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.2f}"


def _percent_range(found: dict[str, float | None]) -> str:
    if found["median"] is None:
        return "-"
    low, high = found["min"], found["max"]
    spread = f" ({_percent(low)}-{_percent(high)})" if low != high else ""
    return _percent(found["median"]) + spread


def curves(
    *,
    session: Session,
    study: Study,
    metric: str,
    center: str = "median",
    band: str = "minmax",
    limit: int = 500,
) -> list[dict[str, Any]]:
    """Per cell, at each step some seed logged `metric`: the median (or mean) over seeds and
    a band, min-max (or +-std); steps evenly thinned to `limit`, each value exact."""
    owners = {
        job_id: cell
        for job_id, cell in session.execute(
            select(Job.id, Job.cell).where(
                Job.study_id == study.id, Job.status.in_(("running", "succeeded"))
            )
        )
    }
    values: defaultdict[int, defaultdict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    if owners:
        points = select(Metric.job_id, Metric.step, Metric.value).where(
            Metric.job_id.in_(list(owners)), Metric.name == metric
        )
        for job_id, step, value in session.execute(points):
            values[owners[job_id] or 0][step].append(value)
    return [
        {
            "cell": index,
            "values": cell["values"],
            **_series(values[index], center, band, limit),
        }
        for index, cell in enumerate(study.cells)
    ]


def _series(
    by_step: dict[int, list[float]], center: str, band: str, max_points: int
) -> dict[str, list[Any]]:
    steps = _thinned(sorted(by_step), max_points)
    middle, lower, upper, seeds = [], [], [], []
    for step in steps:
        found = stats(by_step[step])
        mid = found[center]
        spread = found["std"] or 0.0
        middle.append(mid)
        lower.append(found["min"] if band == "minmax" else (mid or 0.0) - spread)
        upper.append(found["max"] if band == "minmax" else (mid or 0.0) + spread)
        seeds.append(len(by_step[step]))
    return {"steps": steps, "center": middle, "lower": lower, "upper": upper, "seeds": seeds}


def _thinned(steps: list[int], max_points: int) -> list[int]:
    """At most `max_points` of `steps`, evenly spread, first and last kept."""
    if len(steps) <= max_points:
        return steps
    last = len(steps) - 1
    picks = sorted({round(i * last / (max_points - 1)) for i in range(max_points)})
    return [steps[i] for i in picks]


# --- What the seeds say with confidence ----------------------------------------------------


def claims(
    study: Study,
    results: list[dict[str, Any]],
    *,
    level: float = LEVEL,
    power: float = POWER,
    test: significance.Test = "welch",
) -> list[dict[str, Any]]:
    """The orderings the study's preset states between its cells (at its scale, between
    cells it has), each judged on the seeds (`significance.judge_all`, Holm across them);
    an inconclusive one with the seeds per cell that would settle it (`seeds_needed`) and
    that advice in words."""
    pairs = _claimed_pairs(study, results)
    judged = significance.judge_all(
        [(claim, a["samples"][claim.metric], b["samples"][claim.metric]) for claim, a, b in pairs],
        level=level,
        test=test,
    )
    tested = max(1, sum(found["p"] is not None for found in judged))
    return [
        {
            **found,
            "metric": claim.metric,
            "relation": claim.relation,
            "a": a["cell"],
            "b": b["cell"],
            **_advice(found, a, b, claim.metric, level / tested, power),
        }
        for found, (claim, a, b) in zip(judged, pairs, strict=True)
    ]


def _claimed_pairs(
    study: Study, results: list[dict[str, Any]]
) -> list[tuple[significance.Claim, dict[str, Any], dict[str, Any]]]:
    """Each claim of the study's preset with the two cells it names. A claim names a cell by
    some axes; where the grid has others (a depth axis beside a unit axis), it holds at each
    of their values, between the cells that share them."""
    preset = presets.PRESETS.get(study.preset or "")
    if preset is None:
        return []
    scale = study.spec.get("scale") or "quick"
    found = []
    for claim in preset.claims:
        if scale not in claim.scales:
            continue
        for a in (row for row in results if _matches(row["values"], claim.a)):
            others = {k: v for k, v in a["values"].items() if k not in {*claim.a, *claim.b}}
            for b in results:
                if _matches(b["values"], {**claim.b, **others}) and b is not a:
                    found.append((dataclasses.replace(claim, where=others), a, b))
    return found


def _matches(values: dict[str, Any], named: Mapping[str, Any]) -> bool:
    return all(axis in values and values[axis] == value for axis, value in named.items())


def _advice(
    found: dict[str, Any],
    a: dict[str, Any],
    b: dict[str, Any],
    metric: str,
    level: float,
    power: float,
) -> dict[str, Any]:
    """For an inconclusive claim: the seeds per cell that would settle it at `level` with
    `power` (at least one more than either cell has) and the advice in words."""
    if found["verdict"] != "inconclusive":
        return {"seeds_needed": None, "advice": None}
    x, y = a["samples"][metric], b["samples"][metric]
    if min(len(x), len(y)) < 2:
        return {"seeds_needed": None, "advice": "needs at least 2 finished seeds in each cell"}
    needed = significance.seeds_needed(x, y, level, power)
    if needed is None:
        return {
            "seeds_needed": None,
            "advice": f"not resolvable within {significance.MAX_SEEDS} seeds: the gap is too "
            "small against the seeds' spread",
        }
    needed = max(needed, len(x) + 1, len(y) + 1)
    return {
        "seeds_needed": needed,
        "advice": f"about {needed} seeds per cell would settle it (power {power:.0%}); "
        f"cell {a['cell']} has {len(x)}, cell {b['cell']} {len(y)}",
    }


def claims_markdown(found: list[dict[str, Any]]) -> list[str]:
    """The claims as Markdown lines: a table of claim, verdict, p, effect and n, then the
    planner's advice for the inconclusive ones."""
    lines = [
        "| claim | verdict | p | effect | n |",
        "|---|---|---|---|---|",
        *(
            f"| {c['claim']} | {c['verdict']} | {_p_text(c['p'])} | {_effect_text(c)} | "
            f"{c['n'][0]}, {c['n'][1]} |"
            for c in found
        ),
        "",
        f"p: one-sided {found[0]['test']} in the claimed direction, Holm-adjusted across the "
        f"{len(found)} claims; reproduced at p <= {LEVEL}, contradicted where the reverse "
        f"ordering is; effect: {found[0]['effect_name']} (positive: the first cell higher).",
    ]
    advice = [f"- {c['claim']}: {c['advice']}." for c in found if c["advice"]]
    return lines + (["", "Inconclusive:", *advice] if advice else [])


def _p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3g}"


def _effect_text(found: dict[str, Any]) -> str:
    return "-" if found["effect"] is None else f"{found['effect']:+.2f}"


def comparisons(
    study: Study,
    results: list[dict[str, Any]],
    *,
    metric: str,
    test: significance.Test = "welch",
    reference: int | None = None,
    a: int | None = None,
    b: int | None = None,
    level: float = LEVEL,
) -> dict[str, Any]:
    """Cells compared on `metric`: `a` against `b`, or every cell against `reference`, or
    (neither given) every pair of a study of up to `MAX_PAIRED_CELLS` cells; two-sided p
    Holm-adjusted across the comparisons, and which cell is lower where p <= `level`."""
    if metric not in ERRORS:
        raise InvalidError(
            f"metric {metric!r} is not in the results; metrics are {', '.join(ERRORS)}",
            field=("query", "metric"),
        )
    pairs = _pairs(results, reference, a, b)
    compared = [
        significance.compare(results[i]["samples"][metric], results[j]["samples"][metric], test)
        for i, j in pairs
    ]
    tested = [k for k, found in enumerate(compared) if found.p is not None]
    adjusted = dict(
        zip(tested, significance.holm([compared[k].p or 1.0 for k in tested]), strict=True)
    )
    return {
        "metric": metric,
        "test": significance.TEST_NAMES[test],
        "level": level,
        "reference": reference,
        "comparisons": [
            _comparison(results[i], results[j], compared[k], adjusted.get(k), level)
            for k, (i, j) in enumerate(pairs)
        ],
    }


def _pairs(
    results: list[dict[str, Any]], reference: int | None, a: int | None, b: int | None
) -> list[tuple[int, int]]:
    """The (a, b) cell indexes to compare; `InvalidError` for an unknown cell, for a or b
    alone, or for every pair of too many cells."""
    for name, index in (("reference", reference), ("a", a), ("b", b)):
        if index is not None and not 0 <= index < len(results):
            raise InvalidError(
                f"cell {index} is unknown; the study's cells are 0 to {len(results) - 1}",
                field=("query", name),
            )
    if (a is None) != (b is None) or (a is not None and reference is not None):
        raise InvalidError(
            "give a and b (two cells), or reference (every cell against it), or neither "
            "(every pair)",
            field=("query", "a" if a is None else "b"),
        )
    if a is not None and b is not None:
        return [(a, b)]
    if reference is not None:
        return [(i, reference) for i in range(len(results)) if i != reference]
    if len(results) > MAX_PAIRED_CELLS:
        raise InvalidError(
            f"the study has {len(results)} cells, over {MAX_PAIRED_CELLS} to compare in every "
            "pair; give a reference cell, or a and b",
            field=("query", "reference"),
        )
    return list(itertools.combinations(range(len(results)), 2))


def _comparison(
    a: dict[str, Any],
    b: dict[str, Any],
    found: significance.Comparison,
    p: float | None,
    level: float,
) -> dict[str, Any]:
    lower = None
    if p is not None and p <= level and found.difference:
        lower = a["cell"] if found.difference < 0 else b["cell"]
    return {
        "a": a["cell"],
        "b": b["cell"],
        "a_label": cell_label(a["values"]),
        "b_label": cell_label(b["values"]),
        "n": list(found.n),
        "difference": found.difference,
        "p": p,
        "p_raw": found.p,
        "p_less": found.p_less,
        "p_greater": found.p_greater,
        "effect": found.effect,
        "effect_name": found.effect_name,
        "lower": lower,
    }


def plan(
    study: Study,
    results: list[dict[str, Any]],
    *,
    level: float = LEVEL,
    power: float = POWER,
    test: significance.Test = "welch",
) -> dict[str, Any]:
    """Per claim its verdict and the seeds per cell an open one needs; and `extend`, the body
    `{"add_seeds": {cell: n}}` adding to each cell the most any of its open claims asks for,
    less the seeds it has."""
    found = claims(study, results, level=level, power=power, test=test)
    add: dict[str, int] = {}
    for claim in found:
        if claim["seeds_needed"] is None:
            continue
        for cell, done in zip((claim["a"], claim["b"]), claim["n"], strict=True):
            more = claim["seeds_needed"] - done
            if more > 0:
                add[str(cell)] = max(add.get(str(cell), 0), more)
    return {
        "level": level,
        "power": power,
        "test": significance.TEST_NAMES[test],
        "claims": found,
        "extend": {"add_seeds": dict(sorted(add.items(), key=lambda item: int(item[0])))},
    }
