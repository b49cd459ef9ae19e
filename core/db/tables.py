"""ORM tables (SQLAlchemy 2.0). Alembic migrations in `migrations/` create them; nothing
else does. Snake_case singular names, `_at` timestamps, explicit constraint names.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from client.wire import ACTIVE_STATUSES as ACTIVE_STATUSES
from client.wire import FINAL_STATUSES as FINAL_STATUSES
from client.wire import JOB_STATUSES as JOB_STATUSES

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# Postgres-only GIN indexes of job.spec and job.tags as jsonb (migration 0008): expression
# indexes that autogenerate cannot compare, so migrations/env.py leaves them out of it.
SEARCH_INDEXES = ("ix_job_spec_jsonb", "ix_job_tags_jsonb")


def utcnow() -> datetime:
    """Timezone-aware now, in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp with its time zone, read back aware on every database: SQLite keeps no
    offset, so what it returns is the UTC that was written."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is None:
            return value
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON,
    }


def _idempotent(table: str) -> tuple[UniqueConstraint, Index]:
    """An Idempotency-Key is unique per owner, and once among the rows without an owner."""
    # Two constraints: a plain unique one lets NULL owners repeat a key (NULLs differ).
    anonymous = text("owner_key_id IS NULL")
    return (
        UniqueConstraint("owner_key_id", "idempotency_key"),
        Index(
            f"uq_{table}_idempotency_key_anonymous",
            "idempotency_key",
            unique=True,
            postgresql_where=anonymous,
            sqlite_where=anonymous,
        ),
    )


class Job(Base):
    """A train or evaluate job: its spec, where it is in its life, and its summary."""

    __tablename__ = "job"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    name: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    note: Mapped[str | None] = mapped_column(Text)  # free text, editable after the run
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    model_name: Mapped[str | None] = mapped_column(String(100))
    model_family: Mapped[str | None] = mapped_column(String(32))
    depth: Mapped[int | None] = mapped_column(Integer)
    dataset_name: Mapped[str | None] = mapped_column(String(100))
    # What the run read and ran on, written once its data is loaded (running jobs too):
    # the data's digest ("sha256:..."), its provenance record, and `training.environment`.
    data_digest: Mapped[str | None] = mapped_column(String(80))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    source_job_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("job.id", ondelete="SET NULL")
    )
    # Delivery and ownership: who runs it, until when, with which fencing token.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    fencing_token: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_expires_at: Mapped[datetime | None]
    worker: Mapped[str | None] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    # Progress and summary (the runs table reads these, never the metric table).
    step: Mapped[int] = mapped_column(Integer, default=0)
    total_steps: Mapped[int | None] = mapped_column(Integer)
    final_test_error: Mapped[float | None] = mapped_column(Double)
    best_test_error: Mapped[float | None] = mapped_column(Double)
    params: Mapped[int | None] = mapped_column(BigInteger)
    macs: Mapped[int | None] = mapped_column(BigInteger)
    wall_time_s: Mapped[float | None] = mapped_column(Double)
    images_per_s: Mapped[float | None] = mapped_column(Double)
    # jsonb on Postgres: a sort or filter by one of its keys reads that key (migration 0008).
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON().with_variant(JSONB, "postgresql"))
    # The bytes its files take as stored, exports aside (`core.usage`); None: not measured.
    artifact_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # The key that submitted it (None: auth off, or made before owners were kept); an
    # Idempotency-Key is unique per owner (`_idempotent`).
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    # A study's job: its study, its cell of the grid, and whether it waits for its turn
    # (a held job is queued but not on the broker: the study's max_parallel is reached).
    study_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("study.id", ondelete="CASCADE"))
    cell: Mapped[int | None] = mapped_column(Integer)
    held: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __table_args__ = (
        Index("ix_job_status_created_at", "status", "created_at"),
        Index("ix_job_created_at_id", "created_at", "id"),
        Index("ix_job_model_name", "model_name"),
        Index("ix_job_dataset_name", "dataset_name"),
        Index("ix_job_data_digest", "data_digest"),
        Index("ix_job_study_id_cell", "study_id", "cell"),
        *_idempotent("job"),
    )


class Study(Base):
    """A grid of train jobs (cells x seeds), or a search's trials, run and read as one
    experiment."""

    __tablename__ = "study"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    # The request as expanded: base spec, grid, seeds, and the preset it came from.
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    preset: Mapped[str | None] = mapped_column(String(64))
    # Each cell's axis values and the papers' number for it, in grid order.
    cells: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    metric: Mapped[str] = mapped_column(String(32))  # the aggregate the papers' numbers meet
    max_parallel: Mapped[int] = mapped_column(Integer)
    # A search's sampler (random, tpe): its cells are trials, asked for as jobs end.
    search: Mapped[str | None] = mapped_column(String(16))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = _idempotent("study")


