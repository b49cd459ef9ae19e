"""Search studies written straight into the database, as a search's trials leave them:
a study with `spec.search` and a cell per trial, each trial's train job and its objective."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from core.db.session import session_scope
from core.db.tables import Job, Metric, Study, utcnow

LR, DECAY = "recipe.lr", "recipe.weight_decay"
SEARCH: dict[str, Any] = {
    "method": "tpe",
    "space": {
        LR: {"type": "loguniform", "low": 0.01, "high": 0.5},
        DECAY: {"type": "uniform", "low": 0.0, "high": 0.001},
    },
    "trials": 6,
    "pruner": "median",
    "objective": "val/error",
    "direction": "minimize",
}
BASE = {"model": {"name": "resnet8"}, "dataset": {"name": "digits"}, "recipe": {"epochs": 4}}


def write_search(
    url: str, made: list[dict[str, Any]], search: dict[str, Any] = SEARCH
) -> uuid.UUID:
    """A search study with a trial per entry of `made` (values, status, objective points
    {step: value}, seconds), its jobs written in reverse order; the study's id."""
    now = utcnow()
    with session_scope(url) as session:
        study = Study(
            name="lr search",
            spec={"base": BASE, "grid": {}, "seeds": [0], "search": search},
            cells=[{"values": t["values"], "paper": None, "trial": n} for n, t in enumerate(made)],
            metric="final_test_error",
            max_parallel=2,
        )
        session.add(study)
        session.flush()
        for cell, trial in reversed(list(enumerate(made))):
            points: dict[int, float] = trial.get("points", {})
            started = now - timedelta(seconds=trial.get("seconds", 0))
            job = Job(
                kind="train",
                status=trial["status"],
                spec={**BASE, "recipe": {"epochs": 4, "lr": trial["values"][LR], "seed": 0}},
                study_id=study.id,
                cell=cell,
                step=max(points, default=0),
                total_steps=400,
                started_at=None if trial["status"] == "queued" else started,
                finished_at=now if trial["status"] not in ("queued", "running") else None,
            )
            session.add(job)
            session.flush()
            session.add_all(
                Metric(job_id=job.id, name="val/error", step=step, value=value)
                for step, value in points.items()
            )
            session.add(Metric(job_id=job.id, name="train/error", step=1, value=0.01))
        return study.id


# Six trials: three succeeded (trial 2 best), one pruned at step 100, one failed, one queued.
MADE: list[dict[str, Any]] = [
    {"values": {LR: 0.1, DECAY: 0.0001}, "status": "succeeded", "seconds": 100,
     "points": {300: 0.30, 100: 0.50, 400: 0.32, 200: 0.40}},
    {"values": {LR: 0.3, DECAY: 0.0005}, "status": "pruned", "seconds": 25,
     "points": {100: 0.70}},
    {"values": {LR: 0.05, DECAY: 0.0002}, "status": "succeeded", "seconds": 90,
     "points": {100: 0.40, 400: 0.20}},
    {"values": {LR: 0.02, DECAY: 0.0009}, "status": "failed", "seconds": 10,
     "points": {100: 0.10}},
    {"values": {LR: 0.2, DECAY: 0.0003}, "status": "succeeded", "seconds": 80,
     "points": {100: 0.45, 400: 0.25}},
    {"values": {LR: 0.4, DECAY: 0.0007}, "status": "queued"},
]  # fmt: skip
