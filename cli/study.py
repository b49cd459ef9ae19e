"""`study presets|run|show`: the papers' experiments, or any grid of train runs over seeds,
with each cell's errors beside the papers' numbers.

`study run` submits to a running service (--url / --key as the other client commands), or
with --local runs the whole study in this process: a SQLite database in --out, every job
one after another, then results.md, results.csv and figure.png in the same folder.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from cli import figures
from cli.client import Key, Url, connect
from cli.formatting import pairs, percent
from cli.server import embedded_places, open_embedded
from cli.train_options import DatasetFields
from client import Client, ServiceUnreachableError
from client.api import RECONNECTS
from client.models import Study as StudyOut
from client.models import StudyTrials
from client.models import Trial as TrialOut
from client.wire import FINAL_STATUSES
from core.db.session import get_engine, session_scope
from core.db.tables import Job, Study
from core.errors import DomainError
from core.settings import Settings, get_settings
from core.studies import presets, results, search, service
from worker.runner import execute

TWO_PANELS = "degradation"  # the preset drawn as 2015 Fig. 6: plain nets left, residual right
Scale = Literal["quick", "paper"]
PresetName = Annotated[
    str | None,
    typer.Argument(help="A preset (see `study presets`); without one, give --base and --grid."),
]
Interval = Annotated[
    float, typer.Option("--interval", min=0.1, help="Seconds between polls with --watch.")
]


def list_presets(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """The papers' experiments that `study run PRESET` repeats."""
    rows = [preset.described() for preset in presets.PRESETS.values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="study presets")
    for column in ("name", "source", "title", "metric"):
        table.add_column(column, no_wrap=column == "name")
    for row in rows:
        table.add_row(row["name"], row["source"], row["title"], row["metric"])
    _console().print(table)


