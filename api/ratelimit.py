"""Per-caller limits, as pure ASGI middleware after authentication (api.edge): submits by
token bucket (429), open event streams by count per caller (429) and in total (503).

The counts live in this API process: with several API processes, each allows its own share
(the limits then apply per process).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from api.edge import answer, caller
from api.schemas import API_PREFIX
from core.settings import Settings

# The POSTs that enqueue work or store uploads: each costs a worker's time or disk.
SUBMIT_ROUTES = (
    "/jobs",
    "/jobs/{job_id}/retry",
    "/studies",
    "/datasets",
    "/registry/{name}/versions/import",
    "/registry/{name}/versions/{version}/exports",
)
SUBMIT_PATHS = frozenset(API_PREFIX + route for route in SUBMIT_ROUTES)  # as OpenAPI names them
SUBMIT_PATH = re.compile(
    "^(?:"
    + "|".join(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(path)) for path in SUBMIT_PATHS)
    + ")$"
)
STREAM_PATH = re.compile(rf"^{re.escape(API_PREFIX)}/jobs/[^/]+/events$")
STREAM_RETRY_AFTER_S = 5  # a stream slot frees when another stream ends: seconds to minutes
MAX_BUCKETS = 10_000  # callers remembered; beyond, the full (idle) buckets are forgotten


class TokenBuckets:
    """One token bucket per caller: `burst` tokens, refilled at `rate_per_s`."""

    def __init__(
        self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s, self.burst, self.clock = rate_per_s, burst, clock
        self.buckets: dict[str, tuple[float, float]] = {}  # caller: (tokens, when)

    def take(self, who: str) -> float:
        """Take a token for `who`: 0 when one was there, else the seconds until one is."""
        now = self.clock()
        tokens = self._tokens(who, now)
        if tokens >= 1:
            self.buckets[who] = (tokens - 1, now)
            return 0.0
        self.buckets[who] = (tokens, now)
        return (1 - tokens) / self.rate_per_s

    def _tokens(self, who: str, now: float) -> float:
        if who not in self.buckets and len(self.buckets) >= MAX_BUCKETS:
            self.buckets = {
                name: (tokens, when)
                for name, (tokens, when) in self.buckets.items()
                if tokens + (now - when) * self.rate_per_s < self.burst
            }
        tokens, when = self.buckets.get(who, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - when) * self.rate_per_s)


class SubmitLimit:
    """ASGI middleware: POSTs that enqueue work (jobs, retries, studies, imports, exports)
    or store uploads, within each caller's rate."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        per_minute = settings.rate_limit_submits_per_minute
        self.per_minute, self.burst = per_minute, settings.rate_limit_submit_burst
        self.buckets = TokenBuckets(per_minute / 60, self.burst) if per_minute > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.buckets is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or not SUBMIT_PATH.match(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        wait_s = self.buckets.take(caller(scope))
        if wait_s > 0:
            retry = max(1, math.ceil(wait_s))
            message = (
                f"too many submits: {self.burst} at once, then {self.per_minute:g} a minute "
                f"(RATE_LIMIT_SUBMITS_PER_MINUTE); retry in {retry} s"
            )
            await answer(send, 429, "too_many_requests", message, {"Retry-After": str(retry)})
            return
        await self.app(scope, receive, send)


class StreamLimit:
    """ASGI middleware: open event streams, at most so many per caller and in total."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.per_caller, self.total = settings.stream_max_per_key, settings.stream_max_total
        self.open: dict[str, int] = {}  # one event loop: no lock needed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not STREAM_PATH.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        who = caller(scope)
        retry = {"Retry-After": str(STREAM_RETRY_AFTER_S)}
        if self.open.get(who, 0) >= self.per_caller:
            message = (
                f"{self.per_caller} event streams are open for this caller already "
                "(STREAM_MAX_PER_KEY); close one, or retry later"
            )
            await answer(send, 429, "too_many_requests", message, retry)
            return
        if sum(self.open.values()) >= self.total:
            message = f"the service has {self.total} event streams open (STREAM_MAX_TOTAL)"
            await answer(send, 503, "unavailable", f"{message}; retry later", retry)
            return
        self.open[who] = self.open.get(who, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open[who] -= 1
            if not self.open[who]:
                del self.open[who]


def install(app: FastAPI, settings: Settings) -> None:
    """Add the limits to `app` (inside the edge: they read the key it checked), and their
    answers to its OpenAPI schema."""
    app.add_middleware(SubmitLimit, settings=settings)
    app.add_middleware(StreamLimit, settings=settings)
    schema = app.openapi

    def documented() -> dict[str, Any]:
        described = schema()
        for path, operations in described.get("paths", {}).items():
            for method, operation in operations.items():
                for status in _limit_statuses(path, method):
                    operation.setdefault("responses", {}).setdefault(str(status), _ANSWER[status])
        return described

    app.openapi = documented  # type: ignore[method-assign]


def _limit_statuses(path: str, method: str) -> tuple[int, ...]:
    """The statuses these limits may answer for an operation of the OpenAPI schema."""
    if method == "post" and path in SUBMIT_PATHS:
        return (429,)
    if method == "get" and path == f"{API_PREFIX}/jobs/{{job_id}}/events":
        return (429, 503)
    return ()


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
_ANSWER = {
    429: {"description": "too_many_requests (with Retry-After)", "content": _ERROR},
    503: {"description": "unavailable (with Retry-After)", "content": _ERROR},
}
