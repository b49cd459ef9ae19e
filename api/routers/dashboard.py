"""The dashboard: its page, its scripts and styles, and plotly.js.

Everything the browser loads comes from this process, so the dashboard works offline.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import plotly.offline
from fastapi import APIRouter, Response
from fastapi.responses import FileResponse, HTMLResponse

from client.wire import ACTIVE_STATUSES, JOB_STATUSES

router = APIRouter(tags=["dashboard"])
DASHBOARD = Path(__file__).resolve().parent.parent / "dashboard"
STATIC = DASHBOARD / "static"
# The dashboard's own files change with the code: browsers revalidate them (ETag).
# plotly.js changes only with the installed package, so it is cached for a year.
REVALIDATE = "no-cache"
YEAR = "public, max-age=31536000, immutable"
# The words of the wire that the scripts need (ui.js reads them from the page): declared
# once, in client.wire, for the API, its Python client and the dashboard.
WORDS = json.dumps({"statuses": JOB_STATUSES, "active": ACTIVE_STATUSES})


@router.get("/", include_in_schema=False)
def index() -> HTMLResponse:
    """The single page of the dashboard, with the service's words its scripts read."""
    html = (DASHBOARD / "index.html").read_text().replace("{{words}}", WORDS)
    return HTMLResponse(html, headers={"Cache-Control": REVALIDATE})


@router.get("/static/plotly.min.js", include_in_schema=False)
def plotly_js() -> Response:
    """plotly.js from the installed plotly package."""
    return Response(_plotly(), media_type="text/javascript", headers={"Cache-Control": YEAR})


@cache
def _plotly() -> bytes:
    script: str = plotly.offline.get_plotlyjs()
    return script.encode()


def _static_route(path: Path) -> None:
    """GET /static/<name> for one file of the dashboard (a route per file: no path input)."""

    def serve() -> FileResponse:
        return FileResponse(path, headers={"Cache-Control": REVALIDATE})

    serve.__doc__ = f"The dashboard's {path.name}."
    router.add_api_route(f"/static/{path.name}", serve, methods=["GET"], include_in_schema=False)


for _file in sorted(STATIC.iterdir()):
    if _file.is_file() and not _file.name.startswith("."):
        _static_route(_file)
