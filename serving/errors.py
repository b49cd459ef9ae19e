"""The data plane's refusals, one class each, whatever protocol the request came by.

Each protocol's adapter renders them in its own shape; `api.errors` maps each class to one
HTTP status. A refusal about a reference (unknown, not the caller's to read, not servable)
is the domain's (`core.errors`), raised as it is.
"""

from __future__ import annotations

from typing import ClassVar

RETRY_AFTER_S = 1  # a full model queue drains in well under a second
STORE_RETRY_AFTER_S = 5  # an object store's restart or a network blip
STORE_UNAVAILABLE = f"the artifact store is unavailable; try again in {STORE_RETRY_AFTER_S} s"

Location = tuple[str | int, ...]  # where in the request an input is, e.g. ("body", "files", 0)


class ServingError(Exception):
    """A request the data plane refuses; `details` name each input at fault."""

    retry_after_s: ClassVar[int | None] = None  # when the client may try again, if it may

    def __init__(self, message: str, *, details: list[tuple[Location, str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class BadInputError(ServingError):
    """An input the model cannot take: an undecodable image, a malformed tensor."""


class InputTooLargeError(ServingError):
    """More images, bytes or pixels than a request may hold."""


class UnsupportedInputError(ServingError):
    """A file that is no image of an accepted format."""


class OverloadedError(ServingError):
    """The model has no place for the request now."""

    retry_after_s = RETRY_AFTER_S


class UnavailableError(ServingError):
    """The artifact store cannot be reached, and the model is not loaded yet."""

    retry_after_s = STORE_RETRY_AFTER_S


class ModelFailedError(ServingError):
    """The model failed where the request was not at fault (its forward pass raised)."""
