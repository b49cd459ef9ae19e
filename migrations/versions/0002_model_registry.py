"""model registry: registered models, their versions (job checkpoints) and aliases

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:03:59.500243
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('registered_model',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_registered_model')),
    sa.UniqueConstraint('name', name=op.f('uq_registered_model_name'))
    )
    op.create_table('model_version',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('checkpoint', sa.String(length=16), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_model_version_job_id_job'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['model_id'], ['registered_model.id'], name=op.f('fk_model_version_model_id_registered_model'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_version')),
    sa.UniqueConstraint('model_id', 'version', name=op.f('uq_model_version_model_id_version'))
    )
    op.create_table('model_alias',
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('alias', sa.String(length=64), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['registered_model.id'], name=op.f('fk_model_alias_model_id_registered_model'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['version_id'], ['model_version.id'], name=op.f('fk_model_alias_version_id_model_version'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('model_id', 'alias', name=op.f('pk_model_alias'))
    )


def downgrade() -> None:
    op.drop_table('model_alias')
    op.drop_table('model_version')
    op.drop_table('registered_model')
