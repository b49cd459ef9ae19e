"""A search study: trials sampled by Optuna (random or TPE) and stopped early by its pruners.

Optuna's ask-and-tell interface runs over the service's own rows. Each decision, asking
for trials or judging a running one, rebuilds the study's Optuna study in memory from the
database: a trial is a cell of the study (its parameters, and the attributes Optuna's
pruners keep, such as ASHA's rungs), its state is its job's status, its value and
intermediate values are its job's points of the objective metric. Decisions are taken
under the study's row lock and what Optuna decided is written back in the same
transaction, so a study survives restarts and two API processes or workers never sample
the same trial or decide on a stale view. No second copy of a trial's state exists that
could disagree with its job (a pruned trial retried to the end is simply complete).

A trial is an ordinary train job of the study: its spec is the base with the trial's
parameters set, checked like a grid's cell; a sampled spec the checks refuse is a failed
trial with its reason in its cell, and counts against the budget.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import optuna
from optuna.distributions import BaseDistribution
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import FrozenTrial, TrialState, create_trial
from pydantic import ValidationError
from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from core import jobs
from core.db.tables import Event, Job, Metric, Study
from core.errors import InvalidError
from core.kinds import train
from core.settings import Settings
from core.studies import grid, space
from training.specs import EarlyStopMetric

optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per rebuilt study

Method = Literal["random", "tpe"]
PrunerName = Literal["none", "median", "asha", "hyperband"]
# What a trial may be judged on: the errors and losses a train job logs, all minimised
# (those an early stop may watch).
OBJECTIVES: tuple[str, ...] = get_args(EarlyStopMetric)
PRUNED_EVENT = "pruned"  # the status event a pruned job's log holds


@dataclass(frozen=True)
class Search:
    """How a study searches: the sampler, the space, the budget and the pruner."""

    method: Method
    space: dict[str, dict[str, Any]]
    trials: int
    pruner: PrunerName = "none"
    objective: str = "val/error"
    seed: int = 0
    startup_trials: int = 2  # the median pruner's: trials that end before it judges
    reduction_factor: int = 3  # ASHA's and Hyperband's

    def record(self) -> dict[str, Any]:
        """The search as the study's spec keeps it."""
        return {**asdict(self), "direction": "minimize"}

    @classmethod
    def of(cls, record: dict[str, Any]) -> Search:
        """The search a study's spec keeps."""
        known = {name: record[name] for name in cls.__dataclass_fields__ if name in record}
        return cls(**known)

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        """The space's Optuna distributions."""
        return space.distributions(self.space)


def of_study(study: Study) -> Search | None:
    """The study's search, or None for a grid."""
    found = study.spec.get("search")
    return Search.of(found) if found else None


def check(
    search: Search,
    base: dict[str, Any],
    *,
    settings: Settings,
    seed: int,
    name: str | None,
    tags: list[str],
) -> None:
    """`InvalidError` for a space that cannot be searched: a bad distribution, an objective no
    train job logs, or a parameter whose bounds (or one of whose choices) make no valid spec,
    the other parameters at their lows."""
    if search.objective not in OBJECTIVES:
        raise InvalidError(
            f"objective {search.objective!r} is none of the metrics a train job logs: "
            f"{', '.join(OBJECTIVES)}",
            field=("body", "objective"),
        )
    distributions = search.distributions
    if search.objective.startswith("val/") and base.get("dataset", {}).get("validation") == 0:
        raise InvalidError(
            f"objective {search.objective} needs a validation split, and base.dataset."
            "validation is 0: give it a fraction (0.1 is the default) or use a test metric",
            field=("body", "objective"),
        )
    lows = {path: _corners(dist)[0] for path, dist in distributions.items()}
    for path, distribution in distributions.items():
        for value in _corners(distribution):
            drawn = {**lows, path: value}
            values = {p: space.spec_value(distributions[p], v) for p, v in drawn.items()}
            payload = grid.payload_of(base, values, seed, name=name, tags=tags)
            try:
                train.KIND.parse(payload, settings)
            except ValidationError as error:
                raise InvalidError(
                    f"space parameter {path!r} at {value!r}: {_problem(error, payload)}",
                    field=("body", "space", path),
                ) from None


