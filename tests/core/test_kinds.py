"""Job kinds: one registration gives a kind its spec, its row facts and its run; the
registry answers, for any kind, whether a caller may submit a spec, what a job's row
records (leaving the spec it is given as it was), and a spec's budgets from the settings
it is parsed with."""

from __future__ import annotations

import typing
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic import TypeAdapter, ValidationError

from core import jobs, keys, kinds
from core.db.session import session_scope
from core.db.tables import Checkpoint, Event, Job
from core.errors import InvalidError
from core.kinds.base import JobKind, RowFacts, RunContext, register
from core.owners import ANYONE, Caller
from core.settings import Settings, get_settings
from training.specs import Spec
from worker import runner


class EchoSpec(Spec):
    """A kind made up for the test: it reports its text and succeeds."""

    kind: Literal["echo"]
    name: str | None = None
    tags: tuple[str, ...] = ()
    text: str


def _record(_session: Any, _settings: Settings, spec: EchoSpec) -> tuple[EchoSpec, RowFacts]:
    return spec, RowFacts(dataset_name="none", model_name=None, model_family=None, depth=None)


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
        job_id = jobs.create(session=session, settings=settings, spec=spec, max_attempts=1).id

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


TRAIN = {"kind": "train", "model": {"name": "resnet20"}, "dataset": {"name": "digits"}}
DIGITS = {"name": "digits"}


@pytest.fixture
def environment_budgets(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Budgets set in this process's environment, as a deployment sets them."""
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def test_a_spec_is_held_to_the_budgets_of_the_settings_it_is_parsed_with(
    environment_budgets: pytest.MonkeyPatch,
) -> None:
    # The environment of whoever builds the spec allows next to nothing...
    environment_budgets.setenv("MAX_JOB_MACS", "1e6")
    environment_budgets.setenv("MAX_TRAIN_MEMORY_BYTES", str(2**20))
    assert get_settings().max_job_macs == 1e6
    roomy = Settings(max_job_macs=1e18, max_train_memory_bytes=2**40)
    # ...the settings passed in are what the spec is checked against.
    spec = kinds.parse(TRAIN, roomy)
    assert isinstance(spec, kinds.TrainJobSpec)
    assert kinds.get("train").parse(TRAIN, roomy) == spec
    tight = Settings(max_job_macs=1e9, max_train_memory_bytes=2**40)
    with pytest.raises(ValidationError, match="over MAX_JOB_MACS = 1e\\+09"):
        kinds.parse(TRAIN, tight)
    with pytest.raises(ValidationError, match="over MAX_JOB_MACS = 1e\\+09"):
        kinds.get("train").parse(TRAIN, tight)


def test_a_spec_built_in_code_fills_in_its_resources_with_no_settings() -> None:
    built = kinds.TrainJobSpec.model_validate(TRAIN)
    assert built == kinds.parse(TRAIN, Settings())
    assert built.resources.device == "any"


def test_what_the_service_asks_of_a_kind_is_declared_by_the_kind() -> None:
    declared = {
        name: (kind.trains is not None, kind.registrable, kind.queued)
        for name, kind in kinds.KINDS.items()
    }
    assert declared == {
        "train": (True, True, True),
        "evaluate": (False, False, True),
        "predict": (False, False, True),
        "import": (False, True, False),
    }
    trained = kinds.training_of("train", kinds.parse(TRAIN, Settings()).model_dump())
    assert trained is not None
    assert trained.model.name == "resnet20"
    assert kinds.training_of("evaluate", {}) is None
    assert kinds.training_of("no-such-kind", {}) is None


def _key(session: Any) -> Caller:
    row, _secret = keys.create_key(session=session, name="kinds", scopes=["read", "train"])
    return Caller(keys.Principal(row.id, frozenset(row.scopes)), own_reads_only=True)


def _trained(session: Any, owner: uuid.UUID | None) -> Job:
    """A succeeded train job of `owner` with a best checkpoint (rows only, no files)."""
    spec = kinds.parse({**TRAIN, "model": {"name": "resnet8"}}, Settings())
    job = jobs.create(session=session, settings=Settings(), spec=spec, max_attempts=1)
    job.status, job.owner_key_id = "succeeded", owner
    best = Checkpoint(step=5, epoch=1, path="/nowhere/5.pt", sha256="0" * 64, bytes=1)
    session.add(best)
    best.job_id, best.is_best = job.id, True
    session.flush()
    return job


def test_the_registry_asks_each_kind_whether_the_caller_may_submit_it(sqlite_url: str) -> None:
    settings = Settings(database_url=sqlite_url)
    with session_scope(sqlite_url) as session:
        owner, other = _key(session), _key(session)
        source = _trained(session, owner.owner)
        evaluate = kinds.parse(
            {"kind": "evaluate", "source_job": str(source.id), "dataset": DIGITS}, settings
        )
        predict = kinds.parse(
            {"kind": "predict", "model": str(source.id), "dataset": DIGITS}, settings
        )
        for spec in (evaluate, predict):
            kinds.check_access(session, settings, spec, owner)
            kinds.check_access(session, settings, spec, ANYONE)
            with pytest.raises(InvalidError) as refused:
                kinds.check_access(session, settings, spec, other)
            assert refused.value.field in (("body", "source_job"), ("body", "model"))


def test_record_pins_what_a_spec_names_in_a_copy(sqlite_url: str) -> None:
    settings = Settings(database_url=sqlite_url)
    with session_scope(sqlite_url) as session:
        source = _trained(session, None)
        sent = kinds.parse(
            {"kind": "predict", "model": str(source.id), "dataset": DIGITS}, settings
        )
        before = sent.model_dump()
        stored, facts = kinds.get("predict").record(session, settings, sent)
        assert sent.model_dump() == before  # the spec given stays as it was
        assert isinstance(stored, kinds.PredictJobSpec)
        assert isinstance(sent, kinds.PredictJobSpec)
        assert sent.resolved is None
        assert stored.resolved is not None
        assert (stored.resolved.job_id, stored.resolved.step) == (source.id, 5)
        assert (facts.source_job_id, facts.model_name) == (source.id, "resnet8")
        job = jobs.create(session=session, settings=settings, spec=sent, max_attempts=1)
        assert job.spec["resolved"]["step"] == 5
        assert sent.resolved is None
