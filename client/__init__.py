"""A Python client of the ResNet service's API: jobs, studies, metrics, the model registry
and predictions, with typed answers and one exception class per refusal."""

from client.api import Client
from client.errors import (
    ApiError,
    BadRequestError,
    ClientError,
    ConflictError,
    ForbiddenError,
    InvalidError,
    NotFoundError,
    OverloadedError,
    RateLimitedError,
    ServerError,
    ServiceUnreachableError,
    TooLargeError,
    UnauthorizedError,
    UnsupportedMediaError,
)
from client.models import Event, MetricPoint, Point

__all__ = [
    "ApiError",
    "BadRequestError",
    "Client",
    "ClientError",
    "ConflictError",
    "Event",
    "ForbiddenError",
    "InvalidError",
    "MetricPoint",
    "NotFoundError",
    "OverloadedError",
    "Point",
    "RateLimitedError",
    "ServerError",
    "ServiceUnreachableError",
    "TooLargeError",
    "UnauthorizedError",
    "UnsupportedMediaError",
]
