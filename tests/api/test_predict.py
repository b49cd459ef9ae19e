"""Prediction over HTTP with a model a real worker trained: accuracy, equality with the
evaluation engine, alias switches under load, bad inputs, limits, the cache and scopes.

A `resnet-service worker` process trains ResNet-8 on digits once for the module.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image
from sqlalchemy import select, update
from typer.testing import CliRunner

from api.app import create_app
from cli.main import app
from core import artifacts, model_registry
from core.db.session import session_scope
from core.db.tables import ModelVersion, RegisteredModel
from core.kinds import TrainJobSpec
from core.settings import Settings
from serving.cache import RefCache
from tests import images
from tests.helpers import make_key, new_job, recipe, submit, trained_job, wait_status
from tests.services import WorkerProcess, service_env
from training import checkpoints
from training.data import TensorSplit
from training.datasets import load_dataset
from training.runs import load_trained_model
from training.specs import DigitsSpec

pytestmark = pytest.mark.slow

PREDICT = "/api/v1/predict"
MAX_FILES = 16
MAX_IMAGE_BYTES = 64 * 1024
DIGITS = DigitsSpec(name="digits", validation=0)


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The API's settings with small prediction limits, so the tests can pass them."""
    return settings.model_copy(
        update={"predict_max_files": MAX_FILES, "predict_max_image_bytes": MAX_IMAGE_BYTES}
    )


