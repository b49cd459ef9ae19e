"""The routes' dependencies and shared parameters, as Annotated aliases: settings, a session,
the caller's key, a version number."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.errors import KEY_REQUIRED, ForbiddenError, UnauthorizedError
from core import keys
from core.db.session import get_engine, session_scope
from core.keys import Principal
from core.owners import Caller
from core.settings import Settings
from serving.cache import RefCache
from serving.memo import TtlCache

_bearer = HTTPBearer(auto_error=False, description="An API key: rs_<prefix>_<secret>.")


# Dependencies without I/O are `async def`: a plain `def` would cost a thread-pool hop.


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(_settings)]


KeyCache = TtlCache[str, Principal]  # keys checked a moment ago, by their sha256


async def _keys(request: Request) -> KeyCache:
    checked: KeyCache = request.app.state.keys
    return checked


KeysDep = Annotated[KeyCache, Depends(_keys)]


async def _refs(request: Request) -> RefCache:
    refs: RefCache = request.state.refs  # the lifespan's (see api.app.Serving)
    return refs


RefsDep = Annotated[RefCache, Depends(_refs)]


async def _session(settings: SettingsDep) -> AsyncIterator[Session]:
    """One session per request, committed when the route returns, else rolled back."""
    session = Session(get_engine(settings.database_url), expire_on_commit=False)
    try:
        yield session
    except BaseException:
        await run_in_threadpool(session.close)  # rolls back, off the event loop
        raise
    await run_in_threadpool(_commit_and_close, session)


def _commit_and_close(session: Session) -> None:
    try:
        session.commit()
    finally:
        session.close()


# "function" scope: the commit happens before the response is sent, so a client that
# reads right after a write sees it.
SessionDep = Annotated[Session, Depends(_session, scope="function")]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def _principal(
    request: Request, settings: SettingsDep, credentials: Credentials
) -> Principal | None:
    """The caller's key; None when auth is off (anonymous)."""
    if not settings.auth_enabled:
        return None
    if credentials is None:
        raise UnauthorizedError(KEY_REQUIRED)
    principal = await check_key(request.app.state.keys, settings, credentials.credentials)
    if principal is None:
        raise UnauthorizedError("the API key is malformed, unknown or revoked")
    return principal


async def check_key(checked: KeyCache, settings: Settings, key: str) -> Principal | None:
    """The key's principal (None: malformed, unknown or revoked), from `checked` when it
    was checked within AUTH_CACHE_SECONDS, else from the database (and then cached)."""
    digest = hashlib.sha256(key.encode()).hexdigest()  # the plaintext is not kept
    principal = checked.get(digest, settings.auth_cache_seconds)
    if principal is None:
        generation = checked.generation
        principal = await run_in_threadpool(_authenticate, settings.database_url, key)
        if principal is not None:
            checked.put(digest, principal, generation)
    return principal


def _authenticate(url: str, key: str) -> Principal | None:
    # A session of its own: a long event stream must not hold the request's connection.
    with session_scope(url) as session:
        return keys.authenticate(session=session, key=key)


CurrentKey = Annotated[Principal | None, Depends(_principal)]


def _requires(scope: str) -> Callable[[Principal | None], Awaitable[Principal | None]]:
    """A dependency that lets through keys holding `scope` (and everyone when auth is off)."""

    async def check(principal: CurrentKey) -> Principal | None:
        if principal is not None:
            check_scope(principal, scope)
        return principal

    return check


def check_scope(principal: Principal, scope: str) -> None:
    """`ForbiddenError` unless the key holds `scope`."""
    if not principal.allows(scope):
        raise ForbiddenError(f"this API key lacks the '{scope}' scope")


ReadKey = Annotated[Principal | None, Depends(_requires("read"))]
TrainKey = Annotated[Principal | None, Depends(_requires("train"))]
AdminKey = Annotated[Principal | None, Depends(_requires("admin"))]
PredictKey = Annotated[Principal | None, Depends(_requires("predict"))]


async def _read_caller(principal: ReadKey, settings: SettingsDep) -> Caller:
    return Caller(principal, own_reads_only=settings.reads_owner_only)


async def _train_caller(principal: TrainKey, settings: SettingsDep) -> Caller:
    return Caller(principal, own_reads_only=settings.reads_owner_only)


# Who asks (a key holding the scope, or none with auth off), for the services that check
# owners (core.owners): to read, and to change.
ReadCaller = Annotated[Caller, Depends(_read_caller)]
TrainCaller = Annotated[Caller, Depends(_train_caller)]


Version = Annotated[int, Path(ge=1, le=2**31 - 1)]  # a registered version's number, in a path
