"""Rollouts in the registry, on Postgres and SQLite: weighted aliases, sticky and shadow,
promotion, the history of every change, and the migration that brings them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect
from sqlalchemy.orm import Session

from core import model_registry
from core.db import schema
from core.db.session import get_engine, session_scope
from core.errors import ConflictError, InvalidError, NotFoundError
from core.owners import ANYONE, Caller
from tests.helpers import caller_of, recorded_job


def _model(url: str, versions: int = 4) -> str:
    """A new model of `versions` versions (1..versions), each of its own job."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    made = [recorded_job(url) for _ in range(versions)]  # before the session: SQLite's lock
    with session_scope(url) as session:
        for job in made:
            model_registry.register(session=session, name=name, job_id=job)
    return name


def _set(url: str, name: str, caller: Caller = ANYONE, **state: Any) -> model_registry.AliasState:
    with session_scope(url) as session:
        return model_registry.set_alias(
            session=session, name=name, alias="production", caller=caller, **state
        )


def _resolve(url: str, ref: str) -> model_registry.Resolved:
    with session_scope(url) as session:
        return model_registry.resolve(session=session, ref=ref)


def test_a_weighted_alias_resolves_to_its_versions_and_their_bounds(database_url: str) -> None:
    name = _model(database_url)
    state = _set(database_url, name, weights={3: 10, 2: 90}, sticky=True, shadow=(4, 25))
    assert (state.version, state.weights, state.sticky, state.shadow) == (
        2,
        {2: 90, 3: 10},
        True,
        (4, 25),
    )
    target = _resolve(database_url, f"{name}@production")
    assert target.version == 2  # the primary: the version of greatest weight
    assert target.rollout is not None
    assert [arm.version for arm in target.rollout.arms] == [2, 3]  # oldest first
    assert target.rollout.bounds == (90, 100)
    assert target.rollout.sticky
    assert target.rollout.alias == "production"
    assert all(arm.ref == f"{name}@production" for arm in target.rollout.arms)
    assert all(
        arm.shadow is not None and arm.shadow.target.version == 4 for arm in target.rollout.arms
    )
    assert target.shadow is not None
    assert target.shadow.percent == 25
    # One version (as before): no rollout to choose from, and no cost of one.
    _set(database_url, name, version=3)
    plain = _resolve(database_url, f"{name}@production")
    assert (plain.version, plain.rollout, plain.shadow) == (3, None, None)
    with session_scope(database_url) as session:
        (only,) = model_registry.aliases_of(session=session, model_ids=[_id(session, name)])[
            _id(session, name)
        ]
        assert (only.weights, only.sticky, only.shadow) == ({3: 100}, False, None)


def _id(session: Session, name: str) -> int:
    return model_registry.get_model(session=session, name=name).id


@pytest.mark.parametrize(
    ("state", "error", "message"),
    [
        ({"weights": {1: 90, 9: 10}}, NotFoundError, "has no version 9"),
        ({"weights": {1: 90, 2: 0}}, InvalidError, "the weight of version 2 is 0"),
        ({"weights": {1: -5}}, InvalidError, "a weight is an integer from 1"),
        ({"weights": {n: 1 for n in range(1, 12)}}, InvalidError, "between 1 and 10"),
        ({"weights": {}}, InvalidError, "between 1 and 10"),
        ({"version": 1, "weights": {1: 1}}, InvalidError, "either version or weights"),
        ({"version": 1, "shadow": (1, 50)}, InvalidError, "serves through the alias already"),
        ({"version": 1, "shadow": (2, 0)}, InvalidError, "percent is 0"),
        ({"version": 1, "shadow": (7, 50)}, NotFoundError, "has no version 7"),
    ],
)
def test_a_wrong_state_is_refused_and_changes_nothing(
    database_url: str, state: dict[str, Any], error: type[Exception], message: str
) -> None:
    name = _model(database_url, versions=2)
    _set(database_url, name, version=2)
    with pytest.raises(error, match=message):
        _set(database_url, name, **state)
    assert _resolve(database_url, f"{name}@production").version == 2


