"""The service's refusals as exceptions: one class per HTTP status, all `ApiError`s.

Every error answer of the API has the shape `{"error": {"code", "message", "details"}}`;
`raise_for` turns one into the exception of its status. A service that cannot be reached
(refused connection, timeout, dropped stream) is a `ServiceUnreachableError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import httpx

from client.models import ErrorDetail


class ClientError(Exception):
    """Anything the client raises about the service."""


class ServiceUnreachableError(ClientError):
    """The service did not answer: no connection, a timeout, or a stream that kept dropping."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"the service at {url} is unreachable: {reason}")
        self.url = url
        self.reason = reason


class ApiError(ClientError):
    """An error answer: its HTTP status and the API's code, message and details."""

    status_code: ClassVar[int | None] = None  # the status of the subclass; None: any other

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


class BadRequestError(ApiError):
    status_code = 400


class UnauthorizedError(ApiError):
    """No API key, or one that is unknown or revoked."""

    status_code = 401


class ForbiddenError(ApiError):
    """The key lacks the scope, or the resource belongs to another key."""

    status_code = 403


class NotFoundError(ApiError):
    status_code = 404


class ConflictError(ApiError):
    """The resource is in a state that forbids the request (say, deleting a running job)."""

    status_code = 409


class TooLargeError(ApiError):
    status_code = 413


class UnsupportedMediaError(ApiError):
    status_code = 415


class InvalidError(ApiError):
    """The request's fields are invalid; `details` names each one (`loc`, `msg`)."""

    status_code = 422


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


class RateLimitedError(RetryLaterError):
    status_code = 429


class ServerError(ApiError):
    """The service failed where the request was not at fault."""

    status_code = 500


class OverloadedError(RetryLaterError):
    """The service (a model's queue, the database, the artifact store) is busy or down."""

    status_code = 503


_BY_STATUS: dict[int, type[ApiError]] = {
    cls.status_code: cls
    for cls in (
        BadRequestError,
        UnauthorizedError,
        ForbiddenError,
        NotFoundError,
        ConflictError,
        TooLargeError,
        UnsupportedMediaError,
        InvalidError,
        RateLimitedError,
        ServerError,
        OverloadedError,
    )
    if cls.status_code is not None
}


def raise_for(response: httpx.Response) -> None:
    """Raise the `ApiError` of an error answer; nothing for a success."""
    if response.is_success:
        return
    status = response.status_code
    code, message, details = _parsed(response)
    cls = _BY_STATUS.get(status, ApiError)
    if issubclass(cls, RetryLaterError):
        raise cls(status, code, message, details, retry_after=_retry_after(response))
    raise cls(status, code, message, details)


def _parsed(response: httpx.Response) -> tuple[str, str, list[ErrorDetail]]:
    """Code, message and details of the shared error shape, or of a body without it."""
    try:
        error: Any = response.json()["error"]
        return str(error["code"]), str(error["message"]), list(error.get("details") or [])
    except (ValueError, KeyError, TypeError):
        text = response.text[:500]
        return "http_error", f"HTTP {response.status_code}: {text}", []


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None
