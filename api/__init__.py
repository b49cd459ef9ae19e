"""The HTTP API (FastAPI): routers under /api/v1, auth, limits, prediction, the dashboard."""