@pytest.fixture(scope="module")
def digits_job(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> uuid.UUID:
    """ResNet-8 trained on digits (10 epochs) by a real worker process, once."""
    spec = TrainJobSpec.model_validate(
        {
            "model": {"name": "resnet8"},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(epochs=10),
        }
    )
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = WorkerProcess("predict", service_env(settings, settings.artifact_dir), log)
    try:
        worker.wait_ready()
        job_id = submit(settings, spec)
        wait_status(settings.database_url, job_id, "succeeded", timeout=180)
    finally:
        worker.stop()
    return job_id


@pytest.fixture(scope="module")
def registered(client: TestClient, settings: Settings, digits_job: uuid.UUID) -> uuid.UUID:
    """digits/1 (the worker's best checkpoint) as `production`, digits/2 another net."""
    for job_id in (digits_job, trained_job(settings)):
        answer = client.post("/api/v1/registry/digits/versions", json={"job": str(job_id)})
        assert answer.status_code == 201, answer.text
    moved = client.put("/api/v1/registry/digits/aliases/production", json={"version": 1})
    assert moved.status_code == 200, moved.text
    return digits_job


@pytest.fixture(scope="module")
def predictor(anonymous: TestClient, settings: Settings) -> Iterator[TestClient]:
    """A client of the module's app with a predict key."""
    key = make_key(settings.database_url, "predict", "read")
    with TestClient(anonymous.app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def digit_test_split(root: Path) -> TensorSplit:
    """The digits test split, as the training run saw it (same spec, same seed)."""
    test = load_dataset(DIGITS, data_root=root).test
    assert isinstance(test, TensorSplit)
    return test


def as_files(pngs: list[tuple[str, bytes]]) -> list[tuple[str, tuple[str, bytes, str]]]:
    """A multipart `files` list."""
    return [("files", (name, data, "image/png")) for name, data in pngs]


def digit_png(test: TensorSplit, index: int) -> bytes:
    """Test image `index` rendered as an 8x8 grayscale PNG."""
    return images.encode(Image.fromarray(test.images[index][0].numpy(), mode="L"))


def engine_probabilities(path: Path, test: TensorSplit) -> torch.Tensor:
    """The evaluation engine's class probabilities for the whole test split."""
    trained = load_trained_model(path)
    model, info = trained.model, trained.info
    return images.engine_probabilities(model, info, test)


def test_digits_are_classified_as_the_evaluation_engine_does(
    predictor: TestClient, registered: uuid.UUID, settings: Settings, tmp_path: Path
) -> None:
    test = digit_test_split(tmp_path)
    correct, answered = 0, []
    for start in range(0, len(test.labels), MAX_FILES):
        indices = range(start, min(start + MAX_FILES, len(test.labels)))
        files = as_files([(f"digit-{i}.png", digit_png(test, i)) for i in indices])
        answer = predictor.post(PREDICT, params={"model": "digits@production"}, files=files)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        for index, result in zip(indices, body["results"], strict=True):
            assert (result["file"], result["resize"], result["error"]) == (
                f"digit-{index}.png",
                "none",
                None,
            )
            correct += result["top_k"][0]["index"] == int(test.labels[index])
            answered.append(result["top_k"])
    assert correct / len(test.labels) >= 0.95

    served = body["model"]
    assert (served["ref"], served["name"], served["version"]) == ("digits@production", "digits", 1)
    assert served["job_id"] == str(registered)
    assert body["preprocessing"]["channels"] == 1
    assert body["preprocessing"]["input_size"] == [8, 8]
    assert body["timing"]["total_ms"] >= body["timing"]["queue_forward_ms"] > 0
    # The same probabilities as the evaluation engine on the same checkpoint and images.
    best = artifacts.job_dir(settings, registered) / checkpoints.DIRECTORY / checkpoints.BEST
    engine = engine_probabilities(best, test)
    for row, top in zip(engine, answered, strict=True):
        assert len(top) == 5
        assert [t["index"] for t in top] == row.topk(5).indices.tolist()
        expected = row.topk(5).values.tolist()
        assert [t["probability"] for t in top] == pytest.approx(expected, abs=1e-5)
        assert top[0]["label"] == str(top[0]["index"])


def test_a_loaded_model_is_not_loaded_again(
    predictor: TestClient, registered: uuid.UUID, tmp_path: Path
) -> None:
    files = as_files([("a.png", digit_png(digit_test_split(tmp_path), 0))])
    ref = {"model": str(registered), "top_k": 2}
    assert predictor.post(PREDICT, params=ref, files=files).status_code == 200
    loads = predictor.get(f"{PREDICT}/stats").json()["loads"]
    answer = predictor.post(PREDICT, params=ref, files=files)
    assert answer.status_code == 200
    assert len(answer.json()["results"][0]["top_k"]) == 2
    assert answer.json()["model"]["version"] is None  # a job id reference
    stats = predictor.get(f"{PREDICT}/stats").json()
    assert stats["loads"] == loads >= 1
    assert sum(m["images"] for m in stats["models"]) > 0


def test_moving_the_alias_under_load_fails_no_request(
    live_url: str, settings: Settings, registered: uuid.UUID, tmp_path: Path
) -> None:
    files = as_files([("seven.png", digit_png(digit_test_split(tmp_path), 7))])
    # An admin key: the alias it moves is of a model another key registered.
    key = make_key(settings.database_url, "admin")

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=f"{live_url}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60
        ) as http:

            async def one() -> httpx.Response:
                params = {"model": "digits@production"}
                return await http.post("/predict", params=params, files=files)

            async def flip(version: int) -> None:
                moved = await http.put(
                    "/registry/digits/aliases/production", json={"version": version}
                )
                assert moved.status_code == 200, moved.text

            # Ten rounds of ten concurrent requests, each round racing one alias move: the
            # rounds alternate the version, so both are served whatever the timing.
            answers: list[httpx.Response] = []
            for n in range(10):
                wave, _ = await asyncio.gather(
                    asyncio.gather(*(one() for _ in range(10))), flip(2 - n % 2)
                )
                answers += wave
            await flip(1)
            return answers

    answers = asyncio.run(fire())
    assert [a.status_code for a in answers] == [200] * 100, [a.text for a in answers][:3]
    versions = {a.json()["model"]["version"] for a in answers}
    assert versions <= {1, 2}
    assert len(versions) == 2, "the alias moves while requests are served"


BOMB = images.png_header(20_000, 20_000)
TRUNCATED = images.encode(Image.new("L", (64, 64), 3))[:60]


@pytest.mark.parametrize(
    ("name", "data", "status", "message"),
    [
        ("empty.png", b"", 400, "empty.png: the file is empty"),
        ("notes.txt", b"hello, I am text", 415, "notes.txt: not an image"),
        (
            "cut.png",
            images.encode(Image.new("L", (64, 64), 3))[:60],
            400,
            "cut.png: the image is truncated",
        ),
        ("bomb.png", BOMB, 413, "bomb.png: over the limit"),
        ("big.png", b"\x89PNG" + bytes(MAX_IMAGE_BYTES), 413, "big.png: 65,540 bytes is over"),
    ],
)
def test_a_bad_file_alone_fails_the_request_naming_it(
    predictor: TestClient, registered: uuid.UUID, name: str, data: bytes, status: int, message: str
) -> None:
    started = time.perf_counter()
    answer = predictor.post(
        PREDICT, params={"model": "digits@production"}, files=as_files([(name, data)])
    )
    assert time.perf_counter() - started < 1  # the bomb is refused from its header
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert message in error["message"]
    assert error["details"][0]["loc"] == ["body", "files", 0]


def test_good_files_are_answered_beside_bad_ones(
    predictor: TestClient, registered: uuid.UUID, tmp_path: Path
) -> None:
    good = digit_png(digit_test_split(tmp_path), 3)
    files = as_files([("bad.txt", b"text"), ("good.png", good), ("empty.png", b"")])
    answer = predictor.post(PREDICT, params={"model": "digits"}, files=files)
    assert answer.status_code == 200, answer.text
    bad, fine, empty = answer.json()["results"]
    assert (bad["file"], bad["top_k"], bad["error"]["status"]) == ("bad.txt", [], 415)
    assert (fine["error"], len(fine["top_k"])) == (None, 5)
    assert empty["error"] == {"status": 400, "message": "empty.png: the file is empty"}
    assert answer.json()["model"]["version"] == 2  # `digits` is its latest version


def _many_files(count: int) -> list[tuple[str, tuple[str, bytes, str]]]:
    return as_files([(f"f{i}.png", b"x") for i in range(count)])


@pytest.mark.parametrize(
    ("params", "files", "status", "message"),
    [
        ({"model": "nobody"}, None, 404, "model 'nobody' is not registered"),
        ({"model": "digits/9"}, None, 404, "has no version 9"),
        ({"model": "digits@staging"}, None, 404, "has no alias 'staging'"),
        ({"model": str(uuid.uuid4())}, None, 404, "does not exist"),
        ({"model": "../etc/passwd"}, None, 422, "must be a job id, name"),
        ({"model": "digits"}, _many_files(MAX_FILES + 1), 413, "17 files is over the limit of 16"),
        ({"model": "digits"}, [], 422, "files"),
        ({"model": "digits", "top_k": 0}, None, 422, "top_k"),
    ],
)
def test_requests_that_cannot_be_served(
    predictor: TestClient,
    registered: uuid.UUID,
    tmp_path: Path,
    params: dict[str, Any],
    files: list[Any] | None,
    status: int,
    message: str,
) -> None:
    if files is None:
        files = as_files([("a.png", digit_png(digit_test_split(tmp_path), 0))])
    answer = predictor.post(PREDICT, params=params, files=files or None)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]


