"""Migrations are reversible, and an outdated schema is refused with a way out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import JSON, Connection, Uuid, column, delete, inspect, select, table, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import ColumnClause

from core.db import schema
from core.db.session import get_engine
from core.db.tables import Job, ModelVersion, RegisteredModel


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


def _insert(connection: Connection, into: str, **values: object) -> None:
    """Insert one row into table `into` as the schema of the moment has it."""

    def typed(key: str, value: object) -> ColumnClause[object]:
        kind = (
            Uuid()
            if isinstance(value, uuid.UUID)
            else JSON()
            if isinstance(value, list | dict)
            else None
        )
        return column(key, kind)

    connection.execute(table(into, *(typed(k, v) for k, v in values.items())).insert(), values)


def test_owners_arrive_on_a_database_of_0004(database_url: str) -> None:
    config = schema._config(database_url)
    command.downgrade(config, "0004")
    key, anonymous_job, keyed_job = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    job = {"kind": "train", "status": "succeeded", "tags": [], "spec": {}, "attempt": 1}
    job |= {"max_attempts": 3, "fencing_token": 1, "cancel_requested": False, "step": 0}
    job |= {"created_at": now, "updated_at": now}
    with get_engine(database_url).begin() as connection:
        _insert(connection, "api_key", id=key, name="old", prefix="k0004", scopes=["train"],
                secret_sha256="0" * 64, created_at=now)  # fmt: skip
        _insert(connection, "job", **job, id=anonymous_job, idempotency_key="same")
        _insert(connection, "job", **job, id=keyed_job, idempotency_key="k", owner_key_id=key)
        _insert(connection, "registered_model", name="old", created_at=now)
        model_id = connection.scalar(text("SELECT id FROM registered_model"))
        _insert(connection, "model_version", model_id=model_id, version=1, job_id=keyed_job,
                checkpoint="best", step=1, path="p", sha256="0" * 64, created_at=now)  # fmt: skip
    schema.upgrade(database_url)
    schema.check_current(database_url)
    with Session(get_engine(database_url)) as session:
        model = session.scalars(select(RegisteredModel)).one()
        version = session.scalars(select(ModelVersion)).one()
        assert (model.owner_key_id, version.owner_key_id) == (None, None)
        jobs = {row.id: row for row in session.scalars(select(Job))}
        assert jobs[anonymous_job].owner_key_id is None
        assert (jobs[keyed_job].owner_key_id, jobs[keyed_job].idempotency_key) == (key, "k")
        # A key is unique per owner now: another owner may reuse one, no owner may not.
        session.add(Job(**_spec_of(jobs[keyed_job]), idempotency_key="same", owner_key_id=key))
        session.commit()
        session.add(Job(**_spec_of(jobs[keyed_job]), idempotency_key="same"))
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        session.add(Job(**_spec_of(jobs[keyed_job]), idempotency_key="k", owner_key_id=key))
        with pytest.raises(IntegrityError):
            session.commit()
        session.rollback()
        session.execute(delete(RegisteredModel))
        session.execute(delete(Job))
        session.commit()


def _spec_of(job: Job) -> dict[str, object]:
    return {"kind": job.kind, "status": "queued", "tags": [], "spec": job.spec}


def test_the_run_record_arrives_on_0009_and_leaves_on_its_downgrade(database_url: str) -> None:
    config = schema._config(database_url)
    command.downgrade(config, "0008")
    assert "data_digest" not in {
        c["name"] for c in inspect(get_engine(database_url)).get_columns("job")
    }
    schema.upgrade(database_url)
    engine = get_engine(database_url)
    columns = {c["name"] for c in inspect(engine).get_columns("job")}
    assert {"data_digest", "data", "environment"} <= columns
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("job")}
    assert indexes["ix_job_data_digest"] == ["data_digest"]
    command.downgrade(config, "0008")
    columns = {c["name"] for c in inspect(get_engine(database_url)).get_columns("job")}
    assert not {"data_digest", "data", "environment"} & columns
    schema.upgrade(database_url)
    schema.check_current(database_url)
