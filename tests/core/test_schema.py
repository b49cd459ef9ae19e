"""Migrations are reversible, and an outdated schema is refused with a way out."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect

from core.db import schema
from core.db.session import get_engine


def test_migrations_go_down_and_up_again(database_url: str) -> None:
    config = schema._config(database_url)
    command.downgrade(config, "base")
    assert "job" not in inspect(get_engine(database_url)).get_table_names()
    schema.upgrade(database_url)
    tables = set(inspect(get_engine(database_url)).get_table_names())
    assert {"job", "metric", "checkpoint", "event", "api_key", "model_version"} <= tables
    schema.check_current(database_url)


def test_an_outdated_schema_is_refused(database_url: str) -> None:
    command.downgrade(schema._config(database_url), "0001")
    with pytest.raises(schema.SchemaOutdated, match="run `resnet-service migrate`"):
        schema.check_current(database_url)
    schema.upgrade(database_url)


def test_the_tables_and_the_migrations_agree(database_url: str) -> None:
    # Raises when autogenerate would find a difference (a table changed without a migration).
    command.check(schema._config(database_url))
