"""Artifact usage: the bytes each owner's job files and exports take as stored, and the
budget they are held to (`MAX_ARTIFACT_BYTES_PER_OWNER`; 0: unlimited).

A job's bytes are measured from its files (its folder under ARTIFACT_DIR, or its objects in
the bucket: checkpoints, result files, the run's records), its exports left out: they count
for the key that made them, by their rows' `bytes`. The worker writes a job's measure to its
row (`job.artifact_bytes`) after every checkpoint and when the job ends; an owner's usage
is the sum over its jobs' rows and its exports' rows. An ended job never measured (made
before the column was) is measured when usage is read.

The budget is held on submission (`check_room`: a train spec whose `keep_last` checkpoints
alone would not fit in what is left is a 422) and while a job runs (`worker.sink`: a run
prunes its own older checkpoints to fit its next one, or fails naming the usage).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from core import admission, artifacts, layout
from core.db.tables import FINAL_STATUSES, ApiKey, Job, ModelExport
from core.errors import InvalidError
from core.jobs import LeaseLost
from core.settings import Settings
from core.storage import store_for
from training.specs import TrainSpec

SETTING = "MAX_ARTIFACT_BYTES_PER_OWNER"
# Copies of the parameters a checkpoint holds: the weights, then per optimizer its state.
_CHECKPOINT_COPIES = {"sgd": 2, "nesterov": 2, "adamw": 3}


@dataclass(frozen=True)
class Usage:
    """What one owner keeps: its jobs' files and its exports, against the budget."""

    owner: uuid.UUID | None
    job_bytes: int
    export_bytes: int
    jobs: int  # jobs with stored files
    limit: int  # 0: unlimited

    @property
    def bytes(self) -> int:
        return self.job_bytes + self.export_bytes

    @property
    def left(self) -> int | None:
        """Bytes the owner may still add; None when unlimited."""
        return max(0, self.limit - self.bytes) if self.limit else None


def job_bytes(settings: Settings, job_id: uuid.UUID) -> int:
    """The bytes a job's files take in the store, its exports left out."""
    sizes = store_for(settings).sizes(layout.job_prefix(job_id))
    return sum(size for key, size in sizes.items() if not layout.is_export_key(key))


def folder_bytes(settings: Settings, job_id: uuid.UUID) -> int:
    """The bytes a job's files take in its folder on this machine, its exports left out: a
    running job's worker writes each file there before it puts it in a bucket."""
    folder = artifacts.job_dir(settings, job_id)
    if not folder.is_dir():
        return 0
    return sum(_file_size(path) for path in folder.rglob("*") if _counted(folder, path))


def _counted(folder: Path, path: Path) -> bool:
    """Whether a path of a job's folder is a file of the job's own (not an export's)."""
    return path.is_file() and path.relative_to(folder).parts[0] != layout.EXPORTS


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # pruned meanwhile
        return 0


def record_job(*, session: Session, settings: Settings, job_id: uuid.UUID) -> int:
    """Measure a job's files and write the figure to its row; the figure."""
    measured = job_bytes(settings, job_id)
    session.execute(update(Job).where(Job.id == job_id).values(artifact_bytes=measured))
    return measured


def record_running(*, session: Session, job_id: uuid.UUID, token: int, measured: int) -> None:
    """Write a running job's measure to its row while `token` holds the job; `LeaseLost`
    when another delivery owns it now."""
    held = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.fencing_token == token, Job.status == "running")
        .values(artifact_bytes=measured)
        .returning(Job.id)
    ).one_or_none()
    if held is None:
        raise LeaseLost(f"job {job_id} is no longer held with token {token}")


def _of(column: InstrumentedAttribute[Any], owner: uuid.UUID | None) -> ColumnElement[bool]:
    return column.is_(None) if owner is None else column == owner


def _measure_unmeasured(
    session: Session, settings: Settings, where: ColumnElement[bool] | None = None
) -> None:
    """Measure the ended jobs (those `where` picks, or all) whose rows have no figure yet."""
    query = select(Job.id).where(Job.artifact_bytes.is_(None), Job.status.in_(FINAL_STATUSES))
    if where is not None:
        query = query.where(where)
    for job_id in session.scalars(query).all():
        record_job(session=session, settings=settings, job_id=job_id)


