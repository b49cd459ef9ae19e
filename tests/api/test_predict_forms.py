"""The predict route's one-pass split of small multipart bodies agrees with Starlette's form
parser wherever it answers, and leaves every other body to that parser."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import Message

from api.routers.predict import _form_boundary, _split_files

Files = list[tuple[str, bytes]]


def parsed(body: bytes, content_type: str) -> tuple[Files, list[str]] | None:
    """Starlette's reading of a body: the `files` uploads and the other fields' names (None:
    it refused the body)."""
    headers = [(b"content-type", content_type.encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    messages = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive() -> Message:
        return next(messages, {"type": "http.disconnect"})

    async def read() -> tuple[Files, list[str]] | None:
        try:
            async with Request(scope, receive).form() as form:
                files = [
                    (item.filename or "", item.file.read())
                    for item in form.getlist("files")
                    if isinstance(item, UploadFile)
                ]
                others = [
                    key
                    for key, value in form.multi_items()
                    if key != "files" or not isinstance(value, UploadFile)
                ]
                return files, others
        except Exception:  # the parser's refusal, whatever it is
            return None

    return asyncio.run(read())


def quick(body: bytes, content_type: str) -> Files | None:
    boundary = _form_boundary(content_type)
    return None if boundary is None else _split_files(body, boundary)


DATA = b"data\r\n--notboundary" + bytes(range(256))
NAMES = ["a.png", "my file.png", "ünï.png", 'q"uote.png', "semi;colon.png", "", "back\\slash.png"]


@pytest.mark.parametrize(
    "fields",
    [
        *({"files": [("files", (name, DATA, "image/png"))]} for name in NAMES),
        {"files": [("files", ("x" * 300, DATA, "image/png"))]},
        {"files": [("files", ("empty.png", b"", "image/png"))]},
        {"files": [("files", (f"{i}.png", bytes([i]) * i, "image/png")) for i in range(20)]},
        {"files": [("files", ("a.png", b"abc", "image/png"))], "data": {"other": "x"}},
        {"files": [("other", ("a.png", b"abc", "image/png"))]},
        {"files": [("files", ("a.png", b"abc"))]},
    ],
)
def test_a_client_built_form_splits_as_the_parser_reads_it(fields: dict[str, Any]) -> None:
    request = httpx.Request("POST", "http://test/", files=fields["files"], data=fields.get("data"))
    body, content_type = request.read(), request.headers["content-type"]
    split = quick(body, content_type)
    if split is not None:
        assert parsed(body, content_type) == (split, [])


B = "multipart/form-data; boundary=B"
PART = b'--B\r\nContent-Disposition: form-data; name="files"; filename="a.png"\r\n\r\nabc'


@pytest.mark.parametrize(
    ("body", "content_type", "split"),
    [
        (PART + b"\r\n--B--\r\n", B, [("a.png", b"abc")]),
        (PART + b"\r\n--B--\r\n", 'multipart/form-data; boundary="B"', [("a.png", b"abc")]),
        (
            b"--B\r\ncontent-disposition: Form-Data; Name=files; FILENAME=a.png\r\n\r\n"
            b"abc\r\n--B--",
            B,
            [("a.png", b"abc")],
        ),
        (PART.replace(b"\r\n\r\n", b"\r\nX-Other: 1\r\n\r\n") + b"\r\n--B--\r\n", B, None),
        (b"preamble\r\n" + PART + b"\r\n--B--\r\n", B, None),
        (PART + b"\r\n--B--\r\nepilogue", B, None),
        (PART + b"\r\n--Bc\r\n--B--\r\n", B, None),
        (PART.replace(b'"a.png"', b'"a.png"; filename="b.png"') + b"\r\n--B--\r\n", B, None),
        (PART + b"\r\n--B--\r\n", "multipart/form-data; charset=utf-8; boundary=B", None),
        (PART + b"\r\n--B--\r\n", "multipart/mixed; boundary=B", None),
        (PART, B, None),  # no closing delimiter
    ],
)
def test_anything_unusual_is_left_to_the_parser(
    body: bytes, content_type: str, split: Files | None
) -> None:
    assert quick(body, content_type) == split
    if split is not None:
        assert parsed(body, content_type) == (split, [])
