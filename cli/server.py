"""Server commands: `migrate`, `worker`, `api`, and `up` (the embedded default, all in one)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from sqlalchemy.engine import make_url

from core.db import schema
from core.queue import QUEUE
from core.settings import Settings, get_settings

# The children of `up` run this same command line in a fresh interpreter.
ENTRY = "from cli.main import app; app(prog_name='resnet-service')"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEALTH_PATH = "/api/v1/healthz"
STOP_GRACE_S = 15.0  # how long a child may take to stop before it is killed


def migrate() -> None:
    """Upgrade the database to the code's schema (alembic upgrade head)."""
    url = get_settings().database_url
    schema.upgrade(url)
    typer.echo(f"database {make_url(url).render_as_string(hide_password=True)} is at head")


def worker(
    device: Annotated[
        str | None, typer.Option(help="cuda:0, cpu; default DEVICE, else the first GPU.")
    ] = None,
    name: Annotated[str, typer.Option(help="Celery node name (%h: host name).")] = "worker@%h",
    loglevel: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING.")] = "INFO",
) -> None:
    """A worker: one job at a time from the train queue, with the reaper (one per GPU)."""
    if device:
        # worker.tasks reads the settings once, at import; the device is one of them.
        os.environ["DEVICE"] = device
        get_settings.cache_clear()
    settings = get_settings()
    try:
        schema.check_current(settings.database_url)
    except schema.SchemaOutdated as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    from worker.tasks import app as celery

    # app.start, unlike worker_main, hands back the worker's exit status.
    raise typer.Exit(celery.start(worker_argv(name, loglevel)) or 0)


def worker_argv(name: str, loglevel: str) -> list[str]:
    """Celery worker arguments: the train queue, one prefork process, one job at a time."""
    return [
        "worker",
        f"--queues={QUEUE}",
        "--concurrency=1",
        "--pool=prefork",
        f"--hostname={name}",
        f"--loglevel={loglevel}",
        "--without-gossip",  # workers need not know each other: the database coordinates
        "--without-mingle",
    ]


def api(
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 for all.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
) -> None:
    """Serve the HTTP API; it refuses to start on an old schema (unless MIGRATE_ON_START)."""
    import uvicorn

    uvicorn.run("api.app:create_app", factory=True, host=host, port=port)


def up(
    host: Annotated[str, typer.Option(help="Interface of the API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the API.")] = 8000,
    device: Annotated[str | None, typer.Option(help="The worker's device.")] = None,
) -> None:
    """Everything in one command: migrate, one worker and the API (SQLite by default)."""
    # The children inherit the environment; this process reads its settings from it too.
    os.environ.update(embedded_environment(get_settings(), host))
    get_settings.cache_clear()
    settings = get_settings()
    _announce(settings, host, port)
    Path("var").mkdir(exist_ok=True)
    schema.upgrade(settings.database_url)
    env = dict(os.environ)
    children = {
        "worker": _spawn(
            ["worker", *(["--device", device] if device else [])], env, signal.SIGQUIT
        ),
        "api": _spawn(["api", "--host", host, "--port", str(port)], env, signal.SIGTERM),
    }
    raise typer.Exit(supervise(children, f"http://{_url_host(host)}:{port}{HEALTH_PATH}"))


def embedded_environment(settings: Settings, host: str) -> dict[str, str]:
    """What `up` sets for its children: ./var for whatever is not configured; auth on loopback."""
    var = Path("var").resolve()
    defaults = {
        "database_url": f"sqlite:///{var / 'resnet.db'}",
        "broker_url": f"sqla+sqlite:///{var / 'broker.db'}",
        "artifact_dir": str(var / "artifacts"),
        "data_dir": str(var / "data"),
    }
    chosen = settings.model_fields_set
    env = {key.upper(): value for key, value in defaults.items() if key not in chosen}
    if host in LOOPBACK and "auth_enabled" not in chosen:
        env["AUTH_ENABLED"] = "false"
    return env


def _announce(settings: Settings, host: str, port: int) -> None:
    """Say where everything lives, and say loudly when anyone on this machine may call in."""
    console = Console(stderr=True)
    database = make_url(settings.database_url).render_as_string(hide_password=True)
    broker = make_url(settings.broker_url.removeprefix("sqla+")).render_as_string(
        hide_password=True
    )
    console.print(f"database  {database}\nbroker    {broker}\nartifacts {settings.artifact_dir}")
    if not settings.auth_enabled:
        console.print(
            Panel(
                f"AUTH IS OFF: any program on this machine can use http://{host}:{port} "
                "without an API key (web pages of other sites cannot: only loopback Host "
                "names and the dashboard's own changes are served, and no key can be made). "
                "This happens only on a loopback address; bind another host (or set "
                "AUTH_ENABLED=true) to require keys.",
                style="bold red",
            )
        )


def _spawn(
    args: list[str], env: dict[str, str], deathsig: signal.Signals
) -> subprocess.Popen[bytes]:
    """Run `resnet-service ARGS` in its own process group, ended with us even by SIGKILL."""
    return subprocess.Popen(
        [sys.executable, "-c", ENTRY, *args],
        env=env,
        start_new_session=True,  # Ctrl-C reaches `up` only, which stops the children in order
        preexec_fn=_die_with_parent(deathsig),
    )


def _die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """On Linux, a pre-exec hook that has the kernel send `sig` when `up` dies."""
    if sys.platform != "linux":
        return None

    def hook() -> None:
        ctypes.CDLL(None).prctl(1, int(sig))  # PR_SET_PDEATHSIG

    return hook


def supervise(children: dict[str, subprocess.Popen[bytes]], health_url: str) -> int:
    """Wait for SIGINT/SIGTERM or a child's exit, then stop every child; the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code, ready = 0, False
    while not stop.wait(0.5):
        for name, child in children.items():
            if child.poll() is not None:
                typer.echo(f"{name} exited with status {child.returncode}; stopping", err=True)
                code = 1
                stop.set()
        if not ready and _healthy(health_url):
            ready = True
            typer.echo(f"ready: {health_url.removesuffix(HEALTH_PATH)} (Ctrl-C stops everything)")
    stop_children(children)
    return code


def stop_children(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """Ask each child to stop (the worker cold: its job resumes later), then kill leftovers."""
    for name, child in children.items():
        if child.poll() is None:
            # SIGQUIT is Celery's cold shutdown: the running job stops now, not when done.
            child.send_signal(signal.SIGQUIT if name == "worker" else signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The whole process group: a worker's job process included.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
