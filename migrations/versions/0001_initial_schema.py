"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 15:22:12.958978
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_key',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('secret_sha256', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_key')),
    sa.UniqueConstraint('prefix', name=op.f('uq_api_key_prefix'))
    )
    op.create_table('job',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('model_name', sa.String(length=100), nullable=True),
    sa.Column('model_family', sa.String(length=32), nullable=True),
    sa.Column('depth', sa.Integer(), nullable=True),
    sa.Column('dataset_name', sa.String(length=100), nullable=True),
    sa.Column('source_job_id', sa.Uuid(), nullable=True),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('fencing_token', sa.BigInteger(), nullable=False),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('device', sa.String(length=64), nullable=True),
    sa.Column('cancel_requested', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('total_steps', sa.Integer(), nullable=True),
    sa.Column('final_test_error', sa.Double(), nullable=True),
    sa.Column('best_test_error', sa.Double(), nullable=True),
    sa.Column('params', sa.BigInteger(), nullable=True),
    sa.Column('macs', sa.BigInteger(), nullable=True),
    sa.Column('wall_time_s', sa.Double(), nullable=True),
    sa.Column('images_per_s', sa.Double(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=True),
    sa.Column('idempotency_key', sa.String(length=200), nullable=True),
    sa.Column('owner_key_id', sa.Uuid(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['owner_key_id'], ['api_key.id'], name=op.f('fk_job_owner_key_id_api_key'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['source_job_id'], ['job.id'], name=op.f('fk_job_source_job_id_job'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_job_idempotency_key'))
    )
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_created_at_id', ['created_at', 'id'], unique=False)
        batch_op.create_index('ix_job_dataset_name', ['dataset_name'], unique=False)
        batch_op.create_index('ix_job_model_name', ['model_name'], unique=False)
        batch_op.create_index('ix_job_status_created_at', ['status', 'created_at'], unique=False)

    op.create_table('checkpoint',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('epoch', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('is_best', sa.Boolean(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_checkpoint_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_checkpoint'))
    )
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.create_index('ix_checkpoint_job_id_step', ['job_id', 'step'], unique=False)

    op.create_table('event',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('level', sa.String(length=16), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_event_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_event'))
    )
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.create_index('ix_event_job_id_id', ['job_id', 'id'], unique=False)

    op.create_table('metric',
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.Column('epoch', sa.Double(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_metric_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'name', 'step', name=op.f('pk_metric'))
    )


def downgrade() -> None:
    op.drop_table('metric')
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.drop_index('ix_event_job_id_id')

    op.drop_table('event')
    with op.batch_alter_table('checkpoint', schema=None) as batch_op:
        batch_op.drop_index('ix_checkpoint_job_id_step')

    op.drop_table('checkpoint')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_status_created_at')
        batch_op.drop_index('ix_job_model_name')
        batch_op.drop_index('ix_job_dataset_name')
        batch_op.drop_index('ix_job_created_at_id')

    op.drop_table('job')
    op.drop_table('api_key')
