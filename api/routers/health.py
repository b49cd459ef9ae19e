"""Liveness, readiness and Prometheus metrics (no API key needed)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api import probes
from api.deps import SettingsDep
from api.schemas import HealthOut, ReadyOut
from api.telemetry import Telemetry
from core.settings import Settings

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> HealthOut:
    """Always ok while the process serves requests."""
    return HealthOut()


@router.get(
    "/readyz",
    summary="The database and the broker are reachable",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "a dependency did not answer"}},
)
async def readyz(settings: SettingsDep) -> JSONResponse:
    """`SELECT 1` on the database and a broker connection, each within the probe timeout."""
    checks = await readiness(settings)
    ready = all(result == "ok" for result in checks.values())
    body = ReadyOut(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


async def readiness(settings: Settings) -> dict[str, str]:
    """Per dependency (database, broker): "ok", or why it did not answer in time."""
    timeout = settings.probe_timeout_seconds
    checks: dict[str, str] = {}
    async with anyio.create_task_group() as group:
        database = partial(probes.check_database, settings.database_url)
        group.start_soon(_probe, checks, "database", database, timeout)
        group.start_soon(_probe, checks, "broker", partial(probes.check_broker, settings), timeout)
    return checks


async def _probe(
    checks: dict[str, str], name: str, check: Callable[[], None], timeout: float
) -> None:
    """Run a blocking check in a thread; record "ok" or why it failed."""
    try:
        with anyio.fail_after(timeout):
            await anyio.to_thread.run_sync(check, abandon_on_cancel=True)
    except TimeoutError:
        checks[name] = f"no answer within {timeout} s"
    except Exception as error:  # any failure makes the service not ready; say which
        checks[name] = f"{type(error).__name__}: {error}"
    else:
        checks[name] = "ok"


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    """Requests and latencies per route template, jobs by status, queue depth."""
    telemetry: Telemetry = request.app.state.telemetry
    return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)
