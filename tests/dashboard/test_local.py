"""The dashboard of a service with auth off, as `resnet-service up` serves it on 127.0.0.1:
its own changes pass the edge's Origin check, another site's do not."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import func, select

from core.db.session import session_scope
from core.db.tables import Job
from core.settings import Settings
from tests.dashboard.helpers import Server, visit


@pytest.fixture(scope="module")
def settings(settings: Settings) -> Settings:
    """The module's settings with auth off."""
    return settings.model_copy(update={"auth_enabled": False})


def _jobs(url: str) -> int:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def test_with_auth_off_the_new_job_form_submits(page: Page, server: Server) -> None:
    before = _jobs(server.settings.database_url)
    visit(page, server, "#/new")
    page.fill("input[name=model]", "resnet8")
    page.click("#submit-job")
    page.wait_for_url("**#/runs?new=*")
    assert _jobs(server.settings.database_url) == before + 1
    # The same request from another site's page is refused.
    foreign = httpx.post(
        f"{server.url}/api/v1/jobs",
        json={"kind": "train", "model": {"name": "resnet8"}, "dataset": {"name": "digits"}},
        headers={"Origin": "http://attacker.example"},
        timeout=60,
    )
    assert foreign.status_code == 403
    assert _jobs(server.settings.database_url) == before + 1
    expect(page.locator("body")).not_to_contain_text("another site")
