"""The domain's errors: what the services raise when a request cannot be met.

Each class is one kind of refusal; the API answers each with exactly one HTTP status
(`api/errors.py`), and the command line prints the message. A message names what was
asked and says what would work instead.
"""

from __future__ import annotations

from collections.abc import Sequence


class DomainError(Exception):
    """A request the service cannot meet; `field` locates the offending input, if one does."""

    def __init__(self, message: str, *, field: Sequence[str | int] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.field = tuple(field)


class NotFoundError(DomainError):
    """What the request names does not exist (a job, a model, a version, an alias, a key)."""


class NotOwnedError(DomainError):
    """The caller's API key may not change what the request names: another key owns it."""


class ConflictError(DomainError):
    """The request clashes with the current state (a running job, an alias in use)."""


class InvalidError(DomainError):
    """The request's content cannot be used (a reference, a name, a choice)."""
