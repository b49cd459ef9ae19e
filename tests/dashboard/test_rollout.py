"""The models page's rollout: an alias's weights, stickiness and shadow, the shadow's
figures against the version it copies, the history, and promotion from the page."""

from __future__ import annotations

import uuid
from typing import Any, cast

import pytest
from playwright.sync_api import Dialog, Page, expect

from tests import images
from tests.dashboard.helpers import Server, screenshot, visit
from tests.helpers import TINY, trained_job, wait_for

pytestmark = pytest.mark.slow


def test_the_rollout_of_a_model_and_its_promotion(page: Page, server: Server) -> None:
    recipe = {**cast(dict[str, Any], TINY["recipe"]), "seed": 1}
    job, other = (
        trained_job(server.settings),
        trained_job(server.settings, {**TINY, "recipe": recipe}),
    )
    name = f"rollout-{uuid.uuid4().hex[:6]}"
    with server.client() as client:
        for made, checkpoint in ((job, "best"), (job, "last"), (other, "best")):
            body = {"job": str(made), "checkpoint": checkpoint}
            answer = client.post(f"/api/v1/registry/{name}/versions", json=body)
            assert answer.status_code == 201, answer.text
        state = {"weights": {"1": 90, "2": 10}, "sticky": True, "shadow": {"version": 3}}
        answer = client.put(f"/api/v1/registry/{name}/aliases/production", json=state)
        assert answer.status_code == 200, answer.text
        png = images.flat_png((30, 60, 90))
        for _ in range(4):
            served = client.post(
                "/api/v1/predict",
                params={"model": f"{name}@production"},
                files={"files": ("a.png", png, "image/png")},
            )
            assert served.status_code == 200, served.text
        wait_for(
            lambda: (
                sum(f["images"] for f in client.get(f"/api/v1/registry/{name}/shadow").json()) >= 4
                or None
            ),
            60,
            "the shadow's comparisons",
        )

    visit(page, server, "#/models")
    card = page.locator(f"[data-model='{name}']")
    row = card.locator("table[data-role=aliases] tr[data-alias=production]")
    expect(row.locator("[data-role=weights]")).to_have_text("v1 90 (90.00%) · v2 10 (10.00%)")
    expect(row.locator("[data-role=sticky]")).to_have_text("sticky")
    expect(row.locator("[data-role=shadow]")).to_have_text("v3 (100% copied)")
    # The versions' table tags each version with its share, and the shadow.
    versions = card.locator("table").first
    expect(versions.locator("tr[data-version='1']")).to_contain_text("production 90%")
    expect(versions.locator("tr[data-version='3']")).to_contain_text("production (shadow 100%)")
    figures = card.locator("table[data-role=shadow] tbody tr")
    expect(figures.first.locator("td").nth(1)).to_have_text("v3")
    compared = sum(
        int(figures.nth(n).locator("td").nth(2).inner_text()) for n in range(figures.count())
    )
    assert compared == 4
    expect(figures.first.locator("td").nth(3)).to_contain_text("%")
    card.locator("[data-role=history-panel] summary").click()
    history = card.locator("table[data-role=history] tbody tr")
    expect(history).to_have_count(4)  # three versions registered, one alias created
    expect(history.first).to_contain_text("alias.created production v1")
    expect(history.first).to_contain_text("v1=90 v2=10 sticky shadow v3:100%")
    screenshot(page, "rollout")

    def accept(dialog: Dialog) -> None:
        dialog.accept()

    page.once("dialog", accept)
    row.locator("button[data-action=promote][data-version='3']").click()
    expect(row.locator("[data-role=weights]")).to_have_text("v3")
    expect(row.locator("[data-role=shadow]")).to_have_text("\u2013")  # none
    expect(row.locator("button[data-action=promote]")).to_have_count(0)
