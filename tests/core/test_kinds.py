"""Job kinds: one registration gives a kind its spec, its row facts and its run."""

from __future__ import annotations

import typing
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic import TypeAdapter, ValidationError

from core import jobs, kinds
from core.db.session import session_scope
from core.db.tables import Event, Job
from core.errors import InvalidError
from core.kinds.base import JobKind, RowFacts, RunContext, register
from core.settings import Settings
from training.specs import Spec
from worker import runner


class EchoSpec(Spec):
    """A kind made up for the test: it reports its text and succeeds."""

    kind: Literal["echo"]
    name: str | None = None
    tags: tuple[str, ...] = ()
    text: str


def _record(_session: Any, spec: EchoSpec) -> RowFacts:
    return RowFacts(dataset_name="none", model_name=None, model_family=None, depth=None)


def _run(spec: EchoSpec, context: RunContext) -> dict[str, Any]:
    context.sink.on_event("info", f"echo: {spec.text}")
    context.set_budget(10, 1e6)
    return {"echoed": spec.text, "device": str(context.device)}


@pytest.fixture
def echo_kind() -> Iterator[JobKind[EchoSpec]]:
    kind = register(JobKind("echo", "Say a text back.", EchoSpec, _record, _run))
    yield kind
    del kinds.KINDS["echo"]


def test_each_kind_is_registered_under_the_kind_its_spec_names() -> None:
    assert list(kinds.KINDS) == ["train", "evaluate", "predict", "import"]
    for name, kind in kinds.KINDS.items():
        assert typing.get_args(kind.spec.model_fields["kind"].annotation) == (name,)


def test_the_job_spec_is_the_union_of_the_registered_specs() -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(kinds.JobSpec)
    train = adapter.validate_python(
        {"kind": "train", "model": {"name": "resnet20"}, "dataset": {"name": "digits"}}
    )
    assert isinstance(train, kinds.TrainJobSpec)
    source = str(uuid.uuid4())
    evaluate = adapter.validate_python(
        {"kind": "evaluate", "source_job": source, "dataset": {"name": "digits"}}
    )
    assert isinstance(evaluate, kinds.EvaluateJobSpec)
    predict = adapter.validate_python(
        {"kind": "predict", "model": "digits-net@production", "dataset": {"name": "digits"}}
    )
    assert isinstance(predict, kinds.PredictJobSpec)
    assert (predict.top_k, predict.batch_size, predict.formats) == (5, 256, ("csv",))
    with pytest.raises(ValidationError, match="echo"):
        adapter.validate_python({"kind": "echo", "text": "hi"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_k": 0}, "top_k"),
        ({"batch_size": 4096}, "batch_size"),
        ({"format": "parquet"}, "format"),
        ({"dataset": {"name": "imagenet"}}, "dataset"),
        ({"dataset": {"name": "imagefolder", "path": "../elsewhere"}}, "relative to the data root"),
        ({"resources": {"device": "gpu", "gpus": 2}}, "one device"),
    ],
)
def test_a_predict_spec_refuses_what_it_cannot_run(fields: dict[str, Any], message: str) -> None:
    spec = {"kind": "predict", "model": "m", "dataset": {"name": "digits"}, **fields}
    with pytest.raises(ValidationError, match=message):
        kinds.PredictJobSpec.model_validate(spec)


def test_a_name_is_registered_once_and_an_unknown_one_is_named() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register(kinds.KINDS["train"])
    with pytest.raises(InvalidError, match="kinds are train, evaluate, predict, import"):
        kinds.get("finetune")


def test_a_registered_kind_is_recorded_and_run_by_the_worker(
    sqlite_url: str, echo_kind: JobKind[EchoSpec]
) -> None:
    settings = Settings(database_url=sqlite_url, device="cpu")
    spec = EchoSpec(kind="echo", name="hello", text="residual")
    with session_scope(sqlite_url) as session:
        job_id = jobs.create(session=session, spec=spec, max_attempts=1).id

    runner.execute(job_id, settings=settings, worker="test")

    with session_scope(sqlite_url) as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.kind, job.name, job.status, job.dataset_name) == (
            "echo",
            "hello",
            "succeeded",
            "none",
        )
        assert job.summary == {"echoed": "residual", "device": "cpu"}
        messages = [event.message for event in session.query(Event).filter_by(job_id=job_id)]
    assert "echo: residual" in messages
