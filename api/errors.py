"""One error shape for every failure: `{"error": {"code", "message", "details"}}`.

The domain's errors (`core.errors`) and the data plane's (`serving.errors`) map to one
status each, by class, in `STATUS`; routes call the services straight and let them raise.
`ApiError` subclasses are the refusals that only HTTP has (authentication, scopes, sizes),
one status each. Framework errors (validation, unknown routes, body limits) look the same.
The Open Inference Protocol's adapter (`api.routers.inference`) renders the same statuses
in its own shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.responses import Response

from api.schemas import ErrorDetail, ErrorOut
from core.db.session import UNAVAILABLE
from core.errors import ConflictError, DomainError, InvalidError, NotFoundError, NotOwnedError
from core.storage import StoreUnavailableError
from serving.errors import STORE_RETRY_AFTER_S as STORE_RETRY_AFTER_S
from serving.errors import STORE_UNAVAILABLE as STORE_UNAVAILABLE
from serving.errors import (
    BadInputError,
    InputTooLargeError,
    ModelFailedError,
    OverloadedError,
    ServingError,
    UnavailableError,
    UnsupportedInputError,
)

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    500: "internal",
    503: "unavailable",
}


class ApiError(Exception):
    """An error answered with `status` and the shared error shape."""

    status: ClassVar[int] = 400
    headers: ClassVar[dict[str, str]] = {}

    def __init__(
        self, message: str, *, code: str | None = None, details: list[ErrorDetail] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or _CODES[self.status]
        self.details = details or []


class UnauthorizedError(ApiError):
    status = 401
    headers: ClassVar[dict[str, str]] = {"WWW-Authenticate": "Bearer"}


class ForbiddenError(ApiError):
    status = 403


class TooLargeError(ApiError):
    status = 413


class ServerFaultError(ApiError):
    """The service failed where the request was not at fault (say, a model's forward pass)."""

    status = 500


# What a request without a key is told where keys are required.
KEY_REQUIRED = "an API key is required: send `Authorization: Bearer rs_...`"


class StoreDownError(ApiError):
    """The object store cannot be reached now; the client should retry later."""

    status = 503
    headers: ClassVar[dict[str, str]] = {"Retry-After": str(STORE_RETRY_AFTER_S)}


DATABASE_RETRY_AFTER_S = 2  # a database restart or failover usually takes seconds
DATABASE_UNAVAILABLE = f"the database is unavailable; try again in {DATABASE_RETRY_AFTER_S} s"


# The status of each refusal of the domain and of the data plane, by class.
STATUS: dict[type[Exception], int] = {
    NotFoundError: 404,
    NotOwnedError: 403,
    ConflictError: 409,
    InvalidError: 422,
    BadInputError: 400,
    InputTooLargeError: 413,
    UnsupportedInputError: 415,
    OverloadedError: 503,
    UnavailableError: 503,
    ModelFailedError: 500,
    StoreUnavailableError: 503,
    **dict.fromkeys(UNAVAILABLE, 503),
}


def status_for(kind: type[BaseException]) -> int:
    """The status of an error class: its nearest class's in `STATUS`, else 500."""
    return next((STATUS[cls] for cls in kind.__mro__ if cls in STATUS), 500)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    return {status: {"model": ErrorOut, "description": _CODES[status]} for status in statuses}


@dataclass(slots=True)
class Refusal:
    """An error as it is answered: status, code, message, details and headers."""

    status: int
    code: str
    message: str
    details: list[ErrorDetail] = field(default_factory=list)
    headers: dict[str, str] | None = None


def refusal_of(error: BaseException) -> Refusal | None:
    """How an error is answered, by its class; None for an unexpected one (a 500 that
    `api.edge.PublicErrors` answers with an error id)."""
    if isinstance(error, ApiError):
        return Refusal(
            error.status, error.code, error.message, error.details, error.headers or None
        )
    if isinstance(error, HTTPException):
        return _http_refusal(error)
    if isinstance(error, RequestValidationError):
        return _validation_refusal(error)
    status = status_for(type(error))
    if status == 500 and not isinstance(error, ModelFailedError):
        return None
    if isinstance(error, DomainError):
        details = [ErrorDetail(loc=list(error.field), msg=error.message)] if error.field else []
        return Refusal(status, _CODES[status], error.message, details)
    if isinstance(error, ServingError):
        details = [ErrorDetail(loc=list(loc), msg=message) for loc, message in error.details]
        return Refusal(status, _CODES[status], error.message, details, retry_after(error))
    if isinstance(error, StoreUnavailableError):
        headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
        return Refusal(503, "unavailable", STORE_UNAVAILABLE, [], headers)
    # The database: the pool drops the broken connections (and pings before reuse), so the
    # next request after the database is back succeeds with no restart.
    headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
    return Refusal(503, "unavailable", DATABASE_UNAVAILABLE, [], headers)


def status_of(error: BaseException) -> int:
    """The status an error is answered with (500: an unexpected one)."""
    refusal = refusal_of(error)
    return 500 if refusal is None else refusal.status


def retry_after(error: ServingError) -> dict[str, str] | None:
    """The Retry-After header of a refusal the client may try again after, else None."""
    return None if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}


