"""A fine-tune through a real worker: a train job started from a registered version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from api.routers.model_registry import _version_out
from core import jobs, model_registry
from core.db.session import session_scope
from core.errors import InvalidError
from core.kinds import TrainJobSpec
from tests.helpers import checkpoint_rows, job, messages, recipe, submit, train_spec, wait_status
from tests.services import Service, make_settings
from training import checkpoints

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(
    postgres_url: str, redis_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """One worker on Postgres and Redis: the jobs here run one after another."""
    root = tmp_path_factory.mktemp("service")
    running = Service(make_settings(postgres_url, redis_broker_url, root), root)
    try:
        running.start("w1")
        yield running
    finally:
        running.stop()


def _fine_tune(source: str, model: str = "resnet8") -> TrainJobSpec:
    return TrainJobSpec.model_validate(
        {
            "model": {"name": model},
            "dataset": {"name": "digits", "validation": 0},
            "recipe": recipe(1),
            "init": {"source": source, "head": "reset", "freeze": ["stem"], "backbone_lr": 0.5},
        }
    )


def test_a_fine_tune_of_a_registered_version_runs_and_shows_its_lineage(service: Service) -> None:
    url, settings = service.url, service.settings
    base_id = submit(settings, train_spec(epochs=2))
    wait_status(url, base_id, "succeeded")
    with session_scope(url) as session:
        base = model_registry.register(session=session, name="digits-base", job_id=base_id)
        base_sha256, base_path, base_step = base.sha256, base.path, base.step
        model_registry.set_alias(session=session, name="digits-base", alias="prod", version=1)

    tuned_id = submit(settings, _fine_tune("digits-base@prod"))
    tuned = wait_status(url, tuned_id, "succeeded", timeout=120)
    assert tuned.source_job_id == base_id
    pinned = tuned.spec["init"]["resolved"]
    assert pinned["job_id"] == str(base_id)
    assert (pinned["model"], pinned["version"], pinned["step"]) == ("digits-base", 1, base_step)
    assert (pinned["sha256"], pinned["path"]) == (base_sha256, base_path)
    line = next(m for m in messages(url, tuned_id) if m.startswith("fine-tuning from"))
    origin = f"digits-base@prod (digits-base/1, job {base_id}, step {base_step})"
    assert line.startswith(f"fine-tuning from {origin}")
    assert "(head replaced: 10 -> 10 classes; frozen: stem; backbone lr x0.5;" in line

    # The frozen stem is the registered version's, bit for bit.
    last = checkpoints.load(Path(checkpoint_rows(url, tuned_id)[-1].path))
    source = checkpoints.load(Path(base_path), sha256=base_sha256)
    assert torch.equal(last["model"]["conv1.weight"], source["model"]["conv1.weight"])
    assert not torch.equal(last["model"]["fc.weight"], source["model"]["fc.weight"])
    assert last["spec"]["init"]["head"] == "reset"

    with session_scope(url) as session:
        version = model_registry.register(session=session, name="digits-tuned", job_id=tuned_id)
        shown = _version_out(version, job(url, tuned_id))
    assert shown.fine_tuned_from is not None
    assert shown.fine_tuned_from.model_dump() == {
        "job_id": base_id,
        "model": "digits-base",
        "version": 1,
    }


def test_an_unknown_reference_or_another_net_is_refused(service: Service) -> None:
    with session_scope(service.url) as session:
        with pytest.raises(InvalidError) as unknown:
            jobs.create(
                session=session,
                settings=service.settings,
                spec=_fine_tune("no-such-model/3"),
                max_attempts=1,
            )
        assert "init.source 'no-such-model/3'" in unknown.value.message
        assert unknown.value.field == ("body", "init", "source")
        session.rollback()


def test_another_net_than_the_sources_is_refused(service: Service) -> None:
    url, settings = service.url, service.settings
    base_id = submit(settings, train_spec(epochs=1))
    wait_status(url, base_id, "succeeded")
    with session_scope(url) as session:
        with pytest.raises(InvalidError, match=r"model resnet14 is not the net of init\.source"):
            jobs.create(
                session=session,
                settings=settings,
                spec=_fine_tune(str(base_id), "resnet14"),
                max_attempts=1,
            )
        session.rollback()
