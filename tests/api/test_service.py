"""Health, readiness, Prometheus metrics, the zoo, start-up schema checks, OpenAPI, SQLite."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import jobs
from core.db import schema
from core.db.session import session_scope
from core.settings import Settings
from tests.helpers import claim, new_job
from tests.services import throwaway_database

API = "/api/v1"
LOCAL = "http://127.0.0.1:8000"  # with auth off the app answers to loopback names only


def test_healthz_and_readyz(anonymous: TestClient) -> None:
    assert anonymous.get(f"{API}/healthz").json() == {"status": "ok"}
    ready = anonymous.get(f"{API}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_names_the_broker_when_it_is_down(settings: Settings) -> None:
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down)) as client:
        response = client.get(f"{API}/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"] == "ok"
    assert "Connection refused" in checks["broker"] or "connecting" in checks["broker"]


def test_prometheus_metrics_count_requests_jobs_and_the_queue(client: TestClient) -> None:
    client.post(f"{API}/jobs", json={"kind": "train", "model": {"name": "resnet20"},
                                     "dataset": {"name": "digits"}})  # fmt: skip
    client.get(f"{API}/jobs/{uuid.uuid4()}")
    body = client.get(f"{API}/metrics").text
    assert (
        'resnet_http_requests_total{method="GET",route="/api/v1/jobs/{job_id}",status="404"}'
        in (body)
    )
    assert 'resnet_http_request_duration_seconds_bucket{le="0.005",method="POST"' in body
    assert 'resnet_jobs{status="queued"}' in body
    assert "resnet_queue_depth " in body


def test_the_zoo_lists_every_net_with_params_and_macs(client: TestClient) -> None:
    zoo = {row["name"]: row for row in client.get(f"{API}/models").json()}
    assert len(zoo) == 25
    assert (zoo["resnet20"]["params"], zoo["resnet20"]["depth"]) == (269_722, 20)
    assert round(zoo["resnet56"]["macs"] / 1e6, 2) == 125.49
    assert zoo["preact_resnet1001"]["params"] == 10_327_706


def test_every_route_documents_a_summary_and_its_errors(anonymous: TestClient) -> None:
    spec = anonymous.get("/openapi.json").json()
    open_paths = {f"{API}/healthz", f"{API}/readyz", f"{API}/metrics"}
    open_paths |= {"/v2", "/v2/health/live", "/v2/health/ready"}  # the protocol's probes
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            codes = set(operation["responses"])
            assert operation.get("summary"), (method, path)
            if operation.get("parameters") or operation.get("requestBody"):
                # The Open Inference Protocol answers a malformed request with a 400.
                assert ("400" if path.startswith("/v2/") else "422") in codes, (method, path)
            assert ("401" in codes) == (path not in open_paths), (method, path)
    error = spec["paths"][f"{API}/jobs"]["post"]["responses"]["422"]
    assert error["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    assert "HTTPValidationError" not in spec["components"]["schemas"]


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database with no tables at all."""
    with throwaway_database() as url:
        yield url


def test_the_api_refuses_an_unmigrated_database_unless_told_to_migrate(
    settings: Settings, empty_database: str
) -> None:
    outdated = settings.model_copy(update={"database_url": empty_database})
    with pytest.raises(schema.SchemaOutdated, match="resnet-service migrate"):
        TestClient(create_app(outdated)).__enter__()
    migrating = outdated.model_copy(update={"migrate_on_start": True, "auth_enabled": False})
    with TestClient(create_app(migrating), base_url=LOCAL) as client:
        assert client.get(f"{API}/jobs").json() == {"items": [], "next_cursor": None}
    schema.check_current(empty_database)


def test_list_and_curves_work_on_sqlite(sqlite_url: str, tmp_path: Path) -> None:
    embedded = Settings(
        database_url=sqlite_url,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        auth_enabled=False,
        artifact_dir=tmp_path,
        data_dir=tmp_path,
    )
    tagged = new_job(sqlite_url, tags=["wide"], name="Wide_1")
    new_job(sqlite_url, tags=["narrow"])
    token = claim(sqlite_url, tagged)
    with session_scope(sqlite_url) as session:
        points = [jobs.Point("lr", step, float(step)) for step in range(10)]
        jobs.write_metrics(session=session, job_id=tagged, token=token, points=points)
    with TestClient(create_app(embedded), base_url=LOCAL) as client:
        page = client.get(f"{API}/jobs", params={"tag": "wide", "q": "e_1", "limit": 1}).json()
        assert [item["id"] for item in page["items"]] == [str(tagged)]
        curves = client.get(f"{API}/jobs/{tagged}/metrics", params={"max_points": 5}).json()
        assert curves["series"]["lr"] == {
            "steps": [1, 3, 5, 7, 9],
            "values": [0.5, 2.5, 4.5, 6.5, 8.5],
        }
        assert client.get(f"{API}/readyz").json()["checks"] == {"database": "ok", "broker": "ok"}
