"""`GET /whoami`: the caller's scopes; its first name, `/session`, still answers alike."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api.schemas import API_PREFIX as API


def test_whoami_gives_the_keys_scopes_and_the_old_path_answers_alike(
    client: TestClient, anonymous: TestClient
) -> None:
    mine = client.get(f"{API}/whoami")
    assert mine.json() == {"auth_enabled": True, "scopes": ["read", "train"]}
    assert client.get(f"{API}/session").json() == mine.json()
    assert anonymous.get(f"{API}/whoami").status_code == 401
    assert anonymous.get(f"{API}/session").status_code == 401


def test_only_whoami_is_in_the_schema(anonymous: TestClient) -> None:
    paths = anonymous.get("/openapi.json").json()["paths"]
    assert f"{API}/whoami" in paths
    assert f"{API}/session" not in paths
