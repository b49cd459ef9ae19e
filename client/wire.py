"""The words the service and its client share on the wire, declared once: where the API's
routes start, a job's statuses, an API key's scopes and the export formats.

This module imports nothing (of the product or outside it), so that the client installs
without the server's packages while the server (`api`, `core`) takes these declarations
from here instead of spelling them again: a status or scope added on one side is there on
the other. `tests/client/test_contract.py` holds the client's answer types against the
service's OpenAPI schema; `tests/test_layout.py` lets `api` and `core` import `client`
for this module alone.
"""

from __future__ import annotations

from typing import Literal, get_args

API_PREFIX = "/api/v1"  # where the service's routes start

# pruned: a search's trial its pruner stopped early (its checkpoint kept; retry resumes it).
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "pruned"]
JOB_STATUSES: tuple[JobStatus, ...] = get_args(JobStatus)
ACTIVE_STATUSES: tuple[JobStatus, ...] = ("queued", "running")
FINAL_STATUSES: tuple[JobStatus, ...] = ("succeeded", "failed", "cancelled", "pruned")
# A study's state takes the same words: queued or running while some job is unfinished, then
# succeeded (some job did), failed or cancelled.

Scope = Literal["read", "train", "predict", "admin"]  # admin holds every scope
SCOPES: tuple[Scope, ...] = get_args(Scope)

ExportFormat = Literal["onnx", "torchscript", "torch_export", "onnx_int8"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
