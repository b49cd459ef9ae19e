"""Celery workers: claim a job, run its kind under a watchdog, record how it ended."""