def run(
    preset: PresetName = None,
    dataset: Annotated[
        str | None, typer.Option(help="With a preset: the dataset, e.g. fashion_mnist.")
    ] = None,
    dataset_option: DatasetFields = None,
    scale: Annotated[Scale, typer.Option(help="With a preset: quick (CPU) or paper.")] = "quick",
    seeds: Annotated[int, typer.Option(min=1, max=1000, help="Seeds 0..N-1 of each cell.")] = 1,
    base: Annotated[
        Path | None,
        typer.Option(exists=True, dir_okay=False, help="Without a preset: a train spec (JSON)."),
    ] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option(help="With --base: AXIS=V1,V2 (repeatable), e.g. model.name=plain8,resnet8."),
    ] = None,
    max_parallel: Annotated[int, typer.Option(min=1, max=1000, help="Jobs run at once.")] = 2,
    method: Annotated[
        Literal["grid", "random", "tpe"],
        typer.Option("--search", help="With --base: random or tpe search a --space instead."),
    ] = "grid",
    space: Annotated[
        list[str] | None,
        typer.Option(
            help="With --search: PATH=loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or "
            "choice:V1,V2 (repeatable), e.g. recipe.lr=loguniform:0.01:0.5."
        ),
    ] = None,
    trials: Annotated[int | None, typer.Option(min=1, help="With --search: the budget.")] = None,
    pruner: Annotated[
        Literal["none", "median", "asha", "hyperband"],
        typer.Option(help="With --search: stop poor trials early at their evaluations."),
    ] = "none",
    objective: Annotated[
        str, typer.Option(help="With --search: the metric minimised.")
    ] = "val/error",
    name: Annotated[str | None, typer.Option(help="A name for the study.")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="A tag (repeatable).")] = None,
    follow: Annotated[bool, typer.Option("--watch", help="Then follow it to its end.")] = False,
    interval: Interval = 5.0,
    local: Annotated[bool, typer.Option("--local", help="Run it here, with no service.")] = False,
    out: Annotated[Path | None, typer.Option(help="With --local: the study's folder.")] = None,
    device: Annotated[str | None, typer.Option(help="With --local: cpu, cuda, cuda:1.")] = None,
    data_root: Annotated[Path | None, typer.Option(help="With --local; default DATA_DIR.")] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Run a study: a preset on a dataset, or --base with --grid, over seeds; or --base with
    --search random|tpe over a --space, --trials of them.

    On the service it prints the study's id and job count; --local --out FOLDER runs it here.
    """
    body = _body(
        preset=preset,
        dataset=dataset,
        dataset_fields=dataset_option,
        scale=scale,
        base_file=base,
        grid=grid,
        common={"seeds": seeds, "name": name, "tags": tag or [], "max_parallel": max_parallel},
        searched=_searched(method, space, trials, pruner, objective),
    )
    if local:
        if out is None:
            raise typer.BadParameter("--local needs a folder for the study", param_hint="--out")
        if follow:
            raise typer.BadParameter("--local shows its progress as it runs", param_hint="--watch")
        _run_local(body, out=out, device=device, data_root=data_root)
        return
    if out or device or data_root:
        raise typer.BadParameter("only with --local", param_hint="--out, --device, --data-root")
    with connect(url, key) as client:
        study = client.submit_study(**body)
        typer.echo(study["id"])
        if "search" in body:
            typer.echo(f"{body['trials']} trials, {study['counts']['total']} started")
        else:
            cells = len(study["cells"])
            typer.echo(f"{study['counts']['total']} jobs: {cells} cells x {seeds} seeds")
        if follow:
            _show(_watch(client, study["id"], interval), exit_unless_succeeded=True)


def show(
    study_id: Annotated[str, typer.Argument(help="The study's id.")],
    markdown: Annotated[bool, typer.Option(help="Print the results as Markdown.")] = False,
    follow: Annotated[bool, typer.Option("--watch", help="First wait until it ends.")] = False,
    interval: Interval = 5.0,
    url: Url = None,
    key: Key = None,
) -> None:
    """A study's results: per cell, errors over seeds beside the papers' number."""
    with connect(url, key) as client:
        study = _watch(client, study_id, interval) if follow else None
        shown = study or client.study(study_id)
        if shown["spec"].get("search"):
            _show_search(shown, client.study_trials(study_id))
        elif markdown:
            typer.echo(client.study_results_markdown(study_id), nl=False)
        else:
            _show(shown)
    if study is not None and study["state"] != "succeeded":
        raise typer.Exit(1)


def _body(
    *,
    preset: str | None,
    dataset: str | None,
    dataset_fields: list[str] | None,
    scale: Scale,
    base_file: Path | None,
    grid: list[str] | None,
    common: dict[str, Any],
    searched: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The study as `POST /studies` takes it: a preset on a dataset, or a base with a grid
    or a search."""
    if (preset is None) == (base_file is None):
        raise typer.BadParameter(
            "give a PRESET, or --base FILE.json with --grid", param_hint="PRESET"
        )
    fields = pairs(dataset_fields, "--dataset-option")
    if preset is not None:
        if grid:
            raise typer.BadParameter("a preset makes its own grid", param_hint="--grid")
        if dataset is None:
            raise typer.BadParameter(
                "a preset runs on a dataset, e.g. fashion_mnist", param_hint="--dataset"
            )
        if searched:
            raise typer.BadParameter("a search takes --base, not a preset", param_hint="--search")
        return {"preset": preset, "dataset": {"name": dataset, **fields}, "scale": scale, **common}
    assert base_file is not None
    spec = _base(base_file)
    if dataset is not None:
        spec["dataset"] = {"name": dataset}
    if fields:
        spec["dataset"] = {**spec.get("dataset", {}), **fields}
    if searched:
        if grid:
            raise typer.BadParameter("a search takes a --space, not a grid", param_hint="--grid")
        return {"base": spec, "grid": {}, **common, **searched}
    return {"base": spec, "grid": _grid(grid or []), **common}


