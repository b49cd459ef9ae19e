"""Migrations from code: upgrade to head, or check that a database is at head."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from core.db.session import get_engine

ROOT = Path(__file__).resolve().parents[2]


class SchemaOutdated(RuntimeError):  # noqa: N818 (reads as a state, like the message)
    """The database is not at the code's migration head."""


def _config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Run every migration up to head (`alembic upgrade head`)."""
    command.upgrade(_config(url), "head")


def check_current(url: str) -> None:
    """Refuse to go on when the database is not at head, saying how to migrate."""
    head = ScriptDirectory.from_config(_config(url)).get_current_head()
    with get_engine(url).connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if current != head:
        raise SchemaOutdated(
            f"database schema is at {current or 'nothing'}, the code needs {head}: "
            "run `resnet-service migrate` (or `alembic upgrade head`)"
        )
