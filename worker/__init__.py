"""Celery workers: filled by the service issue; nothing here yet."""
