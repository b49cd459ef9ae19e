"""The client of a running service: `submit`, `jobs`, `watch` and `predict`, over HTTP.

The service's address and API key come from --url / --key, else RESNET_URL / RESNET_KEY.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.formatting import percent
from cli.train_options import (
    DatasetFields,
    DatasetName,
    Epochs,
    Iterations,
    ModelName,
    ModelOptions,
    RecipeFields,
    train_spec,
)
from core.settings import get_settings

API_PREFIX = "/api/v1"  # where the service's routes start (api.schemas.API_PREFIX)
Url = Annotated[
    str | None, typer.Option("--url", help="The service; default: RESNET_URL or 127.0.0.1:8000.")
]
Key = Annotated[str | None, typer.Option("--key", help="API key; default: RESNET_KEY.")]
RECONNECTS = 5  # a dropped event stream is resumed this many times (from Last-Event-ID)


def _client(url: str | None, key: str | None) -> httpx.Client:
    """An HTTP client for the service's /api/v1, with the API key if there is one."""
    settings = get_settings()
    secret = key or settings.client_key
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    base = (url or settings.client_url).rstrip("/") + API_PREFIX
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def _checked(response: httpx.Response) -> Any:
    """The JSON of a successful answer; otherwise print the error and exit (2 for 422)."""
    if response.is_success:
        return response.json()
    try:
        error = response.json()["error"]
    except (ValueError, KeyError):
        typer.echo(f"error: HTTP {response.status_code}: {response.text[:500]}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"error: {error['message']}", err=True)
    for detail in error["details"][1:]:
        where = ".".join(str(part) for part in detail["loc"][1:])
        typer.echo(f"error: {where}: {detail['msg']}", err=True)
    raise typer.Exit(2 if response.status_code == 422 else 1)


def submit(
    model: ModelName = "resnet20",
    dataset: DatasetName = "digits",
    epochs: Epochs = None,
    iterations: Iterations = None,
    option: ModelOptions = None,
    dataset_option: DatasetFields = None,
    recipe: RecipeFields = None,
    name: Annotated[str | None, typer.Option(help="A name for the runs table.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    spec_file: Annotated[
        Path | None, typer.Option("--spec", help="A whole job spec (train or evaluate) as JSON.")
    ] = None,
    follow: Annotated[bool, typer.Option("--watch", help="Then follow it live.")] = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Submit a job to a running service; prints its id."""
    payload = (
        json.loads(spec_file.read_text())
        if spec_file
        else {
            "kind": "train",
            "name": name,
            "tags": tag or [],
            **train_spec(
                model=model,
                dataset=dataset,
                epochs=epochs,
                iterations=iterations,
                options=option,
                dataset_fields=dataset_option,
                recipe=recipe,
            ),
        }
    )
    with _client(url, key) as client:
        job = _checked(client.post("/jobs", json=payload))
    typer.echo(job["id"])
    if follow:
        watch(job["id"], url=url, key=key)


def list_jobs(
    status: Annotated[list[str] | None, typer.Option(help="queued, running, ... (repeat).")] = None,
    model: Annotated[str | None, typer.Option(help="Only this zoo name.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only jobs with this tag.")] = None,
    sort: Annotated[str, typer.Option(help="created, finished, best_test_error; - desc.")] = (
        "-created"
    ),
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    url: Url = None,
    key: Key = None,
) -> None:
    """The service's jobs as a table, newest first."""
    filters = {"status": status or [], "model": model, "dataset": dataset, "tag": tag}
    params: dict[str, str | int | list[str]] = {k: v for k, v in filters.items() if v}
    params |= {"sort": sort, "limit": limit}
    with _client(url, key) as client:
        page = _checked(client.get("/jobs", params=params))
    table = Table(title=f"jobs ({sort})")
    for column in (
        "id",
        "name",
        "kind",
        "model",
        "dataset",
        "status",
        "step",
        "best err",
        "created",
    ):
        table.add_column(column, no_wrap=column in ("id", "created"))
    for job in page["items"]:
        progress = job["progress"]
        table.add_row(
            job["id"][:8],
            job["name"] or "",
            job["kind"],
            job["model"] or "",
            job["dataset"] or "",
            job["status"],
            f"{progress['step']:,}/{progress['total_steps'] or '?'}",
            percent(job["results"]["best_test_error"]),
            job["created_at"][:19].replace("T", " "),
        )
    Console(width=None if Console().is_terminal else 160).print(table)


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, Any, str | None]]:
    """(event, data, id) of each event of a Server-Sent Events stream."""
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "event" in fields:
            yield fields["event"], json.loads(fields.get("data", "null")), fields.get("id")
        fields = {}


class _Watch:
    """A job's progress bar and log, drawn from its event stream."""

    def __init__(self, job_id: str, progress: Progress) -> None:
        self.job_id = job_id
        self.progress = progress
        self.task = progress.add_task(job_id[:8], total=None)
        self.latest: dict[str, float] = {}
        self.last_event_id: str | None = None

    def show(self, event: str, data: Any) -> str | None:
        """Draw one event; the job's final status when it is `end`."""
        if event == "log":
            self.progress.console.print(f"[dim]{data['created_at'][11:19]}[/] {data['message']}")
        elif event == "progress":
            self.progress.update(self.task, completed=data["step"], total=data["total_steps"])
        elif event == "status":
            self.progress.update(self.task, description=f"{self.job_id[:8]} {data['status']}")
        elif event == "metrics":
            self.latest |= {n: s["values"][-1] for n, s in data["series"].items()}
            shown = [
                f"{n} {self.latest[n]:.4g}"
                for n in ("train/loss", "test/error")
                if n in self.latest
            ]
            self.progress.update(self.task, description=f"{self.job_id[:8]} {'  '.join(shown)}")
        return str(data["status"]) if event == "end" else None

    def follow(self, client: httpx.Client) -> str | None:
        """Read the stream until `end` (the status) or until it drops (None)."""
        headers = {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}
        path = f"/jobs/{self.job_id}/events"
        timeout = httpx.Timeout(30, read=None)
        with client.stream("GET", path, headers=headers, timeout=timeout) as response:
            if not response.is_success:
                response.read()
                _checked(response)
            for event, data, event_id in _sse(response.iter_lines()):
                self.last_event_id = event_id or self.last_event_id
                ended = self.show(event, data)
                if ended is not None:
                    return ended
        return None


def watch(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: Url = None,
    key: Key = None,
) -> None:
    """Follow a job live until it ends; exits 1 unless it succeeded."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    status = None
    with _client(url, key) as client, Progress(*columns, TimeElapsedColumn()) as progress:
        watching = _Watch(job_id, progress)
        for _attempt in range(RECONNECTS + 1):
            try:
                status = watching.follow(client)
            except httpx.TransportError as error:
                progress.console.print(f"[yellow]stream dropped ({error}); reconnecting[/]")
                continue
            if status is not None:
                break
    typer.echo(f"job {job_id} {status or 'still running: the stream kept dropping'}")
    if status != "succeeded":
        raise typer.Exit(1)


def predict(
    images: Annotated[list[Path], typer.Argument(help="PNG, JPEG, WebP or BMP files.")],
    model: Annotated[
        str, typer.Option(help="A job id, a registered name, name/VERSION or name@ALIAS.")
    ],
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=1000)] = 5,
    url: Url = None,
    key: Key = None,
) -> None:
    """Classify images with a served model; prints a table of top classes per image."""
    missing = [str(path) for path in images if not path.is_file()]
    if missing:
        raise typer.BadParameter(f"no such file: {', '.join(missing)}", param_hint="IMAGE")
    files = [("files", (path.name, path.read_bytes())) for path in images]
    with _client(url, key) as client:
        answer = _checked(
            client.post("/predict", params={"model": model, "top_k": top_k}, files=files)
        )
    served = answer["model"]
    version = f"/{served['version']}" if served["version"] is not None else ""
    console = Console(width=None if Console().is_terminal else 160)
    console.print(
        f"{served['ref']} -> {served['name'] or 'job'}{version} (job {served['job_id'][:8]}, "
        f"step {served['step']}, sha256 {served['sha256'][:12]}), "
        f"{answer['timing']['total_ms']:.1f} ms"
    )
    for result in answer["results"]:
        console.print(_prediction_table(result))
    if any(result["error"] for result in answer["results"]):
        raise typer.Exit(1)


def _prediction_table(result: dict[str, Any]) -> Table | str:
    """One image's top classes as a table, or its error."""
    if result["error"]:
        return f"[red]{result['file']}: {result['error']['message']}[/]"
    table = Table(title=f"{result['file']} (resize: {result['resize']})")
    for column in ("#", "label", "index", "probability"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for rank, score in enumerate(result["top_k"], start=1):
        table.add_row(str(rank), score["label"], str(score["index"]), f"{score['probability']:.2%}")
    return table
