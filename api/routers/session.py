"""The caller's session: whether the API asks for keys, and what the caller's key may do."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentKey, SettingsDep
from api.errors import responses
from api.schemas import SessionOut
from core.keys import SCOPES

router = APIRouter(prefix="/session", tags=["session"])


@router.get("", summary="The caller's scopes, and whether auth is on", responses=responses(401))
def session(settings: SettingsDep, key: CurrentKey) -> SessionOut:
    """With auth off every scope is allowed; with auth on, the presented key's."""
    if key is None:
        return SessionOut(auth_enabled=settings.auth_enabled, scopes=list(SCOPES))
    return SessionOut(auth_enabled=True, scopes=sorted(key.scopes))
