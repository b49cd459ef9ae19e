"""The client of a running service: `submit`, `jobs`, `edit`, `watch`, `cancel`, `retry`,
`delete`, `register`, `download`, `workers`, `predict`, `predict-batch`, `export` and
`import`, over HTTP.

The service's address and API key come from --url / --key, else RESNET_URL / RESNET_KEY.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli.formatting import pairs, percent
from cli.train_options import (
    DatasetFields,
    DatasetName,
    Epochs,
    Init,
    InitFields,
    Iterations,
    ModelName,
    ModelOptions,
    RecipeFields,
    train_spec,
)
from client import ApiError, Client, ClientError, ServiceUnreachableError
from client.api import RECONNECTS
from client.filters import JobFilter
from client.models import ImagePrediction
from client.wire import ExportFormat
from core.settings import get_settings

Url = Annotated[
    str | None, typer.Option("--url", help="The service; default: RESNET_URL or 127.0.0.1:8000.")
]
Key = Annotated[str | None, typer.Option("--key", help="API key; default: RESNET_KEY.")]


@contextmanager
def connect(url: str | None, key: str | None) -> Iterator[Client]:
    """The service's client; a refusal is printed and exits 2 (invalid, 422) or 1."""
    settings = get_settings()  # RESNET_URL and RESNET_KEY, from the environment or .env
    try:
        with Client(url or settings.client_url, key or settings.client_key) as client:
            yield client
    except ApiError as error:
        typer.echo(f"error: {error.message}", err=True)
        for detail in error.details[1:]:
            where = ".".join(str(part) for part in detail["loc"][1:])
            typer.echo(f"error: {where}: {detail['msg']}", err=True)
        raise typer.Exit(2 if error.status == 422 else 1) from None
    except ClientError as error:  # unreachable, a download that did not verify, ...
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None


def submit(
    model: ModelName = "resnet20",
    dataset: DatasetName = "digits",
    epochs: Epochs = None,
    iterations: Iterations = None,
    option: ModelOptions = None,
    dataset_option: DatasetFields = None,
    recipe: RecipeFields = None,
    init: Init = None,
    init_option: InitFields = None,
    name: Annotated[str | None, typer.Option(help="A name for the runs table.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    device: Annotated[
        str | None, typer.Option(help="What it runs on: cpu, gpu, any (default: by its size).")
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs it needs (with --device gpu).")] = None,
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
                init=init,
                init_fields=init_option,
            ),
        }
    )
    asked = {"device": device, "gpus": gpus}
    if any(value is not None for value in asked.values()):
        # The service fills in what is left out, by the job's size.
        payload["resources"] = {k: v for k, v in asked.items() if v is not None}
    with connect(url, key) as client:
        job = client.submit(payload)
    typer.echo(job["id"])
    if follow:
        watch(job["id"], url=url, key=key)


def list_jobs(
    status: Annotated[list[str] | None, typer.Option(help="queued, running, ... (repeat).")] = None,
    model: Annotated[str | None, typer.Option(help="Only this zoo name.")] = None,
    dataset: Annotated[str | None, typer.Option(help="Only this dataset.")] = None,
    tag: Annotated[
        list[str] | None, typer.Option(help="Only jobs with this tag (repeat: all).")
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--filter",
            help="`path op value` (repeat: all hold), e.g. best_test_error<0.08, "
            "model.options.unit=full_preact, summary.best_train_error<0.05.",
        ),
    ] = None,
    sort: Annotated[
        str,
        typer.Option(help="created, finished, a summary column, summary.<key>, recipe.lr; - desc."),
    ] = "-created",
    data_digest: Annotated[
        str | None,
        typer.Option(help="Only jobs that read this data: its digest, or its first 8+ hex digits."),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="Every match as CSV on stdout (no limit).")
    ] = False,
    columns: Annotated[
        list[str] | None,
        typer.Option("--column", help="With --csv: a spec or summary path to add."),
    ] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """The service's jobs as a table, newest first (or as CSV with --csv)."""
    digest = [f"data_digest={data_digest}"] if data_digest else []
    search = JobFilter.asked(
        {"status": status, "model": model, "dataset": dataset, "tag": tag, "sort": sort}
        | {"filter": [*(where or []), *digest]}
    )
    with connect(url, key) as client:
        if as_csv:
            typer.echo(client.jobs_csv(search, columns=columns or []), nl=False)
            return
        page = client.jobs_page(search, limit=limit)
    table = Table(title=f"jobs ({sort})")
    for column in (
        "id",
        "name",
        "kind",
        "model",
        "dataset",
        "data",
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
            (job.get("data_digest") or "").removeprefix("sha256:")[:12],
            job["status"],
            f"{progress['step']:,}/{progress['total_steps'] or '?'}",
            percent(job["results"]["best_test_error"]),
            job["created_at"][:19].replace("T", " "),
        )
    Console(width=None if Console().is_terminal else 160).print(table)