def _searched(
    method: str, space: list[str] | None, trials: int | None, pruner: str, objective: str
) -> dict[str, Any] | None:
    """A search's fields of `POST /studies`, or None for a grid (and no search option)."""
    if method == "grid":
        if space or trials is not None or pruner != "none":
            raise typer.BadParameter(
                "--space, --trials and --pruner need --search random or tpe", param_hint="--search"
            )
        return None
    if not space or trials is None:
        raise typer.BadParameter(
            f"--search {method} needs --space and --trials", param_hint="--space"
        )
    parsed = dict(_parameter(item) for item in space)
    return {
        "search": method,
        "space": parsed,
        "trials": trials,
        "pruner": pruner,
        "objective": objective,
    }


def _parameter(item: str) -> tuple[str, dict[str, Any]]:
    """`PATH=TYPE:...` to a space's parameter: loguniform:LOW:HIGH, uniform:LOW:HIGH,
    int:LOW:HIGH[:STEP] or choice:V1,V2 (each value JSON when it parses, else text)."""
    path, sep, rest = item.partition("=")
    kind, _, args = rest.partition(":")
    hint = "--space"
    if not sep or not path or not args:
        raise typer.BadParameter(f"expected PATH=TYPE:..., got {item!r}", param_hint=hint)
    if kind == "choice":
        return path, {"type": "choice", "values": list(_grid([f"{path}={args}"])[path])}
    bounds = args.split(":")
    try:
        numbers = [json.loads(bound) for bound in bounds]
    except json.JSONDecodeError:
        raise typer.BadParameter(f"{item!r}: bounds must be numbers", param_hint=hint) from None
    if kind in ("uniform", "loguniform") and len(numbers) == 2:
        return path, {"type": kind, "low": numbers[0], "high": numbers[1]}
    if kind == "int" and len(numbers) in (2, 3):
        step = {"step": numbers[2]} if len(numbers) == 3 else {}
        return path, {"type": "int", "low": numbers[0], "high": numbers[1], **step}
    raise typer.BadParameter(
        f"{item!r}: expected loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH[:STEP] or "
        "choice:V1,V2",
        param_hint=hint,
    )


def _base(path: Path) -> dict[str, Any]:
    """The --base file: a train spec's model, dataset and recipe, as a JSON object."""
    try:
        spec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise typer.BadParameter(f"{path}: {error}", param_hint="--base") from error
    if not isinstance(spec, dict) or not isinstance(spec.get("dataset", {}), dict):
        raise typer.BadParameter(f"{path}: expected a train spec object", param_hint="--base")
    return spec


