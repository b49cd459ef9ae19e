"""The API's edge: loopback hosts and same-origin changes with auth off, no keys minted with
auth off, no server paths or tracebacks in answers, authentication before any body."""

from __future__ import annotations

import logging
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from core import jobs
from core.db.session import session_scope
from core.db.tables import ApiKey, Event, Job
from core.errors import NotFoundError
from core.settings import Settings
from tests.helpers import TRAIN, claim, make_key, new_job
from tests.services import serve
from worker import outcomes

API = "/api/v1"
LOOPBACK = "http://127.0.0.1:8000"  # a TestClient's server address and Host
TIMEOUT_S = 60  # generous: a busy machine may serve slowly, but these answers must come


def _count(url: str, table: type[Job] | type[ApiKey]) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(table)) or 0


@pytest.fixture(scope="module")
def auth_off(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth_enabled": False})


@pytest.fixture(scope="module")
def local(auth_off: Settings) -> Iterator[TestClient]:
    """A client of an app with auth off, as `up` runs it on 127.0.0.1:8000."""
    with TestClient(create_app(auth_off), base_url=LOOPBACK) as client:
        yield client


@pytest.fixture(scope="module")
def local_url(auth_off: Settings) -> Iterator[str]:
    """The app with auth off, served by uvicorn on a free loopback port."""
    with serve(create_app(auth_off)) as url:
        yield url


# --- hosts and origins with auth off --------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000"])
def test_with_auth_off_the_loopback_names_at_the_port_are_served(
    local: TestClient, host: str
) -> None:
    assert local.get(f"{API}/whoami", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["attacker.example:8000", "127.0.0.1:9000", "localhost", ""])
def test_with_auth_off_another_host_is_refused(local: TestClient, host: str) -> None:
    response = local.get(f"{API}/whoami", headers={"Host": host})
    assert response.status_code == 421
    error = response.json()["error"]
    assert error["code"] == "misdirected_request"
    assert "127.0.0.1:8000, localhost:8000, [::1]:8000" in error["message"]
    assert "ALLOWED_HOSTS" in error["message"]


def test_a_rebinding_host_is_refused_at_the_port_the_server_listens_on(local_url: str) -> None:
    port = urlsplit(local_url).port
    whoami = f"{local_url}{API}/whoami"
    refused = httpx.get(whoami, headers={"Host": f"rebound.example:{port}"}, timeout=TIMEOUT_S)
    assert refused.status_code == 421
    assert f"127.0.0.1:{port}" in refused.json()["error"]["message"]
    served = httpx.get(whoami, headers={"Host": f"localhost:{port}"}, timeout=TIMEOUT_S)
    assert served.is_success


def test_with_auth_off_a_change_from_another_site_is_refused(
    local: TestClient, settings: Settings
) -> None:
    before = _count(settings.database_url, Job)
    for origin in ("http://attacker.example", "null", "http://127.0.0.1:9000"):
        refused = local.post(f"{API}/jobs", json=TRAIN, headers={"Origin": origin})
        assert refused.status_code == 403, origin
        assert "another site" in refused.json()["error"]["message"]
    assert _count(settings.database_url, Job) == before
    # Reading from elsewhere is left to the browser's same-origin policy.
    assert local.get(f"{API}/whoami", headers={"Origin": "http://attacker.example"}).is_success


def test_with_auth_off_the_services_own_pages_may_send_changes(
    local: TestClient, settings: Settings
) -> None:
    before = _count(settings.database_url, Job)
    own = local.post(f"{API}/jobs", json=TRAIN, headers={"Origin": LOOPBACK})
    assert own.status_code == 202, own.text
    no_origin = local.post(f"{API}/jobs", json=TRAIN)  # curl, the command-line client
    assert no_origin.status_code == 202, no_origin.text
    assert _count(settings.database_url, Job) == before + 2


def test_with_auth_on_any_host_and_origin_pass_unless_allowed_hosts_is_set(
    client: TestClient, settings: Settings
) -> None:
    headers = {"Host": "api.example.com", "Origin": "http://elsewhere.example"}
    assert client.get(f"{API}/whoami", headers=headers).status_code == 200
    pinned = settings.model_copy(update={"allowed_hosts": [".example.com", "127.0.0.1"]})
    with TestClient(create_app(pinned), base_url=LOOPBACK) as pinned_client:
        for host, status in [
            ("api.example.com", 401),
            ("example.com:8443", 401),
            ("127.0.0.1:8000", 401),
            ("example.org", 421),
        ]:
            answer = pinned_client.get(f"{API}/whoami", headers={"Host": host})
            assert answer.status_code == status, host


# --- no keys minted with auth off -----------------------------------------------------


def test_with_auth_off_no_key_can_be_created(local: TestClient, settings: Settings) -> None:
    before = _count(settings.database_url, ApiKey)
    response = local.post(f"{API}/keys", json={"name": "sneaky", "scopes": ["admin"]})
    assert response.status_code == 403
    assert "AUTH_ENABLED=true" in response.json()["error"]["message"]
    assert _count(settings.database_url, ApiKey) == before


def test_with_auth_on_an_admin_key_still_creates_keys(
    anonymous: TestClient, settings: Settings
) -> None:
    admin = make_key(settings.database_url, "admin")
    response = anonymous.post(
        f"{API}/keys",
        json={"name": "ci", "scopes": ["read"]},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert response.status_code == 201, response.text


# --- no server paths, no tracebacks ---------------------------------------------------


def _failing_app(settings: Settings) -> FastAPI:
    """The app with two routes that fail: a refusal naming a file, and a plain bug."""
    app = create_app(settings)
    checkpoint = settings.artifact_dir.resolve() / "jobs" / "j1" / "checkpoints" / "best.pt"

    def refuse() -> None:
        raise NotFoundError(f"checkpoint {checkpoint} does not exist")

    def crash() -> None:
        raise RuntimeError(f"cannot open {settings.data_dir.resolve()}/secret/x.npz")

    app.add_api_route(f"{API}/test-refusal", refuse)
    app.add_api_route(f"{API}/test-crash", crash)
    return app


def test_an_unexpected_exception_is_a_500_citing_an_error_id_logged_with_its_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        TestClient(_failing_app(settings)) as app_client,
        caplog.at_level(logging.ERROR, logger="api.edge"),
    ):
        response = app_client.get(f"{API}/test-crash")
    assert response.status_code == 500
    error = response.json()["error"]
    error_id = response.headers["X-Error-Id"]
    assert error == {
        "code": "internal",
        "message": f"an unexpected error occurred; quote error id {error_id} when reporting it",
        "details": [],
    }
    assert "secret" not in response.text
    assert "Traceback" not in response.text
    logged = [record for record in caplog.records if error_id in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert "secret/x.npz" in str(logged[0].exc_info[1])


def test_error_answers_show_paths_relative_to_their_root(settings: Settings) -> None:
    with TestClient(_failing_app(settings)) as app_client:
        response = app_client.get(f"{API}/test-refusal")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        "checkpoint jobs/j1/checkpoints/best.pt does not exist"
    )
    assert int(response.headers["content-length"]) == len(response.content)


def test_an_upload_error_names_no_server_path(client: TestClient, settings: Settings) -> None:
    bad = {"file": ("photos.zip", b"PK\x03\x04 not really a zip", "application/zip")}
    response = client.post(f"{API}/datasets", files=bad)
    assert response.status_code == 422, response.text
    assert str(settings.data_dir.resolve()) not in response.text
    assert "/tmp" not in response.text
    assert ".upload-" not in response.text


def test_a_failed_jobs_error_and_events_carry_no_path_or_traceback(
    client: TestClient, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    url = settings.database_url
    job_id = new_job(url)
    held = jobs.Claim(job_id=job_id, token=claim(url, job_id), attempt=1)
    missing = settings.data_dir.resolve() / "cifar10" / "data_batch_1"
    try:
        raise FileNotFoundError(2, "No such file or directory", str(missing))
    except FileNotFoundError as error:
        failed = outcomes.failure(error)
    with caplog.at_level(logging.ERROR, logger="worker.outcomes"):
        outcomes.record(settings, held, failed, {})
    job = client.get(f"{API}/jobs/{job_id}")
    assert job.status_code == 200, job.text
    assert job.json()["status"] == "failed"
    assert job.json()["error"] == (
        "FileNotFoundError: [Errno 2] No such file or directory: 'cifar10/data_batch_1'"
    )
    with session_scope(url) as session:
        logged = list(session.scalars(select(Event.message).where(Event.job_id == job_id)))
    text = "\n".join(logged)
    assert "Traceback" not in text
    assert str(settings.data_dir.resolve()) not in text
    (error_id,) = [line.split()[2].rstrip(":") for line in logged if line.startswith("error id")]
    in_log = [record.getMessage() for record in caplog.records if error_id in record.getMessage()]
    assert len(in_log) == 1
    assert "Traceback" in in_log[0]


# --- authentication before any body ---------------------------------------------------


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder where request bodies would be spooled (Python's temporary directory)."""
    folder = tmp_path_factory.mktemp("spool")
    before, tempfile.tempdir = tempfile.tempdir, str(folder)
    yield folder
    tempfile.tempdir = before


@pytest.fixture(scope="module")
def big_uploads_url(settings: Settings, spool: Path) -> Iterator[str]:
    """The app (auth on) taking uploads of up to 256 MiB, served by uvicorn."""
    roomy = settings.model_copy(update={"max_upload_bytes": 256 * 1024**2})
    with serve(create_app(roomy)) as url:
        yield url


def _post_head_only(url: str, path: str, authorization: str | None) -> int:
    """POST a 200 MB multipart body of which only the first 256 KiB are sent: the status
    the server answers with (a server waiting for the rest would time this out)."""
    parts = urlsplit(url)
    boundary = uuid.uuid4().hex
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Content-Type: multipart/form-data; boundary={boundary}",
        f"Content-Length: {200 * 1024**2}",
    ]
    if authorization:
        head.append(f"Authorization: {authorization}")
    preamble = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=files; filename=a.zip\r\n"
        "Content-Type: application/zip\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=TIMEOUT_S) as conn:
        conn.sendall(("\r\n".join(head) + "\r\n\r\n" + preamble).encode())
        conn.sendall(b"\0" * 256 * 1024)
        answer = conn.recv(4096).decode(errors="replace")
    return int(answer.split()[1])


@pytest.mark.parametrize("path", [f"{API}/datasets", f"{API}/predict?model=digits"])
@pytest.mark.parametrize("authorization", [None, "Bearer rs_nothing_real", "Basic dXNlcjpw"])
def test_an_unauthenticated_upload_is_a_401_before_its_body_is_read(
    big_uploads_url: str, spool: Path, settings: Settings, path: str, authorization: str | None
) -> None:
    # Answered while 199.75 MB of the body were never sent.
    assert _post_head_only(big_uploads_url, path, authorization) == 401
    assert list(spool.iterdir()) == []
    uploads = settings.data_dir / "uploads"
    assert not uploads.exists() or list(uploads.iterdir()) == []


def test_a_keyed_upload_is_read_and_spooled(
    big_uploads_url: str, spool: Path, settings: Settings
) -> None:
    """The control: with a valid key the same kind of body is read (and spooled past 1 MiB)."""
    key = make_key(settings.database_url, "train")
    body = b"PK\x03\x04" + b"\0" * (1024**2 + 1024)
    response = httpx.post(
        f"{big_uploads_url}{API}/datasets",
        files={"file": ("a.zip", body, "application/zip")},
        headers={"Authorization": f"Bearer {key}"},
        timeout=TIMEOUT_S,
    )
    assert response.status_code == 422, response.text  # read whole, then found no zip
    assert "cannot unpack a.zip" in response.json()["error"]["message"]