def test_a_job_that_has_not_succeeded_cannot_serve(
    predictor: TestClient, settings: Settings, registered: uuid.UUID
) -> None:
    queued = new_job(settings.database_url)
    answer = predictor.post(
        PREDICT, params={"model": str(queued)}, files=as_files([("a.png", b"x")])
    )
    assert answer.status_code == 409
    assert "queued train job" in answer.json()["error"]["message"]


def test_an_oversized_body_is_refused_and_the_service_keeps_answering(
    predictor: TestClient, registered: uuid.UUID, tmp_path: Path
) -> None:
    huge = [("files", (f"f{i}.png", bytes(MAX_IMAGE_BYTES), "image/png")) for i in range(20)]
    answer = predictor.post(PREDICT, params={"model": "digits"}, files=huge)
    assert answer.status_code == 413
    assert "request body is larger than the limit" in answer.json()["error"]["message"]

    # A streamed body without a Content-Length is counted as it arrives.
    def chunks() -> Iterator[bytes]:
        yield b"--x\r\nContent-Disposition: form-data; name=files; filename=a.png\r\n\r\n"
        for _ in range(20):
            yield bytes(MAX_IMAGE_BYTES)

    headers = {"Content-Type": "multipart/form-data; boundary=x"}
    streamed = predictor.post(
        PREDICT, params={"model": "digits"}, content=chunks(), headers=headers
    )
    assert streamed.status_code == 413

    files = as_files([("a.png", digit_png(digit_test_split(tmp_path), 0))])
    assert predictor.post(PREDICT, params={"model": "digits"}, files=files).status_code == 200


