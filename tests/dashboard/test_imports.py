"""The models page imports weights: a file sent from the form becomes a version whose row
says what it was imported from; a file that does not fit the net is refused in place."""

from __future__ import annotations

from pathlib import Path

import torch
from playwright.sync_api import Page, expect
from safetensors.torch import save_file

import models
from tests.dashboard.helpers import Server, visit


def test_the_import_form_adds_a_version_that_names_its_file(
    page: Page, server: Server, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    path = tmp_path / "cifar-r20.safetensors"
    save_file(models.build("resnet20", num_classes=10).state_dict(), path)
    visit(page, server, "#/models")
    form = page.locator("#import-form")
    form.locator("input[name=file]").set_input_files(str(path))
    form.locator("input[name=name]").fill("dashboard-imported")
    form.locator("input[name=architecture]").fill("resnet20")
    form.locator("button[type=submit]").click()
    row = page.locator("[data-model='dashboard-imported'] tr[data-version='1']")
    expect(row.locator("[data-role=imported]")).to_contain_text(
        "cifar-r20.safetensors (safetensors, 116 keys)"
    )
    expect(row).to_contain_text("resnet20")

    form = page.locator("#import-form")
    form.locator("input[name=file]").set_input_files(str(path))
    form.locator("input[name=name]").fill("dashboard-imported")
    form.locator("input[name=architecture]").fill("resnet32")
    form.locator("button[type=submit]").click()
    expect(form.locator("[data-role=import-status]")).to_contain_text("missing")
    expect(page.locator("[data-model='dashboard-imported'] tbody tr")).to_have_count(1)
