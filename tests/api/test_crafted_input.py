"""Crafted input on every operation of the OpenAPI schema, sent over raw sockets to the
served API on Postgres and on SQLite: control characters and oversized or non-ASCII
numbers in the path, the query, the headers and the body are each a 4xx with a message,
never a 5xx."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pytest

from api.app import create_app
from core.settings import Settings
from tests.helpers import make_key
from tests.services import serve

# A path parameter's crafted values, as they go on the wire (percent-encoded).
PATH_VALUES = [
    b"a%00b",
    b"99999999999999999999",
    b"-99999999999999999999",
    b"%C2%B2",  # superscript two: str.isdigit() says True, int() refuses it
]
QUERY_VALUES = [
    b"a%00b",
    b"%0A",
    b"99999999999999999999",
    b"%D9%A1",  # Arabic-Indic one
    b"x/99999999999999999999",  # a model reference's version past the database's integer
    b"x/%D9%A1",
]
# Headers with values that are not what their readers expect; latin-1 bytes as sent.
HEADERS = [
    b"Last-Event-ID: \xb2",
    b"Last-Event-ID: 99999999999999999999999",
    b"Idempotency-Key: \xb2\xff",
    b"Inference-Header-Content-Length: \xb2",
    b"X-Request-Id: \xff\xfe",
    b"Range: bytes=99999999999999999999-",
    b"Content-Type: application/json; charset=\xff",
]
# Bodies for operations that take JSON: an escaped NUL, huge numbers, deep nesting.
BODIES = [
    b'{"name": "a\\u0000b", "tags": ["\\u0000"], "q": "\\u0001"}',
    b'{"name": 99999999999999999999999, "version": 1e400, "seed": -99999999999999999999}',
    b"[" * 50_000 + b"]" * 50_000,
]
TIMEOUT_S = 60  # generous: a busy machine may serve slowly, but every answer must come
PARAM = re.compile(r"\{([^}]+)\}")


@pytest.fixture(scope="module")
def served(settings: Settings, database_url: str) -> Iterator[tuple[str, int, str]]:
    """The app on the module's database, served by uvicorn: its host, port and admin key."""
    unlimited = settings.model_copy(
        update={"database_url": database_url, "rate_limit_submits_per_minute": 0}
    )
    with serve(create_app(unlimited)) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        yield parts.hostname, parts.port, make_key(database_url, "admin")


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    """Every (method, path, operation) of the schema, but job event streams (they stay open
    while their job runs; tests/api/test_job_data.py follows them)."""
    paths = create_app(Settings()).openapi()["paths"]
    return [
        (method.upper(), path, operation)
        for path, methods in paths.items()
        for method, operation in methods.items()
        if not path.endswith("/events")
    ]


Request = tuple[str, bytes, list[bytes], bytes | None]  # label, method and target, headers, body


def requests() -> Iterator[Request]:
    """Every crafted request: each path parameter, query parameter and header crafted in
    turn, and crafted JSON bodies where an operation takes JSON."""
    for method, path, operation in operations():
        params = operation.get("parameters", [])
        queries = [p["name"] for p in params if p["in"] == "query"] + ["unknown"]
        plain = f"{method} {PARAM.sub('x', path)}".encode()
        takes_json = "application/json" in operation.get("requestBody", {}).get("content", {})
        body = b"{}" if takes_json else None
        for name in PARAM.findall(path):
            for value in PATH_VALUES:
                target = PARAM.sub("x", path.replace("{" + name + "}", value.decode()))
                yield f"{method} {path} {name}={value!r}", f"{method} {target}".encode(), [], body
        for name in queries:
            for value in QUERY_VALUES:
                line = plain + b"?" + name.encode() + b"=" + value
                yield f"{method} {path} ?{name}={value!r}", line, [], body
        for header in HEADERS:
            yield f"{method} {path} {header!r}", plain, [header], body
        for crafted in BODIES if takes_json else []:
            yield f"{method} {path} body {crafted[:40]!r}", plain, [], crafted


def raw_request(host: str, port: int, key: str, request: Request) -> bytes:
    """One request's bytes, with the admin key; the connection closes after it."""
    _, line, headers, body = request
    lines = [line + b" HTTP/1.1", f"Host: {host}:{port}".encode(), b"Connection: close"]
    lines += [f"Authorization: Bearer {key}".encode(), *headers]
    if body is not None:
        lines += [b"Content-Type: application/json", f"Content-Length: {len(body)}".encode()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def answer_of(host: str, port: int, raw: bytes, tries: int = 3) -> tuple[int, bytes]:
    """Send raw request bytes; the answer's status and its bytes. A server that refuses a
    request before reading its body closes with the body unread, which the kernel may turn
    into a reset that drops the answer: such a request is sent again (a few times)."""
    for _ in range(tries - 1):
        try:
            return _answer_of(host, port, raw)
        except ConnectionResetError:
            continue
    return _answer_of(host, port, raw)


def _answer_of(host: str, port: int, raw: bytes) -> tuple[int, bytes]:
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as conn:
        conn.sendall(raw)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def test_every_crafted_request_is_a_4xx_with_a_message(served: tuple[str, int, str]) -> None:
    host, port, key = served
    crafted = list(requests())

    def sent(request: Request) -> tuple[str, int, bytes]:
        return (request[0], *answer_of(host, port, raw_request(host, port, key, request)))

    with ThreadPoolExecutor(4) as pool:  # the server answers several at once, as in use
        answers = list(pool.map(sent, crafted))
    server_errors = [
        f"{label}: {status} {answer[-300:]!r}" for label, status, answer in answers if status >= 500
    ]
    assert not server_errors, f"{len(server_errors)} of {len(crafted)}:\n" + "\n".join(
        server_errors
    )
    for label, status, answer in answers:
        if status >= 400:  # uvicorn's own refusals of malformed HTTP are plain text
            assert b'"error"' in answer or b"Invalid HTTP request" in answer, label
    print(f"{len(crafted)} crafted requests, none answered 5xx")
