"""Helpers of the API tests: keys, jobs made and moved directly in the database, a trained
job with real checkpoints, a submitted job run in this process, a clock that moves when
told."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import torch

from core import artifacts, jobs, keys, kinds
from core.db.session import session_scope
from core.db.tables import Job
from core.kinds import RunContext, TrainJobSpec
from core.queue import QUEUE, RUN_JOB
from core.settings import Settings
from training import checkpoints
from training.datasets import load_dataset
from training.events import RecordingSink
from training.loop import fit
from training.specs import TrainSpec

TRAIN = {"kind": "train", "model": {"name": "resnet20"}, "dataset": {"name": "digits"}}


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
        return jobs.create(session=session, spec=spec, max_attempts=3).id


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


TINY = {
    "model": {"name": "resnet8"},
    "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
    "recipe": {"iterations": 2, "batch_size": 16, "checkpoint_every": 1},
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
    fit(spec, data, out_dir=out, sink=RecordingSink())
    folder = out / "checkpoints"
    saved = [(1, folder / "step-1.pt", False), (2, folder / checkpoints.BEST, True)]
    kept = [str(path) for _, path, _ in saved]
    with session_scope(url) as session:
        for step, path, is_best in saved:
            jobs.record_checkpoint(
                session=session,
                job_id=job_id,
                token=token,
                step=step,
                epoch=step,
                path=str(path),
                sha256=checkpoints.sha256_of(path),
                size=path.stat().st_size,
                is_best=is_best,
                kept=kept,
            )
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


def queued_ids(queue: redis.Redis) -> list[str]:
    """The job ids of the messages on the train queue (kombu's JSON envelope)."""
    ids = []
    for raw in queue.lrange(QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == RUN_JOB
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return ids
