"""The predict page's Grad-CAM: a toggle asks the API once and lays the heatmap over the
image, naming the class explained; a slider sets its opacity."""

from __future__ import annotations

import pytest
from playwright.sync_api import FilePayload, Page, expect

from tests import images
from tests.dashboard.helpers import Server, screenshot, visit
from tests.helpers import trained_job

pytestmark = pytest.mark.slow


def test_the_heatmap_is_laid_over_the_uploaded_image(page: Page, server: Server) -> None:
    source = trained_job(server.settings)  # ResNet-8 on 8x8 RGB
    visit(page, server, f"#/predict?model={source}")
    png = images.flat_png((200, 30, 30))
    chosen: FilePayload = {"name": "red.png", "mimeType": "image/png", "buffer": png}
    page.set_input_files("input[name=files]", files=[chosen])
    card = page.locator(".pred[data-file='red.png']")
    expect(card.locator(".top-class")).to_be_visible(timeout=60_000)  # the model starts
    top = card.locator(".top-class").get_attribute("data-label")
    with page.expect_response(lambda r: "/api/v1/explain" in r.url, timeout=60_000) as explained:
        card.locator("input[name=explain]").check()
    assert explained.value.status == 200
    said = card.locator(".explained")
    expect(said).to_contain_text("explains", timeout=60_000)  # its explain process starts
    expect(said).to_contain_text("layer3")
    assert said.get_attribute("data-label") == top  # the top class is the one explained
    canvas = card.locator("canvas.heatmap")
    expect(canvas).to_be_visible()
    size = canvas.evaluate("c => [c.width, c.height]")
    assert size == [8, 8]  # the net's input
    drawn = canvas.evaluate(
        "c => Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)"
    )
    assert len(drawn) == 8 * 8 * 4
    assert max(drawn[3::4]) == 255  # opaque colours, shown through the canvas's opacity
    assert canvas.evaluate("c => c.style.opacity") == "0.5"
    card.locator("input[name=opacity]").fill("0.8")
    assert canvas.evaluate("c => c.style.opacity") == "0.8"
    card.locator("input[name=explain]").uncheck()
    expect(canvas).to_be_hidden()
    screenshot(page, "predict-explain")
