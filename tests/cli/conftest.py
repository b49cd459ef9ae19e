"""The command line's fixtures: the client tests run against the API tests' live service."""

from __future__ import annotations

from tests.api.conftest import broker, live_url, queue, settings

# Fixtures are found by name in the conftest.py files above a test; these are the API
# tests' own (a Redis database and a served app per module), shared rather than copied.
__all__ = ["broker", "live_url", "queue", "settings"]