def _corners(distribution: BaseDistribution) -> list[Any]:
    """The values a space is checked at: a range's two ends, or every choice."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return list(distribution.choices)
    return [distribution.low, distribution.high]  # type: ignore[attr-defined]


def _problem(error: ValidationError, payload: dict[str, Any]) -> str:
    """A spec's first validation problem in a line: where, and what."""
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def ask(
    *,
    session: Session,
    settings: Settings,
    study: Study,
    count: int,
    max_attempts: int,
) -> list[uuid.UUID]:
    """Sample up to `count` new trials within the budget and add a queued job for each;
    their ids. The caller holds the study's row lock (`lock`) and commits."""
    search = of_study(study)
    assert search is not None, "a search study"
    count = min(count, search.trials - len(study.cells))
    if count <= 0:
        return []
    rebuilt = _rebuild(session, study, search)
    distributions = search.distributions
    base = study.spec["base"]
    seed = study.spec["seeds"][0]
    cells, created = list(study.cells), []
    for _ in range(count):
        trial = rebuilt.ask(fixed_distributions=distributions)
        values = {
            path: space.spec_value(distributions[path], trial.params[path])
            for path in distributions
        }
        cell: dict[str, Any] = {"values": values, "paper": None, "trial": trial.number}
        payload = grid.payload_of(base, values, seed, name=study.name, tags=list(study.tags))
        try:
            spec = train.KIND.parse(payload, settings)
        except ValidationError as error:
            cell["error"] = _problem(error, payload)
            rebuilt.tell(trial, state=TrialState.FAIL)
            cells.append(cell)
            continue
        cells.append(cell)
        job = jobs.create(
            session=session,
            settings=settings,
            spec=spec,
            max_attempts=max_attempts,
            owner_key_id=study.owner_key_id,
            study=(study.id, len(cells) - 1, False),
        )
        created.append(job.id)
    study.cells = cells
    session.flush()
    return created


def lock(session: Session, study_id: uuid.UUID) -> Study | None:
    """The study, its row locked for this transaction (on SQLite too, by a write)."""
    session.execute(
        update(Study).where(Study.id == study_id).values(max_parallel=Study.max_parallel)
    )
    return session.get(Study, study_id, with_for_update=True, populate_existing=True)


def wants_more(study: Study) -> bool:
    """Whether a search study has trials left to ask for (and is not cancelled)."""
    search = of_study(study)
    return search is not None and not study.cancel_requested and len(study.cells) < search.trials


class Judge:
    """The pruner's view of one running trial: judges it at each point of the objective."""

    def __init__(self, study_id: uuid.UUID, job_id: uuid.UUID, cell: int, search: Search) -> None:
        self.study_id, self.job_id, self.cell, self.search = study_id, job_id, cell, search
        self.points: dict[int, float] = {}  # this run's points so far, flushed or not

    @classmethod
    def of_job(cls, session: Session, job_id: uuid.UUID) -> Judge | None:
        """The judge of a search trial's job whose study prunes; None for any other job, and
        for a pruned trial retried (it runs to its end)."""
        job = session.get(Job, job_id)
        if job is None or job.study_id is None or job.cell is None:
            return None
        study = session.get(Study, job.study_id)
        search = of_study(study) if study is not None else None
        if search is None or search.pruner == "none":
            return None
        retried = session.scalar(
            select(exists().where(Event.job_id == job_id, Event.message == PRUNED_EVENT))
        )
        if retried:
            return None
        judge = cls(job.study_id, job_id, job.cell, search)
        judge.points = _points(session, [job_id], search.objective).get(job_id, {})
        return judge

    @property
    def metric(self) -> str:
        """The metric it judges on."""
        return self.search.objective

    def prunes(self, session: Session, step: int, value: float) -> str | None:
        """Judge the trial at a new point: the reason it is pruned, or None to go on."""
        self.points[step] = value
        study = lock(session, self.study_id)
        if study is None or self.cell >= len(study.cells):
            return None
        rebuilt = _rebuild(session, study, self.search, current=(self.cell, self.points))
        trial = rebuilt.trials[self.cell]
        pruner = rebuilt.pruner
        pruned = pruner.prune(rebuilt, trial)
        kept = rebuilt._storage.get_trial(trial._trial_id).system_attrs
        if kept != study.cells[self.cell].get("system_attrs", {}):
            cells = list(study.cells)
            cells[self.cell] = {**cells[self.cell], "system_attrs": kept}
            study.cells = cells
            session.flush()
        if not pruned:
            return None
        return (
            f"pruned by the {self.search.pruner} pruner at step {step}: {self.metric} {value:.4g}"
        )


