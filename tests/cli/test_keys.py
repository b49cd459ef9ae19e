"""`resnet-service keys create|list|revoke` against the database (Postgres and SQLite)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from cli.main import app
from core.db.session import session_scope
from core.keys import authenticate, list_keys
from core.settings import Settings, get_settings
from tests.services import serve

runner = CliRunner()


@pytest.fixture
def database(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The commands' settings point at the module's database."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    yield database_url
    get_settings.cache_clear()


def test_create_list_revoke(database: str) -> None:
    created = runner.invoke(app, ["keys", "create", "--name", "ci", "--scope", "read"])
    assert created.exit_code == 0, created.output
    plaintext = created.stdout.strip()
    with session_scope(database) as session:
        principal = authenticate(session=session, key=plaintext)
    assert principal is not None
    assert principal.scopes == {"read"}
    listed = runner.invoke(app, ["keys", "list"])
    assert listed.exit_code == 0, listed.output
    assert str(principal.key_id) in listed.stdout
    revoked = runner.invoke(app, ["keys", "revoke", str(principal.key_id)])
    assert revoked.exit_code == 0, revoked.output
    with session_scope(database) as session:
        assert authenticate(session=session, key=plaintext) is None


def test_create_refuses_an_unknown_scope(database: str) -> None:
    with session_scope(database) as session:
        before = len(list_keys(session=session))
    result = runner.invoke(app, ["keys", "create", "--name", "ci", "--scope", "root"])
    assert result.exit_code == 2
    # The message as one line, out of the error panel that wraps it.
    message = " ".join(result.output.replace("│", " ").split())
    assert "--scope: scopes must be some of read, train, predict, admin; got ['root']" in message
    with session_scope(database) as session:
        assert len(list_keys(session=session)) == before


def test_revoke_names_a_missing_key(database: str) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    result = runner.invoke(app, ["keys", "revoke", missing])
    assert result.exit_code == 1
    assert f"no API key {missing}" in result.stderr


def test_create_refuses_while_auth_is_off_here(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTH_ENABLED", "false")
    get_settings.cache_clear()
    with session_scope(database) as session:
        before = len(list_keys(session=session))
    result = runner.invoke(app, ["keys", "create", "--name", "ci", "--scope", "admin"])
    assert result.exit_code == 1
    assert "AUTH_ENABLED is false" in result.stderr
    assert "turn auth on (AUTH_ENABLED=true)" in result.stderr
    with session_scope(database) as session:
        assert len(list_keys(session=session)) == before


def test_create_refuses_while_the_service_runs_with_auth_off(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` on 127.0.0.1 turns auth off for its API only: the command asks the service."""
    from api.app import create_app  # here: the other tests of this module serve no API

    served = Settings(database_url=database, auth_enabled=False)
    with serve(create_app(served)) as url:
        monkeypatch.setenv("RESNET_URL", url)
        get_settings.cache_clear()
        result = runner.invoke(app, ["keys", "create", "--name", "ci", "--scope", "admin"])
    assert result.exit_code == 1
    assert f"the service at {url} runs with auth off" in result.stderr