def _grid(items: list[str]) -> dict[str, list[Any]]:
    """`AXIS=V1,V2` items to a grid; each value is read as JSON when it parses, else as text,
    and a value that is a whole JSON list (`recipe.milestones=[[0.5,0.75],[0.3,0.6]]`) is
    taken as the list of values."""
    if not items:
        raise typer.BadParameter("--base needs at least one AXIS=V1,V2", param_hint="--grid")
    found: dict[str, list[Any]] = {}
    for item in items:
        axis, sep, raw = item.partition("=")
        if not sep or not axis or not raw:
            raise typer.BadParameter(f"expected AXIS=V1,V2, got {item!r}", param_hint="--grid")
        if axis in found:
            raise typer.BadParameter(f"axis {axis!r} is given twice", param_hint="--grid")
        whole = _json_or_text(raw)
        found[axis] = (
            whole if isinstance(whole, list) else [_json_or_text(v) for v in raw.split(",")]
        )
    return found


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _watch(client: Client, study_id: str, interval: float) -> StudyOut:
    """Poll the study until every job ended, with a bar of jobs done; its last state."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    try:
        with Progress(*columns, TimeElapsedColumn()) as progress:
            task = progress.add_task(f"study {study_id[:8]}", total=None)
            while True:
                study = _fetch(client, study_id, progress, interval)
                counts = study["counts"]
                line = f"{study_id[:8]} {study['state']}: {counts['running']} running"
                line += f", {counts['failed']} failed" if counts["failed"] else ""
                progress.update(task, description=line, completed=counts["done"])
                progress.update(task, total=counts["total"])
                if study["state"] in FINAL_STATUSES:  # a study's states once every job ended
                    # Read once more: the answer that saw the last job end may hold results
                    # read a moment before it; once every job ended nothing changes.
                    return _fetch(client, study_id, progress, interval)
                time.sleep(interval)
    except KeyboardInterrupt:
        typer.echo(f"study {study_id} goes on; `study show {study_id}` to see it", err=True)
        raise typer.Exit(130) from None


def _fetch(client: Client, study_id: str, progress: Progress, interval: float) -> StudyOut:
    """The study as the service has it; an unreachable service is tried again a few times."""
    failures = 0
    while True:
        try:
            return client.study(study_id)
        except ServiceUnreachableError as error:
            failures += 1
            if failures > RECONNECTS:
                typer.echo(f"error: {error}", err=True)
                raise typer.Exit(1) from error
            progress.console.print(f"[yellow]service unreachable ({error.reason}); retrying[/]")
            time.sleep(interval)


def _show(study: StudyOut, *, exit_unless_succeeded: bool = False) -> None:
    """Print a study's results table, its source and note."""
    counts = study["counts"]
    title = f"{study['name'] or 'study'} {study['id'][:8]}: {study['state']}, "
    title += f"{counts['done']}/{counts['total']} jobs ended"
    table = _results_table(title, list(study["spec"]["grid"]), study["cells"], study["metric"])
    _print_results(table, study["source"], study["note"])
    _print_claims(study.get("claims", []))
    if exit_unless_succeeded and study["state"] != "succeeded":
        raise typer.Exit(1)


def _results_table(
    title: str, axes: list[str], cells: Sequence[Mapping[str, Any]], metric: str
) -> Table:
    """Per cell: its axis values, seeds done, errors in % as median (min-max) over seeds,
    and where the papers give one, their number (of `metric`) and our median's difference."""
    papers = any(cell["paper"] is not None for cell in cells)
    caption = "errors in %, median (min-max) over seeds"
    table = Table(title=title, caption=caption + (f"; paper: {metric}" if papers else ""))
    for column in (*axes, "seeds", "final train", "final test", "best test"):
        table.add_column(column, justify="left" if column in axes else "right")
    if papers:
        table.add_column("paper", justify="right")
        table.add_column("ours-paper", justify="right")
    for cell in cells:
        lost = cell["failed"] + cell["cancelled"]
        seeds = f"{len(cell['seeds_done'])}/{cell['jobs']}" + (f" ({lost} lost)" if lost else "")
        row = [
            *(results.cell_label({axis: cell["values"][axis]}) for axis in axes),
            seeds,
            *(_spread(cell[error]) for error in results.ERRORS),
        ]
        if papers:
            difference = cell["difference"]
            row += [
                _number(cell["paper"]),
                "-" if difference is None else f"{100 * difference:+.2f}",
            ]
        table.add_row(*row)
    return table


def _spread(found: dict[str, float | None]) -> str:
    """median (min-max) in %, '-' before any seed finished."""
    low, high = found["min"], found["max"]
    if found["median"] is None or low is None or high is None:
        return "-"
    spread = f" ({_number(low)}-{_number(high)})" if low != high else ""
    return _number(found["median"]) + spread


def _number(fraction: float | None) -> str:
    return percent(fraction).removesuffix("%")


def _console() -> Console:
    return Console(width=None if Console().is_terminal else 160)