def edit(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    tag: Annotated[
        list[str] | None, typer.Option(help="Its tags become these (repeat); see --no-tags.")
    ] = None,
    no_tags: Annotated[bool, typer.Option("--no-tags", help="Remove every tag.")] = False,
    note: Annotated[str | None, typer.Option(help='Its note ("" clears it).')] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Change a job's tags or note (your own jobs, or any with an admin key)."""
    if tag is None and not no_tags and note is None:
        raise typer.BadParameter("nothing to change: give --tag, --no-tags or --note")
    tags = [] if no_tags else tag
    with connect(url, key) as client:
        job = client.update(job_id, tags=tags, note=note)
    typer.echo(f"{job['id']} tags: {', '.join(job['tags']) or '-'}")
    typer.echo(f"note: {job.get('note') or '-'}")


class _Watch:
    """A job's progress bar and log, drawn from its event stream."""

    def __init__(self, job_id: str, progress: Progress) -> None:
        self.job_id = job_id
        self.progress = progress
        self.task = progress.add_task(job_id[:8], total=None)
        self.latest: dict[str, float] = {}

    def show(self, event: str, data: dict[str, Any]) -> str | None:
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


def watch(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: Url = None,
    key: Key = None,
) -> None:
    """Follow a job live until it ends; exits 1 unless it succeeded."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    status = None
    with connect(url, key) as client, Progress(*columns, TimeElapsedColumn()) as progress:
        watching = _Watch(job_id, progress)

        def dropped(error: ServiceUnreachableError) -> None:
            progress.console.print(f"[yellow]stream dropped ({error.reason}); reconnecting[/]")

        try:
            for event in client.events(job_id, reconnects=RECONNECTS, on_drop=dropped):
                status = watching.show(event.name, event.data) or status
        except ServiceUnreachableError:
            status = None
    typer.echo(f"job {job_id} {status or 'still running: the stream kept dropping'}")
    if status != "succeeded":
        raise typer.Exit(1)


JobIds = Annotated[list[str], typer.Argument(help="The jobs' ids.", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead.")]


def _each(
    client: Client, job_ids: list[str], act: Callable[[Client, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`act` on each job in turn; a refused one is told and the rest still go. Each job's
    outcome: what `act` said, or the refusal's `error`."""
    outcomes = []
    for job_id in job_ids:
        try:
            outcomes.append({"id": job_id, **act(client, job_id)})
        except ApiError as error:
            outcomes.append({"id": job_id, "error": error.message, "status_code": error.status})
    return outcomes


def _told(
    outcomes: list[dict[str, Any]], as_json: bool, said: Callable[[dict[str, Any]], str]
) -> None:
    """Print each job's outcome (`said` words a done one); exit 1 if any was refused."""
    if as_json:
        typer.echo(json.dumps(outcomes, indent=2))
    for outcome in outcomes:
        if "error" in outcome:
            typer.echo(f"{outcome['id']} refused: {outcome['error']}", err=True)
        elif not as_json:
            typer.echo(f"{outcome['id']} {said(outcome)}")
    if any("error" in outcome for outcome in outcomes):
        raise typer.Exit(1)


def _cancelled(client: Client, job_id: str) -> dict[str, Any]:
    job = client.cancel(job_id)
    return {"status": job["status"], "cancel_requested": job["cancel_requested"]}


def cancel(job_ids: JobIds, as_json: AsJson = False, url: Url = None, key: Key = None) -> None:
    """Cancel jobs: a queued one now, a running one at its worker's next check (seconds);
    exits 1 if any was refused."""
    with connect(url, key) as client:
        outcomes = _each(client, job_ids, _cancelled)
    _told(
        outcomes,
        as_json,
        lambda done: (
            "cancelled"
            if done["status"] == "cancelled"
            else f"cancel requested: it is {done['status']} and stops within seconds"
        ),
    )


def retry(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Queue a failed, cancelled or pruned job again, from its last verified checkpoint."""
    with connect(url, key) as client:
        retried = client.retry(job_id)
    if as_json:
        typer.echo(json.dumps(retried, indent=2))
        return
    typer.echo(f"{retried['job']['id']} {retried['job']['status']}: {retried['message']}")


def _deleted(client: Client, job_id: str) -> dict[str, Any]:
    client.delete(job_id)
    return {"deleted": True}


def delete(
    job_ids: JobIds,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Delete jobs that are not running, with their metrics, events and files (asks first,
    unless --yes); exits 1 if any was refused."""
    if not yes:
        count = f"{len(job_ids)} jobs" if len(job_ids) > 1 else f"job {job_ids[0]}"
        typer.confirm(f"Delete {count}, metrics, events and files too?", abort=True)
    with connect(url, key) as client:
        outcomes = _each(client, job_ids, _deleted)
    _told(outcomes, as_json, lambda _: "deleted")


def register(
    job_id: Annotated[str, typer.Argument(help="A succeeded train job's id.")],
    name: Annotated[str, typer.Argument(help="The registered model it becomes a version of.")],
    checkpoint: Annotated[
        Literal["best", "last"], typer.Option(help="Which of the job's checkpoints.")
    ] = "best",
    as_json: AsJson = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Register a succeeded train job's checkpoint as the next version of a model (made on
    first use); prints name/version."""
    with connect(url, key) as client:
        version = client.register(name, job_id, checkpoint=checkpoint)
    if as_json:
        typer.echo(json.dumps(version, indent=2))
        return
    typer.echo(
        f"{name}/{version['version']}: job {version['job_id']} {version['checkpoint']} "
        f"checkpoint (step {version['step']}, test error {percent(version['test_error'])}), "
        f"sha256 {version['sha256']}"
    )


def download(
    ref: Annotated[
        str,
        typer.Argument(help="A job id, or a registered version: name/VERSION, name@ALIAS, name."),
    ],
    checkpoint: Annotated[
        str, typer.Option(help="A job's best, last or a step number (a version has one).")
    ] = "best",
    fmt: Annotated[
        ExportFormat | None,
        typer.Option("--export", help="A version's export instead: onnx, torchscript, ..."),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="This file, or into this folder.")
    ] = Path("."),
    force: Annotated[bool, typer.Option(help="Overwrite a file already there.")] = False,
    url: Url = None,
    key: Key = None,
) -> None:
    """Download a checkpoint (a job's or a registered version's) or a version's export,
    streamed to a file and checked against the service's sha256."""
    if checkpoint not in ("best", "last") and not checkpoint.isdigit():
        raise typer.BadParameter(
            f"best, last or a step number, not {checkpoint!r}", param_hint="--checkpoint"
        )
    with connect(url, key) as client:
        if fmt is not None:
            saved = client.download_export(ref, fmt, to=out, overwrite=force)
        else:
            saved = client.download_checkpoint(ref, which=checkpoint, to=out, overwrite=force)
    typer.echo(f"saved {saved} ({saved.stat().st_size:,} bytes, sha256 checked)")


def workers(as_json: AsJson = False, url: Url = None, key: Key = None) -> None:
    """The service's workers: devices, queues, state, current job, last seen."""
    with connect(url, key) as client:
        seen = client.workers()
    if as_json:
        typer.echo(json.dumps(seen, indent=2))
        return
    table = Table(title=f"workers ({len(seen)})")
    for column in ("name", "device", "queues", "state", "job", "done", "last seen"):
        table.add_column(column, no_wrap=column in ("name", "last seen"))
    for worker in seen:
        table.add_row(
            worker["name"],
            ", ".join(worker["devices"]),
            ", ".join(worker["queues"]),
            worker["state"] if worker["state"] == "alive" else f"[red]{worker['state']}[/]",
            (worker["current_job"] or "-")[:8],
            str(worker["jobs_done"]),
            worker["last_seen_at"][:19].replace("T", " "),
        )
    Console(width=None if Console().is_terminal else 160).print(table)


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
    with connect(url, key) as client:
        answer = client.predict(list(images), model, top_k=top_k)
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


def _prediction_table(result: ImagePrediction) -> Table | str:
    """One image's top classes as a table, or its error."""
    if result["error"]:
        return f"[red]{result['file']}: {result['error']['message']}[/]"
    table = Table(title=f"{result['file']} (resize: {result['resize']})")
    for column in ("#", "label", "index", "probability"):
        table.add_column(column, justify="left" if column == "label" else "right")
    for rank, score in enumerate(result["top_k"], start=1):
        table.add_row(str(rank), score["label"], str(score["index"]), f"{score['probability']:.2%}")
    return table


def predict_batch(
    model: Annotated[
        str, typer.Argument(help="A train job id, a registered name, name/VERSION or name@ALIAS.")
    ],
    dataset: DatasetName = "digits",
    split: Annotated[str, typer.Option(help="The split to predict: train, val or test.")] = "test",
    dataset_option: DatasetFields = None,
    top_k: Annotated[int, typer.Option("--top-k", min=1, max=100)] = 5,
    batch_size: Annotated[int, typer.Option(min=1, max=512, help="Images per pass.")] = 256,
    file_format: Annotated[
        str, typer.Option("--format", help="csv, jsonl (every probability) or both.")
    ] = "csv",
    device: Annotated[
        str | None, typer.Option(help="What it runs on: cpu, gpu or any (default).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Wait for the job, then download its files here.")
    ] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Submit a predict job over every image of a dataset split; prints its id (with --out,
    waits and downloads its predictions and confusion matrix)."""
    payload: dict[str, Any] = {
        "kind": "predict",
        "model": model,
        "dataset": {"name": dataset, "split": split, **pairs(dataset_option, "--dataset-option")},
        "top_k": top_k,
        "batch_size": batch_size,
        "format": file_format,
    }
    if device is not None:
        payload["resources"] = {"device": device}
    with connect(url, key) as client:
        job_id = client.submit(payload)["id"]
        typer.echo(job_id)
        if out is None:
            return
        finished = client.wait(job_id)
        if finished["status"] != "succeeded":
            typer.echo(f"job {job_id} {finished['status']}: {finished['error'] or ''}", err=True)
            raise typer.Exit(1)
        out.mkdir(parents=True, exist_ok=True)
        for artifact in client.artifacts(job_id):
            saved = client.download_artifact(job_id, artifact["name"], to=out)
            typer.echo(f"{saved} {artifact['bytes']:,} bytes sha256 {artifact['sha256'][:12]}")
    summary = finished["summary"] or {}
    typer.echo(
        f"{summary.get('images', 0):,} images; error {percent(summary.get('error'))}, "
        f"top-{summary.get('top_k')} error {percent(summary.get('top_k_error'))}"
    )


def export(
    ref: Annotated[
        str, typer.Argument(help="A registered version: name/VERSION, name@ALIAS or name.")
    ],
    fmt: Annotated[
        ExportFormat, typer.Option("--format", help="onnx, torchscript or torch_export.")
    ] = "onnx",
    out: Annotated[
        Path | None, typer.Option("--out", help="Download it too, to this file or folder.")
    ] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Export a registered version: the service writes its served net (softmax included),
    checks it against the eager net's probabilities and stores it (or has it already)."""
    with connect(url, key) as client:
        made = client.export(ref, fmt)
        saved = client.download_export(ref, fmt, to=out) if out is not None else None
    typer.echo(
        f"{made['model']}/{made['version']} {made['format']}: {made['bytes']:,} bytes, "
        f"sha256 {made['sha256']}, max |p_export - p_eager| {made['max_abs_diff']:.2g} "
        f"(bound {made['tolerance']:g})"
    )
    if saved is not None:
        typer.echo(f"saved {saved}")


def import_weights(
    file: Annotated[
        Path | None, typer.Argument(help="A torchvision .pth, an akamaster .th or safetensors.")
    ] = None,
    name: Annotated[str, typer.Option(help="The registered model it becomes a version of.")] = "",
    architecture: Annotated[
        str | None, typer.Option(help="The zoo's net: resnet18..152, resnet20..1202.")
    ] = None,
    option: ModelOptions = None,
    classes: Annotated[
        Path | None, typer.Option(help="A file of class names, one a line (default: by net).")
    ] = None,
    preprocessing: Annotated[
        str | None, typer.Option(help='JSON, e.g. {"resize": 256, "crop": 224}.')
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="auto, torchvision, akamaster or safetensors.")
    ] = "auto",
    weights: Annotated[
        str | None, typer.Option(help="torchvision weights by name (the service downloads).")
    ] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Import weights made elsewhere as the next version of a registered model: read without
    unpickling code, loaded into the zoo's net strictly, checked against torchvision's."""
    if not name:
        raise typer.BadParameter("a model name is needed", param_hint="--name")
    if (file is None) == (weights is None):
        raise typer.BadParameter("give a FILE or --weights, one of them", param_hint="FILE")
    if file is not None and not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    names = [line.strip() for line in classes.read_text().splitlines()] if classes else None
    with connect(url, key) as client:
        version = client.import_weights(
            name,
            file,
            architecture=architecture,
            options=pairs(option, "--option"),
            classes=[line for line in names if line] if names is not None else None,
            preprocessing=json.loads(preprocessing) if preprocessing else None,
            format=fmt,
            weights=weights,
        )
    facts: dict[str, Any] = dict(version.get("imported") or {})
    checked = (
        f", torchvision's outputs within {facts['max_abs_diff']:.2g}"
        if facts.get("checked_against")
        else ""
    )
    typer.echo(
        f"{name}/{version['version']}: {version['model']} from {facts.get('file_name')} "
        f"({facts.get('format')}, {facts.get('keys')} keys{checked}), sha256 {version['sha256']}"
    )
