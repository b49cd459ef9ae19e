"""`Client`: the service's /api/v1 over HTTP (httpx), with typed answers and errors.

    with Client("http://127.0.0.1:8000", key="rs_...") as service:
        job = service.submit({"kind": "train", "model": {"name": "resnet20"}, ...})
        finished = service.wait(job["id"], timeout=600)

Without `url` / `key` the client takes them from the environment, as the command line
does: RESNET_URL (default http://127.0.0.1:8000) and RESNET_KEY.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypedDict, Unpack, cast
from uuid import UUID

import httpx
from pydantic import BaseModel

from client.errors import ClientError, ServiceUnreachableError, raise_for
from client.filters import JobFilter
from client.models import (
    Alias,
    Artifact,
    CellResult,
    Checkpoint,
    Drift,
    Event,
    Explanation,
    Export,
    Health,
    HistoryEntry,
    Job,
    JobItem,
    JobPage,
    Kind,
    MetricPoint,
    Metrics,
    PayloadPage,
    PayloadSegment,
    Point,
    Prediction,
    Preset,
    Ready,
    RegisteredModel,
    RegistryPage,
    Retried,
    Session,
    ShadowComparison,
    Study,
    StudyComparisons,
    StudyExtend,
    StudyItem,
    StudyPlan,
    StudyPreview,
    StudyTrials,
    Version,
    Worker,
)
from client.stream import parse_sse
from client.wire import API_PREFIX, FINAL_STATUSES, ExportFormat

if TYPE_CHECKING:
    import pandas

DEFAULT_URL = "http://127.0.0.1:8000"  # the service `resnet-service up` starts
DEFAULT_TIMEOUT_S = 30.0
IMPORT_TIMEOUT_S = 600.0  # an import sends the file, then converts and checks it
EXPORT_TIMEOUT_S = 1800.0  # the service's own limit of an export (EXPORT_TIMEOUT_S)
RECONNECTS = 5  # a dropped event stream is resumed this many times in a row (Last-Event-ID)
Image = str | Path | bytes | tuple[str, bytes]  # a file, raw bytes, or (file name, bytes)
Spec = Mapping[str, Any] | BaseModel  # a job spec as JSON, or core.kinds' TrainJobSpec, ...
Id = str | UUID  # a job's or a study's id


class StudyFields(TypedDict, total=False):
    """What a study asks for beside its preset: the keywords of `submit_study` and
    `preview_study` (absent: the default named here)."""

    dataset: str | Mapping[str, Any] | None  # with a preset: its dataset (a name or a spec)
    scale: Literal["quick", "paper"]  # with a preset: "quick" (default) or "paper"
    base: Mapping[str, Any] | None  # without a preset: the train spec the grid varies
    grid: Mapping[str, Sequence[Any]] | None  # axis -> values
    seeds: int | Sequence[int]  # a number of seeds (default 1) or the seeds themselves
    name: str | None
    tags: Sequence[str]
    # A search instead of a grid (without a preset): its sampler, space and budget.
    search: Literal["grid", "random", "tpe"]  # default "grid"
    space: Mapping[str, Mapping[str, Any]]  # path -> {"type": "loguniform", "low", "high"}
    trials: int
    pruner: Literal["none", "median", "asha", "hyperband"]
    objective: str  # default "val/error"
    search_seed: int


SEARCH_FIELDS = ("search", "space", "trials", "pruner", "objective", "search_seed")


class Client:
    """The service at `url` with the API key `key`; a context manager that closes itself."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url = url or os.environ.get("RESNET_URL") or DEFAULT_URL
        key = key or os.environ.get("RESNET_KEY")
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    # -- jobs ------------------------------------------------------------------------

    def submit(self, spec: Spec, *, idempotency_key: str | None = None) -> Job:
        """Submit a job (train, evaluate, predict: the spec's `kind`); the queued job."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return cast(Job, self._json("POST", "/jobs", json=_spec(spec), headers=headers))

    def job(self, job_id: Id) -> Job:
        """A job: status, progress, results, spec."""
        return cast(Job, self._json("GET", f"/jobs/{job_id}"))

    def jobs_page(
        self,
        search: JobFilter | None = None,
        *,
        limit: int = 50,
        cursor: str | None = None,
        **fields: Any,
    ) -> JobPage:
        """One page of jobs; pass its `next_cursor` as `cursor` for the next.

        The filters are a `JobFilter`, or its fields as keywords (`status`, `kind`, `model`,
        `family`, `dataset`, `tag`, `q`, `study`, `owner`, `sort`; `filters` for `filter`):
        `filters` are `path op value` expressions, e.g. "best_test_error<0.08",
        "model.options.unit=full_preact"; `sort` may name a summary key ("-summary.x")."""
        params = _asked(search, fields).params() | {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return cast(JobPage, self._json("GET", "/jobs", params=params))

    def jobs(
        self, search: JobFilter | None = None, *, page_size: int = 50, **fields: Any
    ) -> Iterator[JobItem]:
        """Every job that passes the filters (as `jobs_page` takes them), page after page as
        the iterator goes."""
        asked = _asked(search, fields)
        cursor: str | None = None
        while True:
            page = self.jobs_page(asked, limit=page_size, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def jobs_csv(
        self, search: JobFilter | None = None, *, columns: Sequence[str] = (), **fields: Any
    ) -> str:
        """Every job that passes the filters (as `jobs_page` takes them) as CSV text (header
        row first); `columns` adds spec or summary paths, e.g. "recipe.lr",
        "summary.best_train_error"."""
        params = _asked(search, fields).params()
        if columns:
            params["columns"] = ",".join(columns)
        return self._send("GET", "/jobs.csv", params=params).text

    def jobs_frame(
        self, search: JobFilter | None = None, *, columns: Sequence[str] = (), **fields: Any
    ) -> pandas.DataFrame:
        """The filtered job list as a pandas DataFrame, one row per job, indexed by id."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError(
                "jobs_frame needs pandas: pip install 'resnet-service[pandas]'"
            ) from error
        text = self.jobs_csv(search, columns=columns, **fields)
        frame = pandas.read_csv(io.StringIO(text), parse_dates=["created_at", "finished_at"])
        return frame.set_index("id")

    def update(
        self, job_id: Id, *, tags: Sequence[str] | None = None, note: str | None = None
    ) -> Job:
        """Replace a job's tags and/or set its note ("" clears it); None leaves either as is."""
        body: dict[str, Any] = {} if tags is None else {"tags": list(tags)}
        if note is not None:
            body["note"] = note
        return cast(Job, self._json("PATCH", f"/jobs/{job_id}", json=body))

    def kinds(self) -> list[Kind]:
        """The job kinds the service takes."""
        return cast(list[Kind], self._json("GET", "/jobs/kinds"))

    def cancel(self, job_id: Id) -> Job:
        """Cancel a job: a queued one now, a running one within seconds."""
        return cast(Job, self._json("POST", f"/jobs/{job_id}/cancel"))

    def retry(self, job_id: Id) -> Retried:
        """Queue a failed, cancelled or pruned job again (it resumes from its last checkpoint)."""
        return cast(Retried, self._json("POST", f"/jobs/{job_id}/retry"))

    def delete(self, job_id: Id) -> None:
        """Delete a job that is not running, its rows and its files."""
        self._send("DELETE", f"/jobs/{job_id}")

    def wait(self, job_id: Id, timeout: float | None = None, *, interval: float = 1.0) -> Job:
        """Poll the job every `interval` s until it is over; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in FINAL_STATUSES:
                return job
            _pause(deadline, interval, f"job {job_id} is still {job['status']}")

    def events(
        self,
        job_id: Id,
        *,
        since_step: int | None = None,
        reconnects: int = RECONNECTS,
        on_drop: Callable[[ServiceUnreachableError], None] | None = None,
    ) -> Iterator[Event]:
        """A job's live events (`log`, `metrics`, `progress`, `status`) until `end`.

        A stream that drops (or reaches its maximum life) is opened again after its last
        log line (Last-Event-ID) and metric step; `on_drop` hears of each drop. After
        `reconnects` tries in a row with nothing new: ServiceUnreachableError."""
        resume = _Resume(since_step=since_step)
        failures = 0
        while True:
            fresh = False
            try:
                for event in self._stream_once(job_id, resume):
                    fresh = True
                    yield event
                    if event.name == "end":
                        return
            except ServiceUnreachableError as error:
                if on_drop is not None:
                    on_drop(error)
            failures = 0 if fresh else failures + 1
            if failures > reconnects:
                raise ServiceUnreachableError(self.url, f"the events of job {job_id} kept dropping")

    def stream_metrics(
        self, job_id: Id, *, since_step: int | None = None, reconnects: int = RECONNECTS
    ) -> Iterator[MetricPoint]:
        """A job's metric points as they are written, until it ends (from `since_step`;
        default: only new ones)."""
        for event in self.events(job_id, since_step=since_step, reconnects=reconnects):
            if event.name == "metrics":
                yield from _points(event.data)

    def metrics(
        self, job_id: Id, names: Sequence[str] = (), *, max_points: int = 1000
    ) -> dict[str, list[Point]]:
        """A job's curves by metric name (all, or `names`), each at most `max_points` long."""
        params: dict[str, Any] = {"max_points": max_points}
        if names:
            params["names"] = ",".join(names)
        answer = cast(Metrics, self._json("GET", f"/jobs/{job_id}/metrics", params=params))
        return {
            name: [Point(step, value) for step, value in zip(s["steps"], s["values"], strict=True)]
            for name, s in answer["series"].items()
        }

    def metrics_frame(
        self, job_id: Id, names: Sequence[str] = (), *, max_points: int = 1000
    ) -> pandas.DataFrame:
        """A job's curves as a pandas DataFrame: one column per metric, indexed by step."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError(
                "metrics_frame needs pandas: pip install 'resnet-service[pandas]'"
            ) from error
        curves = self.metrics(job_id, names, max_points=max_points)
        columns = {
            name: pandas.Series([p.value for p in points], index=[p.step for p in points])
            for name, points in sorted(curves.items())
        }
        frame = pandas.DataFrame(columns) if columns else pandas.DataFrame()
        frame.index.name = "step"
        return frame

    def checkpoints(self, job_id: Id) -> list[Checkpoint]:
        """The checkpoints a job keeps, by step."""
        return cast(list[Checkpoint], self._json("GET", f"/jobs/{job_id}/checkpoints"))

    def artifacts(self, job_id: Id) -> list[Artifact]:
        """The result files a job wrote (a predict job's predictions), with bytes and sha256."""
        return cast(list[Artifact], self._json("GET", f"/jobs/{job_id}/artifacts"))

    def download_artifact(self, job_id: Id, name: str, *, to: str | Path = ".") -> Path:
        """Save one of a job's result files into the folder `to` (or as the file `to`),
        checking the sha256 the service sends; the file's path."""
        target = Path(to)
        saved = target / name if target.is_dir() else target
        return self._download(f"/jobs/{job_id}/artifacts/{name}", name, saved, overwrite=True)

    def predictions_frame(self, job_id: Id) -> pandas.DataFrame:
        """A predict job's rows as a pandas DataFrame (its CSV, else its JSONL)."""
        try:
            import pandas
        except ImportError as error:
            raise ImportError(
                "predictions_frame needs pandas: pip install 'resnet-service[pandas]'"
            ) from error
        names = {artifact["name"] for artifact in self.artifacts(job_id)}
        if "predictions.csv" in names:
            body = self._send("GET", f"/jobs/{job_id}/artifacts/predictions.csv").content
            # Class names stay text ("007" is no number); probabilities are numbers.
            frame = pandas.read_csv(io.BytesIO(body), dtype=str, keep_default_na=False)
            chances = [column for column in frame.columns if column.startswith("prob_")]
            return frame.astype(dict.fromkeys(chances, float))
        body = self._send("GET", f"/jobs/{job_id}/artifacts/predictions.jsonl").content
        return pandas.read_json(io.BytesIO(body), lines=True)

    # -- studies ---------------------------------------------------------------------

    def submit_study(
        self,
        preset: str | None = None,
        *,
        max_parallel: int = 2,
        idempotency_key: str | None = None,
        **study: Unpack[StudyFields],
    ) -> Study:
        """Submit a study: a `preset` on a `dataset`, a `base` train spec with a `grid`, or
        a `base` with a `search` of a `space` (`StudyFields`)."""
        body = _study_body(preset, study, max_parallel)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return cast(Study, self._json("POST", "/studies", json=body, headers=headers))

    def preview_study(
        self, preset: str | None = None, **study: Unpack[StudyFields]
    ) -> StudyPreview:
        """What `submit_study` would make (a dry run, nothing written): cells, job count."""
        body = _study_body(preset, study, 1)
        params = {"dry_run": "true"}
        return cast(StudyPreview, self._json("POST", "/studies", json=body, params=params))

    def study(self, study_id: Id) -> Study:
        """A study: state, counts, results per cell, jobs."""
        return cast(Study, self._json("GET", f"/studies/{study_id}"))

    def studies(self, *, limit: int = 50) -> list[StudyItem]:
        """The newest studies."""
        return cast(list[StudyItem], self._json("GET", "/studies", params={"limit": limit}))

    def presets(self) -> list[Preset]:
        """The papers' experiments that `submit_study(preset)` repeats."""
        return cast(list[Preset], self._json("GET", "/studies/presets"))

    def study_results(self, study_id: Id) -> list[CellResult]:
        """A study's results table: per cell, errors over seeds beside the papers' number."""
        return self.study(study_id)["cells"]

    def study_results_csv(self, study_id: Id) -> str:
        """A study's results table as CSV text."""
        return self._send("GET", f"/studies/{study_id}/results.csv").text

    def study_results_markdown(self, study_id: Id) -> str:
        """A study's results table as Markdown, errors in % the way the papers print them."""
        return self._send("GET", f"/studies/{study_id}/results.md").text

    def study_trials(self, study_id: Id) -> StudyTrials:
        """A search study's trials, best trial, best so far, importances and job-seconds
        (a grid study answers ConflictError: its results are per cell)."""
        return cast(StudyTrials, self._json("GET", f"/studies/{study_id}/trials"))

    def study_trials_csv(self, study_id: Id) -> str:
        """A search study's trials as CSV text."""
        return self._send("GET", f"/studies/{study_id}/trials.csv").text

    def extend_study(
        self,
        study_id: Id,
        *,
        add_seeds: int | Mapping[int, int] | None = None,
        add_trials: int | None = None,
    ) -> Study:
        """Add seeds to every cell (a number) or chosen cells ({cell: seeds}), or trials to a
        search; the new jobs join the study's results."""
        seeds = (
            {str(cell): count for cell, count in add_seeds.items()}
            if isinstance(add_seeds, Mapping)
            else add_seeds
        )
        body: StudyExtend = {"add_seeds": seeds, "add_trials": add_trials}
        return cast(Study, self._json("POST", f"/studies/{study_id}/extend", json=body))

    def study_compare(
        self,
        study_id: Id,
        *,
        metric: str = "final_test_error",
        test: str = "welch",
        reference: int | None = None,
        a: int | None = None,
        b: int | None = None,
    ) -> StudyComparisons:
        """Cells compared on `metric`: a and b, every cell against `reference`, or every pair."""
        given = {"metric": metric, "test": test, "reference": reference, "a": a, "b": b}
        params = {key: value for key, value in given.items() if value is not None}
        return cast(
            StudyComparisons, self._json("GET", f"/studies/{study_id}/compare", params=params)
        )

    def study_plan(self, study_id: Id, *, level: float = 0.05, power: float = 0.8) -> StudyPlan:
        """Per claim the seeds per cell that would settle it, and the body adding them."""
        params = {"level": level, "power": power}
        return cast(StudyPlan, self._json("GET", f"/studies/{study_id}/plan", params=params))

    def cancel_study(self, study_id: Id) -> Study:
        """Cancel every unfinished job of a study."""
        return cast(Study, self._json("POST", f"/studies/{study_id}/cancel"))

    def delete_study(self, study_id: Id) -> None:
        """Delete a study none of whose jobs runs, its jobs and their files."""
        self._send("DELETE", f"/studies/{study_id}")

    def wait_study(
        self, study_id: Id, timeout: float | None = None, *, interval: float = 2.0
    ) -> Study:
        """Poll the study until every job ended; TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            study = self.study(study_id)
            if study["state"] in FINAL_STATUSES:  # a study ends in the words of its jobs
                return study
            _pause(deadline, interval, f"study {study_id} is still {study['state']}")

    # -- registry --------------------------------------------------------------------

    def register(self, name: str, job_id: Id, *, checkpoint: str = "best") -> Version:
        """Register a succeeded train job's `best` or `last` checkpoint as `name`'s next
        version (the model is made on first use)."""
        body = {"job": str(job_id), "checkpoint": checkpoint}
        return cast(Version, self._json("POST", f"/registry/{name}/versions", json=body))

    def import_weights(
        self,
        name: str,
        file: str | Path | None = None,
        *,
        architecture: str | None = None,
        options: Mapping[str, Any] | None = None,
        classes: Sequence[str] | None = None,
        preprocessing: Mapping[str, Any] | None = None,
        format: str = "auto",
        weights: str | None = None,
        timeout: float = IMPORT_TIMEOUT_S,
    ) -> Version:
        """Import a weights file (a torchvision `.pth`, an akamaster `.th`, safetensors) as
        `name`'s next version of the zoo's `architecture`; or, where the service allows
        downloads, torchvision's `weights` by name (ResNet50_Weights.IMAGENET1K_V2)."""
        fields = {"architecture": architecture, "format": format, "weights": weights}
        form = {key: value for key, value in fields.items() if value is not None}
        for key, value in (("options", options), ("classes", classes)):
            if value is not None:
                form[key] = json.dumps(value if key == "options" else list(value))
        if preprocessing is not None:
            form["preprocessing"] = json.dumps(dict(preprocessing))
        path = f"/registry/{name}/versions/import"
        if file is None:
            return cast(Version, self._json("POST", path, data=form, timeout=timeout))
        with Path(file).open("rb") as sent:
            files = {"file": (Path(file).name, sent)}
            answer = self._json("POST", path, data=form, files=files, timeout=timeout)
        return cast(Version, answer)

    def registered(self, name: str) -> RegisteredModel:
        """A registered model with its versions and aliases."""
        return cast(RegisteredModel, self._json("GET", f"/registry/{name}"))

    def registry(self, *, q: str | None = None, page_size: int = 50) -> Iterator[RegisteredModel]:
        """Every registered model (whose name contains `q`), in name order."""
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            params |= {name: value for name, value in (("q", q), ("cursor", cursor)) if value}
            page = cast(RegistryPage, self._json("GET", "/registry", params=params))
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def set_alias(
        self,
        name: str,
        alias: str,
        version: int | None = None,
        *,
        weights: Mapping[int, int] | None = None,
        sticky: bool = False,
        shadow: int | None = None,
        shadow_percent: int = 100,
    ) -> Alias:
        """Point `name@alias` at a version, or split it by `weights` (version -> weight),
        `sticky` per caller, with a `shadow` version taking a copy of `shadow_percent` of
        its requests: the alias's whole state in one request."""
        body: dict[str, Any] = (
            {"version": version}
            if weights is None
            else {"weights": {str(v): w for v, w in weights.items()}}
        )
        body["sticky"] = sticky
        if shadow is not None:
            body["shadow"] = {"version": shadow, "percent": shadow_percent}
        return cast(Alias, self._json("PUT", f"/registry/{name}/aliases/{alias}", json=body))

    def promote(self, name: str, alias: str, version: int) -> Alias:
        """`name@alias` serves `version` (one of its versions or its shadow) alone."""
        path = f"/registry/{name}/aliases/{alias}/promote"
        return cast(Alias, self._json("POST", path, json={"version": version}))

    def history(self, name: str, *, limit: int = 100) -> list[HistoryEntry]:
        """The model's registry changes, newest first."""
        path = f"/registry/{name}/history"
        return cast(list[HistoryEntry], self._json("GET", path, params={"limit": limit}))

    def shadow_comparisons(self, name: str) -> list[ShadowComparison]:
        """Each shadow version against the version it copies, as this server counted."""
        return cast(list[ShadowComparison], self._json("GET", f"/registry/{name}/shadow"))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove an alias."""
        self._send("DELETE", f"/registry/{name}/aliases/{alias}")

    def delete_version(self, name: str, version: int) -> None:
        """Remove a version that no alias points to."""
        self._send("DELETE", f"/registry/{name}/versions/{version}")

    # -- predict, health -------------------------------------------------------------

    def predict(
        self, images: Sequence[Image] | Image, model: str, *, top_k: int = 5, raw: bool = False
    ) -> Prediction:
        """The top-k classes of each image by `model`: a job id, `name`, `name/3` or
        `name@alias`. Images are paths, bytes, or (file name, bytes). With `raw`, one image
        is sent as the request body (no multipart framing); its result's file is `image`."""
        many = images if isinstance(images, list | tuple) and not _named(images) else [images]
        params = {"model": model, "top_k": top_k}
        if raw:
            if len(many) != 1:
                raise ValueError(f"raw sends one image as the body; got {len(many)}")
            _, data = _file(cast(Image, many[0]), 0)
            headers = {"Content-Type": _media_type(data)}
            sent = self._json("POST", "/predict", params=params, content=data, headers=headers)
            return cast(Prediction, sent)
        files = [("files", _file(image, n)) for n, image in enumerate(cast(list[Image], many))]
        return cast(Prediction, self._json("POST", "/predict", params=params, files=files))

    def explain(
        self, images: Sequence[Image] | Image, model: str, *, target: str | int = "top"
    ) -> Explanation:
        """The Grad-CAM of each image (at most EXPLAIN_MAX_IMAGES) by `model` for `target`:
        `top` (each image's top class), a class name or an index."""
        many = images if isinstance(images, list | tuple) and not _named(images) else [images]
        files = [("files", _file(image, n)) for n, image in enumerate(cast(list[Image], many))]
        params = {"model": model, "class": str(target)}
        return cast(Explanation, self._json("POST", "/explain", params=params, files=files))

    def explain_png(self, image: Image, model: str, *, target: str | int = "top") -> bytes:
        """One image's Grad-CAM overlay (PNG) by `model` for `target` (as `explain`)."""
        params = {"model": model, "class": str(target), "format": "png"}
        files = [("files", _file(image, 0))]
        return self._send("POST", "/explain", params=params, files=files).content

    def health(self) -> Health:
        """Whether the process is up."""
        return cast(Health, self._json("GET", "/healthz"))

    def ready(self) -> Ready:
        """Whether the database and broker answer (`status` "ok" or "unavailable")."""
        response = self._request("GET", "/readyz")
        if response.status_code != 503:  # a 503 here is the answer, not an error
            raise_for(response)
        return cast(Ready, response.json())

    def session(self) -> Session:
        """Whether the service asks for keys, and the scopes of this client's key."""
        return cast(Session, self._json("GET", "/whoami"))

    def workers(self) -> list[Worker]:
        """The registered workers by name: devices, queues, state, current job, last seen."""
        return cast(list[Worker], self._json("GET", "/workers"))

    # -- downloads and exports ---------------------------------------------------------

    def version_of(self, ref: str) -> tuple[str, int]:
        """The model and version number `ref` names: `name/N`, `name@alias` or `name` (its
        latest version)."""
        name, _, number = ref.partition("/")
        if number:
            return name, int(number)
        name, _, alias = name.partition("@")
        model = self.registered(name)
        if alias:
            for found in model["aliases"]:
                if found["alias"] == alias:
                    return name, found["version"]
            raise ClientError(f"model {name!r} has no alias {alias!r}")
        if not model["versions"]:
            raise ClientError(f"model {name!r} has no versions")
        return name, model["versions"][-1]["version"]

    def download_checkpoint(
        self, ref: Id, *, to: str | Path = ".", which: str | int = "best", overwrite: bool = True
    ) -> Path:
        """Save a checkpoint into the folder `to` (or as the file `to`), checking the sha256
        the service sends: a job's (`ref` a job id; `which`: best, last or a step number) or
        a registered version's (`name/N`, `name@alias`, `name`); the file's path. Without
        `overwrite`, a file already there is a ClientError, left as it was."""
        try:
            job_id = UUID(str(ref))
        except ValueError:
            name, version = self.version_of(str(ref))
            path = f"/registry/{name}/versions/{version}/checkpoint"
            return self._download(path, f"{name}-v{version}.pt", to, overwrite=overwrite)
        path = f"/jobs/{job_id}/checkpoints/{which}/file"
        return self._download(path, f"{job_id}.pt", to, overwrite=overwrite)

    def export(
        self,
        ref: str,
        format: ExportFormat = "onnx",
        *,
        calibration_images: int | None = None,
        max_error_increase_pp: float | None = None,
        eval_limit: int | None = None,
    ) -> Export:
        """Export a registered version (`name/N`, `name@alias`, `name`): made, checked against
        the eager net and stored by the service, or the one made before. onnx_int8 is
        calibrated on `calibration_images` training images and kept only when its evaluation
        error (over `eval_limit` images at most) is within `max_error_increase_pp` of the
        float graph's."""
        name, version = self.version_of(ref)
        path = f"/registry/{name}/versions/{version}/exports"
        int8 = {
            "calibration_images": calibration_images,
            "max_error_increase_pp": max_error_increase_pp,
            "eval_limit": eval_limit,
        }
        body = {"format": format} | {key: value for key, value in int8.items() if value is not None}
        answer = self._json("POST", path, json=body, timeout=EXPORT_TIMEOUT_S)
        return cast(Export, answer)

    def exports(self, ref: str) -> list[Export]:
        """The exports made of a registered version."""
        name, version = self.version_of(ref)
        return cast(list[Export], self._json("GET", f"/registry/{name}/versions/{version}/exports"))

    def download_export(
        self,
        ref: str,
        format: ExportFormat = "onnx",
        *,
        to: str | Path = ".",
        overwrite: bool = True,
    ) -> Path:
        """Save a version's export into the folder `to` (or as the file `to`), checking the
        sha256 the service sends; the file's path. Without `overwrite`, a file already there
        is a ClientError, left as it was."""
        name, version = self.version_of(ref)
        path = f"/registry/{name}/versions/{version}/exports/{format}/file"
        return self._download(path, f"{name}-v{version}.{format}", to, overwrite=overwrite)

    def payloads(self, ref: Id, *, page_size: int = 50) -> Iterator[PayloadSegment]:
        """The payload log's segments of a registered version (`name/N`, `name@alias`,
        `name`) or of a job served by its id, newest first, page by page."""
        path = f"{self._served_path(ref)}/payloads"
        cursor: str | None = None
        while True:
            params = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            page = cast(PayloadPage, self._json("GET", path, params=params))
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def download_payloads(
        self, ref: Id, segment: str, *, to: str | Path = ".", overwrite: bool = True
    ) -> Path:
        """Save one segment of a payload log (gzip'd JSON Lines) into the folder `to` (or as
        the file `to`), checking its sha256; the file's path."""
        path = f"{self._served_path(ref)}/payloads/{segment}"
        return self._download(path, segment, to, overwrite=overwrite)

    def drift(self, ref: Id) -> Drift:
        """The drift of a registered version (or a job served by its id) from its training
        data: per channel the served mean and std against the training split's, and the
        predicted classes against the reference, over the service's window."""
        return cast(Drift, self._json("GET", f"{self._served_path(ref)}/drift"))

    def _served_path(self, ref: Id) -> str:
        """The path of what serves `ref`: a job by its id, else a registered version."""
        try:
            return f"/jobs/{UUID(str(ref))}"
        except ValueError:
            name, version = self.version_of(str(ref))
            return f"/registry/{name}/versions/{version}"

    def _download(self, path: str, fallback: str, to: str | Path, *, overwrite: bool) -> Path:
        """Stream a file the service sends with its sha256 into `to` (a folder: under the
        name the service gives), through a partial file renamed once the sha256 matches."""
        with self._unreachable(), self._http.stream("GET", path) as got:
            if got.is_error:
                got.read()
                raise_for(got)
            target = Path(to)
            if target.is_dir():
                target = target / (_attachment_name(got) or fallback)
            if not overwrite and target.exists():
                raise ClientError(f"{target} exists; it was left as it was")
            partial = target.with_name(f".{target.name}.partial")
            digest = hashlib.sha256()
            with partial.open("wb") as out:
                for chunk in got.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
            expected = got.headers.get("X-Checksum-Sha256")
        if expected != digest.hexdigest():
            partial.unlink()
            raise ClientError(
                f"{path} arrived with sha256 {digest.hexdigest()}, not the service's "
                f"{expected}; download it again"
            )
        os.replace(partial, target)
        return target

    # -- transport -------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to a request; an error answer raised as its ApiError."""
        response = self._request(method, path, **kwargs)
        raise_for(response)
        return response

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with self._unreachable():
            return self._http.request(method, path, **kwargs)

    @contextmanager
    def _unreachable(self) -> Iterator[None]:
        """Network failures as ServiceUnreachableError."""
        try:
            yield
        except httpx.TransportError as error:
            reason = str(error) or type(error).__name__
            raise ServiceUnreachableError(self.url, reason) from error

    def _stream_once(self, job_id: Id, resume: _Resume) -> Iterator[Event]:
        """The events of one connection to a job's stream, noting where to resume."""
        timeout = httpx.Timeout(self._http.timeout.connect, read=None)
        with (
            self._unreachable(),
            self._http.stream(
                "GET",
                f"/jobs/{job_id}/events",
                headers=resume.headers(),
                params=resume.params(),
                timeout=timeout,
            ) as response,
        ):
            if not response.is_success:
                response.read()
                raise_for(response)
            for event in parse_sse(response.iter_lines()):
                resume.saw(event)
                yield event


class _Resume:
    """Where a job's event stream goes on after a drop: its last log line and metric step."""

    def __init__(self, *, since_step: int | None) -> None:
        self.last_event_id: str | None = None
        self.since_step = since_step

    def saw(self, event: Event) -> None:
        self.last_event_id = event.id or self.last_event_id
        if event.name == "metrics":
            steps = [step for s in event.data["series"].values() for step in s["steps"]]
            if steps:
                self.since_step = max(steps) + 1

    def headers(self) -> dict[str, str]:
        return {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}

    def params(self) -> dict[str, int]:
        return {} if self.since_step is None else {"since_step": self.since_step}


def _asked(search: JobFilter | None, fields: Mapping[str, Any]) -> JobFilter:
    """The job list's filter: `search`, with the filters named as keywords over it."""
    given = (
        {} if search is None else {name: getattr(search, name) for name in search.model_fields_set}
    )
    return JobFilter.asked({**given, **fields})


def _attachment_name(response: httpx.Response) -> str | None:
    """The file name of a `Content-Disposition: attachment; filename="..."`, its last part."""
    _, found, rest = response.headers.get("Content-Disposition", "").partition('filename="')
    name = Path(rest.partition('"')[0]).name if found else ""
    return name or None


def _spec(spec: Spec) -> Any:
    """A job spec as JSON."""
    if isinstance(spec, BaseModel):
        return spec.model_dump(mode="json")
    return dict(spec)


def _study_body(preset: str | None, study: StudyFields, max_parallel: int) -> dict[str, Any]:
    """A study as `POST /studies` takes it."""
    unknown = sorted(study.keys() - StudyFields.__optional_keys__)
    if unknown:
        raise TypeError(f"a study takes no {', '.join(unknown)}")
    seeds = study.get("seeds", 1)
    body: dict[str, Any] = {
        "seeds": seeds if isinstance(seeds, int) else list(seeds),
        "name": study.get("name"),
        "tags": list(study.get("tags", ())),
        "max_parallel": max_parallel,
    }
    dataset = study.get("dataset")
    if isinstance(dataset, str):
        dataset = {"name": dataset}
    if preset is not None:
        return {"preset": preset, "dataset": dataset, "scale": study.get("scale", "quick"), **body}
    spec = dict(study.get("base") or {})
    if dataset is not None:
        spec["dataset"] = dict(dataset)
    grid_lists = {axis: list(values) for axis, values in (study.get("grid") or {}).items()}
    searched = {name: study[name] for name in SEARCH_FIELDS if name in study}  # type: ignore[literal-required]
    return {"base": spec, "grid": grid_lists, **body, **searched}


def _points(data: Mapping[str, Any]) -> Iterator[MetricPoint]:
    """The points of a `metrics` event, series by series."""
    for name, series in data["series"].items():
        for step, value in zip(series["steps"], series["values"], strict=True):
            yield MetricPoint(name, step, value)


def _named(images: Sequence[Image] | Image) -> bool:
    """Whether `images` is one (file name, bytes) pair rather than a list of images."""
    return (
        isinstance(images, tuple)
        and len(images) == 2
        and isinstance(images[0], str)
        and isinstance(images[1], bytes)
    )


def _file(image: Image, index: int) -> tuple[str, bytes]:
    """A multipart file: its name and bytes."""
    if isinstance(image, bytes):
        return f"image-{index}", image
    if isinstance(image, tuple):
        return image
    path = Path(image)
    return path.name, path.read_bytes()


_SIGNATURES = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"BM", "image/bmp"))


def _media_type(data: bytes) -> str:
    """The Content-Type of an image's bytes, read from its signature (PNG when unknown: the
    service reads the format from the bytes, and refuses what is not an image)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in _SIGNATURES if data.startswith(magic)), "image/png")


def _pause(deadline: float | None, interval: float, waiting: str) -> None:
    """Sleep `interval` s (less when the deadline is nearer); TimeoutError once it passed."""
    left = interval if deadline is None else deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"{waiting} at the deadline")
    time.sleep(min(interval, left))
