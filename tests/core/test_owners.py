"""Owners: which rows a caller reads and changes, as list filters on a real database and as
fetches of one row."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select, update

from core import keys, owners
from core.db.session import session_scope
from core.db.tables import Job
from core.errors import InvalidError, NotFoundError, NotOwnedError
from core.owners import ANYONE, Caller
from tests.helpers import caller_of, new_job


def _key(url: str, *scopes: str) -> keys.Principal:
    key = caller_of(url, *scopes).key
    assert key is not None
    return key


def _job_of(url: str, owner: keys.Principal | None) -> uuid.UUID:
    job_id = new_job(url)
    with session_scope(url) as session:
        owner_id = None if owner is None else owner.key_id
        session.execute(update(Job).where(Job.id == job_id).values(owner_key_id=owner_id))
    return job_id


@pytest.fixture(scope="module")
def alice(postgres_url: str) -> keys.Principal:
    return _key(postgres_url, "read", "train")


@pytest.fixture(scope="module")
def bob(postgres_url: str) -> keys.Principal:
    return _key(postgres_url, "read", "train")


@pytest.fixture(scope="module")
def admin(postgres_url: str) -> keys.Principal:
    return _key(postgres_url, "admin")


@pytest.fixture(scope="module")
def made(postgres_url: str, alice: keys.Principal, bob: keys.Principal) -> dict[str, uuid.UUID]:
    """A job of alice's, one of bob's and one of no owner (made with auth off)."""
    return {
        "alice": _job_of(postgres_url, alice),
        "bob": _job_of(postgres_url, bob),
        "nobody": _job_of(postgres_url, None),
    }


def _listed(url: str, caller: Caller, asked: owners.Owner = None) -> set[uuid.UUID]:
    with session_scope(url) as session:
        where = owners.visible(caller, Job.owner_key_id, asked, noun="jobs")
        return set(session.scalars(select(Job.id).where(*where)))


def test_every_reader_lists_every_owners_rows_unless_reads_keep_to_the_owner(
    postgres_url: str, made: dict[str, uuid.UUID], alice: keys.Principal, admin: keys.Principal
) -> None:
    everything = set(made.values())
    assert everything <= _listed(postgres_url, ANYONE)
    assert everything <= _listed(postgres_url, Caller(alice))
    own = _listed(postgres_url, Caller(alice, own_reads_only=True))
    assert own & everything == {made["alice"]}
    assert everything <= _listed(postgres_url, Caller(admin, own_reads_only=True))


def test_a_list_asked_for_one_owner_keeps_to_it(
    postgres_url: str, made: dict[str, uuid.UUID], alice: keys.Principal, bob: keys.Principal
) -> None:
    everything = set(made.values())
    assert _listed(postgres_url, Caller(alice), "me") & everything == {made["alice"]}
    assert _listed(postgres_url, Caller(alice), bob.key_id) & everything == {made["bob"]}
    with pytest.raises(NotOwnedError, match="reads only its own jobs"):
        _listed(postgres_url, Caller(alice, own_reads_only=True), bob.key_id)
    with pytest.raises(InvalidError, match="owner=me needs an API key"):
        _listed(postgres_url, ANYONE, "me")


def test_a_train_key_changes_only_its_own_rows_and_an_admin_key_any(
    alice: keys.Principal, admin: keys.Principal
) -> None:
    assert Caller(alice).may_change(alice.key_id)
    assert not Caller(alice).may_change(uuid.uuid4())
    assert not Caller(alice).may_change(None)  # made with auth off: only admin keys
    assert Caller(admin).may_change(None)
    assert ANYONE.may_change(alice.key_id)
    with pytest.raises(NotOwnedError, match="does not own job x; only the key that made it"):
        owners.check_owner(Caller(alice), None, "job x", "cancel")


def test_fetch_finds_a_readable_row_and_locks_it_only_for_its_owner(
    postgres_url: str, made: dict[str, uuid.UUID], alice: keys.Principal, bob: keys.Principal
) -> None:
    with session_scope(postgres_url) as session:
        row = owners.fetch(session, Job, made["alice"], Caller(alice), noun="job", action="cancel")
        assert row.id == made["alice"]
        readable = owners.fetch(session, Job, made["alice"], Caller(bob), noun="job")
        assert readable.id == made["alice"]
        with pytest.raises(NotOwnedError, match=f"does not own job {made['alice']}"):
            owners.fetch(session, Job, made["alice"], Caller(bob), noun="job", action="cancel")


def test_fetch_hides_anothers_row_as_missing_when_reads_keep_to_the_owner(
    postgres_url: str, made: dict[str, uuid.UUID], bob: keys.Principal
) -> None:
    private = Caller(bob, own_reads_only=True)
    with session_scope(postgres_url) as session:
        with pytest.raises(NotFoundError) as hidden:
            owners.fetch(session, Job, made["alice"], private, noun="job")
        with pytest.raises(NotFoundError) as missing:
            owners.fetch(session, Job, (unknown := uuid.uuid4()), private, noun="job")
    assert str(hidden.value) == f"job {made['alice']} does not exist"
    assert str(missing.value) == f"job {unknown} does not exist"
