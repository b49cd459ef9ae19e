"""One error shape for every failure: `{"error": {"code", "message", "details"}}`.

The domain's errors (`core.errors`) map to one status each, by class, in `DOMAIN_STATUS`;
routes call the services straight and let them raise. `ApiError` subclasses are the
refusals that only HTTP has (authentication, scopes, sizes, media types, overload), one
status each. Framework errors (validation, unknown routes, body limits) look the same.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.schemas import ErrorDetail, ErrorOut
from core.db.session import UNAVAILABLE
from core.errors import ConflictError, DomainError, InvalidError, NotFoundError, NotOwnedError
from core.storage import StoreUnavailableError

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


class BadImageError(ApiError):
    status = 400


class TooLargeError(ApiError):
    status = 413


class UnsupportedMediaError(ApiError):
    status = 415


class ServerFaultError(ApiError):
    """The service failed where the request was not at fault (say, a model's forward pass)."""

    status = 500


# What a request without a key is told where keys are required.
KEY_REQUIRED = "an API key is required: send `Authorization: Bearer rs_...`"

RETRY_AFTER_S = 1


class OverloadedError(ApiError):
    """The service is busy; the client should retry after `RETRY_AFTER_S`."""

    status = 503
    headers: ClassVar[dict[str, str]] = {"Retry-After": str(RETRY_AFTER_S)}


STORE_RETRY_AFTER_S = 5  # an object store's restart or a network blip
STORE_UNAVAILABLE = f"the artifact store is unavailable; try again in {STORE_RETRY_AFTER_S} s"


class StoreDownError(ApiError):
    """The object store cannot be reached now; the client should retry later."""

    status = 503
    headers: ClassVar[dict[str, str]] = {"Retry-After": str(STORE_RETRY_AFTER_S)}


DATABASE_RETRY_AFTER_S = 2  # a database restart or failover usually takes seconds
DATABASE_UNAVAILABLE = f"the database is unavailable; try again in {DATABASE_RETRY_AFTER_S} s"


DOMAIN_STATUS: dict[type[DomainError], int] = {
    NotFoundError: 404,
    NotOwnedError: 403,
    ConflictError: 409,
    InvalidError: 422,
}


def domain_status(error: DomainError) -> int:
    """The status of a domain error: its nearest class's in `DOMAIN_STATUS`."""
    return next(DOMAIN_STATUS[cls] for cls in type(error).__mro__ if cls in DOMAIN_STATUS)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    return {status: {"model": ErrorOut, "description": _CODES[status]} for status in statuses}


def _render(
    status: int,
    code: str,
    message: str,
    details: list[ErrorDetail],
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorOut.model_validate(
        {"error": {"code": code, "message": message, "details": details}}
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


async def _api_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return _render(error.status, error.code, error.message, error.details, error.headers or None)


async def _domain_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, DomainError)
    status = domain_status(error)
    details = [ErrorDetail(loc=list(error.field), msg=error.message)] if error.field else []
    return _render(status, _CODES[status], error.message, details)


async def _database_unavailable(request: Request, error: Exception) -> JSONResponse:
    # The pool drops the broken connections (and pings before reuse): the next request
    # after the database is back succeeds with no restart.
    log.warning("%s %s: database unavailable: %s", request.method, request.url.path, error)
    headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)}
    return _render(503, "unavailable", DATABASE_UNAVAILABLE, [], headers)


# The framework answers 400 for a body it cannot decode (bytes that are not UTF-8, a broken
# multipart form) but 422 for one that is not JSON: both are bodies a route cannot use, so
# both are a 422, the status every route with a body documents. (The service's own 400s
# are `ApiError`s, never an HTTPException.)
UNPARSABLE_BODY = (
    "the body could not be parsed: send JSON in UTF-8, or a multipart form to the routes "
    "that take files"
)


async def _http_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    if error.status_code == 400:
        message = f"{UNPARSABLE_BODY} ({error.detail})"
        return _render(422, "invalid", f"body: {message}", [ErrorDetail(loc=["body"], msg=message)])
    code = _CODES.get(error.status_code, "error")
    headers = dict(error.headers) if error.headers else None
    return _render(error.status_code, code, str(error.detail), [], headers)


async def _validation_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    details = [_detail(problem, error.body) for problem in error.errors()]
    first = details[0]
    where = ".".join(str(part) for part in first.loc[1:]) or first.loc[0]
    extra = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    return _render(422, "invalid", f"{where}: {first.msg}{extra}", details)


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


async def _store_unavailable(request: Request, error: Exception) -> JSONResponse:
    log.warning("%s %s: artifact store unavailable: %s", request.method, request.url.path, error)
    headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
    return _render(503, "unavailable", STORE_UNAVAILABLE, [], headers)


def install(app: FastAPI) -> None:
    """Render every error of `app` in the shared shape."""
    app.add_exception_handler(ApiError, _api_error)
    for domain_error in DOMAIN_STATUS:
        app.add_exception_handler(domain_error, _domain_error)
    app.add_exception_handler(HTTPException, _http_error)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)
    app.add_exception_handler(StoreUnavailableError, _store_unavailable)
    app.add_exception_handler(RequestValidationError, _validation_error)