def render(refusal: Refusal) -> JSONResponse:
    """A refusal in the shared shape."""
    body = ErrorOut.model_validate(
        {"error": {"code": refusal.code, "message": refusal.message, "details": refusal.details}}
    )
    return JSONResponse(
        body.model_dump(mode="json"), status_code=refusal.status, headers=refusal.headers
    )


Renderer = Callable[[Refusal], Response]


# The framework answers 400 for a body it cannot decode (bytes that are not UTF-8, a broken
# multipart form) but 422 for one that is not JSON: both are bodies a route cannot use, so
# both are a 422, the status every route with a body documents. (The service's own 400s
# are `ApiError`s, never an HTTPException.)
UNPARSABLE_BODY = (
    "the body could not be parsed: send JSON in UTF-8, or a multipart form to the routes "
    "that take files"
)


def _http_refusal(error: HTTPException) -> Refusal:
    if error.status_code == 400:
        message = f"{UNPARSABLE_BODY} ({error.detail})"
        return Refusal(422, "invalid", f"body: {message}", [ErrorDetail(loc=["body"], msg=message)])
    code = _CODES.get(error.status_code, "error")
    headers = dict(error.headers) if error.headers else None
    return Refusal(error.status_code, code, str(error.detail), [], headers)


def _validation_refusal(error: RequestValidationError) -> Refusal:
    details = [_detail(problem, error.body) for problem in error.errors()]
    first = details[0]
    where = ".".join(str(part) for part in first.loc[1:]) or first.loc[0]
    extra = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return Refusal(422, "invalid", f"{where}: {first.msg}{extra}", details)


def _detail(problem: Any, body: Any) -> ErrorDetail:
    """A pydantic problem with the union tags dropped from its location."""
    message = str(problem["msg"]).removeprefix("Value error, ")
    loc = tuple(problem["loc"])
    return ErrorDetail(
        loc=_field_path(loc, body, missing=problem["type"] == "missing"), msg=message
    )


def _field_path(loc: tuple[str | int, ...], body: Any, *, missing: bool) -> list[str | int]:
    """`loc` walked through the request body, without the discriminated unions' tags."""
    # A part that is no key of the body there but repeats its `kind` or `name` is the tag
    # pydantic adds for a discriminated union ("train", "digits").
    if not loc or loc[0] != "body":
        return list(loc)
    path: list[str | int] = ["body"]
    node = body
    for index, part in enumerate(loc[1:], start=1):
        last_missing = missing and index == len(loc) - 1
        if _is_tag(node, part) and not last_missing:
            continue
        path.append(part)
        node = _child(node, part)
    return path


def _is_tag(node: Any, part: str | int) -> bool:
    return (
        isinstance(node, dict) and part not in node and part in (node.get("kind"), node.get("name"))
    )


def _child(node: Any, part: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return node[part]
    return None


def install(app: FastAPI, renderers: dict[str, Renderer] | None = None) -> None:
    """Render every error of `app` in the shared shape, or under a path prefix of
    `renderers` in that protocol's own (`api.routers.inference`)."""
    by_prefix = tuple((renderers or {}).items())

    async def refused(request: Request, error: Exception) -> Response:
        refusal = refusal_of(error)
        if refusal is None:
            raise error
        if isinstance(error, (StoreUnavailableError, *UNAVAILABLE)):
            what = "artifact store" if isinstance(error, StoreUnavailableError) else "database"
            log.warning("%s %s: %s unavailable: %s", request.method, request.url.path, what, error)
        path = request.url.path
        render_as = next(
            (r for prefix, r in by_prefix if path == prefix or path.startswith(prefix + "/")),
            render,
        )
        return render_as(refusal)

    for kind in (ApiError, DomainError, ServingError, HTTPException, RequestValidationError):
        app.add_exception_handler(kind, refused)
    for unavailable in (StoreUnavailableError, *UNAVAILABLE):
        app.add_exception_handler(unavailable, refused)
