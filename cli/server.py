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
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.panel import Panel
from sqlalchemy.engine import make_url

from core import resources
from core.db import schema
from core.settings import Settings, get_settings

# The children of `up` run this same command line in a fresh interpreter.
ENTRY = "from cli.main import app; app(prog_name='resnet-service')"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEALTH_PATH = "/api/v1/healthz"
GRPC_PORT = 8001  # the Open Inference Protocol over gRPC, unless GRPC_PORT says otherwise
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
    gpus: Annotated[
        str | None,
        typer.Option(help="all, or GPU ids such as 0,1: one worker process per GPU (group)."),
    ] = None,
    gpus_per_worker: Annotated[
        int,
        typer.Option(min=1, max=resources.MAX_GPUS, help="GPUs each worker process owns."),
    ] = 1,
    group: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """A worker: one job at a time from the queues it can serve, with the reaper; with
    --gpus, one such worker per GPU (or per group of --gpus-per-worker GPUs), supervised."""
    if gpus is not None and group is None:
        raise typer.Exit(supervise_workers(gpus, gpus_per_worker, name, loglevel))
    settings = get_settings()
    if device or group is not None:
        settings = settings.model_copy(update={"device": device or "cuda:0"})
    try:
        schema.check_current(settings.database_url)
    except schema.SchemaOutdated as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    owned = _devices(settings, group)
    if group is None and owned[0].startswith("cuda") and not visible_gpus():
        # It would take GPU jobs from their queues and send them back, again and again
        # (a group's GPUs were checked by the command that started it).
        typer.echo(f"error: device {owned[0]} is asked for, but no GPU is visible", err=True)
        raise typer.Exit(1)
    from worker.tasks import create_worker_app

    celery = create_worker_app(settings, owned)
    queues = resources.queues_served(sum(d.startswith("cuda") for d in owned))
    # app.start, unlike worker_main, hands back the worker's exit status.
    raise typer.Exit(celery.start(worker_argv(name, loglevel, queues)) or 0)


def _devices(settings: Settings, group: str | None) -> list[str]:
    """The devices this worker process owns: its group's GPUs, else its device."""
    if group is not None:
        return [f"cuda:{index}" for index in group.split(",")]
    if settings.device:
        return [settings.device]
    # NVML's count: it does not initialise CUDA in this process, which forks the job's.
    return ["cuda:0"] if visible_gpus() else ["cpu"]


def visible_gpus() -> int:
    """How many GPUs this machine shows (CUDA_VISIBLE_DEVICES applied)."""
    import torch

    return int(torch.cuda.device_count())


def worker_argv(name: str, loglevel: str, queues: list[str] | None = None) -> list[str]:
    """Celery worker arguments: the queues served, one prefork process, one job at a time."""
    return [
        "worker",
        f"--queues={','.join(queues or [resources.CPU_QUEUE])}",
        "--concurrency=1",
        "--pool=prefork",
        f"--hostname={name}",
        f"--loglevel={loglevel}",
        "--without-gossip",  # workers need not know each other: the database coordinates
        "--without-mingle",
    ]


