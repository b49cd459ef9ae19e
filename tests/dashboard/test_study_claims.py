"""The study page's claims table and interval column, in headless Chromium against the real
API and Postgres, on a cifar_depth study run by hand with made-up errors."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.dashboard.helpers import Server, visit
from tests.dashboard.test_studies import _create, _finish_all

pytestmark = pytest.mark.slow


def test_a_preset_study_shows_its_claims_with_verdicts_and_intervals(
    page: Page, server: Server
) -> None:
    body = {"preset": "cifar_depth", "dataset": {"name": "fashion_mnist"}, "seeds": 3}
    study = _create(server, body)
    _finish_all(server, study["id"])
    visit(page, server, f"#/studies/{study['id']}")
    expect(page.locator("h1 .status")).to_have_text("succeeded")
    rows = page.locator("#claims-table tbody tr")
    expect(rows).to_have_count(3)  # the quick scale's 4 depths: 3 orderings
    expect(rows.first.locator("td").first).to_have_text("resnet56 < resnet44 in final test error")
    verdicts = rows.locator("[data-verdict]")
    expect(verdicts).to_have_count(3)
    for text in verdicts.all_inner_texts():
        assert text in {"reproduced", "contradicted", "inconclusive"}
    first = page.locator("#study-table tbody tr").first.locator("[data-col=median_ci]")
    expect(first).to_have_text("52.60\N{EN DASH}56.60")  # 3 seeds 0.02 apart: their range