class Metric(Base):
    """One point of one time series of a job; (job, name, step) is unique, written by upsert."""

    __tablename__ = "metric"

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Double)
    epoch: Mapped[float | None] = mapped_column(Double)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    # The value rides in the key's index on Postgres, so reading a sampled curve is an
    # index-only scan (migration 0003).
    __table_args__ = (PrimaryKeyConstraint("job_id", "name", "step", postgresql_include=["value"]),)


class Checkpoint(Base):
    """A checkpoint file of a job, with the sha256 it must have when loaded."""

    __tablename__ = "checkpoint"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    is_best: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_checkpoint_job_id_step", "job_id", "step"),)


class Event(Base):
    """A line of a job's log: status changes, warnings, errors."""

    __tablename__ = "event"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    level: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_event_job_id_id", "job_id", "id"),)


class ApiKey(Base):
    """An API key: only the sha256 of its secret is stored."""

    __tablename__ = "api_key"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class RegisteredModel(Base):
    """A named model in the registry; its versions point at job checkpoints."""

    __tablename__ = "registered_model"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # The key that registered its first version: only it (or an admin key) adds versions,
    # moves aliases and deletes them.
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ModelVersion(Base):
    """Version N of a registered model: one verified checkpoint of a succeeded job."""

    __tablename__ = "model_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("registered_model.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    # RESTRICT: a job cannot be deleted while a registered version serves its checkpoint.
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("job.id", ondelete="RESTRICT"))
    checkpoint: Mapped[str] = mapped_column(String(16))  # best | last
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(  # the key that registered it
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("model_id", "version"),)


class ModelExport(Base):
    """A registered version in a deployment format (onnx, torchscript, torch_export), as
    stored after its check against the eager net: where it lies, its sha256, how close."""

    __tablename__ = "model_export"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("model_version.id", ondelete="CASCADE"))
    format: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(Text)  # an artifact path or store key
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    # The check before storing: max |p_export - p_eager| over a batch, and its bound.
    max_abs_diff: Mapped[float] = mapped_column(Double)
    tolerance: Mapped[float] = mapped_column(Double)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # opset, batch, ...
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(  # the key that exported it
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("version_id", "format"),)


class ModelAlias(Base):
    """A movable name for one version (production, staging, ...)."""

    __tablename__ = "model_alias"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("registered_model.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The primary: the version of greatest weight (the only one of an unweighted alias).
    version_id: Mapped[int] = mapped_column(ForeignKey("model_version.id", ondelete="RESTRICT"))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    sticky: Mapped[bool] = mapped_column(Boolean, default=False)  # a caller keeps its version
    # A version that takes a copy of `shadow_percent` of the traffic, its answers compared only.
    shadow_version_id: Mapped[int | None] = mapped_column(
        ForeignKey("model_version.id", ondelete="RESTRICT")
    )
    shadow_percent: Mapped[int | None] = mapped_column(Integer)


class ModelAliasWeight(Base):
    """A version's share of a weighted alias's traffic (an unweighted alias has no rows)."""

    __tablename__ = "model_alias_weight"

    model_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("model_version.id", ondelete="RESTRICT"), primary_key=True
    )
    weight: Mapped[int] = mapped_column(Integer)

    __table_args__ = (
        ForeignKeyConstraint(
            ["model_id", "alias"],
            ["model_alias.model_id", "model_alias.alias"],
            ondelete="CASCADE",
        ),
    )


class ModelHistory(Base):
    """One change of a registered model (a version registered or deleted, an alias set,
    weighted, shadowed, promoted or removed): who, when, and its state before and after."""

    __tablename__ = "model_history"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_id: Mapped[int] = mapped_column(
        ForeignKey("registered_model.id", ondelete="CASCADE"), index=True
    )
    action: Mapped[str] = mapped_column(String(32))
    alias: Mapped[str | None] = mapped_column(String(64))
    version: Mapped[int | None] = mapped_column(Integer)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_key.id", ondelete="SET NULL"))
    key_name: Mapped[str | None] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Upload(Base):
    """Who uploaded a dataset archive (its files: `DATA_DIR/uploads/<sha256>/`, see
    `core.uploads`). The same archive sent by two keys is one folder and two rows."""

    __tablename__ = "upload"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64))  # the upload's id: its archive's sha256
    owner_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_key.id", ondelete="SET NULL")
    )
    files: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)  # unpacked, what the owner's quota counts
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("sha256", "owner_key_id"),
        Index("ix_upload_owner_key_id", "owner_key_id"),
    )


class Worker(Base):
    """A worker process group as it registered itself: where it runs, what it serves, and
    when its main process was last seen (a heartbeat); its name is its Celery node name."""

    __tablename__ = "worker"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    devices: Mapped[list[str]] = mapped_column(JSON)  # cpu, or the GPUs it owns: cuda:N
    queues: Mapped[list[str]] = mapped_column(JSON)
    current_job_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("job.id", ondelete="SET NULL")
    )
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)  # since it started
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_worker_last_seen_at", "last_seen_at"),)