def gpu_groups(gpus: str, per_worker: int, visible: int) -> list[list[int]]:
    """The GPU ids of each worker process, or `BadParameter` saying what is wrong."""
    if visible == 0:
        raise typer.BadParameter(
            "no GPU is visible on this machine (CUDA_VISIBLE_DEVICES applied); leave out "
            "--gpus to run one CPU worker",
            param_hint="--gpus",
        )
    try:
        ids = list(range(visible)) if gpus == "all" else [int(i) for i in gpus.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{gpus!r} is neither all nor GPU ids such as 0,1") from None
    unknown = sorted({i for i in ids if not 0 <= i < visible})
    if unknown or len(set(ids)) != len(ids):
        raise typer.BadParameter(
            f"GPU ids must be distinct and below {visible} (the GPUs visible here), not {gpus}",
            param_hint="--gpus",
        )
    if len(ids) % per_worker:
        raise typer.BadParameter(
            f"{len(ids)} GPUs do not split into groups of {per_worker} (--gpus-per-worker)",
            param_hint="--gpus",
        )
    return [ids[i : i + per_worker] for i in range(0, len(ids), per_worker)]


def supervise_workers(gpus: str, per_worker: int, name: str, loglevel: str) -> int:
    """One worker process per GPU group, each seeing only its GPUs; SIGTERM or SIGQUIT goes
    to every one (a warm stop hands their jobs back); the exit code."""
    groups = gpu_groups(gpus, per_worker, visible_gpus())
    children = {}
    for ids in groups:
        label = "-".join(map(str, ids))
        node = name.replace("@", f"-gpu{label}@", 1) if "@" in name else f"{name}-gpu{label}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}
        args = ["worker", "--group", ",".join(map(str, ids)), "--name", node]
        children[node] = _spawn([*args, "--loglevel", loglevel], env, signal.SIGTERM)
    typer.echo(f"{len(children)} workers: {', '.join(children)}", err=True)
    return watch_workers(children)


def watch_workers(children: dict[str, subprocess.Popen[bytes]]) -> int:
    """Pass SIGTERM/SIGQUIT/SIGINT on to every worker and wait for all; if one exits by
    itself, stop the others warm. The exit code: 1 if any worker failed."""
    passed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
        signal.signal(sig, lambda number, _: passed.append(signal.Signals(number)))
    sent: set[tuple[str, signal.Signals]] = set()
    while any(child.poll() is None for child in children.values()):
        ended = any(child.poll() is not None for child in children.values())
        wanted = passed[-1] if passed else (signal.SIGTERM if ended else None)
        for node, child in children.items():
            if wanted is not None and child.poll() is None and (node, wanted) not in sent:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(wanted)
                sent.add((node, wanted))
        time.sleep(0.2)
    codes = {node: child.returncode for node, child in children.items()}
    failed = {node: code for node, code in codes.items() if code}
    if failed:
        typer.echo(f"workers exited with {failed}", err=True)
    return 1 if failed and not passed else 0


GrpcPort = Annotated[
    int | None,
    typer.Option(min=0, max=65_535, help="The gRPC port (0: none); default GRPC_PORT, else 8001."),
]


def api(
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 for all.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    grpc_port: GrpcPort = None,
) -> None:
    """Serve the HTTP API, and the inference protocol over gRPC beside it; it refuses to
    start on an old schema (unless MIGRATE_ON_START)."""
    import uvicorn

    from cli.connections import server_options

    # The app that uvicorn builds reads its settings from this environment.
    os.environ |= {"GRPC_PORT": str(chosen_grpc_port(get_settings(), grpc_port))}
    os.environ |= {"GRPC_HOST": host}
    get_settings.cache_clear()
    options = server_options(get_settings())
    uvicorn.run("api.app:create_app", factory=True, host=host, port=port, **options)


def chosen_grpc_port(settings: Settings, option: int | None) -> int:
    """The gRPC port a server command serves: --grpc-port, else GRPC_PORT if set, else 8001."""
    if option is not None:
        return option
    return settings.grpc_port if "grpc_port" in settings.model_fields_set else GRPC_PORT


def up(
    host: Annotated[str, typer.Option(help="Interface of the API.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the API.")] = 8000,
    device: Annotated[str | None, typer.Option(help="The worker's device.")] = None,
    grpc_port: GrpcPort = None,
) -> None:
    """Everything in one command: migrate, one worker and the API (SQLite by default)."""
    embedded = embedded_environment(get_settings(), host)
    embedded["GRPC_PORT"] = str(chosen_grpc_port(get_settings(), grpc_port))
    # The children read their settings from this environment; this process, the same.
    env = {**os.environ, **embedded}
    chosen: dict[str, Any] = {key.lower(): value for key, value in embedded.items()}
    settings = Settings(**chosen)
    _announce(settings, host, port)
    open_embedded(Path("var"), settings)
    children = {
        "worker": _spawn(
            ["worker", *(["--device", device] if device else [])], env, signal.SIGQUIT
        ),
        "api": _spawn(
            ["api", "--host", host, "--port", str(port), "--grpc-port", embedded["GRPC_PORT"]],
            env,
            signal.SIGTERM,
        ),
    }
    raise typer.Exit(supervise(children, f"http://{_url_host(host)}:{port}{HEALTH_PATH}"))


def embedded_environment(settings: Settings, host: str) -> dict[str, str]:
    """What `up` sets for its children: ./var for whatever is not configured; auth on loopback."""
    var = Path("var").resolve()
    defaults = {**embedded_places(var), "data_dir": str(var / "data")}
    chosen = settings.model_fields_set
    env = {key.upper(): value for key, value in defaults.items() if key not in chosen}
    if host in LOOPBACK and "auth_enabled" not in chosen:
        env["AUTH_ENABLED"] = "false"
    return env


def embedded_places(root: Path, database: str = "resnet.db") -> dict[str, str]:
    """The settings of a service kept in the folder `root`: a SQLite database, the embedded
    broker beside it and the artifacts (`up` in ./var, `study run --local` in its --out)."""
    return {
        "database_url": f"sqlite:///{root / database}",
        "broker_url": f"sqla+sqlite:///{root / 'broker.db'}",
        "artifact_dir": str(root / "artifacts"),
    }


def open_embedded(root: Path, settings: Settings) -> None:
    """Make the folder of an embedded service and bring its database to the code's schema."""
    root.mkdir(parents=True, exist_ok=True)
    schema.upgrade(settings.database_url)


def _announce(settings: Settings, host: str, port: int) -> None:
    """Say where everything lives, and say loudly when anyone on this machine may call in."""
    console = Console(stderr=True)
    database = make_url(settings.database_url).render_as_string(hide_password=True)
    broker = make_url(settings.broker_url.removeprefix("sqla+")).render_as_string(
        hide_password=True
    )
    console.print(f"database  {database}\nbroker    {broker}\nartifacts {settings.artifact_dir}")
    if settings.grpc_port:
        console.print(f"gRPC      {_url_host(host)}:{settings.grpc_port} (the inference protocol)")
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
