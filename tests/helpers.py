"""Helpers of the tests: keys, jobs made and moved directly in the database, a trained job
with real checkpoints, a job run in this process, a job's rows as its run wrote them, polling
with deadlines, a clock that moves when told, this process's peak memory."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import redis
import torch
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from core import artifacts, jobs, keys, kinds, queue
from core.db.session import session_scope
from core.db.tables import Checkpoint, Event, Job, Metric
from core.kinds import EvaluateJobSpec, RunContext, TrainJobSpec
from core.owners import Caller
from core.queue import QUEUE, RUN_JOB
from core.settings import Settings
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.options import RunOptions
from training.specs import TrainSpec

T = TypeVar("T")
TRAIN = {"kind": "train", "model": {"name": "resnet20"}, "dataset": {"name": "digits"}}
LOG_EVERY = 11  # digits with batch 64 and no validation split: 22 steps per epoch


def recipe(epochs: int) -> dict[str, Any]:
    """A tiny digits recipe: resnet8, batch 64, no augmentation, checkpoint every epoch."""
    return {"epochs": epochs, "batch_size": 64, "augment": False, "log_every": LOG_EVERY}


def train_spec(epochs: int) -> TrainJobSpec:
    """ResNet-8 on scikit-learn's digits (always available offline) for `epochs` epochs."""
    return TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(epochs),
        }
    )


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, every: float = 0.1) -> T:
    """Poll `condition` until it returns something truthy, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def submit(
    settings: Settings,
    spec: TrainJobSpec | EvaluateJobSpec,
    *,
    deliveries: int = 1,
    max_attempts: int = 3,
) -> uuid.UUID:
    """Create the job, commit, then enqueue its id `deliveries` times (as the API does once)."""
    with session_scope(settings.database_url) as session:
        job_id = jobs.create(
            session=session, settings=settings, spec=spec, max_attempts=max_attempts
        ).id
    for _ in range(deliveries):
        queue.enqueue(job_id, settings=settings)
    return job_id


def job(url: str, job_id: uuid.UUID) -> Job:
    """The job's row, freshly read."""
    with session_scope(url) as session:
        row = session.get(Job, job_id)
        assert row is not None
        return row


def wait_status(url: str, job_id: uuid.UUID, status: str, timeout: float = 90) -> Job:
    """Wait until the job has `status`; fail at once if it ends otherwise."""

    def reached() -> Job | None:
        row = job(url, job_id)
        ended = row.status in ("succeeded", "failed", "cancelled")
        assert row.status == status or not ended, (
            f"job ended {row.status} (error: {row.error}), not {status}; "
            f"events: {messages(url, job_id)}"
        )
        return row if row.status == status else None

    return wait_for(reached, timeout, f"job {job_id} to be {status}")


def messages(url: str, job_id: uuid.UUID) -> list[str]:
    """The job's event log, oldest first."""
    with session_scope(url) as session:
        query = select(Event.message).where(Event.job_id == job_id).order_by(Event.id)
        return list(session.scalars(query))


def metric_steps(url: str, job_id: uuid.UUID, name: str) -> list[int]:
    """The steps of one metric series, in order."""
    with session_scope(url) as session:
        query = select(Metric.step).where(Metric.job_id == job_id, Metric.name == name)
        return list(session.scalars(query.order_by(Metric.step)))


def metric_counts(url: str, job_id: uuid.UUID) -> tuple[int, int]:
    """(rows, distinct (name, step) pairs) of a job's metrics."""
    with session_scope(url) as session:
        rows = session.scalar(select(func.count()).where(Metric.job_id == job_id))
        pairs = select(Metric.name, Metric.step).where(Metric.job_id == job_id).distinct()
        distinct = session.scalar(select(func.count()).select_from(pairs.subquery()))
        return rows or 0, distinct or 0


def checkpoint_rows(url: str, job_id: uuid.UUID) -> list[Checkpoint]:
    """The job's checkpoint rows, by step."""
    with session_scope(url) as session:
        query = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
        return list(session.scalars(query))


def job_pid(row: Job) -> int:
    """The pid of the process running a job, from its `worker` column ("name pid N")."""
    assert row.worker is not None
    return int(row.worker.rsplit(" pid ", 1)[1])


def make_key(url: str, *scopes: str) -> str:
    """A new API key with `scopes`, in plaintext."""
    with session_scope(url) as session:
        return keys.create_key(session=session, name="test", scopes=scopes)[1]


@dataclass(frozen=True)
class Key:
    """An API key of a test: its id and the header that sends it."""

    id: str
    headers: dict[str, str]


def key_of(url: str, *scopes: str) -> Key:
    """A new key with `scopes`, with its id."""
    plaintext = make_key(url, *scopes)
    with session_scope(url) as session:
        principal = keys.authenticate(session=session, key=plaintext)
    assert principal is not None
    return Key(str(principal.key_id), {"Authorization": f"Bearer {plaintext}"})


