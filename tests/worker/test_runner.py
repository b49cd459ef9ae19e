"""The worker's parts: resume fallback, checkpoint rows, time limits, the watchdog, outcomes."""

from __future__ import annotations

import fcntl
import hashlib
import math
import time
from pathlib import Path

import pytest
import redis
import torch

from core import artifacts, jobs
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import job, messages, queued_ids, train_spec
from training import checkpoints
from training.checkpoints import CheckpointInfo
from training.events import RecordingSink
from training.runs import json_safe
from worker import runner
from worker.homes import recorded_path
from worker.limits import HARD_GRACE_S, MIN_LIMIT_S, TimeLimits, time_limits
from worker.outcomes import failure, of_run
from worker.resume import keep_verified_latest
from worker.watchdog import CANCEL_GRACE_SECONDS, Watchdog


def _checkpoint(directory: Path, step: int, data: bytes) -> str:
    """A step file with its sha256 sidecar, as training.checkpoints writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(data).hexdigest()
    (directory / f"step-{step}.pt").write_bytes(data)
    (directory / f"step-{step}.sha256").write_text(f"{digest}  step-{step}.pt\n")
    return digest


def test_a_corrupt_latest_checkpoint_is_set_aside_for_the_one_before(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 22, b"older")
    _checkpoint(tmp_path, 44, b"newer")
    (tmp_path / "step-44.pt").write_bytes(b"newer, but torn")
    sink = RecordingSink()

    keep_verified_latest(tmp_path, {}, sink)

    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-22.pt"]
    assert (tmp_path / "step-44.pt.corrupt").is_file()
    assert len(sink.events) == 1
    assert sink.events[0][0] == "warning"
    assert sink.events[0][1].startswith("step-44.pt does not match its recorded sha256")


def test_the_database_sha256_wins_over_the_sidecar(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 22, b"state")
    sink = RecordingSink()
    keep_verified_latest(tmp_path, {str(tmp_path / "step-22.pt"): "0" * 64}, sink)
    assert not list(tmp_path.glob("step-*.pt"))
    assert sink.events[-1] == (
        "warning",
        "no verified checkpoint is left: starting over from step 0",
    )


def test_a_verified_latest_checkpoint_is_left_alone(tmp_path: Path) -> None:
    digest = _checkpoint(tmp_path, 22, b"state")
    sink = RecordingSink()
    keep_verified_latest(tmp_path, {str(tmp_path / "step-22.pt"): digest}, sink)
    keep_verified_latest(tmp_path / "missing", {}, sink)
    assert (tmp_path / "step-22.pt").is_file()
    assert sink.events == []


def test_checkpoint_rows_name_best_pt_for_the_best_and_keep_only_present_files(
    tmp_path: Path,
) -> None:
    _checkpoint(tmp_path, 22, b"a")
    _checkpoint(tmp_path, 44, b"b")
    best = CheckpointInfo(tmp_path / "step-44.pt", "x", 1, 44, 2, is_best=True)
    path, kept = recorded_path(best)
    assert path == tmp_path / "best.pt"
    assert sorted(kept) == [str(tmp_path / "step-22.pt"), str(tmp_path / "step-44.pt")]

    plain = CheckpointInfo(tmp_path / "step-44.pt", "x", 1, 44, 2, is_best=False)
    path, kept = recorded_path(plain)
    assert path == tmp_path / "step-44.pt"
    assert str(tmp_path / "best.pt") in kept


def test_time_limits_grow_with_the_budget_and_stop_at_the_maximum() -> None:
    cpu = torch.device("cpu")
    small = time_limits(100, 1e6, cpu, 7 * 24 * 3600)
    assert small.soft_s == pytest.approx(MIN_LIMIT_S + 100 * (0.05 + 4e6 / 2e9))
    assert small.hard_s == small.soft_s + HARD_GRACE_S
    huge = time_limits(64_000, 253e6 * 128, cpu, 7 * 24 * 3600)
    assert huge.soft_s == 7 * 24 * 3600
    faster = time_limits(64_000, 253e6 * 128, torch.device("cuda", 0), 10**9)
    assert faster.soft_s < time_limits(64_000, 253e6 * 128, cpu, 10**9).soft_s


def test_summaries_become_json_safe_and_failures_one_line() -> None:
    assert json_safe({"a": [1.0, math.nan], "b": {"c": math.inf}, "d": "x"}) == {
        "a": [1.0, None],
        "b": {"c": None},
        "d": "x",
    }
    try:
        raise ValueError("dataset 'cifar10' is missing\nlooked in /data")
    except ValueError as error:
        outcome = failure(error)
    assert (outcome.status, outcome.error) == ("failed", "ValueError: dataset 'cifar10' is missing")
    assert outcome.details is not None
    assert "Traceback" in outcome.details


def _claimed(url: str) -> tuple[Settings, jobs.Claim]:
    settings = Settings(database_url=url, lease_seconds=60, heartbeat_seconds=1.0)
    with session_scope(url) as session:
        job_id = jobs.create(
            session=session, settings=settings, spec=train_spec(epochs=1), max_attempts=3
        ).id
    with session_scope(url) as session:
        claim = jobs.claim(
            session=session, job_id=job_id, worker="w", device="cpu", lease_seconds=60
        )
    assert claim is not None
    return settings, claim


@pytest.mark.parametrize(
    ("stuck", "status", "error"),
    [
        ("cancel", "cancelled", None),
        ("overrun", "failed", "exceeded its hard time limit of 0 s; ended by force"),
    ],
)
def test_the_watchdog_ends_a_stuck_job_and_its_process(
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    stuck: str,
    status: str,
    error: str | None,
) -> None:
    settings, claim = _claimed(sqlite_url)
    watchdog = Watchdog(settings=settings, claim=claim)
    if stuck == "cancel":
        watchdog.cancelled.set()
        watchdog._cancel_seen = time.monotonic() - CANCEL_GRACE_SECONDS - 1
    else:
        watchdog.limits = TimeLimits(0, 0)
    exits: list[int] = []
    monkeypatch.setattr("worker.watchdog.os._exit", exits.append)

    watchdog._enforce_limits()

    assert exits == [1]
    with session_scope(sqlite_url) as session:
        row = session.get(Job, claim.job_id)
        assert row is not None
        assert (row.status, row.error) == (status, error)


def test_a_run_stopped_by_its_soft_limit_fails_with_the_reason(sqlite_url: str) -> None:
    settings, claim = _claimed(sqlite_url)
    watchdog = Watchdog(settings=settings, claim=claim)
    assert of_run({"stopped": False}, watchdog).status == "succeeded"
    watchdog.limits = TimeLimits(0, 60)
    outcome = of_run({"stopped": True}, watchdog)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error.startswith("exceeded its time limit of 0 s")
    watchdog.cancelled.set()
    assert of_run({"stopped": True}, watchdog).status == "cancelled"


def test_a_folder_an_earlier_owner_still_holds_hands_the_job_back(
    settings: Settings, queue: redis.Redis
) -> None:
    quick = settings.model_copy(update={"lease_seconds": 5})  # the fence waits a lease
    with session_scope(quick.database_url) as session:
        job_id = jobs.create(
            session=session, settings=quick, spec=train_spec(epochs=1), max_attempts=3
        ).id
    folder = artifacts.job_dir(quick, job_id) / checkpoints.DIRECTORY
    folder.mkdir(parents=True)
    with (folder / checkpoints.LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as an owner frozen in the middle of a save
        runner.execute(job_id, settings=quick, worker="w")

    row = job(quick.database_url, job_id)
    assert (row.status, row.attempt, row.max_attempts) == ("queued", 1, 4)  # no failed attempt
    log = messages(quick.database_url, job_id)
    assert "handed back: an earlier attempt still holds its checkpoints" in log, log
    assert queued_ids(queue) == [str(job_id)]  # back on its queue, for another try
