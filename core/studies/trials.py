"""A search study's trials: each trial's parameters, objective and cost, the best trial, the
best value so far, the parameters' importances and the compute each status took.

A search's cells are its trials (`{"values": ..., "trial": n}`), each run by one train job
whose `cell` is the trial's index. A trial's objective is its job's last point of the metric
`spec.search.objective` (pruned trials too); its best is the best point of that metric in
the search's direction. *Completed* trials are those that succeeded with a finite objective,
as Optuna counts COMPLETE trials: only they enter the best trial, the best-so-far curve, the
importances and the parallel coordinates.
"""

from __future__ import annotations

import csv
import io
import json
import math
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.importance import FanovaImportanceEvaluator
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from core.db.tables import Job, Metric, Study, utcnow
from core.errors import ConflictError
from core.studies import space as search_space

IMPORTANCE_SEED = 0  # fANOVA's forest is random: one seed, the same importances each read


@dataclass(frozen=True)
class Trial:
    """One trial of a search as its job has it."""

    trial: int
    cell: int
    job_id: uuid.UUID | None
    status: str
    params: dict[str, Any]
    value: float | None  # the objective's last point
    best_value: float | None  # the objective's best point
    steps: int
    job_seconds: float
    pruned_at: int | None  # the step of its last objective point, where the pruner stopped it
    total_steps: int | None = None
    spec: dict[str, Any] = field(default_factory=dict, repr=False)  # its job's full spec

    @property
    def completed(self) -> bool:
        """Whether it succeeded with an objective value (Optuna's COMPLETE)."""
        return self.status == "succeeded" and self.value is not None


def search_of(study: Study) -> dict[str, Any]:
    """The study's `spec.search`, or `ConflictError` for a grid study (its results are per
    cell over seeds instead)."""
    search = study.spec.get("search")
    if not search:
        raise ConflictError(
            f"study {study.id} is a grid, not a search: it has cells over seeds, no trials; "
            f"read its results per cell at /api/v1/studies/{study.id} or "
            f"/api/v1/studies/{study.id}/results.csv"
        )
    return dict(search)


def minimizes(search: dict[str, Any]) -> bool:
    """Whether the search minimizes its objective (the default)."""
    return bool(search.get("direction", "minimize") != "maximize")


def rows(session: Session, study: Study) -> list[Trial]:
    """Every trial of the search in trial order, with its job's status, objective and cost."""
    search = search_of(study)
    jobs = _jobs_by_cell(session, study.id)
    ids = [job.id for job in jobs.values()]
    last = _last_points(session, ids, search["objective"])
    best = _best_points(session, ids, search["objective"], minimize=minimizes(search))
    found = [
        _trial(index, cell, jobs.get(index), last, best) for index, cell in enumerate(study.cells)
    ]
    return sorted(found, key=lambda row: (row.trial, row.cell))


def _jobs_by_cell(session: Session, study_id: uuid.UUID) -> dict[int, Job]:
    """Each cell's job (the newest, should a cell have more than one)."""
    query = select(Job).where(Job.study_id == study_id).order_by(Job.created_at)
    return {job.cell or 0: job for job in session.scalars(query)}