def test_a_checkpoint_outside_the_artifact_store_is_never_opened(
    predictor: TestClient, client: TestClient, settings: Settings, registered: uuid.UUID
) -> None:
    answer = client.post("/api/v1/registry/moved/versions", json={"job": str(registered)})
    assert answer.status_code == 201
    with session_scope(settings.database_url) as session:
        moved = select(RegisteredModel.id).where(RegisteredModel.name == "moved")
        session.execute(
            update(ModelVersion)
            .where(ModelVersion.model_id == moved.scalar_subquery())
            .values(path="/etc/passwd")
        )
    refused = predictor.post(PREDICT, params={"model": "moved"}, files=as_files([("a", b"x")]))
    assert refused.status_code == 409
    assert "outside the artifact store" in refused.json()["error"]["message"]


def test_scopes(
    anonymous: TestClient, settings: Settings, registered: uuid.UUID, tmp_path: Path
) -> None:
    reader = {"Authorization": f"Bearer {make_key(settings.database_url, 'read')}"}
    files = as_files([("a.png", digit_png(digit_test_split(tmp_path), 0))])
    params = {"model": "digits"}
    assert anonymous.post(PREDICT, params=params, files=files).status_code == 401
    refused = anonymous.post(PREDICT, params=params, files=files, headers=reader)
    assert refused.status_code == 403
    assert "'predict' scope" in refused.json()["error"]["message"]
    register = anonymous.post(
        "/api/v1/registry/digits/versions", json={"job": str(registered)}, headers=reader
    )
    assert register.status_code == 403


def test_the_command_line_client_prints_a_table_per_image(
    live_url: str, settings: Settings, registered: uuid.UUID, tmp_path: Path
) -> None:
    key = make_key(settings.database_url, "predict")
    good = tmp_path / "seven.png"
    good.write_bytes(digit_png(digit_test_split(tmp_path), 7))
    bad = tmp_path / "notes.txt"
    bad.write_text("not an image")
    args = ["predict", str(good), "--model", "digits@production", "--top-k", "3"]
    result = CliRunner().invoke(app, [*args, "--url", live_url, "--key", key])
    assert result.exit_code == 0, result.output
    assert "digits@production -> digits/1" in result.output
    assert "seven.png (resize: none)" in result.output
    assert result.output.count("%") == 3
    mixed = CliRunner().invoke(app, [*args, str(bad), "--url", live_url, "--key", key])
    assert mixed.exit_code == 1
    assert "notes.txt: not an image" in mixed.output


def test_a_resolution_that_straddles_a_registry_write_is_not_kept() -> None:
    refs = RefCache()
    target = model_registry.Resolved("m", uuid.uuid4(), "m", 1, "/x.pt", "0" * 64, 1)
    before = refs.generation
    refs.clear()  # a registry write committed while the reference was being resolved
    refs.put("m", target, before)
    assert refs.get("m", ttl_s=60) is None
    refs.put("m", target, refs.generation)
    assert refs.get("m", ttl_s=60) == target
    assert refs.get("m", ttl_s=0) is None


def test_a_full_queue_answers_503_with_retry_after(
    settings: Settings, registered: uuid.UUID, tmp_path: Path
) -> None:
    # One request in flight at most, and the model holds a batch 0.5 s for company: the
    # requests sent meanwhile find the queue full.
    crowded = settings.model_copy(update={"predict_queue_size": 1, "predict_max_wait_ms": 500})
    key = make_key(settings.database_url, "predict")
    files = as_files([("a.png", digit_png(digit_test_split(tmp_path), 0))])
    params = {"model": str(registered)}
    with TestClient(create_app(crowded), headers={"Authorization": f"Bearer {key}"}) as http:
        assert http.post(PREDICT, params=params, files=files).status_code == 200  # loads it

        def one(_: int) -> httpx.Response:
            answer: httpx.Response = http.post(PREDICT, params=params, files=files)
            return answer

        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(one, range(4)))
    statuses = sorted(answer.status_code for answer in answers)
    assert 200 in statuses, statuses
    assert 503 in statuses, statuses
    refused = next(answer for answer in answers if answer.status_code == 503)
    assert refused.headers["Retry-After"] == "1"
    assert "queue is full" in refused.json()["error"]["message"]
