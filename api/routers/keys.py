"""API keys: create (the plaintext is shown once), list, revoke; admin scope only."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from api.deps import AdminKey, KeysDep, SessionDep, SettingsDep
from api.errors import ForbiddenError, responses
from api.schemas import KeyCreated, KeyIn, KeyOut
from core import keys
from core.errors import NotFoundError

router = APIRouter(prefix="/keys", tags=["keys"])
AUTH_OFF = (
    "API keys cannot be created while auth is off; restart the service with "
    "AUTH_ENABLED=true, then create keys with `resnet-service keys create`"
)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create an API key",
    responses=responses(401, 403, 422),
)
def create_key(body: KeyIn, session: SessionDep, settings: SettingsDep, _: AdminKey) -> KeyCreated:
    """A new key with its scopes; the `key` field is the only time the secret is shown."""
    if not settings.auth_enabled:
        # Anyone who reaches a service without auth could mint a key that outlives it.
        raise ForbiddenError(AUTH_OFF)
    row, plaintext = keys.create_key(session=session, name=body.name, scopes=body.scopes)
    return KeyCreated.model_validate({**KeyOut.of(row).model_dump(), "key": plaintext})


@router.get("", summary="List API keys", responses=responses(401, 403))
def list_keys(session: SessionDep, _: AdminKey) -> list[KeyOut]:
    """Every key, newest first, without secrets."""
    return [KeyOut.of(row) for row in keys.list_keys(session=session)]


@router.delete("/{key_id}", summary="Revoke an API key", responses=responses(401, 403, 404, 422))
def revoke_key(key_id: uuid.UUID, session: SessionDep, checked: KeysDep, _: AdminKey) -> KeyOut:
    """The key stops working: at once through this process, within AUTH_CACHE_SECONDS
    through other API processes. Its row stays for the record.
    """
    row = keys.revoke_key(session=session, key_id=key_id)
    if row is None:
        raise NotFoundError(f"API key {key_id} does not exist")
    session.commit()  # then forget the checks made before it
    checked.clear()
    return KeyOut.of(row)
