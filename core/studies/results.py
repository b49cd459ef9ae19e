"""A study's results: each cell aggregated over its seeds, beside the papers' number.

Every statistic is computed from the jobs' own rows: final and best test error from the
job summary columns, final training error from the last `train/error` metric point.
`std` is the sample standard deviation (n - 1); it is None with fewer than two seeds.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db.tables import Job, Metric, Study

ERRORS = ("final_train_error", "final_test_error", "best_test_error")
STATS = ("median", "mean", "std", "min", "max")
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
    done = [job for job in jobs if job.status == "succeeded"]
    values: dict[str, list[float | None]] = {
        "final_train_error": [train_errors.get(job.id) for job in done],
        "final_test_error": [job.final_test_error for job in done],
        "best_test_error": [job.best_test_error for job in done],
    }
    errors = {
        name: stats([v for v in found if v is not None and math.isfinite(v)])
        for name, found in values.items()
    }
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
    }


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


def table(study: Study, results: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The results as a header and rows: a cell's axis values, then the statistics."""
    axes = list(study.spec["grid"])
    header = [
        *axes,
        "seeds",
        "failed",
        *(f"{error}_{stat}" for error in ERRORS for stat in STATS),
        "params",
        "macs",
        f"paper_{study.metric}",
        "difference",
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
        ]
        for row in results
    ]
    return header, rows


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
    axes = list(study.spec["grid"])
    metric = study.metric
    lines = [
        "| "
        + " | ".join(
            [*axes, "seeds", *(e.replace("_", " ") for e in ERRORS), "paper", "ours - paper"]
        )
        + " |",
        "|" + "---|" * (len(axes) + len(ERRORS) + 3),
    ]
    for row in results:
        cells = [cell_label({axis: row["values"][axis]}) for axis in axes]
        cells.append(f"{len(row['seeds_done'])}/{row['jobs']}")
        cells += [_percent_range(row[error]) for error in ERRORS]
        cells.append(_percent(row["paper"]))
        cells.append(_signed(row["difference"]))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Errors in %, median over seeds (min-max); the papers' number is {metric}.")
    for row in results:
        for warning in row.get("warnings", []):
            lines.append(f"Cell {row['cell']} ({cell_label(row['values'])}): {warning}.")
    return "\n".join(lines) + "\n"


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