def _run_local(
    body: dict[str, Any], *, out: Path, device: str | None, data_root: Path | None
) -> None:
    """The whole study here: a SQLite database in `out`, its jobs one after another, then its
    results and figure beside it."""
    # Its broker is never used: every job is released at once below, so none waits on it.
    places: dict[str, Any] = embedded_places(out.resolve(), "study.db")
    settings = Settings(**places, data_dir=data_root or get_settings().data_dir, device=device)
    open_embedded(out, settings)
    with session_scope(settings.database_url) as session:
        if session.scalar(select(func.count()).select_from(Study)):
            raise typer.BadParameter(
                f"{out} already holds a study; give a new folder", param_hint="--out"
            )
    try:
        study, job_ids = _create(settings, body)
    except DomainError as error:
        typer.echo(f"error: {error.message}", err=True)
        raise typer.Exit(2) from error
    typer.echo(f"study {study.id}: {len(job_ids)} jobs, one at a time, in {out}")
    try:
        while job_ids:  # a search asks for its next trial as each ends
            _run_jobs(settings, job_ids, study_name=study.name)
            job_ids = _queued(settings, study.id)
        _write_results(settings, study.id, out)
    finally:
        # Closing the last connection folds the WAL into study.db.
        get_engine(settings.database_url).dispose()


def _create(settings: Settings, body: dict[str, Any]) -> tuple[Study, list[uuid.UUID]]:
    """Create the study with every job released; it and its jobs in order, seed by seed."""
    seeds = list(range(body["seeds"]))
    if "preset" in body:
        request = service.from_preset(
            body["preset"],
            dataset=body["dataset"],
            scale=body["scale"],
            seeds=seeds,
            max_parallel=1,
            title=body["name"],
            tags=tuple(body["tags"]),
        )
    else:
        request = service.Request(
            base=body["base"],
            grid=body["grid"],
            seeds=seeds,
            name=body["name"],
            tags=tuple(body["tags"]),
            search=_search_of(body),
        )
    # A grid's every job at once; a search's trials one by one, each sampled once the
    # previous ended (its sampler learns from them).
    at_once = 1 if request.search is not None else settings.max_study_jobs
    everything = dataclasses.replace(request, max_parallel=at_once)
    with session_scope(settings.database_url) as session:
        study = service.create(
            session=session,
            settings=settings,
            request=everything,
            max_jobs=settings.max_study_jobs,
            max_attempts=settings.max_attempts,
        )
        job_ids = service.release(session=session, settings=settings, study_id=study.id)
        study.max_parallel = 1  # what happens here: one job at a time
    return study, job_ids


def _run_jobs(settings: Settings, job_ids: list[uuid.UUID], *, study_name: str | None) -> None:
    """Run each job in this process, with a bar of jobs and one of the current job's steps."""
    prefix = f"{study_name}: " if study_name else ""  # each job's name repeats the study's
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn()) as progress:
        jobs_bar = progress.add_task("jobs", total=len(job_ids))
        steps_bar = progress.add_task("", total=None)
        for job_id in job_ids:
            label = (_job(settings, job_id).name or str(job_id)).removeprefix(prefix)
            progress.reset(steps_bar, description=f"  {label}", total=None)
            with _steps_shown(settings, job_id, progress, steps_bar):
                execute(job_id, settings=settings, worker="local")
            job = _job(settings, job_id)
            outcome = f"final test error {percent(job.final_test_error)}"
            progress.console.print(f"{label}: {job.status}, {job.error or outcome}")
            progress.advance(jobs_bar)
        progress.remove_task(steps_bar)


def _search_of(body: dict[str, Any]) -> search.Search | None:
    """The search a local study's body asks for, or None for a grid."""
    if "search" not in body:
        return None
    fields = ("space", "trials", "pruner", "objective")
    return search.Search(method=body["search"], **{name: body[name] for name in fields})


def _queued(settings: Settings, study_id: uuid.UUID) -> list[uuid.UUID]:
    """The study's queued jobs, in cell order (a search's next trial)."""
    with session_scope(settings.database_url) as session:
        query = select(Job.id).where(Job.study_id == study_id, Job.status == "queued")
        return list(session.scalars(query.order_by(Job.cell)))


