"""Prediction refuses before it spends: bad files before any model starts, a full queue
before the body is read (and, once its reference is resolved, before routing), and a
bounded number of model processes starting at once.

The app on Postgres with a real checkpoint (`trained_job`); a request whose body never
comes is sent straight to the ASGI app, so the test sees whether its body was read.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.app import create_app
from api.edge import PRINCIPAL
from api.limits import PredictShed
from core import artifacts, model_registry
from core.db.session import session_scope
from core.keys import Principal
from core.settings import Settings
from serving.cache import ModelCache, RefCache
from serving.dataplane import DataPlane
from serving.metrics import ModelMetrics
from serving.process import ServingOptions
from tests.helpers import make_key, trained_job

QUEUE = 2  # PREDICT_QUEUE_SIZE here: two requests in hand per model


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """A queue of two requests per model, one model process starting at a time."""
    return settings.model_copy(
        update={"predict_queue_size": QUEUE, "predict_max_starting": 1, "predict_threads": 1}
    )


@pytest.fixture(scope="module")
def job_id(settings: Settings) -> uuid.UUID:
    return trained_job(settings)


@pytest.fixture(scope="module")
def key(settings: Settings) -> str:
    return make_key(settings.database_url, "predict", "read")


@pytest.fixture(scope="module")
def api(settings: Settings, key: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def test_bad_files_are_refused_before_their_model_starts(
    api: TestClient, job_id: uuid.UUID
) -> None:
    url = f"/api/v1/predict?model={job_id}"
    started = time.perf_counter()
    garbage = api.post(url, files={"files": ("x.png", b"\x89PNG not really", "image/png")})
    empty = api.post(url, files={"files": ("y.png", b"", "image/png")})
    took = time.perf_counter() - started
    assert garbage.status_code in (400, 415), garbage.text
    assert empty.status_code == 400, empty.text
    assert "x.png" in garbage.json()["error"]["message"]
    assert took < 2.0  # a model start takes seconds here; none happened
    assert api.get("/api/v1/predict/stats").json()["loads"] == 0


def _state(settings: Settings, cache: ModelCache) -> dict[str, object]:
    """A server's lifespan state around `cache`: the early shed and the routes read it."""
    refs = RefCache()
    plane = DataPlane(settings, cache, refs, ModelMetrics(CollectorRegistry()))
    return {"model_cache": cache, "refs": refs, "plane": plane}


class _Call:
    """One request sent straight to the ASGI app: its body arrives only when released."""

    def __init__(
        self, app: ASGIApp, settings: Settings, job_id: uuid.UUID, key: str, cache: ModelCache
    ) -> None:
        self.app, self.released, self.reads = app, asyncio.Event(), 0
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/api/v1/predict",
            "raw_path": b"/api/v1/predict",
            "root_path": "",
            "query_string": f"model={job_id}".encode(),
            "headers": [
                (b"host", b"127.0.0.1"),
                (b"authorization", f"Bearer {key}".encode()),
                (b"content-type", b"multipart/form-data; boundary=b"),
                (b"content-length", b"100000"),
            ],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
            "state": _state(settings, cache),
        }
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    async def receive(self) -> Message:
        self.reads += 1
        await self.released.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], dict(message["headers"])
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    async def run(self) -> None:
        await self.app(self.scope, self.receive, self.send)


