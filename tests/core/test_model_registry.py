"""The model registry on a real database: versions of succeeded jobs, aliases, references
resolved to checkpoints, and who may change what."""

from __future__ import annotations

import uuid

import pytest

from core import model_registry
from core.db.session import session_scope
from core.errors import ConflictError, InvalidError, NotFoundError, NotOwnedError
from core.owners import ANYONE, Caller
from tests.helpers import caller_of, claim, new_job, recorded_job


def _name() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


def _register(
    url: str,
    name: str,
    job_id: uuid.UUID,
    *,
    checkpoint: str = "best",
    caller: Caller = ANYONE,
    max_versions: int | None = None,
) -> int:
    with session_scope(url) as session:
        registered = model_registry.register(
            session=session,
            name=name,
            job_id=job_id,
            checkpoint=checkpoint,
            caller=caller,
            max_versions=max_versions,
        )
        return registered.version


def _resolve(url: str, ref: str) -> model_registry.Resolved:
    with session_scope(url) as session:
        return model_registry.resolve(session=session, ref=ref)


def test_versions_are_numbered_from_one_and_hold_their_checkpoint(postgres_url: str) -> None:
    name, job_id = _name(), recorded_job(postgres_url, steps=3)
    assert _register(postgres_url, name, job_id) == 1
    assert _register(postgres_url, name, job_id, checkpoint="1") == 2
    with session_scope(postgres_url) as session:
        best = model_registry.get_version(session=session, name=name, version=1)
        first = model_registry.get_version(session=session, name=name, version=2)
        assert (best.step, best.sha256, best.job_id) == (3, f"{3:064x}", job_id)
        assert (first.step, first.path) == (1, f"/nowhere/{job_id}/step-1.pt")


def test_only_a_succeeded_train_job_with_that_checkpoint_registers(postgres_url: str) -> None:
    name = _name()
    running = new_job(postgres_url)
    claim(postgres_url, running)
    with pytest.raises(ConflictError, match="is running; only succeeded jobs register"):
        _register(postgres_url, name, running)
    with pytest.raises(InvalidError, match="is not a train job of this service"):
        _register(postgres_url, name, uuid.uuid4())
    with pytest.raises(InvalidError, match="has no 7 checkpoint"):
        _register(postgres_url, name, recorded_job(postgres_url), checkpoint="7")
    with pytest.raises(InvalidError, match="must match"):
        _register(postgres_url, "-bad name", recorded_job(postgres_url))


def test_a_job_is_at_most_max_versions_versions(postgres_url: str) -> None:
    job_id = recorded_job(postgres_url)
    first, second = _name(), _name()
    _register(postgres_url, first, job_id, max_versions=2)
    _register(postgres_url, second, job_id, max_versions=2)
    with pytest.raises(ConflictError, match=rf"2 registered versions already \({first}/1, "):
        _register(postgres_url, _name(), job_id, max_versions=2)
    assert _register(postgres_url, first, job_id) == 2  # no bound given: no bound


def test_references_resolve_to_the_latest_a_number_or_an_alias(postgres_url: str) -> None:
    name = _name()
    old, new = recorded_job(postgres_url), recorded_job(postgres_url, steps=4)
    _register(postgres_url, name, old)
    _register(postgres_url, name, new)
    with session_scope(postgres_url) as session:
        model_registry.set_alias(session=session, name=name, alias="production", version=1)
    assert (_resolve(postgres_url, name).version, _resolve(postgres_url, name).step) == (2, 4)
    assert _resolve(postgres_url, f"{name}/1").job_id == old
    assert _resolve(postgres_url, f"{name}@production").job_id == old
    by_job = _resolve(postgres_url, str(new))
    assert (by_job.model, by_job.version, by_job.step) == (None, None, 4)
    with session_scope(postgres_url) as session:  # moving the alias moves what it resolves to
        model_registry.set_alias(session=session, name=name, alias="production", version=2)
    assert _resolve(postgres_url, f"{name}@production").job_id == new