def extend(
    study_id: Annotated[str, typer.Argument(help="The study's id.")],
    seeds: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Seeds to add to every cell.")
    ] = None,
    cell_seeds: Annotated[
        list[str] | None,
        typer.Option("--cell-seeds", help="CELL=N: seeds to add to one cell (repeatable)."),
    ] = None,
    trials: Annotated[int | None, typer.Option(min=1, help="Trials to add to a search.")] = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Add seeds to every cell (--seeds) or chosen cells (--cell-seeds), or trials to a search
    (--trials); the new jobs join the study's results."""
    chosen = pairs(cell_seeds, "--cell-seeds")
    if sum(bool(given) for given in (seeds, chosen, trials)) != 1:
        raise typer.BadParameter("give one of --seeds, --cell-seeds and --trials")
    if not all(key.isdigit() and isinstance(n, int) for key, n in chosen.items()):
        raise typer.BadParameter("expected CELL=N, e.g. 3=4", param_hint="--cell-seeds")
    add_seeds = {int(cell): count for cell, count in chosen.items()} if chosen else seeds
    with connect(url, key) as client:
        study = client.extend_study(study_id, add_seeds=add_seeds, add_trials=trials)
    counts = study["counts"]
    typer.echo(f"{study['id']}: {counts['total']} jobs, {counts['done']} done")


def _job(settings: Settings, job_id: uuid.UUID) -> Job:
    with session_scope(settings.database_url) as session:
        job = session.get(Job, job_id)
        assert job is not None, "the study's job exists"
        return job


