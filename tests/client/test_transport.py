"""The client on a scripted transport: error answers as exceptions, and an event stream that
drops and is resumed where it stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from client import ApiError, Client, OverloadedError, RateLimitedError, ServiceUnreachableError


def _client(handler: httpx.MockTransport) -> Client:
    return Client("http://service.test", "rs_key", transport=handler)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"error": {"code": "unavailable", "message": message, "details": []}}
    return httpx.Response(status, json=body, headers=headers)


def test_a_busy_service_says_when_to_retry() -> None:
    busy = httpx.MockTransport(lambda _: _error(503, "the model is busy", {"Retry-After": "2"}))
    with _client(busy) as client, pytest.raises(OverloadedError) as overloaded:
        client.predict(b"png", "digits@production")
    assert (overloaded.value.status, overloaded.value.retry_after) == (503, 2.0)
    assert overloaded.value.message == "the model is busy"
    limited = httpx.MockTransport(lambda _: _error(429, "too many", {"Retry-After": "7"}))
    with _client(limited) as client, pytest.raises(RateLimitedError) as refused:
        client.submit({"kind": "train"})
    assert refused.value.retry_after == 7.0


def test_an_answer_without_the_error_shape_is_still_an_api_error() -> None:
    proxy = httpx.MockTransport(lambda _: httpx.Response(502, text="<html>bad gateway</html>"))
    with _client(proxy) as client, pytest.raises(ApiError) as failed:
        client.health()
    assert (failed.value.status, failed.value.code) == (502, "http_error")
    assert failed.value.message == "HTTP 502: <html>bad gateway</html>"


class _Dropping(httpx.SyncByteStream):
    """A stream body that sends `chunks`, then breaks like a lost connection."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("connection lost")


def _sse(event: str, data: object, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def test_a_dropped_stream_resumes_after_its_last_line_and_step() -> None:
    asked: list[httpx.Request] = []
    series = {"series": {"train/loss": {"steps": [4, 5], "values": [0.9, 0.8]}}}

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if len(asked) == 1:
            first = [_sse("log", {"message": "epoch 1"}, "3"), _sse("metrics", series)]
            return httpx.Response(200, stream=_Dropping(first))
        return httpx.Response(200, content=_sse("end", {"status": "succeeded"}))

    drops: list[ServiceUnreachableError] = []
    with _client(httpx.MockTransport(answer)) as client:
        events = list(client.events("j1", on_drop=drops.append))
    assert [event.name for event in events] == ["log", "metrics", "end"]
    assert [str(drop.reason) for drop in drops] == ["connection lost"]
    resumed = asked[1]
    assert resumed.headers["Last-Event-ID"] == "3"
    assert resumed.url.params["since_step"] == "6"
    assert "Last-Event-ID" not in asked[0].headers


def test_a_stream_that_keeps_dropping_gives_up() -> None:
    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Dropping([]))

    with _client(httpx.MockTransport(answer)) as client, pytest.raises(ServiceUnreachableError):
        list(client.events("j1", reconnects=2))
