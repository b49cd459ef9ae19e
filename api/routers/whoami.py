"""Who the caller is: whether the API asks for keys, and what the caller's key may do."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import CurrentKey, SettingsDep
from api.errors import responses
from api.schemas import SessionOut
from core.keys import SCOPES

router = APIRouter(tags=["whoami"])


@router.get(
    "/whoami", summary="The caller's scopes, and whether auth is on", responses=responses(401)
)
# The path's first name, answered alike for clients from before it was renamed.
@router.get("/session", include_in_schema=False)
def whoami(settings: SettingsDep, key: CurrentKey) -> SessionOut:
    """With auth off every scope is allowed; with auth on, the presented key's."""
    if key is None:
        return SessionOut(auth_enabled=settings.auth_enabled, scopes=list(SCOPES))
    return SessionOut(auth_enabled=True, scopes=sorted(key.scopes))
