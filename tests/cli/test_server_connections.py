"""`resnet-service api`, the process that faces clients, over real sockets: connections that
send half their headers are closed within the header timeout while others are served, a
body that stalls is a 408, and X-Forwarded-For is trusted only from FORWARDED_ALLOW_IPS."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.app import create_app
from cli.connections import server_options
from core.settings import Settings
from tests.helpers import wait_for
from tests.services import free_port

BIN = Path(sys.executable).parent
HALF_OPEN = 200
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
# Generous: the broken server holds such connections until the client leaves.
CLOSED_WITHIN_S = 15.0
HALF_HEADERS = b"GET /api/v1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
STUDY = {
    "base": {"model": {"name": "resnet20"}, "dataset": {"name": "digits"}},
    "grid": {"model.name": ["plain20", "resnet20"]},
}
DRY_RUN = "/api/v1/studies?dry_run=true"  # a submit that writes nothing
START_S = 180  # a loaded machine may take a minute to import torch and the zoo


@pytest.fixture(scope="module")
def api_url(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`resnet-service api` with auth off, one-second header and body timeouts and a submit
    limit of one per caller; its base URL while it runs."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "ARTIFACT_DIR": str(settings.artifact_dir),
        "DATA_DIR": str(settings.data_dir),
        "AUTH_ENABLED": "false",
        "HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT_S),
        "BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT_S),
        "RATE_LIMIT_SUBMITS_PER_MINUTE": "0.1",
        "RATE_LIMIT_SUBMIT_BURST": "1",
    }
    env.pop("FORWARDED_ALLOW_IPS", None)
    log = tmp_path_factory.mktemp("api") / "api.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BIN / "resnet-service"), "api", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(base) or process.poll() is not None, START_S, "the API")
        assert process.poll() is None, log.read_text(errors="replace")
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/api/v1/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _held_for(connections: list[socket.socket], limit_s: float) -> list[float]:
    """How long each connection stayed open (the server closing it), up to `limit_s`."""
    started = time.monotonic()
    held: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for conn in connections:
            selector.register(conn, selectors.EVENT_READ)
        while len(held) < len(connections) and time.monotonic() - started < limit_s:
            for ready, _ in selector.select(timeout=0.5):
                closing = ready.fileobj
                assert isinstance(closing, socket.socket)
                if closing.recv(4096) == b"":
                    held[closing] = time.monotonic() - started
                    selector.unregister(closing)
    return [held.get(conn, limit_s) for conn in connections]


def test_half_sent_headers_are_closed_while_others_are_served(api_url: str) -> None:
    port = int(api_url.rsplit(":", 1)[1])
    connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(HALF_OPEN)]
    try:
        for conn in connections:
            conn.sendall(HALF_HEADERS)
        assert httpx.get(f"{api_url}/api/v1/healthz", timeout=30).status_code == 200
        held = _held_for(connections, CLOSED_WITHIN_S)
    finally:
        for conn in connections:
            conn.close()
    print(f"{HALF_OPEN} half-header connections held {min(held):.2f}-{max(held):.2f} s")
    assert max(held) < CLOSED_WITHIN_S
    assert min(held) >= HEADER_TIMEOUT_S / 2  # not cut short (timed from after the connects)
    assert httpx.get(f"{api_url}/api/v1/healthz", timeout=30).status_code == 200


def test_a_body_that_stalls_is_a_408_and_the_connection_closes(api_url: str) -> None:
    port = int(api_url.rsplit(":", 1)[1])
    head = (
        f"PATCH /api/v1/jobs/{uuid.uuid4()} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=CLOSED_WITHIN_S) as conn:
        started = time.monotonic()
        conn.sendall(head.encode() + b'{"name": ')  # and then nothing
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"stalled" in answer
    assert waited < CLOSED_WITHIN_S


def test_x_forwarded_for_is_not_trusted_by_default(api_url: str) -> None:
    """With auth off, callers are told apart by address: a forged X-Forwarded-For must not
    give a caller a fresh submit allowance."""
    statuses = [
        httpx.post(
            api_url + DRY_RUN, json=STUDY, headers={"X-Forwarded-For": f"10.0.0.{n}"}, timeout=30
        ).status_code
        for n in range(1, 4)
    ]
    assert statuses == [200, 429, 429]


def test_x_forwarded_for_is_trusted_from_forwarded_allow_ips(settings: Settings) -> None:
    proxied = settings.model_copy(
        update={
            "auth_enabled": False,
            "forwarded_allow_ips": "127.0.0.1",
            "rate_limit_submits_per_minute": 0.1,
            "rate_limit_submit_burst": 1,
        }
    )
    port = free_port()
    options = server_options(proxied)
    config = uvicorn.Config(
        create_app(proxied), host="127.0.0.1", port=port, log_level="warning", **options
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: server.started, 30, "uvicorn to start")
        statuses = [
            httpx.post(
                url + DRY_RUN, json=STUDY, headers={"X-Forwarded-For": address}, timeout=30
            ).status_code
            for address in ("10.0.0.1", "10.0.0.2", "10.0.0.2")
        ]
    finally:
        server.should_exit = True
        thread.join(30)
    assert statuses == [200, 200, 429]  # the proxy's callers, each with its own allowance