def _trial(
    index: int,
    cell: dict[str, Any],
    job: Job | None,
    last: dict[uuid.UUID, tuple[int, float]],
    best: dict[uuid.UUID, float],
) -> Trial:
    number = cell.get("trial")
    point = last.get(job.id) if job is not None else None
    status = job.status if job is not None else "queued"
    return Trial(
        trial=index if number is None else int(number),
        cell=index,
        job_id=job.id if job is not None else None,
        status=status,
        params=dict(cell["values"]),
        value=_finite(point[1]) if point else None,
        best_value=_finite(best.get(job.id)) if job is not None else None,
        steps=job.step if job is not None else 0,
        job_seconds=job_seconds(job) if job is not None else 0.0,
        pruned_at=(point[0] if point else job.step) if job and status == "pruned" else None,
        total_steps=job.total_steps if job is not None else None,
        spec=dict(job.spec) if job is not None else {},
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def job_seconds(job: Job) -> float:
    """The seconds a job held a worker: started to finished (to now while it runs), else
    its summary's wall time; 0 for a job that never started."""
    if job.started_at is not None:
        end = job.finished_at or (utcnow() if job.status == "running" else None)
        if end is not None:
            return max(0.0, (end - job.started_at).total_seconds())
    return float(job.wall_time_s or 0.0)


def _last_points(
    session: Session, job_ids: list[uuid.UUID], name: str
) -> dict[uuid.UUID, tuple[int, float]]:
    """Each job's last point of metric `name`: (step, value)."""
    if not job_ids:
        return {}
    last = (
        select(Metric.job_id, func.max(Metric.step).label("step"))
        .where(Metric.job_id.in_(job_ids), Metric.name == name)
        .group_by(Metric.job_id)
        .subquery()
    )
    query = (
        select(Metric.job_id, Metric.step, Metric.value)
        .join(last, (Metric.job_id == last.c.job_id) & (Metric.step == last.c.step))
        .where(Metric.name == name)
    )
    return {job_id: (step, value) for job_id, step, value in session.execute(query)}


def _best_points(
    session: Session, job_ids: list[uuid.UUID], name: str, *, minimize: bool
) -> dict[uuid.UUID, float]:
    """Each job's best point of metric `name` in the search's direction."""
    if not job_ids:
        return {}
    pick = func.min(Metric.value) if minimize else func.max(Metric.value)
    query = (
        select(Metric.job_id, pick)
        .where(Metric.job_id.in_(job_ids), Metric.name == name)
        .group_by(Metric.job_id)
    )
    return {job_id: value for job_id, value in session.execute(query)}


def _better(a: float, b: float, minimize: bool) -> bool:
    return a < b if minimize else a > b


def best(trials: list[Trial], *, minimize: bool = True) -> Trial | None:
    """The completed trial with the best objective (the lowest trial number on a tie)."""
    found: Trial | None = None
    for trial in trials:
        if not trial.completed:
            continue
        assert trial.value is not None
        if found is None or _better(trial.value, found.value, minimize):  # type: ignore[arg-type]
            found = trial
    return found


def best_so_far(trials: list[Trial], *, minimize: bool = True) -> list[dict[str, Any]]:
    """Over the completed trials in trial order: each one's objective and the best so far."""
    points: list[dict[str, Any]] = []
    running: float | None = None
    for trial in sorted(trials, key=lambda row: row.trial):
        if not trial.completed:
            continue
        assert trial.value is not None
        if running is None or _better(trial.value, running, minimize):
            running = trial.value
        points.append({"trial": trial.trial, "value": trial.value, "best": running})
    return points


def importances(study: Study, trials: list[Trial]) -> dict[str, float] | None:
    """Each parameter's importance to the objective (Optuna's fANOVA, seeded) over the
    completed trials, summing to 1; None under 2 completed trials, with one parameter, or
    when the trials' objectives (or parameters) do not vary."""
    search = search_of(study)
    distributions = search_space.distributions(search["space"])
    if len(distributions) < 2:
        return None
    frozen = [
        made
        for trial in trials
        if trial.completed and (made := _frozen(trial, distributions)) is not None
    ]
    if len(frozen) < 2:
        return None
    rebuilt = optuna.create_study(direction="minimize" if minimizes(search) else "maximize")
    rebuilt.add_trials(frozen)
    evaluator = FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    try:
        found = optuna.importance.get_param_importances(rebuilt, evaluator=evaluator)
    except RuntimeError:  # fANOVA's "zero total variance": no objective or parameter varied
        return None
    return {path: float(found.get(path, 0.0)) for path in distributions}


def _frozen(
    trial: Trial, distributions: dict[str, BaseDistribution]
) -> optuna.trial.FrozenTrial | None:
    """The trial as Optuna keeps a COMPLETE one; None when a value lies outside its space."""
    params = {
        path: _internal(distributions[path], trial.params.get(path)) for path in distributions
    }
    try:
        return optuna.trial.create_trial(
            params=params, distributions=distributions, value=trial.value
        )
    except ValueError:
        return None


def _internal(distribution: BaseDistribution, value: Any) -> Any:
    """A spec value as its distribution holds it: an object choice as its JSON."""
    if isinstance(distribution, CategoricalDistribution) and isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def parallel(study: Study, trials: list[Trial]) -> dict[str, Any]:
    """Parallel coordinates: an axis per parameter (its kind and range, or its choices), and
    a line per completed trial through its parameters to its objective; a pruned trial's
    line ends at its last evaluation's value (what its pruner judged it on)."""
    search = search_of(study)
    axes = [_axis(path, param) for path, param in search["space"].items()]
    lines = [
        {"trial": trial.trial, "params": trial.params, "value": trial.value, "status": trial.status}
        for trial in trials
        if trial.completed or (trial.status == "pruned" and trial.value is not None)
    ]
    return {"objective": search["objective"], "axes": axes, "lines": lines}


def _axis(path: str, param: dict[str, Any]) -> dict[str, Any]:
    kind = param.get("type", "uniform")
    log = kind == "loguniform" or bool(param.get("log", False))
    return {
        "path": path,
        "type": kind,
        "low": param.get("low"),
        "high": param.get("high"),
        "log": log,
        "choices": param.get("values") if kind == "choice" else None,
    }


def seconds_by_status(trials: list[Trial]) -> dict[str, Any]:
    """Job-seconds spent in all and per status, and an estimate of what pruning saved: each
    pruned trial's seconds per step times the steps it did not train."""
    spent: defaultdict[str, float] = defaultdict(float)
    saved = 0.0
    for trial in trials:
        spent[trial.status] += trial.job_seconds
        if trial.status == "pruned" and trial.steps and trial.total_steps:
            left = max(0, trial.total_steps - trial.steps)
            saved += trial.job_seconds / trial.steps * left
    return {"total": sum(spent.values()), "by_status": dict(spent), "saved_by_pruning": saved}


COLUMNS = ("trial", "cell", "job_id", "status")
MEASURES = ("value", "best_value", "steps", "job_seconds", "pruned_at")


def as_csv(study: Study, trials: list[Trial]) -> str:
    """One row per trial: its number, job and status, each parameter, the objective's last
    and best value, steps trained, job-seconds and the step it was pruned at."""
    paths = list(search_of(study)["space"])
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*COLUMNS, *paths, *MEASURES])
    for trial in trials:
        row = [
            *(getattr(trial, column) for column in COLUMNS),
            *(_cell_text(trial.params.get(path)) for path in paths),
            *(getattr(trial, measure) for measure in MEASURES),
        ]
        writer.writerow(["" if value is None else value for value in row])
    return out.getvalue()


def _cell_text(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
