"""`keys create`, `keys list`, `keys revoke`: API keys, written straight to the database."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from client import Client, ClientError
from core import keys
from core.db.session import session_scope
from core.errors import InvalidError
from core.settings import Settings, get_settings


def create_key(
    name: Annotated[str, typer.Option(help="Who or what the key is for.")],
    scope: Annotated[list[str], typer.Option(help="read, train, predict, admin (repeat).")],
) -> None:
    """Create an API key; it is printed this once and cannot be shown again."""
    settings = get_settings()
    refusal = auth_off(settings)
    if refusal:
        typer.echo(
            f"error: {refusal}; turn auth on (AUTH_ENABLED=true), then create keys", err=True
        )
        raise typer.Exit(1)
    with session_scope(settings.database_url) as session:
        try:
            row, plaintext = keys.create_key(session=session, name=name, scopes=scope)
        except InvalidError as error:
            raise typer.BadParameter(error.message, param_hint="--scope") from error
        typer.echo(f"created key {row.prefix} ({', '.join(row.scopes)}); store it now:", err=True)
    typer.echo(plaintext)


def auth_off(settings: Settings) -> str | None:
    """Why keys should not be made now: auth is off here, or at the service (RESNET_URL)."""
    if not settings.auth_enabled:
        return "AUTH_ENABLED is false, so no key would be asked for"
    try:
        with Client(settings.client_url, settings.client_key, timeout=SESSION_PROBE_S) as client:
            answer = client.session()
    except (ClientError, ValueError):
        return None  # no service there (or not this one): nothing says auth is off
    if isinstance(answer, dict) and answer.get("auth_enabled") is False:
        return f"the service at {settings.client_url} runs with auth off (RESNET_URL)"
    return None


SESSION_PROBE_S = 2.0


def list_keys() -> None:
    """Every API key, without secrets."""
    table = Table(title="API keys")
    for column in ("id", "prefix", "name", "scopes", "created", "revoked"):
        table.add_column(column)
    with session_scope(get_settings().database_url) as session:
        for row in keys.list_keys(session=session):
            revoked = row.revoked_at.isoformat(" ", "seconds") if row.revoked_at else ""
            created = row.created_at.isoformat(" ", "seconds")
            table.add_row(str(row.id), row.prefix, row.name, ",".join(row.scopes), created, revoked)
    Console(width=None if Console().is_terminal else 160).print(table)


def revoke_key(key_id: Annotated[uuid.UUID, typer.Argument(help="The key's id.")]) -> None:
    """Revoke an API key at once."""
    with session_scope(get_settings().database_url) as session:
        row = keys.revoke_key(session=session, key_id=key_id)
    if row is None:
        typer.echo(f"error: no API key {key_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked key {row.prefix}")
