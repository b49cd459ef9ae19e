"""The API's edge, pure ASGI middleware that runs before any route reads a body.

- `HostGuard`: with auth off, only the loopback names at the server's own port (or
  ALLOWED_HOSTS) are served, against DNS rebinding; changes that carry another site's
  Origin are refused, against cross-site form posts.
- `InputGuard`: a URL path or query with a control character (NUL, say), or a numeric
  header that is not an ASCII number, is a 400 before any route parses it.
- `AuthFirst`: with auth on, a request that carries a body is authenticated from its
  headers first; without a valid key it is a 401 and its body is never read.
- `PublicErrors`: error answers carry no server paths; an unexpected exception is a 500
  that cites an error id, its traceback going to the server log with that id.

Under `/v2` (the Open Inference Protocol) the edge's own answers take the protocol's
shape, `{"error": "message"}`, as its routes' errors do (`api.routers.inference`).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus, urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import check_key
from api.errors import DATABASE_RETRY_AFTER_S, DATABASE_UNAVAILABLE, KEY_REQUIRED
from api.schemas import API_PREFIX, ErrorOut
from core.db.session import UNAVAILABLE
from core.keys import Principal
from core.redaction import public_text
from core.settings import Settings
from serving.memo import TtlCache

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
PRINCIPAL = "principal"  # where AuthFirst leaves the key it checked, in the request's state
PROTOCOL_PREFIX = "/v2"  # the Open Inference Protocol's routes (api.routers.inference)


def is_protocol(path: str) -> bool:
    """Whether a path is one of the Open Inference Protocol's, whose errors have its shape."""
    return path == PROTOCOL_PREFIX or path.startswith(PROTOCOL_PREFIX + "/")


async def answer(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    *,
    close: bool = True,
    bare: bool = False,
) -> None:
    """Answer with the shared error shape (`bare`: the protocol's, {"error": message}); the
    connection closes (a body may be unread) unless `close` is False (uvicorn discards the
    rest of a body answered before it came)."""
    if bare:
        body = json.dumps({"error": message})
    else:
        body = ErrorOut.model_validate(
            {"error": {"code": code, "message": message, "details": []}}
        ).model_dump_json()
    raw = [(b"content-type", b"application/json")]
    raw += [(b"connection", b"close")] if close else []
    raw += [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body.encode()})


def install(app: FastAPI, settings: Settings, checked: TtlCache[str, Principal]) -> None:
    """Add the edge to `app`, outermost last: errors, hosts, then authentication."""
    app.add_middleware(AuthFirst, settings=settings, checked=checked)
    app.add_middleware(InputGuard)
    app.add_middleware(HostGuard, settings=settings)
    app.add_middleware(PublicErrors, settings=settings)
    schema = app.openapi

    def documented() -> dict[str, Any]:
        """The schema, with the 400 that InputGuard may answer on every operation."""
        described = schema()
        for operations in described.get("paths", {}).values():
            for operation in operations.values():
                operation.setdefault("responses", {}).setdefault("400", _BAD_REQUEST)
        return described

    app.openapi = documented  # type: ignore[method-assign]


_BAD_REQUEST = {
    "description": "bad_request (a control character in the URL, a malformed numeric header)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
}


# --- hosts and origins ----------------------------------------------------------------


class HostGuard:
    """ASGI middleware: the Host (and, for changes with auth off, the Origin) must be ours."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = settings.allowed_hosts
        self.loopback_only = not settings.auth_enabled and not settings.allowed_hosts
        self.check_origin = not settings.auth_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (self.allowed or self.loopback_only):
            await self.app(scope, receive, send)
            return
        allowed = self.allowed or loopback_hosts(scope.get("server"))
        headers = Headers(scope=scope)
        host = headers.get("host", "").lower()
        if not host_allowed(host, allowed):
            message = (
                f"this service does not answer to host {host!r}; it answers to "
                f"{', '.join(allowed)}{_HOSTS_HINT if self.loopback_only else ''}"
            )
            await answer(send, 421, "misdirected_request", message, bare=is_protocol(scope["path"]))
            return
        origin = headers.get("origin")
        if self._foreign_change(scope, origin, allowed):
            message = (
                f"a change sent from another site (Origin {origin!r}) is refused while auth "
                "is off; only this service's own pages may send changes"
            )
            await answer(send, 403, "forbidden", message, bare=is_protocol(scope["path"]))
            return
        await self.app(scope, receive, send)

    def _foreign_change(self, scope: Scope, origin: str | None, allowed: list[str]) -> bool:
        """A change (not GET/HEAD/OPTIONS) whose Origin is another site's, with auth off."""
        changes = self.check_origin and scope["method"] not in SAFE_METHODS
        return changes and origin is not None and not origin_allowed(origin, allowed)


_HOSTS_HINT = " while auth is off (ALLOWED_HOSTS adds names)"


