"""Alembic environment: the URL is the service's DATABASE_URL (or one passed in)."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import create_engine

from core.db.tables import SEARCH_INDEXES, Base
from core.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().database_url


def include_object(
    item: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Whether autogenerate compares `item`: not the job search's expression indexes."""
    return not (type_ == "index" and name in SEARCH_INDEXES)


def run_offline() -> None:
    context.configure(
        url=url, target_metadata=Base.metadata, literal_binds=True, include_object=include_object
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        # SQLite alters tables by copying them ("batch" mode).
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
