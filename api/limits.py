"""Request limits answered before a route runs: body sizes (413), bodies that stall (408),
JSON with control characters (400) and full model queues (503).

A declared Content-Length over the limit is refused before the body is read; a chunked
body is counted as it arrives and refused once it passes the limit. A JSON body whose
strings escape a control character (`\u0000`, say: Postgres stores no NUL) is refused as
it arrives. A prediction for a model whose request queue is full is refused before
routing, dependencies or its body.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.edge import PRINCIPAL, answer, is_protocol
from api.hot_routes import query_of
from core.owners import Caller
from serving.dataplane import overloaded

PathTest = Callable[[str], bool]


class BodyLimit:
    """ASGI middleware: bodies up to `default` bytes, or the limit of their exact path, or
    of the first of `by_test` whose test the path passes (paths with parameters)."""

    def __init__(
        self,
        app: ASGIApp,
        default: int,
        by_path: dict[str, int],
        by_test: tuple[tuple[PathTest, int], ...] = (),
        idle_s: float | None = None,
    ) -> None:
        self.app = app
        self.default = default
        self.by_path = by_path
        self.by_test = by_test
        self.idle_s = idle_s  # the longest wait for a body's next chunk

    def limit(self, path: str) -> int:
        """The body limit of a request path."""
        limit = self.by_path.get(path)
        if limit is not None:
            return limit
        return next((limit for test, limit in self.by_test if test(path)), self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["path"])
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > limit:
            # Answered without reading the body.
            bare = is_protocol(scope["path"])
            await answer(send, 413, "too_large", _message(limit), bare=bare)
            return
        received, complete = 0, False
        escapes = EscapeScan() if _is_json(declared_type(scope)) else None

        async def counted() -> Message:
            nonlocal received, complete
            # Once the body is in, receive waits for the client to leave: no time limit.
            message = await (receive() if complete else self._next(receive))
            complete = complete or not message.get("more_body", False)
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > limit:  # FastAPI lets an HTTPException through body parsing
                raise HTTPException(413, _message(limit))
            if escapes is not None and escapes.found(chunk):
                raise HTTPException(400, CONTROL_MESSAGE)
            return message

        await self.app(scope, counted, send)

    async def _next(self, receive: Receive) -> Message:
        """The next message, or a 408 when the client sends nothing for `idle_s`."""
        if self.idle_s is None:
            return await receive()
        try:
            # A deadline on this task, not `wait_for`'s task per message: a body that is
            # in already (most are) then costs no event-loop round.
            async with asyncio.timeout(self.idle_s):
                return await receive()
        except TimeoutError:
            message = f"the request body stalled: nothing arrived for {self.idle_s:g} s"
            raise HTTPException(408, message, {"Connection": "close"}) from None


CONTROL_MESSAGE = (
    "the JSON body escapes a control character (such as \\u0000) in a string; text "
    "fields take printable characters, tabs and line breaks only"
)
# A \u escape of a C0 control character other than tab, line feed and carriage return,
# after an even run of backslashes (an odd run escapes the backslash instead).
_CONTROL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u00(?:0[0-8bBcCeEfF]|1[0-9a-fA-F])")
_ESCAPE_LENGTH = 6  # \u0000


class EscapeScan:
    """Finds control-character escapes in a JSON body that arrives in chunks."""

    def __init__(self) -> None:
        self.carry = b""  # the end of the last chunk that an escape may continue from

    def found(self, chunk: bytes) -> bool:
        """Whether an escape ends in `chunk`, given the chunks before it."""
        data = self.carry + chunk
        # The literal test first: the regex tries every position, 10 s for 40 MB.
        if b"\\u00" in data and _CONTROL_ESCAPE.search(data):
            return True
        head, tail = data[: -_ESCAPE_LENGTH + 1], data[-_ESCAPE_LENGTH + 1 :]
        run = len(head) - len(head.rstrip(b"\\"))  # backslashes before the tail
        self.carry = b"\\" * (run % 2) + tail
        return False


def declared_type(scope: Scope) -> str:
    """A request's media type, lower case, without parameters."""
    content_type = Headers(scope=scope).get("content-type", "")
    return content_type.partition(";")[0].strip().lower()


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or media_type.endswith("+json")


def _message(limit: int) -> str:
    return f"the request body is larger than the limit of {limit:,} bytes"


class PredictShed:
    """ASGI middleware: POST `path` (or a path `ref_of` finds a model reference in) for a
    model whose request queue is full is a 503 at once.

    At twice the capacity, the excess must cost next to nothing, or refusing it starves the
    requests being served. The route admits too, with the same test (`serving.dataplane.
    overloaded`); this only reads what the app knows already, the references it resolved
    (`RefCache`) and each model's admitted requests, and lets everything else through to
    the route: a reference not resolved yet, or resolved longer ago than `ttl_s`.
    """

    def __init__(
        self,
        app: ASGIApp,
        path: str,
        ttl_s: float,
        reads_owner_only: bool,
        ref_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self.app = app
        self.path, self.ttl_s, self.reads_owner_only = path, ttl_s, reads_owner_only
        self.ref_of = ref_of

    def _ref(self, scope: Scope) -> str | None:
        """The model reference of a prediction request, as its route resolves it."""
        if scope["path"] == self.path:
            return query_of(scope["query_string"]).get("model", "")
        return self.ref_of(scope["path"]) if self.ref_of is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ref = self._ref(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if ref:
            state = scope.get("state") or {}
            refs, cache = state.get("refs"), state.get("model_cache")
            target = refs.get(ref, self.ttl_s) if refs is not None else None
            principal = state.get(PRINCIPAL)
            caller = Caller(principal, own_reads_only=self.reads_owner_only)
            # Only a caller that the route would serve learns that the model is busy.
            if (
                target is not None
                and cache is not None
                and (principal is None or principal.allows("predict"))
                and caller.sees(target.owner_key_id)
                and (refused := overloaded(cache, target)) is not None
            ):
                retry = {"Retry-After": str(refused.retry_after_s)}
                # Kept alive: a client that retries must not pay for a new connection.
                bare = is_protocol(scope["path"])
                await answer(
                    send, 503, "unavailable", refused.message, retry, close=False, bare=bare
                )
                return
        await self.app(scope, receive, send)
