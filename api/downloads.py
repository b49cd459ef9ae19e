"""Stored files sent to a client: streamed from an open, verified file, with their sha256.

A download reads the file once to check it against the database's sha256 and once to send
it, from the same open file (never whole into memory): a file replaced or damaged in the
store is refused (409), never sent. The headers carry the checksum twice: plainly, and as
an RFC 9530 `Repr-Digest` that HTTP tools can check.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from fastapi.responses import StreamingResponse

from api.errors import STORE_UNAVAILABLE, StoreDownError
from core import exports
from core.errors import ConflictError
from core.settings import Settings
from core.storage import StoreUnavailableError
from training.checkpoints import CheckpointError

CHECKSUM_HEADER = "X-Checksum-Sha256"
CHUNK_BYTES = 1024 * 1024
OCTETS = "application/octet-stream"


def opened(settings: Settings, path: str, sha256: str, what: str) -> BinaryIO:
    """The stored file of `what` (a checkpoint, an export), open and verified; else 409 or
    503."""
    try:
        return exports.open_verified(settings, path, sha256)
    except StoreUnavailableError as error:
        raise StoreDownError(f"{STORE_UNAVAILABLE} ({what} was not fetched)") from error
    except CheckpointError as error:
        raise ConflictError(f"{what} cannot be sent: {error}") from error


def streamed(handle: BinaryIO, *, sha256: str, filename: str) -> StreamingResponse:
    """An open file's bytes as an attachment called `filename`, with its size and sha256."""
    digest = base64.b64encode(bytes.fromhex(sha256)).decode()
    headers = {
        "Content-Length": str(os.fstat(handle.fileno()).st_size),
        "Content-Disposition": f'attachment; filename="{filename}"',
        CHECKSUM_HEADER: sha256,
        "Repr-Digest": f"sha-256=:{digest}:",
    }
    return StreamingResponse(_chunks(handle), media_type=OCTETS, headers=headers)


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    """The file's bytes a chunk at a time; closed at the end (or when the client leaves)."""
    with handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


def file_responses(what: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI entry of a download's 200."""
    return {
        200: {
            "description": f"{what}'s bytes; its sha256 in `{CHECKSUM_HEADER}` and `Repr-Digest`.",
            "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}},
        }
    }