def of_owner(
    *,
    session: Session,
    settings: Settings,
    owner: uuid.UUID | None,
    except_job: uuid.UUID | None = None,
    measure: bool = True,
) -> Usage:
    """What `owner` keeps (None: the owner of rows made with auth off); `except_job`'s
    files left out (a running job measures its own). With `measure` off, ended jobs whose
    rows have no figure yet (those that ended before figures were kept) count nothing
    rather than being measured in the store now."""
    if measure:
        _measure_unmeasured(session, settings, _of(Job.owner_key_id, owner))
    jobs = select(
        func.coalesce(func.sum(Job.artifact_bytes), 0),
        func.count(Job.id).filter(Job.artifact_bytes > 0),
    ).where(_of(Job.owner_key_id, owner))
    if except_job is not None:
        jobs = jobs.where(Job.id != except_job)
    job_total, count = session.execute(jobs).one()
    exports = select(func.coalesce(func.sum(ModelExport.bytes), 0)).where(
        _of(ModelExport.owner_key_id, owner)
    )
    export_total = session.scalar(exports) or 0
    return Usage(
        owner,
        int(job_total or 0),
        int(export_total),
        int(count),
        settings.max_artifact_bytes_per_owner,
    )


def every_owner(*, session: Session, settings: Settings) -> list[tuple[Usage, str | None]]:
    """Every owner's usage with its key's name, largest first."""
    _measure_unmeasured(session, settings)
    jobs = select(
        Job.owner_key_id,
        func.coalesce(func.sum(Job.artifact_bytes), 0),
        func.count(Job.id).filter(Job.artifact_bytes > 0),
    ).group_by(Job.owner_key_id)
    of_jobs = {
        owner: (int(total or 0), int(count)) for owner, total, count in session.execute(jobs)
    }
    exports = select(ModelExport.owner_key_id, func.sum(ModelExport.bytes)).group_by(
        ModelExport.owner_key_id
    )
    of_exports = {owner: int(total or 0) for owner, total in session.execute(exports)}
    names = {key_id: name for key_id, name in session.execute(select(ApiKey.id, ApiKey.name))}
    listed = []
    for owner in of_jobs.keys() | of_exports.keys():
        total, count = of_jobs.get(owner, (0, 0))
        usage = Usage(
            owner, total, of_exports.get(owner, 0), count, settings.max_artifact_bytes_per_owner
        )
        listed.append((usage, names.get(owner) if owner is not None else None))
    return sorted(listed, key=lambda entry: (-entry[0].bytes, str(entry[0].owner)))


def checkpoint_estimate(spec: TrainSpec) -> int:
    """The bytes one checkpoint of `spec` is estimated to take: the weights and the
    optimizer's state, in float32 (buffers, the RNG state and the spec are small beside)."""
    found = admission.costs(spec, admission.shape_of(spec.dataset))
    return found.params * admission.BYTES_PER_VALUE * _CHECKPOINT_COPIES[spec.recipe.optimizer]


def describe(usage: Usage) -> str:
    """The owner's usage and budget, for messages."""
    return (
        f"{SETTING} is {mib(usage.limit)} per owner and this owner keeps {mib(usage.bytes)} "
        f"({mib(usage.job_bytes)} of job files, {mib(usage.export_bytes)} of exports)"
    )


def check_room(
    *, session: Session, settings: Settings, spec: object, owner: uuid.UUID | None
) -> None:
    """`InvalidError` when a job of `owner` cannot fit: a train spec whose `keep_last`
    checkpoints alone are estimated past what is left of the budget; any job once the owner
    keeps the whole budget."""
    if not settings.max_artifact_bytes_per_owner:
        return
    usage = of_owner(session=session, settings=settings, owner=owner)
    left = usage.left or 0
    if isinstance(spec, TrainSpec):
        each = checkpoint_estimate(spec)
        needed = spec.recipe.keep_last * each
        if needed > left:
            raise InvalidError(
                f"keeping recipe.keep_last {spec.recipe.keep_last} checkpoints of "
                f"{spec.model.name} (an estimated {mib(each)} each) needs {mib(needed)}, "
                f"more than the {mib(left)} left: {describe(usage)}; lower recipe.keep_last, "
                "or delete jobs or exports you no longer need",
                field=("body", "recipe", "keep_last"),
            )
    elif left <= 0:
        raise InvalidError(
            f"no room is left for this job's files: {describe(usage)}; delete jobs or exports "
            "you no longer need",
            field=("body",),
        )


def mib(count: int) -> str:
    """A byte count in MiB, for messages."""
    return f"{count / 2**20:,.2f} MiB"
