"""The HTTP side of the prediction routes: matched ahead of every other route, their caller
and query strings read without FastAPI's dependency solving, their data plane at hand."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from api.deps import check_scope
from api.edge import PRINCIPAL
from api.errors import KEY_REQUIRED, UnauthorizedError
from core.keys import Principal
from core.owners import Caller
from core.settings import Settings
from serving.dataplane import DataPlane

Endpoint = Callable[[Request], Awaitable[Response]]
_HOT: set[Endpoint] = set()  # the endpoints marked `hot`


class HotRoute(Route):
    """A prediction route as a plain Starlette route, put ahead of every other (`api.app`):
    matched with one regex, its endpoint called with the request alone, without FastAPI's
    per-request route resolution through included routers and its dependency solving.
    Made by `hot_routes` from the FastAPI route marked `hot`, which documents it."""

    def __init__(self, path: str, endpoint: Endpoint) -> None:
        super().__init__(path, endpoint, methods=["POST"], include_in_schema=False)
        self.call = endpoint

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Call the endpoint with the request, for a POST; else Starlette's 405.

        Only the matched route runs this (the routes tried before it pay nothing more
        than Starlette's match), and without `request_response`'s wrapping: an error
        the endpoint raises is rendered by the app's handlers, around the router.
        """
        if scope["method"] != "POST":
            await super().handle(scope, receive, send)
            return
        scope["route"] = self  # its template, for the request metrics
        response = await self.call(Request(scope, receive, send))
        await response(scope, receive, send)


def hot(endpoint: Endpoint) -> Endpoint:
    """Mark a FastAPI route's endpoint as a prediction route: declared (and documented) once,
    by its FastAPI decorator, and served by the `HotRoute` that `hot_routes` derives from it.
    Put it below the decorator (`@router.post(...)` then `@hot`)."""
    _HOT.add(endpoint)
    return endpoint


def hot_routes(*mounted: tuple[str, APIRouter]) -> list[HotRoute]:
    """A `HotRoute` for each route marked `hot` of the routers given with the prefix they
    are included under: the same path and endpoint, matched ahead of every other route."""
    return [
        HotRoute(prefix + route.path, route.endpoint)
        for prefix, router in mounted
        for route in router.routes
        if isinstance(route, APIRoute) and route.endpoint in _HOT
    ]


def caller_of(request: Request, scope: str) -> Caller:
    """The caller of a prediction route, whose key (checked by `api.edge.AuthFirst` before
    the body) must hold `scope`; anyone with auth off."""
    settings: Settings = request.app.state.settings
    principal = principal_of(request, settings, scope)
    return Caller(principal, own_reads_only=settings.reads_owner_only)


def principal_of(request: Request, settings: Settings, scope: str) -> Principal | None:
    """The caller's key if it holds `scope`; None with auth off."""
    if not settings.auth_enabled:
        return None
    principal: Principal | None = request.scope.get("state", {}).get(PRINCIPAL)
    if principal is None:
        raise UnauthorizedError(KEY_REQUIRED)
    check_scope(principal, scope)
    return principal


def plane_of(request: Request) -> DataPlane:
    """The data plane of the server the request came to (its lifespan's, `api.app`)."""
    plane: DataPlane = request.scope["state"]["plane"]
    return plane


_QUERIES: dict[bytes, dict[str, str]] = {}
MAX_QUERIES = 1024  # distinct query strings kept; then the memo starts afresh
MAX_QUERY_BYTES = 512  # longer strings are parsed each time, never kept


def query_of(raw: bytes) -> dict[str, str]:
    """A query string's parameters (the last value of each, as Starlette reads them), parsed
    once per distinct string: under load a prediction route sees the same few strings."""
    parsed = _QUERIES.get(raw)
    if parsed is None:
        parsed = dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))
        if len(raw) <= MAX_QUERY_BYTES:
            if len(_QUERIES) >= MAX_QUERIES:
                _QUERIES.clear()
            _QUERIES[raw] = parsed
    return parsed
