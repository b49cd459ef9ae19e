"""A real worker holds a run's checkpoints to its owner's artifact budget
(MAX_ARTIFACT_BYTES_PER_OWNER): it prunes the run's own older checkpoints (beyond keep_last)
to fit, or fails naming the usage with its newest checkpoint kept and verified."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from core import artifacts, jobs, keys, queue
from core.db.session import session_scope
from core.db.tables import Job
from core.kinds import TrainJobSpec
from core.settings import Settings
from tests.helpers import checkpoint_rows, job, messages, wait_for, wait_status
from tests.services import (
    HEARTBEAT_SECONDS,
    LEASE_SECONDS,
    WorkerProcess,
    file_bytes,
    service_env,
)
from training.checkpoints import sha256_of

pytestmark = pytest.mark.slow

BUDGET = 3 * 2**20 + 2**19  # 3.5 MiB: about five resnet8 checkpoints (631 kB each)
CHECKPOINT = 600_000  # a resnet8 checkpoint on digits is more than this


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The module's settings with a worker process's short lease, and 3.5 MiB of artifacts
    for each owner."""
    return settings.model_copy(
        update={
            "lease_seconds": LEASE_SECONDS,
            "heartbeat_seconds": HEARTBEAT_SECONDS,
            "max_artifact_bytes_per_owner": BUDGET,
        }
    )


@pytest.fixture(scope="module", autouse=True)
def worker(settings: Settings) -> Iterator[WorkerProcess]:
    """One worker process that holds its owners to the budget."""
    env = {
        **service_env(settings, settings.artifact_dir),
        "MAX_ARTIFACT_BYTES_PER_OWNER": str(BUDGET),
    }
    process = WorkerProcess("budget", env, settings.artifact_dir.parent / "budget.log")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def _owner(settings: Settings) -> uuid.UUID:
    with session_scope(settings.database_url) as session:
        return keys.create_key(session=session, name="budget", scopes=["train"])[0].id


def _submit(settings: Settings, owner: uuid.UUID, iterations: int) -> uuid.UUID:
    """A resnet8 run on digits with a checkpoint every step, keeping the last 100."""
    spec = TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": {
                "iterations": iterations,
                "batch_size": 64,
                "augment": False,
                "log_every": 10,
                "checkpoint_every": 1,
                "keep_last": 100,
            },
        }
    )
    with session_scope(settings.database_url) as session:
        job_id = jobs.create(
            session=session, settings=settings, spec=spec, max_attempts=1, owner_key_id=owner
        ).id
    queue.enqueue(job_id, settings=settings)
    return job_id


def _check_rows_verify(settings: Settings, job_id: uuid.UUID) -> dict[int, str]:
    """Every checkpoint row names a file whose bytes match its sha256; the files' names by
    step."""
    rows = checkpoint_rows(settings.database_url, job_id)
    assert rows
    for row in rows:
        assert Path(row.path).is_file(), f"{row.path} is gone but its row stays"
        assert sha256_of(Path(row.path)) == row.sha256
    folder = artifacts.job_dir(settings, job_id) / "checkpoints"
    assert not [
        path.name for path in folder.iterdir() if ".tmp" in path.name or "corrupt" in path.name
    ]
    return {row.step: Path(row.path).name for row in rows}


def test_a_run_prunes_its_older_checkpoints_to_stay_within_the_budget(settings: Settings) -> None:
    job_id = _submit(settings, _owner(settings), iterations=40)

    done = wait_status(settings.database_url, job_id, "succeeded", timeout=300)

    assert done.step == 40
    folder = artifacts.job_dir(settings, job_id)
    kept = file_bytes(folder)
    # 40 checkpoints of over 600 kB with keep_last 100 would keep more than 24 MB.
    assert 4 * CHECKPOINT < kept <= BUDGET
    assert done.artifact_bytes == kept
    steps = sorted(path.name for path in (folder / "checkpoints").glob("step-*.pt"))
    assert 2 <= len(steps) <= 5
    assert "step-40.pt" in steps
    names = _check_rows_verify(settings, job_id)
    assert max(names) == 40
    assert "best.pt" in names.values()
    pruned = [line for line in messages(settings.database_url, job_id) if line.startswith("pruned")]
    assert len(pruned) == 1  # said once; the run prunes on
    assert "beyond recipe.keep_last" in pruned[0]
    assert "MAX_ARTIFACT_BYTES_PER_OWNER (3.50 MiB)" in pruned[0]


def test_a_run_that_cannot_fit_its_next_checkpoint_fails_keeping_its_newest(
    settings: Settings,
) -> None:
    owner = _owner(settings)
    job_id = _submit(settings, owner, iterations=2000)
    url = settings.database_url
    wait_for(lambda: len(checkpoint_rows(url, job_id)) >= 3, 300, "three checkpoints")
    # Another of the owner's jobs (ended, never delivered) comes to keep all but 1 MiB.
    spec = TrainJobSpec.model_validate(job(url, job_id).spec)
    with session_scope(url) as session:
        other = jobs.create(
            session=session, settings=settings, spec=spec, max_attempts=1, owner_key_id=owner
        )
        session.execute(
            update(Job)
            .where(Job.id == other.id)
            .values(status="succeeded", artifact_bytes=BUDGET - 2**20)
        )

    failed = wait_status(url, job_id, "failed", timeout=120)

    assert failed.error is not None
    assert failed.error.startswith("ArtifactBudgetError: the next checkpoint")
    assert "MAX_ARTIFACT_BYTES_PER_OWNER is 3.50 MiB per owner and this owner keeps" in failed.error
    assert failed.step < 2000
    names = _check_rows_verify(settings, job_id)
    assert max(names) >= 3  # the checkpoints before the failure stay, verified
    folder = artifacts.job_dir(settings, job_id) / "checkpoints"
    assert max(names) == max(int(path.stem[5:]) for path in folder.glob("step-*.pt"))