@contextmanager
def _steps_shown(
    settings: Settings, job_id: uuid.UUID, progress: Progress, bar: TaskID
) -> Iterator[None]:
    """While the block runs, show the job's steps as its heartbeats record them."""
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(1.0):
            try:
                job = _job(settings, job_id)
            except SQLAlchemyError:
                continue  # the database is busy; the next poll will do
            progress.update(bar, completed=job.step, total=job.total_steps)

    thread = threading.Thread(target=poll, name=f"steps-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _write_results(settings: Settings, study_id: uuid.UUID, out: Path) -> None:
    """results.md, results.csv and figure.png in `out`, and the table on the terminal;
    exit 1 when no job succeeded."""
    with session_scope(settings.database_url) as session:
        study = session.get(Study, study_id)
        assert study is not None, "the study exists"
        cells = results.cells(session=session, study=study)
        train = results.curves(session=session, study=study, metric="train/error")
        test = results.curves(session=session, study=study, metric="test/error")
        ended = service.state(study, service.counts(session=session, study_id=study_id))
    preset = presets.PRESETS.get(study.preset) if study.preset else None
    title = (
        study.name or f"{' x '.join(results.axes_of(study))} over {len(study.spec['seeds'])} seeds"
    )
    source, note = (preset.source, preset.note) if preset else ("", "")
    sections = [f"# {title}", source, results.as_markdown(study, cells).rstrip(), note]
    (out / "results.md").write_text("\n\n".join(part for part in sections if part) + "\n")
    (out / "results.csv").write_text(results.as_csv(study, cells))
    figure = figures.png(train, test, title=title, plain_and_residual=study.preset == TWO_PANELS)
    (out / "figure.png").write_bytes(figure)
    _print_results(_results_table(title, results.axes_of(study), cells, study.metric), source, note)
    _print_claims(results.claims(study, cells))
    typer.echo(f"wrote {out / 'results.md'}, results.csv and figure.png")
    if ended != "succeeded":
        raise typer.Exit(1)


def _print_results(table: Table, source: str | None, note: str | None) -> None:
    """A results table with the papers' source and the preset's note under it."""
    console = _console()
    console.print(table)
    for label, text in (("source", source), ("note", note)):
        if text:
            console.print(f"{label}: {text}")


def _print_claims(claims: Sequence[Mapping[str, Any]]) -> None:
    """The preset's claims: each ordering, its verdict, Holm-adjusted p, effect, seeds, and
    for an open one the seeds that would settle it."""
    if not claims:
        return
    table = Table(title="the papers' claims", caption=f"p: one-sided {claims[0]['test']}, Holm")
    for column in ("claim", "verdict", "p", "effect", "n", "advice"):
        table.add_column(column, justify="right" if column in ("p", "effect") else "left")
    for claim in claims:
        p, effect = claim["p"], claim["effect"]
        table.add_row(
            claim["claim"],
            claim["verdict"],
            "-" if p is None else f"{p:.3g}",
            "-" if effect is None else f"{effect:+.2f}",
            "{}, {}".format(*claim["n"]),
            claim["advice"] or "",
        )
    _console().print(table)


# A search study: its best trial, its top trials, importances and job-seconds by status.

TOP_TRIALS = 10


def _show_search(study: StudyOut, found: StudyTrials) -> None:
    """Print a search's best trial, its top completed trials, the parameters' importances
    and the job-seconds its trials took by status."""
    console = _console()
    search = study["spec"]["search"]
    counts = study["counts"]
    console.print(
        f"{study['name'] or 'search'} {study['id'][:8]}: {study['state']}, "
        f"{counts['done']}/{counts['total']} trials ended; {found['method']} search, "
        f"pruner {search.get('pruner', 'none')}, {found['direction']} {found['objective']}"
    )
    best = found["best"]
    if best is None:
        console.print("best trial: none completed yet")
    else:
        params = ", ".join(f"{path}={_param(value)}" for path, value in best["params"].items())
        console.print(
            f"best trial {best['trial']}: {found['objective']} {_value(best['value'])} ({params})"
        )
    console.print(_top_trials(found, list(search["space"])))
    if found["importances"]:
        console.print(_importances(found["importances"]))
    console.print(_job_seconds(found))


def _top_trials(found: StudyTrials, paths: list[str]) -> Table:
    """The best completed trials, best first, with their parameters and cost."""
    done = [trial for trial in found["trials"] if trial["status"] == "succeeded"]
    done = [trial for trial in done if trial["value"] is not None]
    done.sort(key=_objective, reverse=found["direction"] == "maximize")
    table = Table(title=f"top trials by {found['objective']}")
    for column in ("trial", *paths, found["objective"], "best", "steps", "job-s"):
        table.add_column(column, justify="left" if column in paths else "right")
    for trial in done[:TOP_TRIALS]:
        table.add_row(
            str(trial["trial"]),
            *(_param(trial["params"].get(path)) for path in paths),
            _value(trial["value"]),
            _value(trial["best_value"]),
            str(trial["steps"]),
            f"{trial['job_seconds']:.0f}",
        )
    return table


def _objective(trial: TrialOut) -> float:
    value = trial["value"]
    assert value is not None  # only completed trials are sorted
    return value


def _importances(importances: dict[str, float]) -> Table:
    """Each parameter's importance, most important first, with a bar."""
    table = Table(title="parameter importances (fANOVA)")
    table.add_column("parameter")
    table.add_column("importance", justify="right")
    table.add_column("")
    for path, share in sorted(importances.items(), key=lambda item: -item[1]):
        table.add_row(path, f"{share:.3f}", "█" * round(20 * share))
    return table


def _job_seconds(found: StudyTrials) -> str:
    """Job-seconds in all and by status, and what pruning saved."""
    spent = found["job_seconds"]
    parts = ", ".join(f"{status} {seconds:.0f}" for status, seconds in spent["by_status"].items())
    line = f"job-seconds: {spent['total']:.0f} in all ({parts})"
    if spent["saved_by_pruning"]:
        line += f"; pruning saved about {spent['saved_by_pruning']:.0f}"
    return line


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else results.cell_label({"": value})
