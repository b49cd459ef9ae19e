"""The service's refusals as exceptions: one class per HTTP status, all `ApiError`s.

Every error answer of the API has the shape `{"error": {"code", "message", "details"}}`
(`client.models.ErrorOut`); `raise_for` turns one into the exception of its status, which
`BY_STATUS` holds: each subclass names its status once, `class X(ApiError, status=N)`.
A service that cannot be reached (refused connection, timeout, dropped stream) is a
`ServiceUnreachableError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from client.models import ErrorBody, ErrorDetail, ErrorOut


class ClientError(Exception):
    """Anything the client raises about the service."""


class ServiceUnreachableError(ClientError):
    """The service did not answer: no connection, a timeout, or a stream that kept dropping."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the service at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


# Each status's exception class: every `ApiError` subclass that names a status is here.
BY_STATUS: dict[int, type[ApiError]] = {}


class ApiError(ClientError):
    """An error answer: its HTTP status and the API's code, message and details."""

    status_code: ClassVar[int | None] = None  # the status of the subclass; None: any other

    def __init_subclass__(cls, *, status: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status_code = status
            BY_STATUS[status] = cls

    def __init__(
        self, status: int, code: str, message: str, details: list[ErrorDetail] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code!r}, {self.message!r})"


class RetryLaterError(ApiError):
    """A refusal that says when to try again (`retry_after`, seconds, from Retry-After)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: list[ErrorDetail] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, code, message, details)
        self.retry_after = retry_after


class BadRequestError(ApiError, status=400):
    """The request could not be used as sent (say, a file that is no image)."""


class UnauthorizedError(ApiError, status=401):
    """No API key, or one that is unknown or revoked."""


class ForbiddenError(ApiError, status=403):
    """The key lacks the scope, or the resource belongs to another key."""


class NotFoundError(ApiError, status=404):
    """No job, study, model, version or file of that name or id."""


class ConflictError(ApiError, status=409):
    """The resource is in a state that forbids the request (say, deleting a running job)."""


class TooLargeError(ApiError, status=413):
    """The body, a file or an image is over the service's limit."""


class UnsupportedMediaError(ApiError, status=415):
    """The body or a file is of a type the route does not take."""


class InvalidError(ApiError, status=422):
    """The request's fields are invalid; `details` names each one (`loc`, `msg`)."""


class RateLimitedError(RetryLaterError, status=429):
    """The key (or address) sent more than its limit allows; try again after `retry_after`."""


class ServerError(ApiError, status=500):
    """The service failed where the request was not at fault."""


class OverloadedError(RetryLaterError, status=503):
    """The service (a model's queue, the database, the artifact store) is busy or down."""


def raise_for(response: httpx.Response) -> None:
    """Raise the `ApiError` of an error answer; nothing for a success."""
    if response.is_success:
        return
    status = response.status_code
    error = _parsed(response)
    cls = BY_STATUS.get(status, ApiError)
    details = error.get("details", [])
    if issubclass(cls, RetryLaterError):
        retry_after = _retry_after(response)
        raise cls(status, error["code"], error["message"], details, retry_after=retry_after)
    raise cls(status, error["code"], error["message"], details)


def _parsed(response: httpx.Response) -> ErrorBody:
    """The error of the shared shape, or one made of a body without it."""
    try:
        answer: ErrorOut = response.json()
        error = answer["error"]
        details = list(error.get("details") or [])
        return {"code": str(error["code"]), "message": str(error["message"]), "details": details}
    except (ValueError, KeyError, TypeError):
        text = response.text[:500]
        return {"code": "http_error", "message": f"HTTP {response.status_code}: {text}"}


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None
