"""API keys `rs_<prefix>_<secret>`: only the sha256 of the secret is stored."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from client.wire import SCOPES as SCOPES
from core.db.tables import ApiKey, utcnow
from core.errors import InvalidError


@dataclass(frozen=True)
class Principal:
    """Who is calling: an API key's id and scopes."""

    key_id: uuid.UUID
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """Whether the key holds `scope` (admin holds every scope)."""
        return scope in self.scopes or "admin" in self.scopes


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(*, session: Session, name: str, scopes: Iterable[str]) -> tuple[ApiKey, str]:
    """Add a key (flushed); returns the row and the plaintext key, which is never stored."""
    wanted = sorted(set(scopes))
    unknown = [scope for scope in wanted if scope not in SCOPES]
    if unknown or not wanted:
        message = f"scopes must be some of {', '.join(SCOPES)}; got {wanted}"
        raise InvalidError(message, field=("body", "scopes"))
    prefix, secret = secrets.token_hex(4), secrets.token_urlsafe(32)
    row = ApiKey(name=name, prefix=prefix, secret_sha256=_digest(secret), scopes=wanted)
    session.add(row)
    session.flush()
    return row, f"rs_{prefix}_{secret}"


def revoke_key(*, session: Session, key_id: uuid.UUID) -> ApiKey | None:
    """Revoke a key from now on; None if there is no such key."""
    row = session.get(ApiKey, key_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def list_keys(*, session: Session) -> list[ApiKey]:
    """Every key, newest first."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc())))


def authenticate(*, session: Session, key: str) -> Principal | None:
    """The principal of a presented key, or None when it is malformed, unknown or revoked."""
    marker, _, rest = key.partition("_")
    prefix, _, secret = rest.partition("_")
    if marker != "rs" or not prefix or not secret:
        return None
    row = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix)).one_or_none()
    if row is None or row.revoked_at is not None:
        return None
    if not hmac.compare_digest(row.secret_sha256, _digest(secret)):
        return None
    return Principal(row.id, frozenset(row.scopes))
