"""Request body limits, answered with the shared error shape (413).

A declared Content-Length over the limit is refused before the body is read; a chunked
body is counted as it arrives and refused once it passes the limit.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.schemas import ErrorOut


class BodyLimit:
    """ASGI middleware: bodies up to `default` bytes, or the limit of their exact path."""

    def __init__(self, app: ASGIApp, default: int, by_path: dict[str, int]) -> None:
        self.app = app
        self.default = default
        self.by_path = by_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.by_path.get(scope["path"], self.default)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _refuse(send, limit)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:  # FastAPI lets an HTTPException through body parsing
                raise HTTPException(413, _message(limit))
            return message

        await self.app(scope, counted, send)


def _message(limit: int) -> str:
    return f"the request body is larger than the limit of {limit:,} bytes"


async def _refuse(send: Send, limit: int) -> None:
    """Answer 413 without reading the body."""
    body = ErrorOut.model_validate(
        {"error": {"code": "too_large", "message": _message(limit), "details": []}}
    ).model_dump_json()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})
