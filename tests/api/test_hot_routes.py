"""The prediction routes are declared once: each FastAPI route marked `hot` is served by a
route matched ahead of every other, and the OpenAPI schema documents exactly those."""

from __future__ import annotations

from api.app import create_app
from api.hot_routes import HotRoute
from api.routers import inference, predict
from core.settings import Settings

HOT_PATHS = {
    "/api/v1/predict",
    "/v2/models/{name}/infer",
    "/v2/models/{name}/versions/{version}/infer",
}


def test_each_hot_route_comes_first_and_is_documented_by_its_one_declaration(
    settings: Settings,
) -> None:
    app = create_app(settings)
    routes = app.router.routes
    hot = [route for route in routes if isinstance(route, HotRoute)]
    assert {route.path for route in hot} == HOT_PATHS
    assert routes[: len(hot)] == hot  # matched before every other route
    assert {route.path: route.endpoint for route in hot} == {
        "/api/v1/predict": predict.predict,
        "/v2/models/{name}/infer": inference.infer,
        "/v2/models/{name}/versions/{version}/infer": inference.version_infer,
    }
    documented = app.openapi()["paths"]
    for path in HOT_PATHS:
        assert documented[path]["post"]["requestBody"]["required"] is True
