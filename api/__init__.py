"""HTTP API (FastAPI): filled by the service issue; nothing here yet."""