def caller_of(url: str, *scopes: str) -> Caller:
    """A caller with a new key of `scopes`, as the service sees a request with it."""
    with session_scope(url) as session:
        principal = keys.authenticate(session=session, key=make_key(url, *scopes))
    assert principal is not None
    return Caller(principal)


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB) since `reset_peak_rss`."""
    status = Path("/proc/self/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) / 1024


def reset_peak_rss() -> float:
    """Start the peak over from the resident memory now (MB)."""
    Path("/proc/self/clear_refs").write_text("5")
    return peak_rss_mb()


def new_job(url: str, **fields: object) -> uuid.UUID:
    """A queued train job made directly in the database."""
    spec = TrainJobSpec.model_validate({**TRAIN, **fields})
    with session_scope(url) as session:
        return jobs.create(
            session=session, settings=Settings(database_url=url), spec=spec, max_attempts=3
        ).id


def claim(url: str, job_id: uuid.UUID) -> int:
    """Claim a job as a worker would; returns the fencing token."""
    with session_scope(url) as session:
        held = jobs.claim(
            session=session, job_id=job_id, worker="test", device="cpu", lease_seconds=60
        )
    assert held is not None
    return held.token


def finish(url: str, job_id: uuid.UUID, token: int, **summary: float) -> None:
    """End a claimed job as succeeded, with summary columns."""
    with session_scope(url) as session:
        jobs.finish(
            session=session, job_id=job_id, token=token, status="succeeded", summary=summary
        )


class Saved(NamedTuple):
    """A checkpoint row as a test records it."""

    step: int
    path: str
    sha256: str
    size: int
    is_best: bool


def _record_checkpoints(
    session: Session, job_id: uuid.UUID, token: int, saved: list[Saved]
) -> None:
    """Record `saved` as the job's checkpoints (epoch = step), all of them kept."""
    kept = [row.path for row in saved]
    for row in saved:
        jobs.record_checkpoint(
            session=session,
            job_id=job_id,
            token=token,
            step=row.step,
            epoch=row.step,
            path=row.path,
            sha256=row.sha256,
            size=row.size,
            is_best=row.is_best,
            kept=kept,
        )


def recorded_job(url: str, *, steps: int = 2, owner: uuid.UUID | None = None) -> uuid.UUID:
    """A succeeded train job of `owner`'s key whose checkpoint rows (steps 1..`steps`, the
    last one best) name files that need not exist: for what reads only the rows."""
    job_id = new_job(url)
    token = claim(url, job_id)
    paths = [f"/nowhere/{job_id}/step-{step}.pt" for step in range(1, steps + 1)]
    saved = [
        Saved(step, path, f"{step:064x}", 1, step == steps) for step, path in enumerate(paths, 1)
    ]
    with session_scope(url) as session:
        _record_checkpoints(session, job_id, token, saved)
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=owner))
    finish(url, job_id, token)
    return job_id


TINY = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
    "recipe": {"iterations": 2, "batch_size": 16, "checkpoint_every": 1},
}


def tiny_synthetic(
    *,
    model: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
    **recipe: Any,
) -> dict[str, Any]:
    """A train spec of seconds: ResNet-8 on 8x8 synthetic images (64 to train, a quarter of
    them held out for validation, 32 to test), batch 16, 40 iterations evaluated every 4;
    `model`, `dataset` and `recipe` fields are laid over it."""
    images = {"image_size": 8, "train_size": 64, "test_size": 32, "validation": 0.25}
    return {
        "model": {"name": "resnet8", **(model or {})},
        "dataset": {"name": "synthetic", **images, **(dataset or {})},
        "recipe": {"batch_size": 16, "iterations": 40, "eval_every": 4, "log_every": 50, **recipe},
    }


def trained_job(settings: Settings, run: dict[str, Any] = TINY) -> uuid.UUID:
    """A succeeded train job whose checkpoints (steps 1 and 2, best at 2) are real files;
    `run` (TINY by default) trains with a checkpoint every step, on the settings' data."""
    url = settings.database_url
    job_id = new_job(url, model=run["model"])
    token = claim(url, job_id)
    out = artifacts.job_dir(settings, job_id)
    spec = TrainSpec.model_validate(run)
    data = load_dataset(spec.dataset, data_root=settings.data_dir)
    fit(spec, data, RunOptions(out_dir=out), RecordingSink())
    folder = out / "checkpoints"
    files = [(1, folder / "step-1.pt", False), (2, folder / checkpoints.BEST, True)]
    saved = [
        Saved(step, str(path), checkpoints.sha256_of(path), path.stat().st_size, is_best)
        for step, path, is_best in files
    ]
    with session_scope(url) as session:
        _record_checkpoints(session, job_id, token, saved)
    finish(url, job_id, token, best_test_error=0.5, final_test_error=0.6, params=75_002)
    return job_id


def run_job(
    settings: Settings,
    job_id: uuid.UUID,
    sink: RecordingSink,
    set_budget: Callable[[int, float], None] = lambda *_: None,
) -> dict[str, Any]:
    """Claim a queued job, run its kind in this process on the CPU as a worker would, and
    end it (cancelled when it stopped early); its summary."""
    token = claim(settings.database_url, job_id)
    with session_scope(settings.database_url) as session:
        row = session.get(Job, job_id)
        assert row is not None
        kind = kinds.get(row.kind)
        spec = kind.spec.model_validate(row.spec)
    context = RunContext(job_id, settings, torch.device("cpu"), sink, set_budget)
    summary = kind.run(spec, context)
    with session_scope(settings.database_url) as session:
        status = "cancelled" if summary.get("stopped") else "succeeded"
        jobs.finish(session=session, job_id=job_id, token=token, status=status, summary=summary)
    return summary


class FakeClock:
    """A monotonic clock (seconds) that moves only when a test advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        self.now += seconds


def queued_ids(broker: redis.Redis) -> list[str]:
    """The job ids of the messages on the cpu queue (kombu's JSON envelope)."""
    ids = []
    for raw in broker.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == RUN_JOB
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids
