"""CSV files the service writes open in a spreadsheet as text: a job name or a class folder
that a spreadsheet would run as a formula is quoted, in `/jobs.csv` and in a predict job's
`predictions.csv`, over HTTP on Postgres with a run as a worker does it; numbers stay
numbers."""

from __future__ import annotations

import csv
import io
import uuid

import redis
from fastapi.testclient import TestClient
from PIL import Image

from core import artifacts
from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.helpers import run_job, trained_job
from training.events import RecordingSink

JOBS = "/api/v1/jobs"
FORMULAS = ('=HYPERLINK("http://x.test","y")', "@SUM(1)", "+1+2", "-1+2", "\tx", "\rx")


def test_the_job_list_quotes_formula_names_and_keeps_numbers(
    client: TestClient, settings: Settings, queue: redis.Redis
) -> None:
    job_id = trained_job(settings)  # best_test_error 0.5, params 75,002
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.name, job.tags, job.note = FORMULAS[0], ["-tag"], "@note"
    answer = client.get(f"{JOBS}.csv", params={"columns": "spec.model.name"})
    assert answer.status_code == 200, answer.text
    rows = {row["id"]: row for row in csv.DictReader(io.StringIO(answer.text))}
    row = rows[str(job_id)]
    assert (row["name"], row["tags"], row["note"]) == (f"'{FORMULAS[0]}", "'-tag", "'@note")
    assert (row["best_test_error"], row["params"], row["spec.model.name"]) == (
        "0.5",
        "75002",
        "resnet8",
    )


def test_predictions_quote_formula_class_and_file_names_and_keep_probabilities(
    client: TestClient, settings: Settings, queue: redis.Redis
) -> None:
    tree = settings.data_dir / f"formulas-{uuid.uuid4().hex[:8]}"
    for label in FORMULAS[1:4]:  # class folders only: a seeded fifth of each is the test
        (tree / label).mkdir(parents=True)
        for index in range(5):
            Image.new("RGB", (8, 8), (200, 20, index)).save(tree / label / f"{index}.png")
    model = trained_job(settings)
    dataset = {"name": "imagefolder", "path": tree.name}
    spec = {"kind": "predict", "model": str(model), "dataset": dataset, "top_k": 2}
    answer = client.post(JOBS, json=spec)
    assert answer.status_code == 202, answer.text
    job_id = uuid.UUID(answer.json()["id"])

    run_job(settings, job_id, RecordingSink())

    text = (artifacts.job_dir(settings, job_id) / "predictions.csv").read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    quoted = sorted(f"'{label}" for label in FORMULAS[1:4])
    assert [row["label"] for row in rows] == quoted
    assert [row["file"].split("/")[0] for row in rows] == quoted
    cells = [cell for row in rows for cell in row.values()]
    assert not [cell for cell in cells if cell[:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert all(0 <= float(row["prob_1"]) <= 1 for row in rows)  # numbers, unquoted
