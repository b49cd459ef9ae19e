"""An export beside the rest of the API, served by uvicorn: it runs in a process of its own
(the API's tracing lock stays free, other requests keep their pace), one at a time per
version on Postgres and on SQLite, a bounded number at once per key, within its time
limit; and a submission's validation waits for no lock on the event loop."""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.app import create_app
from core.db.session import session_scope
from core.db.tables import ModelExport
from core.settings import Settings
from models.zoo import TRACING
from tests.helpers import make_key, trained_job
from tests.services import serve

API = "/api/v1"
EXPORTER = b"training.exporter"


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def on_database(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """The module's settings on Postgres, then on the embedded SQLite database."""
    if request.param == "postgres":
        return settings
    return settings.model_copy(update={"database_url": request.getfixturevalue("sqlite_url")})


@pytest.fixture(scope="module")
def job_id(on_database: Settings) -> uuid.UUID:
    return trained_job(on_database)


@contextmanager
def api(settings: Settings, **changes: Any) -> Iterator[httpx.Client]:
    """The API with `settings` (updated with `changes`) served by uvicorn, once its zoo is
    described; a client of it with a read + train key."""
    served = settings.model_copy(update=changes)
    key = make_key(served.database_url, "read", "train")
    headers = {"Authorization": f"Bearer {key}"}
    with (
        serve(create_app(served)) as url,
        httpx.Client(base_url=f"{url}{API}", headers=headers, timeout=300) as client,
    ):
        assert client.get("/models").status_code == 200  # the zoo's counts at start are done
        yield client


def registered(client: httpx.Client, job_id: uuid.UUID) -> str:
    """A new model whose version 1 is the job's best checkpoint; the version's path."""
    name = f"isolated-{uuid.uuid4().hex[:8]}"
    answer = client.post(f"/registry/{name}/versions", json={"job": str(job_id)})
    assert answer.status_code == 201, answer.text
    return f"/registry/{name}/versions/1"


def exporters(pid: int | None = None) -> list[int]:
    """The export processes among the descendants of `pid` (this process by default)."""
    found = []
    for child in children(pid):
        try:
            if EXPORTER in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
        except FileNotFoundError:  # it ended meanwhile
            continue
        found += exporters(child)
    return found


def children(pid: int | None) -> list[int]:
    """The child processes of `pid`'s threads, skipping threads and processes that end meanwhile."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid or 'self'}/task").iterdir())
    except FileNotFoundError:
        return []
    for task in tasks:
        try:
            found += map(int, (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def wait_for_exporter(answer: Future[httpx.Response]) -> None:
    """Return once an export process runs; fail if the request ends first or in 60 s."""
    deadline = time.monotonic() + 60
    while not exporters():
        assert not answer.done(), f"answered with no export process: {answer.result().text}"
        assert time.monotonic() < deadline, "no export process started within 60 s"
        time.sleep(0.02)


def slowest(client: httpx.Client, path: str, until: Future[Any]) -> float:
    """The slowest of the answers to GET `path`, one after another until `until` is done."""
    worst = 0.0
    while not until.done():
        started = time.perf_counter()
        assert client.get(path).status_code == 200
        worst = max(worst, time.perf_counter() - started)
        time.sleep(0.02)
    return worst


def test_an_export_runs_in_a_process_of_its_own_and_the_api_keeps_its_pace(
    settings: Settings,
) -> None:
    job = trained_job(settings)
    with api(settings) as client, ThreadPoolExecutor(3) as pool:
        version = registered(client, job)
        made = pool.submit(client.post, f"{version}/exports", json={"format": "onnx"})
        wait_for_exporter(made)
        health = pool.submit(slowest, client, "/healthz", made)
        zoo = pool.submit(slowest, client, "/models", made)
        free = 0
        while not made.done():
            # The zoo's counts take this lock: the export never holds it in the API.
            assert TRACING.acquire(timeout=1.0), "the API's tracing lock is held by the export"
            TRACING.release()
            free += 1
            time.sleep(0.05)
        assert made.result().status_code == 201, made.result().text
        assert free >= 1
        assert health.result() < 1.0  # as long as the export (seconds) when it held the loop
        assert zoo.result() < 1.0
    assert exporters() == []


def test_racing_exports_of_one_version_make_one_export(
    on_database: Settings, job_id: uuid.UUID
) -> None:
    with api(on_database) as client, ThreadPoolExecutor(2) as pool:
        version = registered(client, job_id)
        body = {"format": "torchscript"}
        first = pool.submit(client.post, f"{version}/exports", json=body)
        wait_for_exporter(first)
        second = pool.submit(client.post, f"{version}/exports", json=body)
        answers = [first.result(), second.result()]
        assert sorted(answer.status_code for answer in answers) == [200, 201], [
            answer.text for answer in answers
        ]
        assert answers[0].json() == answers[1].json()
        row = answers[0].json()
        with session_scope(on_database.database_url) as session:
            assert session.query(ModelExport).filter_by(sha256=row["sha256"]).count() == 1
        download = client.get(row["file"].removeprefix(API))
        assert download.status_code == 200, download.text
        assert hashlib.sha256(download.content).hexdigest() == row["sha256"]


def test_a_key_makes_its_exports_per_key_at_once_and_no_more(settings: Settings) -> None:
    job = trained_job(settings)
    with api(settings, exports_per_key=1) as client, ThreadPoolExecutor(1) as pool:
        one, other = registered(client, job), registered(client, job)
        body = {"format": "torchscript"}
        first = pool.submit(client.post, f"{one}/exports", json=body)
        wait_for_exporter(first)
        refused = client.post(f"{other}/exports", json=body)
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["retry-after"]) > 0
        assert "EXPORTS_PER_KEY" in refused.json()["error"]["message"]
        assert first.result().status_code == 201, first.result().text
        assert client.post(f"{other}/exports", json=body).status_code == 201


def test_an_export_over_its_time_is_stopped_and_nothing_is_kept(settings: Settings) -> None:
    job = trained_job(settings)
    with api(settings, export_timeout_s=0.5) as client:
        version = registered(client, job)
        answer = client.post(f"{version}/exports", json={"format": "onnx"})
        assert answer.status_code == 500, answer.text
        assert "ran over its 0.5 s (EXPORT_TIMEOUT_S)" in answer.json()["error"]["message"]
        assert client.get(f"{version}/exports").json() == []
    assert exporters() == []


def test_a_submission_waits_for_the_zoo_off_the_event_loop(settings: Settings) -> None:
    # A net no process has counted yet: its budget is counted when it is submitted.
    scale = round(random.uniform(0.1, 0.9), 6)
    options = {"shortcut_variant": "constant_scaling", "shortcut_scale": scale}
    spec = {
        "kind": "train",
        "model": {"name": "resnet26", "options": options},
        "dataset": {"name": "synthetic", "image_size": 8, "train_size": 32, "test_size": 8},
        "recipe": {"iterations": 2, "batch_size": 16},
    }
    with api(settings) as client, ThreadPoolExecutor(1) as pool:
        with TRACING:  # as a long count of the zoo (or a trace) would hold it
            submitted = pool.submit(client.post, "/jobs", json=spec)
            time.sleep(1.0)
            started = time.perf_counter()
            assert client.get("/healthz", timeout=5).status_code == 200
            waited = time.perf_counter() - started
            assert not submitted.done()  # its validation waits for the lock...
        assert waited < 0.5  # ...in a worker thread: the event loop answers meanwhile
        assert submitted.result().status_code == 202, submitted.result().text
