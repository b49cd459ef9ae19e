"""The data plane called straight, without HTTP: a tiny ResNet-8 checkpoint trained by
`tests.helpers.trained_job`, real PNG files, real model processes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from core.errors import InvalidError, NotFoundError
from core.owners import Caller
from core.settings import Settings
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane, Files, overloaded
from serving.errors import BadInputError, OverloadedError, ServingError
from serving.files import Upload
from serving.metrics import ModelMetrics
from serving.process import ServingOptions
from tests import images
from tests.helpers import trained_job

T = TypeVar("T")
ANYONE = Caller(None, own_reads_only=False)
SIZE = 8  # the tiny net's input: 8x8 RGB (tests.helpers.TINY)


def status(error: BaseException) -> int:
    """A protocol's status of a refusal, as an adapter would give it."""
    return 400 if isinstance(error, ServingError) else 500


@pytest.fixture(scope="module")
def job(settings: Settings) -> uuid.UUID:
    """A succeeded train job with a best checkpoint in the artifact store."""
    return trained_job(settings)


def served(settings: Settings, work: Callable[[DataPlane], Awaitable[T]]) -> T:
    """`work(plane)` on a fresh data plane, its model processes stopped after."""

    async def run() -> T:
        cache = ModelCache(options=ServingOptions(max_queue=2, threads=1))
        plane = DataPlane(settings, cache, RefCache(), ModelMetrics(CollectorRegistry()))
        try:
            return await work(plane)
        finally:
            await cache.close()

    return asyncio.run(run())


def files_of(*uploads: tuple[str, bytes]) -> Files:
    """A request's files as the predict call reads them."""

    @asynccontextmanager
    async def read() -> AsyncIterator[list[Upload]]:
        yield [Upload(name, data, len(data)) for name, data in uploads]

    return read


def test_predict_classifies_good_files_and_names_the_bad_ones(
    settings: Settings, job: uuid.UUID
) -> None:
    files = files_of(("red.png", images.flat_png((255, 0, 0))), ("cut.png", b"\x89PNG\r\n"))

    async def work(plane: DataPlane) -> None:
        prediction = await plane.predict(str(job), ANYONE, files, status_of=status)
        assert prediction.target.job_id == job
        assert [file.name for file in prediction.files] == ["red.png", "cut.png"]
        assert prediction.files[0].error is None
        assert prediction.files[1].error is not None
        assert prediction.probabilities.shape == (1, len(prediction.info.classes))
        assert prediction.probabilities.sum() == pytest.approx(1.0, abs=1e-5)
        assert prediction.preprocessing.crop == (SIZE, SIZE)
        assert plane.models.loads == 1
        assert not plane.models.admitted

    served(settings, work)


def test_a_request_of_bad_files_is_refused_before_a_model_starts(
    settings: Settings, job: uuid.UUID
) -> None:
    files = files_of(("a.png", b"not an image at all"), ("b.png", b""))

    async def work(plane: DataPlane) -> None:
        with pytest.raises(ServingError) as refused:
            await plane.predict(str(job), ANYONE, files, status_of=status)
        assert "no file could be classified" in refused.value.message
        assert [loc for loc, _ in refused.value.details] == [
            ("body", "files", 0),
            ("body", "files", 1),
        ]
        assert plane.models.loads == 0

    served(settings, work)


def test_references_are_resolved_once_and_refused_as_the_domain_refuses(
    settings: Settings, job: uuid.UUID
) -> None:
    async def work(plane: DataPlane) -> None:
        with pytest.raises(NotFoundError):
            await plane.target("nobody", ANYONE)
        with pytest.raises(InvalidError, match="version"):
            await plane.ready("tiny", "x", ANYONE)
        first = await plane.target(str(job), ANYONE)
        assert await plane.target(str(job), ANYONE) is first  # kept for a moment
        await plane.ready(str(job), None, ANYONE)

    served(settings, work)


def test_a_full_queue_is_refused_before_the_body_is_read(
    settings: Settings, job: uuid.UUID
) -> None:
    read: list[int] = []

    @asynccontextmanager
    async def files() -> AsyncIterator[list[Upload]]:
        read.append(1)
        yield []

    async def work(plane: DataPlane) -> None:
        target = await plane.target(str(job), ANYONE)
        assert overloaded(plane.models, target) is None
        for _ in range(plane.models.max_admitted):
            plane.models.admit(target.sha256)
        refusal = overloaded(plane.models, target)
        assert isinstance(refusal, OverloadedError)
        assert refusal.retry_after_s == 1
        with pytest.raises(OverloadedError, match="queue is full"):
            await plane.predict(str(job), ANYONE, files, status_of=status)
        assert not read

    served(settings, work)


def test_infer_and_metadata_speak_the_inference_protocol(
    settings: Settings, job: uuid.UUID
) -> None:
    pixels = [7] * (SIZE * SIZE * 3)
    body = {"inputs": [{"name": "INPUT", "shape": [1, SIZE, SIZE, 3], "datatype": "UINT8"}]}
    body["inputs"][0]["data"] = pixels
    sent = json.dumps(body).encode()

    async def read() -> bytes:
        return sent

    async def work(plane: DataPlane) -> None:
        (header, raw), target = await plane.infer(str(job), ANYONE, read, None, status_of=status)
        assert target.job_id == job
        assert raw is None
        answer = json.loads(header)
        (output,) = answer["outputs"]
        assert output["name"] == "PROBABILITIES"
        assert output["datatype"] == "FP32"
        assert output["shape"][0] == 1
        assert sum(output["data"]) == pytest.approx(1.0, abs=1e-5)
        metadata = await plane.metadata(str(job), None, ANYONE)
        assert metadata.inputs[0].shape == [-1, SIZE, SIZE, 3]
        assert metadata.outputs[0].shape == [-1, output["shape"][1]]

        async def malformed() -> bytes:
            return b"{"

        with pytest.raises(BadInputError, match="malformed"):
            await plane.infer(str(job), ANYONE, malformed, None, status_of=status)

    served(settings, work)