def test_a_full_queue_is_refused_before_the_body_is_read(
    settings: Settings, job_id: uuid.UUID, key: str
) -> None:
    app = create_app(settings)

    async def scenario() -> tuple[_Call, ModelCache, int]:
        cache = ModelCache(options=ServingOptions(max_queue=QUEUE, threads=1))
        sha256 = _sha256(settings, job_id)
        held = [_Call(app, settings, job_id, key, cache) for _ in range(QUEUE)]
        tasks = [asyncio.create_task(call.run()) for call in held]
        deadline = time.monotonic() + 30
        while cache.admitted[sha256] < QUEUE:  # both wait for their bodies, in hand
            assert time.monotonic() < deadline, "the requests were never admitted"
            await asyncio.sleep(0.01)
        probe = _Call(app, settings, job_id, key, cache)
        await asyncio.wait_for(probe.run(), 10)  # answered without waiting for its body
        for call in held:
            call.released.set()
        await asyncio.gather(*tasks)
        return probe, cache, cache.admitted[sha256]

    probe, cache, left = asyncio.run(scenario())
    assert probe.status == 503
    assert probe.reads == 0  # its body was never read
    assert probe.headers[b"retry-after"] == b"1"
    error = json.loads(probe.body)["error"]
    assert error["code"] == "unavailable"
    assert f"queue is full ({QUEUE} requests)" in error["message"]
    assert left == 0  # the places of ended requests are free again
    assert cache.loads == 0


def _sha256(settings: Settings, job_id: uuid.UUID) -> str:
    with session_scope(settings.database_url) as session:
        row = artifacts.find_checkpoint(session=session, job_id=job_id, which="best")
        assert row is not None
        return row.sha256


def test_model_processes_start_a_bounded_number_at_once(
    settings: Settings, job_id: uuid.UUID
) -> None:
    folder = artifacts.job_dir(settings, job_id) / "checkpoints"
    with session_scope(settings.database_url) as session:
        rows = [
            artifacts.find_checkpoint(session=session, job_id=job_id, which=which)
            for which in (1, "best")
        ]
    targets = [(Path(row.path), row.sha256) for row in rows if row is not None]
    assert len({sha for _, sha in targets}) == 2, "two different checkpoints"
    assert all(path.is_relative_to(folder) for path, _ in targets)

    async def start_both() -> ModelCache:
        cache = ModelCache(options=ServingOptions(threads=1), max_starting=1)
        try:
            await asyncio.gather(*(cache.get(path, sha) for path, sha in targets))
        finally:
            await cache.close()
        return cache

    cache = asyncio.run(start_both())
    assert cache.loads == 2
    assert cache.peak_starting == 1


def test_a_full_models_requests_are_refused_before_routing() -> None:
    """The shed answers from what the app resolved already; anything else goes on."""
    alice, bob = (uuid.uuid4() for _ in range(2))
    target = model_registry.Resolved("m", uuid.uuid4(), "m", 1, "/x.pt", "0" * 64, 1, alice)
    refs, cache = RefCache(), ModelCache(options=ServingOptions(max_queue=QUEUE, threads=1))
    refs.put("m", target, refs.generation)
    routed: list[str] = []

    async def route(scope: Scope, _receive: Receive, _send: Send) -> None:
        routed.append(scope["query_string"].decode())

    def call(ref: str, principal: Principal | None, owner_only: bool = False) -> int:
        shed = PredictShed(route, "/api/v1/predict", ttl_s=60, reads_owner_only=owner_only)
        status, reads = [], []

        async def receive() -> Message:
            reads.append(1)
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                assert (b"connection", b"close") not in message["headers"]  # kept alive

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/api/v1/predict",
            "query_string": f"model={ref}&top_k=1".encode(),
            "headers": [],
            "state": {"model_cache": cache, "refs": refs, PRINCIPAL: principal},
        }
        asyncio.run(shed(scope, receive, send))
        assert not reads  # no body is read here, ever
        return status[0] if status else 0

    assert call("m", None) == 0  # places free: routed
    for _ in range(QUEUE):
        cache.admit(target.sha256)
    owner = Principal(alice, frozenset({"predict"}))
    assert call("m", None) == 503
    assert call("m", owner, owner_only=True) == 503
    assert call("other", owner) == 0  # not resolved yet: the route resolves and admits
    assert call("m", Principal(bob, frozenset({"read"}))) == 0  # the route answers 403
    assert call("m", Principal(bob, frozenset({"predict"})), owner_only=True) == 0  # 404
    assert routed == ["model=m&top_k=1", "model=other&top_k=1", *["model=m&top_k=1"] * 2]