def _rebuild(
    session: Session,
    study: Study,
    search: Search,
    current: tuple[int, dict[int, float]] | None = None,
) -> optuna.Study:
    """The study's Optuna study in memory: every cell a trial, in order (a trial's number is
    its cell). `current` gives a running trial's own points, fresher than its rows."""
    jobs_of = {
        job.cell: job
        for job in session.scalars(select(Job).where(Job.study_id == study.id))
        if job.cell is not None
    }
    points = _points(session, [job.id for job in jobs_of.values()], search.objective)
    first_step = min(
        (min(found) for found in [*points.values(), current[1] if current else {}] if found),
        default=1,
    )
    rebuilt = optuna.create_study(
        study_name=str(study.id),
        direction="minimize",
        sampler=_sampler(search, len(study.cells)),
        pruner=_pruner(search, first_step),
    )
    distributions = search.distributions
    for index, cell in enumerate(study.cells):
        job = jobs_of.get(index)
        found = points.get(job.id, {}) if job is not None else {}
        if current is not None and current[0] == index:
            found = {**found, **current[1]}
        rebuilt.add_trial(_trial(cell, job, found, distributions))
    return rebuilt


def _trial(
    cell: dict[str, Any],
    job: Job | None,
    points: dict[int, float],
    distributions: dict[str, BaseDistribution],
) -> FrozenTrial:
    """A cell as an Optuna trial: its job's status as its state, its last point its value."""
    status = job.status if job is not None and "error" not in cell else "failed"
    value = points[max(points)] if points else None
    state = {
        "succeeded": TrialState.COMPLETE,
        "pruned": TrialState.PRUNED,
        "queued": TrialState.RUNNING,
        "running": TrialState.RUNNING,
    }.get(status, TrialState.FAIL)
    if state == TrialState.COMPLETE and value is None:
        state = TrialState.FAIL  # ended without a point of the objective
    params = {path: _stored(distributions[path], v) for path, v in cell["values"].items()}
    trial = create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        params=params,
        distributions=distributions,
        intermediate_values=dict(points),
        system_attrs=dict(cell.get("system_attrs", {})),
    )
    if job is not None:
        trial.datetime_start = _naive(job.started_at or job.created_at)
    return trial


def _stored(distribution: BaseDistribution, value: Any) -> Any:
    """A spec value as its distribution holds it (an object choice as its JSON)."""
    return space.storable(value) if hasattr(distribution, "choices") else value


def _naive(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=None)


def _points(
    session: Session, job_ids: list[uuid.UUID], metric: str
) -> dict[uuid.UUID, dict[int, float]]:
    """Each job's points of `metric`, by step."""
    found: defaultdict[uuid.UUID, dict[int, float]] = defaultdict(dict)
    if job_ids:
        query = select(Metric.job_id, Metric.step, Metric.value).where(
            Metric.job_id.in_(job_ids), Metric.name == metric
        )
        for job_id, step, value in session.execute(query):
            found[job_id][step] = value
    return found


def _sampler(search: Search, asked: int) -> BaseSampler:
    """The search's sampler, seeded anew for each ask (a rebuilt sampler would otherwise
    draw the same first numbers every time)."""
    seed = (search.seed * 1_000_003 + asked) % 2**32
    if search.method == "random":
        return RandomSampler(seed=seed)
    return TPESampler(seed=seed, n_startup_trials=max(2, min(10, search.trials // 4)))


def _pruner(search: Search, first_step: int) -> BasePruner:
    """The search's pruner; rungs count from the first evaluation's step."""
    if search.pruner == "median":
        return MedianPruner(n_startup_trials=search.startup_trials)
    if search.pruner == "asha":
        return SuccessiveHalvingPruner(
            min_resource=first_step, reduction_factor=search.reduction_factor
        )
    if search.pruner == "hyperband":
        return HyperbandPruner(min_resource=first_step, reduction_factor=search.reduction_factor)
    return NopPruner()