@pytest.mark.parametrize(
    ("ref", "error", "words"),
    [
        ("{name}/9", NotFoundError, "has no version 9"),
        ("{name}/99999999999", NotFoundError, "has no version 99999999999"),
        ("{name}@canary", NotFoundError, "has no alias 'canary'"),
        ("unknown-model-x", NotFoundError, "is not registered"),
        ("{name}@@x", InvalidError, "must be a job id, name, name/VERSION or name@ALIAS"),
    ],
)
def test_a_reference_to_nothing_says_what_is_missing(
    postgres_url: str, ref: str, error: type[Exception], words: str
) -> None:
    name = _name()
    _register(postgres_url, name, recorded_job(postgres_url))
    with pytest.raises(error, match=words):
        _resolve(postgres_url, ref.format(name=name))


def test_a_job_reference_needs_a_succeeded_train_job(postgres_url: str) -> None:
    queued = new_job(postgres_url)
    with pytest.raises(ConflictError, match="is a queued train job"):
        _resolve(postgres_url, str(queued))
    with pytest.raises(NotFoundError, match="does not exist"):
        _resolve(postgres_url, str(uuid.uuid4()))


def test_a_version_an_alias_serves_is_not_deleted(postgres_url: str) -> None:
    name = _name()
    _register(postgres_url, name, recorded_job(postgres_url))
    with session_scope(postgres_url) as session:
        model_registry.set_alias(session=session, name=name, alias="live", version=1)
    with session_scope(postgres_url) as session, pytest.raises(ConflictError, match="live"):
        model_registry.delete_version(session=session, name=name, version=1)
    with session_scope(postgres_url) as session:
        model_registry.delete_alias(session=session, name=name, alias="live")
        model_registry.delete_version(session=session, name=name, version=1)
    with pytest.raises(NotFoundError, match="has no versions"):
        _resolve(postgres_url, name)


def test_only_the_models_owner_or_an_admin_changes_it(postgres_url: str) -> None:
    owner, other = caller_of(postgres_url, "train"), caller_of(postgres_url, "train")
    admin = caller_of(postgres_url, "admin")
    name = _name()
    mine = recorded_job(postgres_url, owner=owner.owner)
    _register(postgres_url, name, mine, caller=owner)
    theirs = recorded_job(postgres_url, owner=other.owner)
    with pytest.raises(NotOwnedError, match=f"does not own model '{name}'"):
        _register(postgres_url, name, theirs, caller=other)
    with pytest.raises(NotOwnedError, match=f"does not own job {mine}"):
        _register(postgres_url, _name(), mine, caller=other)
    with session_scope(postgres_url) as session, pytest.raises(NotOwnedError):
        model_registry.set_alias(session=session, name=name, alias="a", version=1, caller=other)
    with session_scope(postgres_url) as session:
        model_registry.set_alias(session=session, name=name, alias="a", version=1, caller=admin)
        model = model_registry.get_model(session=session, name=name)
        assert model.owner_key_id == owner.owner


def test_a_private_reader_does_not_see_anothers_model(postgres_url: str) -> None:
    owner, reader = caller_of(postgres_url, "train"), caller_of(postgres_url, "read")
    private = Caller(reader.key, own_reads_only=True)
    name = _name()
    _register(postgres_url, name, recorded_job(postgres_url, owner=owner.owner), caller=owner)
    with session_scope(postgres_url) as session:
        assert model_registry.get_model(session=session, name=name, caller=reader).name == name
        with pytest.raises(NotFoundError, match="is not registered"):
            model_registry.get_model(session=session, name=name, caller=private)
    resolved = _resolve(postgres_url, name)
    assert resolved.owner_key_id == owner.owner
    with pytest.raises(NotFoundError, match="is not registered"):
        resolved.check_visible(private)
