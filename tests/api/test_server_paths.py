"""What clients read of a job holds no server file path: a predict job's pinned checkpoint,
a fine-tune's, an evaluation's summary, the checkpoint list (a name and a download link
instead), the job list's CSV; the runs, as a worker does them, still read the files."""

from __future__ import annotations

import csv
import io
import uuid

import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import run_job, trained_job
from training.events import RecordingSink

JOBS = "/api/v1/jobs"
DIGITS = {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8}


def _no_server_path(text: str, settings: Settings) -> None:
    assert str(settings.artifact_dir) not in text
    assert str(settings.artifact_dir.resolve()) not in text


def test_job_views_keep_checkpoint_paths_on_the_server(
    client: TestClient, settings: Settings, queue: redis.Redis
) -> None:
    source = trained_job(settings)
    registered = client.post("/api/v1/registry/paths/versions", json={"job": str(source)})
    assert registered.status_code == 201, registered.text
    sent = {
        "predict": {"kind": "predict", "model": "paths", "dataset": DIGITS},
        "evaluate": {"kind": "evaluate", "source_job": str(source), "dataset": DIGITS},
        "train": {
            "kind": "train",
            "model": {"name": "resnet8"},
            "dataset": DIGITS,
            "recipe": {"iterations": 1, "batch_size": 16},
            "init": {"source": "paths/1"},
        },
    }
    made = {kind: client.post(JOBS, json=spec) for kind, spec in sent.items()}
    assert all(answer.status_code == 202 for answer in made.values()), made
    ids = {kind: uuid.UUID(answer.json()["id"]) for kind, answer in made.items()}
    with session_scope(settings.database_url) as session:  # the worker's spec keeps them
        specs = {
            kind: session.scalars(select(Job.spec).where(Job.id == ids[kind])).one()
            for kind in ("predict", "train")
        }
    assert str(settings.artifact_dir) in specs["predict"]["resolved"]["path"]
    assert str(settings.artifact_dir) in specs["train"]["init"]["resolved"]["path"]

    for kind in ("predict", "evaluate"):
        run_job(settings, ids[kind], RecordingSink())
    for job_id in ids.values():
        _no_server_path(client.get(f"{JOBS}/{job_id}").text, settings)
    predict, tune = client.get(f"{JOBS}/{ids['predict']}").json(), made["train"].json()
    assert predict["spec"]["resolved"]["sha256"] == predict["summary"]["model"]["sha256"]
    assert "path" not in predict["spec"]["resolved"]
    assert "path" not in tune["spec"]["init"]["resolved"]
    checkpoint = client.get(f"{JOBS}/{ids['evaluate']}").json()["summary"]["checkpoint"]
    assert set(checkpoint) == {"step", "name", "sha256"}
    assert (checkpoint["step"], checkpoint["name"]) == (2, "best.pt")

    listed = client.get(f"{JOBS}/{source}/checkpoints")
    _no_server_path(listed.text, settings)
    rows = listed.json()
    assert [(row["step"], row["name"]) for row in rows] == [(1, "step-1.pt"), (2, "best.pt")]
    fetched = client.get(rows[1]["download"])
    assert fetched.status_code == 200, fetched.text
    assert fetched.headers["X-Checksum-Sha256"] == rows[1]["sha256"]

    columns = "spec.resolved.path,spec.resolved,summary.checkpoint,spec.init.resolved"
    table = client.get(f"{JOBS}.csv", params={"columns": columns})
    assert table.status_code == 200, table.text
    _no_server_path(table.text, settings)
    by_id = {row["id"]: row for row in csv.DictReader(io.StringIO(table.text))}
    assert by_id[str(ids["predict"])]["spec.resolved.path"] == ""
    assert '"sha256"' in by_id[str(ids["predict"])]["spec.resolved"]
