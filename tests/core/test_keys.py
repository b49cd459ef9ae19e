"""API keys in the database: made with known scopes, stored as a digest, authenticated,
revoked, listed."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable

import pytest

from core import keys
from core.db.session import session_scope
from core.errors import InvalidError


def _make(url: str, *scopes: str, name: str = "test") -> tuple[uuid.UUID, str]:
    with session_scope(url) as session:
        row, plaintext = keys.create_key(session=session, name=name, scopes=scopes)
        return row.id, plaintext


def _authenticate(url: str, plaintext: str) -> keys.Principal | None:
    with session_scope(url) as session:
        return keys.authenticate(session=session, key=plaintext)


def test_a_key_is_stored_as_the_digest_of_its_secret(postgres_url: str) -> None:
    with session_scope(postgres_url) as session:
        row, plaintext = keys.create_key(
            session=session, name="ci", scopes=["train", "read", "train"]
        )
        marker, prefix, secret = plaintext.split("_", 2)
        assert (marker, prefix) == ("rs", row.prefix)
        assert row.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in (row.name, row.prefix, row.secret_sha256)
        assert row.scopes == ["read", "train"]  # sorted, once each
        assert row.revoked_at is None


@pytest.mark.parametrize("scopes", [(), ("read", "root")])
def test_unknown_or_no_scopes_are_refused(postgres_url: str, scopes: tuple[str, ...]) -> None:
    with session_scope(postgres_url) as session, pytest.raises(InvalidError) as refused:
        keys.create_key(session=session, name="bad", scopes=scopes)
    assert refused.value.field == ("body", "scopes")
    assert "scopes must be some of" in str(refused.value)


def test_a_key_authenticates_as_its_id_and_scopes(postgres_url: str) -> None:
    key_id, plaintext = _make(postgres_url, "read", "predict")
    principal = _authenticate(postgres_url, plaintext)
    assert principal == keys.Principal(key_id, frozenset({"read", "predict"}))


@pytest.mark.parametrize(
    "garble",
    [
        lambda key: key[:-1] + ("A" if key[-1] != "A" else "B"),  # a wrong secret
        lambda key: "xx" + key[2:],  # not an rs_ key
        lambda key: key.rsplit("_", 1)[0] + "_",  # no secret
        lambda key: "rs_" + "0" * 8 + key[11:],  # an unknown prefix
        lambda key: "",
    ],
)
def test_a_wrong_or_malformed_key_authenticates_as_no_one(
    postgres_url: str, garble: Callable[[str], str]
) -> None:
    _, plaintext = _make(postgres_url, "read")
    assert _authenticate(postgres_url, plaintext) is not None
    assert _authenticate(postgres_url, garble(plaintext)) is None


def test_a_revoked_key_no_longer_authenticates_and_keeps_its_revocation_time(
    postgres_url: str,
) -> None:
    key_id, plaintext = _make(postgres_url, "train")
    with session_scope(postgres_url) as session:
        revoked = keys.revoke_key(session=session, key_id=key_id)
        assert revoked is not None
        first = revoked.revoked_at
    assert first is not None
    assert _authenticate(postgres_url, plaintext) is None
    with session_scope(postgres_url) as session:
        again = keys.revoke_key(session=session, key_id=key_id)
        assert again is not None
        assert again.revoked_at == first
        assert keys.revoke_key(session=session, key_id=uuid.uuid4()) is None


def test_keys_are_listed_newest_first(postgres_url: str) -> None:
    older, _ = _make(postgres_url, "read", name="older")
    newer, _ = _make(postgres_url, "read", name="newer")
    with session_scope(postgres_url) as session:
        listed = [row.id for row in keys.list_keys(session=session)]
    assert listed.index(newer) < listed.index(older)


def test_an_admin_principal_holds_every_scope() -> None:
    admin = keys.Principal(uuid.uuid4(), frozenset({"admin"}))
    reader = keys.Principal(uuid.uuid4(), frozenset({"read"}))
    assert all(admin.allows(scope) for scope in keys.SCOPES)
    assert reader.allows("read")
    assert not reader.allows("train")
