"""`keys create`, `keys list`, `keys revoke`: API keys, written straight to the database."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from core import keys
from core.db.session import session_scope
from core.errors import InvalidError
from core.settings import get_settings


def create_key(
    name: Annotated[str, typer.Option(help="Who or what the key is for.")],
    scope: Annotated[list[str], typer.Option(help="read, train, predict, admin (repeat).")],
) -> None:
    """Create an API key; it is printed this once and cannot be shown again."""
    with session_scope(get_settings().database_url) as session:
        try:
            row, plaintext = keys.create_key(session=session, name=name, scopes=scope)
        except InvalidError as error:
            raise typer.BadParameter(error.message, param_hint="--scope") from error
        typer.echo(f"created key {row.prefix} ({', '.join(row.scopes)}); store it now:", err=True)
    typer.echo(plaintext)


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