def test_versions_in_a_rollout_or_its_shadow_are_not_deleted(database_url: str) -> None:
    name = _model(database_url)
    _set(database_url, name, weights={1: 50, 2: 50}, shadow=(3, 100))
    for version in (1, 2, 3):
        with (
            session_scope(database_url) as session,
            pytest.raises(ConflictError, match="production"),
        ):
            model_registry.delete_version(session=session, name=name, version=version)
    with session_scope(database_url) as session:
        model_registry.delete_version(session=session, name=name, version=4)
    # Removing the alias removes its weights: then every version may go.
    with session_scope(database_url) as session:
        model_registry.delete_alias(session=session, name=name, alias="production")
    with session_scope(database_url) as session:
        for version in (1, 2, 3):
            model_registry.delete_version(session=session, name=name, version=version)


def test_promotion_serves_one_version_alone_and_only_a_candidate(database_url: str) -> None:
    name = _model(database_url)
    _set(database_url, name, weights={1: 90, 2: 10}, sticky=True, shadow=(3, 50))
    with session_scope(database_url) as session, pytest.raises(ConflictError, match="not in"):
        model_registry.promote(session=session, name=name, alias="production", version=4)
    with session_scope(database_url) as session, pytest.raises(NotFoundError, match="no alias"):
        model_registry.promote(session=session, name=name, alias="staging", version=1)
    with session_scope(database_url) as session:
        state = model_registry.promote(session=session, name=name, alias="production", version=3)
    assert (state.version, state.weights, state.sticky, state.shadow) == (3, {3: 100}, False, None)
    target = _resolve(database_url, f"{name}@production")
    assert (target.version, target.rollout, target.shadow) == (3, None, None)


def test_every_change_is_in_the_history_with_who_and_before_after(database_url: str) -> None:
    name = f"h-{uuid.uuid4().hex[:8]}"
    caller = caller_of(database_url, "train")
    made = [recorded_job(database_url, owner=caller.owner) for _ in range(3)]
    with session_scope(database_url) as session:
        for job in made:
            model_registry.register(session=session, name=name, job_id=job, caller=caller)
    _set(database_url, name, caller, version=1)
    _set(database_url, name, caller, version=2)
    _set(database_url, name, caller, weights={2: 90, 3: 10})
    _set(database_url, name, caller, weights={2: 90, 3: 10}, shadow=(1, 20))
    with session_scope(database_url) as session:
        model_registry.promote(
            session=session, name=name, alias="production", version=3, caller=caller
        )
        model_registry.delete_alias(session=session, name=name, alias="production", caller=caller)
        model_registry.delete_version(session=session, name=name, version=1, caller=caller)
    with session_scope(database_url) as session:
        rows = model_registry.history(session=session, name=name, caller=caller)
        actions = [row.action for row in rows]
        assert actions == [
            "version.deleted",
            "alias.deleted",
            "alias.promoted",
            "alias.shadow",
            "alias.weights",
            "alias.moved",
            "alias.created",
            "version.registered",
            "version.registered",
            "version.registered",
        ]
        assert {row.key_id for row in rows} == {caller.owner}
        assert all(row.key_name and row.key_name.startswith("test") for row in rows), [
            r.key_name for r in rows
        ]
        weights = rows[4]
        assert weights.before == {"weights": {"2": 100}, "sticky": False, "shadow": None}
        assert weights.after == {"weights": {"2": 90, "3": 10}, "sticky": False, "shadow": None}
        assert rows[3].after is not None
        assert rows[3].after["shadow"] == {
            "version": 1,
            "percent": 20,
        }
        assert rows[2].after == {"weights": {"3": 100}, "sticky": False, "shadow": None}
        assert rows[0].version == 1
        assert rows[1].after is None


def test_the_rollout_tables_arrive_on_0012_and_leave_on_its_downgrade(database_url: str) -> None:
    config = schema._config(database_url)
    command.downgrade(config, "0011")
    engine = get_engine(database_url)
    assert not {"model_alias_weight", "model_history"} & set(inspect(engine).get_table_names())
    assert "sticky" not in {c["name"] for c in inspect(engine).get_columns("model_alias")}
    schema.upgrade(database_url)
    engine = get_engine(database_url)
    assert {"model_alias_weight", "model_history"} <= set(inspect(engine).get_table_names())
    columns = {c["name"] for c in inspect(engine).get_columns("model_alias")}
    assert {"sticky", "shadow_version_id", "shadow_percent"} <= columns
    schema.check_current(database_url)