def loopback_hosts(server: tuple[str, int | None] | None) -> list[str]:
    """The loopback names at the port the server listens on (any port when unknown)."""
    port = server[1] if server else None
    if port is None:
        return list(LOOPBACK_NAMES)
    names = [f"{name}:{port}" for name in LOOPBACK_NAMES]
    return names + list(LOOPBACK_NAMES) if port == 80 else names


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Whether a Host header matches: `*`, `name:port`, `name` (any port), `.domain`."""
    name = _host_name(host)
    for pattern in allowed:
        if pattern == "*" or host == pattern or name == pattern:
            return True
        if pattern.startswith(".") and (name == pattern[1:] or name.endswith(pattern)):
            return True
    return False


def origin_allowed(origin: str, allowed: list[str]) -> bool:
    """Whether an Origin header names this service (http or https at an allowed host)."""
    parts = urlsplit(origin.lower())
    return parts.scheme in ("http", "https") and host_allowed(parts.netloc, allowed)


def _host_name(host: str) -> str:
    """`host` without its port: 127.0.0.1:8000 -> 127.0.0.1, [::1]:8000 -> [::1]."""
    if host.endswith("]"):
        return host
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


# --- URLs and headers --------------------------------------------------------------

# Headers that the service reads as byte counts or line numbers: ASCII digits only
# (str.isdigit passes superscripts and other scripts' digits, which int() then refuses).
NUMERIC_HEADERS = ("content-length", "inference-header-content-length", "last-event-id")
MAX_NUMBER_DIGITS = 19  # 2**63 - 1 has 19: a longer number is beyond every bound here
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InputGuard:
    """ASGI middleware: a control character in the URL's path or query (decoded), or a
    numeric header that is not a plain ASCII number, is a 400 with what to fix."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = url_problem(scope) or header_problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        await answer(send, 400, "bad_request", problem, bare=is_protocol(scope["path"]))


def url_problem(scope: Scope) -> str | None:
    """What is wrong with a request's path or query, if anything: a control character."""
    if _CONTROL.search(scope["path"]):
        return "the URL path contains a control character (such as %00); remove it"
    query = unquote_plus(scope["query_string"].decode("latin-1"), encoding="latin-1")
    if _CONTROL.search(query):
        return "the URL query contains a control character (such as %00); remove it"
    return None


def header_problem(scope: Scope) -> str | None:
    """What is wrong with a request's numeric headers, if anything."""
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name not in NUMERIC_HEADERS:
            continue
        value = raw_value.decode("latin-1").strip()
        if not (value.isascii() and value.isdigit() and len(value) <= MAX_NUMBER_DIGITS):
            return (
                f"header {name} must be a whole number of at most {MAX_NUMBER_DIGITS} digits, "
                f"not {value!r}"
            )
    return None


# --- authentication before bodies -----------------------------------------------------


class AuthFirst:
    """ASGI middleware: with auth on, API requests (under /api/v1 and /v2) with a body need
    a valid key, checked before the body is read; other requests' keys are checked here
    when they carry one."""

    def __init__(self, app: ASGIApp, settings: Settings, checked: TtlCache[str, Principal]):
        self.app = app
        self.settings = settings
        self.checked = checked

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.settings.auth_enabled
            or not (scope["path"].startswith(API_PREFIX + "/") or is_protocol(scope["path"]))
        ):
            await self.app(scope, receive, send)
            return
        key = bearer_key(Headers(scope=scope).get("authorization", ""))
        principal = await check_key(self.checked, self.settings, key) if key else None
        if principal is not None:
            scope.setdefault("state", {})[PRINCIPAL] = principal
        elif scope["method"] not in SAFE_METHODS:
            message = "the API key is malformed, unknown or revoked" if key else KEY_REQUIRED
            challenge = {"WWW-Authenticate": "Bearer"}
            await answer(
                send, 401, "unauthorized", message, challenge, bare=is_protocol(scope["path"])
            )
            return
        await self.app(scope, receive, send)


def bearer_key(authorization: str) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, as FastAPI's HTTPBearer reads it."""
    scheme, _, key = authorization.partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def caller(scope: Scope) -> str:
    """Who sends a request, for per-caller limits: its key, else its address."""
    principal = scope.get("state", {}).get(PRINCIPAL)
    if isinstance(principal, Principal):
        return f"key {principal.key_id}"
    client = scope.get("client")
    return f"address {client[0] if client else 'unknown'}"


# --- errors without server details ---------------------------------------------------


class PublicErrors:
    """ASGI middleware: JSON error answers without server paths; unexpected exceptions as a
    500 with an error id (the traceback goes to the log under that id)."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # an error's start, until its body is cleaned
        chunks: list[bytes] = []
        started = False
        protocol = is_protocol(scope["path"])

        async def cleaned(message: Message) -> None:
            nonlocal held, started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] >= 400 and _is_json(message):
                    held = message
                    return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._send_clean(send, held, b"".join(chunks))

        try:
            await self.app(scope, receive, cleaned)
        except UNAVAILABLE as error:  # outside the routes (authentication): as they answer
            log.warning("%s %s: database unavailable: %s", scope["method"], scope["path"], error)
            if not started:
                retry = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
                await answer(send, 503, "unavailable", DATABASE_UNAVAILABLE, retry, bare=protocol)
        except Exception as error:
            error_id = uuid.uuid4().hex
            log.error(
                "error id %s: %s %s failed",
                error_id,
                scope["method"],
                scope["path"],
                exc_info=error,
            )
            if started:  # the answer is under way: it can only be cut short
                return
            message = f"an unexpected error occurred; quote error id {error_id} when reporting it"
            await answer(send, 500, "internal", message, {"X-Error-Id": error_id}, bare=protocol)

    async def _send_clean(self, send: Send, start: Message, body: bytes) -> None:
        """Send a held error answer with its strings' server paths made public."""
        try:
            cleaned = _public(json.loads(body), self.settings)
        except ValueError:
            clean = body
        else:
            clean = json.dumps(cleaned).encode()
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(clean)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": clean})


def _is_json(start: Message) -> bool:
    return any(
        name.lower() == b"content-type" and value.startswith(b"application/json")
        for name, value in start["headers"]
    )


def _public(value: Any, settings: Settings) -> Any:
    """`value` (decoded JSON) with every string's server paths made public."""
    if isinstance(value, str):
        return public_text(value, settings)
    if isinstance(value, list):
        return [_public(item, settings) for item in value]
    if isinstance(value, dict):
        return {key: _public(item, settings) for key, item in value.items()}
    return value
