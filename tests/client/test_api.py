"""The Python client against a real HTTP server: jobs, paging, errors as exceptions, events,
metrics, studies, the registry and predictions."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from client import (
    Client,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    Point,
    ServiceUnreachableError,
    UnauthorizedError,
)
from core import jobs
from core.db.session import session_scope
from core.kinds import TrainJobSpec
from core.queue import QUEUE
from core.settings import Settings
from tests import images
from tests.helpers import TRAIN, claim, finish, make_key, new_job, trained_job

SMALL = {**TRAIN, "model": {"name": "resnet8"}, "recipe": {"epochs": 1}}
BASE = {"model": {"name": "resnet8"}, "dataset": {"name": "digits", "validation": 0}}
RED = images.flat_png((200, 30, 30))


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "read", "train", "predict")


@pytest.fixture
def service(live_url: str, key: str) -> Iterator[Client]:
    with Client(live_url, key, timeout=60) as client:
        yield client


def test_submit_read_list_cancel_delete(service: Client, queue: redis.Redis) -> None:
    job = service.submit({**SMALL, "name": "from the client", "tags": ["client"]})
    assert (job["status"], job["name"], job["model"]) == ("queued", "from the client", "resnet8")
    assert queue.llen(QUEUE) == 1
    assert service.job(job["id"])["spec"]["recipe"]["epochs"] == 1
    listed = [item["id"] for item in service.jobs(status=["queued"], tag="client")]
    assert job["id"] in listed
    with pytest.raises(ConflictError):
        service.retry(job["id"])  # only a failed, cancelled or pruned job is retried
    assert service.cancel(job["id"])["status"] == "cancelled"
    assert service.retry(job["id"])["job"]["status"] == "queued"
    service.cancel(job["id"])
    service.delete(job["id"])
    with pytest.raises(NotFoundError) as missing:
        service.job(job["id"])
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert "does not exist" in missing.value.message


def test_submit_takes_a_pydantic_spec(service: Client, queue: redis.Redis) -> None:
    spec = TrainJobSpec.model_validate({**SMALL, "name": "typed"})
    job = service.submit(spec, idempotency_key=f"typed-{uuid.uuid4()}")
    assert (job["name"], job["kind"]) == ("typed", "train")


def test_jobs_pages_through_every_match(service: Client, settings: Settings) -> None:
    tag = f"paged-{uuid.uuid4().hex[:8]}"
    made = {str(new_job(settings.database_url, tags=[tag])) for _ in range(5)}
    first = service.jobs_page(tag=tag, limit=2)
    assert len(first["items"]) == 2
    assert first["next_cursor"] is not None
    assert {job["id"] for job in service.jobs(tag=tag, page_size=2)} == made
    assert len(list(service.jobs(tag=tag, page_size=2))) == 5  # no page repeats a job


def test_jobs_filter_sort_export_and_update(service: Client, settings: Settings) -> None:
    tag = f"search-{uuid.uuid4().hex[:8]}"
    made = [str(new_job(settings.database_url, tags=[tag], recipe={"lr": lr})) for lr in (0.1, 0.2)]
    found = service.jobs(tag=[tag], filters=["recipe.lr>0.15"], sort="-recipe.lr")
    assert [job["id"] for job in found] == made[1:]
    frame = service.jobs_frame(tag=tag, sort="recipe.lr", columns=["recipe.lr"])
    assert list(frame.index) == made
    assert list(frame["recipe.lr"]) == [0.1, 0.2]
    assert service.jobs_csv(tag=tag).splitlines()[0].startswith("id,name,kind,status")
    mine = service.submit({**SMALL, "tags": [tag]})
    edited = service.update(mine["id"], tags=[tag, "keep"], note="the better lr")
    assert (edited["tags"], edited["note"]) == ([tag, "keep"], "the better lr")
    assert service.update(mine["id"], note="")["note"] is None
    with pytest.raises(ForbiddenError):  # made in the database: no key owns it
        service.update(made[0], note="mine")


def test_refusals_are_exceptions(service: Client, live_url: str, settings: Settings) -> None:
    with pytest.raises(InvalidError) as invalid:
        service.submit({**TRAIN, "model": {"name": "resnet21"}, "recipe": {"lr": -1}})
    assert invalid.value.status == 422
    where = {tuple(detail["loc"]) for detail in invalid.value.details}
    assert {("body", "model"), ("body", "recipe", "lr")} <= where
    with Client(live_url, "rs_0_0") as stranger, pytest.raises(UnauthorizedError) as unknown:
        stranger.job(str(uuid.uuid4()))
    assert "unknown or revoked" in unknown.value.message
    reader = make_key(settings.database_url, "read")
    with Client(live_url, reader) as limited, pytest.raises(ForbiddenError):
        limited.submit(SMALL)


def test_an_unreachable_service_fails_fast() -> None:
    started = time.monotonic()
    with Client("http://127.0.0.1:9", "rs_0_0") as nowhere, pytest.raises(ServiceUnreachableError):
        nowhere.health()
    assert time.monotonic() - started < 5


def test_health_session_and_ready(service: Client) -> None:
    assert service.health() == {"status": "ok"}
    assert {"train", "evaluate"} <= {kind["kind"] for kind in service.kinds()}
    assert service.session() == {"auth_enabled": True, "scopes": ["predict", "read", "train"]}
    assert service.ready()["checks"]["database"] == "ok"


def _work(url: str, job_id: uuid.UUID, opened: threading.Event | None = None) -> None:
    """Play a worker: a log line and metric points, then success; once `opened` is set (a
    stream watching the job is open) when one is given, so that its points are new to it."""
    token = claim(url, job_id)
    if opened is not None:
        opened.wait(30)  # on a timeout the test's stream lacks the points, and says so
    points = [jobs.Point("train/loss", step, 1 / step) for step in (1, 2, 3)]
    with session_scope(url) as session:
        jobs.write_metrics(session=session, job_id=job_id, token=token, points=points)
        jobs.add_event(session=session, job_id=job_id, level="info", message="ran", token=token)
    finish(url, job_id, token, best_test_error=0.1)


def test_events_metrics_and_wait(service: Client, settings: Settings) -> None:
    job_id = new_job(settings.database_url)
    opened = threading.Event()
    worker = threading.Thread(target=_work, args=(settings.database_url, job_id, opened))
    worker.start()
    events = []
    for event in service.events(str(job_id)):
        opened.set()  # the stream's first event: the points from now on are new to it
        events.append(event)
    worker.join(10)
    names = [event.name for event in events]
    assert names[-1] == "end"
    assert "metrics" in names  # the points written while it was open came live
    assert events[-1].data["status"] == "succeeded"
    assert any(event.name == "log" and event.data["message"] == "ran" for event in events)
    assert service.wait(job_id, timeout=5)["status"] == "succeeded"  # a UUID does too
    streamed = list(service.stream_metrics(str(job_id), since_step=0))
    assert [(p.name, p.step) for p in streamed] == [("train/loss", s) for s in (1, 2, 3)]
    curves = service.metrics(str(job_id))
    assert curves == {"train/loss": [Point(1, 1.0), Point(2, 0.5), Point(3, 1 / 3)]}
    assert service.metrics(str(job_id), ["test/error"]) == {}


def test_metrics_frame(service: Client, settings: Settings) -> None:
    pandas = pytest.importorskip("pandas")
    job_id = new_job(settings.database_url)
    _work(settings.database_url, job_id)
    frame = service.metrics_frame(str(job_id))
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns) == ["train/loss"]
    assert frame.index.name == "step"
    assert frame.loc[2, "train/loss"] == 0.5


def test_wait_gives_up_at_its_deadline(service: Client, settings: Settings) -> None:
    job_id = new_job(settings.database_url)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still queued"):
        service.wait(str(job_id), timeout=0.5, interval=0.1)
    assert time.monotonic() - started < 2


def test_study_preview_submit_results_cancel(service: Client, queue: redis.Redis) -> None:
    preview = service.preview_study("degradation", dataset="fashion_mnist")
    assert preview["jobs"] == len(preview["cells"]) > 2
    assert queue.llen(QUEUE) == 0  # a dry run writes nothing
    grid = {"model.name": ["plain8", "resnet8"]}
    study = service.submit_study(base=BASE, grid=grid, seeds=2, max_parallel=1, name="client")
    assert (study["counts"]["total"], study["state"]) == (4, "queued")
    rows = service.study_results(study["id"])
    assert [(row["values"], row["jobs"]) for row in rows] == [
        ({"model.name": "plain8"}, 2),
        ({"model.name": "resnet8"}, 2),
    ]
    csv = service.study_results_csv(study["id"]).splitlines()
    assert csv[0].startswith("model.name,")
    assert [line.split(",")[0] for line in csv[1:]] == ["plain8", "resnet8"]
    assert "| plain8 |" in service.study_results_markdown(study["id"])
    assert study["id"] in [item["id"] for item in service.studies()]
    assert len(list(service.jobs(study=uuid.UUID(study["id"])))) == 4
    assert "degradation" in [preset["name"] for preset in service.presets()]
    service.cancel_study(study["id"])
    assert service.wait_study(study["id"], timeout=5)["state"] == "cancelled"
    with pytest.raises(InvalidError, match="resnet9"):
        service.submit_study(base=BASE, grid={"model.name": ["resnet8", "resnet9"]})


def test_registry_alias_and_predict(service: Client, settings: Settings, tmp_path: Path) -> None:
    job_id = str(trained_job(settings))
    assert [c["step"] for c in service.checkpoints(job_id)] == [1, 2]
    name = f"client-{uuid.uuid4().hex[:8]}"
    version = service.register(name, job_id)
    assert (version["version"], version["step"], version["job_id"]) == (1, 2, job_id)
    alias = service.set_alias(name, "production", 1)
    assert alias["version"] == 1
    model = service.registered(name)
    assert [a["alias"] for a in model["aliases"]] == ["production"]
    assert [m["name"] for m in service.registry(q=name)] == [name]

    path = tmp_path / "red.png"
    path.write_bytes(RED)
    answer = service.predict([path, ("raw.png", RED)], f"{name}@production", top_k=3)
    assert answer["model"]["job_id"] == job_id
    assert [r["file"] for r in answer["results"]] == ["red.png", "raw.png"]
    assert all(len(r["top_k"]) == 3 and r["error"] is None for r in answer["results"])
    alone, batched = service.predict(RED, job_id, top_k=1), answer["results"][0]["top_k"][0]
    assert alone["model"]["ref"] == job_id
    assert alone["results"][0]["top_k"][0]["label"] == batched["label"]
    assert alone["results"][0]["top_k"][0]["probability"] == pytest.approx(batched["probability"])

    service.delete_alias(name, "production")
    with pytest.raises(NotFoundError):
        service.predict(RED, f"{name}@production")
