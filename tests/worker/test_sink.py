"""The database sink called directly on Postgres: metric points in batches, events and
checkpoint rows written under the claim's token, nothing more once the lease is lost, a
database gone for the lease's length stopping the job, and one found gone past the lease
meaning the lease is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from core import jobs, layout
from core.db.session import session_scope
from core.settings import Settings
from core.storage import store_for
from tests.helpers import checkpoint_rows, messages, metric_counts, metric_steps, new_job
from training.checkpoints import BEST, CheckpointInfo, sha256_of
from worker.homes import RETRY_FIRST_S, StoredHome
from worker.sink import DatabaseSink, DatabaseUnavailableError, while_leased
from worker.watchdog import Watchdog

NOWHERE = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"  # no server listens there


def _sink(settings: Settings, url: str | None = None) -> DatabaseSink:
    """The sink of a job claimed now, with its (unstarted) watchdog."""
    job_id = new_job(settings.database_url)
    with session_scope(settings.database_url) as session:
        claim = jobs.claim(
            session=session, job_id=job_id, worker="w", device="cpu", lease_seconds=60
        )
    assert claim is not None
    watchdog = Watchdog(settings=settings, claim=claim)
    return DatabaseSink(url=url or settings.database_url, claim=claim, watchdog=watchdog)


def _take_over(settings: Settings, sink: DatabaseSink) -> None:
    """Another worker claims the job (its lease made to have run out)."""
    with session_scope(settings.database_url) as session:
        jobs.heartbeat(
            session=session, job_id=sink.claim.job_id, token=sink.claim.token, lease_seconds=-1
        )
        taken = jobs.claim(
            session=session, job_id=sink.claim.job_id, worker="w2", device="cpu", lease_seconds=60
        )
    assert taken is not None


def _checkpoint(folder: Path, step: int, *, is_best: bool) -> CheckpointInfo:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step}.pt"
    path.write_bytes(f"state at {step}".encode())
    if is_best:
        (folder / BEST).write_bytes(path.read_bytes())
    return CheckpointInfo(path, sha256_of(path), path.stat().st_size, step, step, is_best)


def test_metric_points_wait_for_a_flush_and_are_written_once(settings: Settings) -> None:
    sink, url = _sink(settings), settings.database_url
    job_id = sink.claim.job_id
    sink.on_metrics(1, 0.1, {"train/loss": 2.0, "train/error": 0.9})
    sink.on_metrics(2, 0.2, {"train/loss": 1.0})
    assert metric_counts(url, job_id) == (0, 0)  # buffered

    sink.flush()
    sink.flush()  # nothing left to write

    assert metric_steps(url, job_id, "train/loss") == [1, 2]
    assert metric_counts(url, job_id) == (3, 3)


def test_a_value_that_is_not_finite_is_not_stored_and_said_once(settings: Settings) -> None:
    sink, url = _sink(settings), settings.database_url
    sink.on_metrics(1, 0.1, {"train/loss": float("nan")})
    sink.on_metrics(2, 0.2, {"train/loss": float("inf")})
    sink.flush()
    assert metric_counts(url, sink.claim.job_id) == (0, 0)
    said = [line for line in messages(url, sink.claim.job_id) if "not stored" in line]
    assert said == ["train/loss is nan at step 1; not stored"]


def test_a_sink_whose_lease_was_taken_over_writes_nothing_more(settings: Settings) -> None:
    sink, url = _sink(settings), settings.database_url
    sink.on_event("info", "mine")
    _take_over(settings, sink)

    with pytest.raises(jobs.LeaseLost):
        sink.on_event("info", "after the takeover")
    assert sink.watchdog.lost.is_set()
    assert sink.should_stop()
    with pytest.raises(jobs.LeaseLost):  # refused at once, before any write
        sink.on_metrics(3, 0.3, {"train/loss": 1.0})
    log = messages(url, sink.claim.job_id)
    assert "mine" in log
    assert "after the takeover" not in log


def test_the_best_checkpoint_is_recorded_as_best_pt_and_a_later_one_as_its_step(
    settings: Settings, tmp_path: Path
) -> None:
    sink, url = _sink(settings), settings.database_url
    folder = tmp_path / "checkpoints"
    sink.on_checkpoint(_checkpoint(folder, 1, is_best=True))
    sink.on_checkpoint(_checkpoint(folder, 2, is_best=False))

    rows = checkpoint_rows(url, sink.claim.job_id)
    assert [(row.step, Path(row.path).name, row.is_best) for row in rows] == [
        (1, BEST, True),
        (2, "step-2.pt", False),
    ]
    assert rows[1].sha256 == sha256_of(folder / "step-2.pt")
    assert sink.checkpoint_bytes == (folder / "step-2.pt").stat().st_size


def test_a_cancel_request_or_overtime_stops_the_run(settings: Settings) -> None:
    sink = _sink(settings)
    assert not sink.should_stop()
    sink.watchdog.cancelled.set()
    assert sink.should_stop()
    other = _sink(settings)
    other.watchdog.started -= settings.max_job_seconds + 1
    assert other.should_stop()


def test_a_database_gone_until_the_lease_runs_out_stops_the_job(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = _sink(settings, url=NOWHERE)
    # Less lease left than the first retry's delay: no time to retry in.
    monkeypatch.setattr(Watchdog, "lease_left", property(lambda _: RETRY_FIRST_S / 2))
    with pytest.raises(DatabaseUnavailableError, match="until the lease ran out"):
        sink.on_event("info", "lost")
    with pytest.raises(DatabaseUnavailableError):
        while_leased(NOWHERE, sink.watchdog, lambda session: session.scalar(select(1)))
    assert not sink.watchdog.lost.is_set()


def test_a_database_gone_once_the_lease_ran_out_means_the_lease_is_lost(
    settings: Settings,
) -> None:
    sink = _sink(settings, url=NOWHERE)
    sink.watchdog.renewed -= settings.lease_seconds + 1  # paused past its lease, say
    with pytest.raises(jobs.LeaseLost, match="lost its lease"):
        sink.on_event("info", "too late")
    assert sink.watchdog.lost.is_set()


def test_with_a_store_each_checkpoint_is_put_and_its_row_names_its_key(
    settings: Settings, tmp_path: Path
) -> None:
    sink, url = _sink(settings), settings.database_url
    store = store_for(settings)
    sink.home = StoredHome(store, sink.watchdog)
    job_id, folder = sink.claim.job_id, tmp_path / "checkpoints"
    sink.on_checkpoint(_checkpoint(folder, 1, is_best=True))
    sink.on_checkpoint(_checkpoint(folder, 2, is_best=False))

    keys = [layout.checkpoint_key(job_id, f"step-{step}.pt") for step in (1, 2)]
    assert [row.path for row in checkpoint_rows(url, job_id)] == keys
    assert sorted(store.keys(layout.checkpoints_prefix(job_id))) == keys
    assert Path(store.ref(keys[1])).read_bytes() == b"state at 2"
