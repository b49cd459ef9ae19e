"""An API process killed (SIGKILL) mid-upload leaves its temporary archive and partial unpack
in the uploads folder; the next API process sweeps them when it starts."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path

import httpx
import uvicorn

from core.settings import Settings
from core.uploads import folder
from tests.services import free_port

FILES, SIZE = 4000, 8 * 1024  # 32 MiB stored: unpacking takes long enough to be caught


def _serve(settings: Settings, port: int) -> None:
    from api.app import create_app

    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


@contextmanager
def _api(settings: Settings) -> Iterator[tuple[BaseProcess, str]]:
    """The API for `settings` in a process of its own (forked: this one has imported it
    already, which takes a minute on a busy machine); the process and its URL."""
    port = free_port()
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(settings, port))
    process.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.is_alive(), f"the API exited with {process.exitcode}"
            assert time.monotonic() < deadline, "the API did not answer within 60 s"
            try:
                httpx.get(f"{url}/api/v1/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield process, url
    finally:
        if process.is_alive():
            process.kill()
        process.join(30)


def _leftovers(settings: Settings) -> list[Path]:
    return sorted(path for path in folder(settings).glob(".*"))


def _size(paths: list[Path]) -> int:
    files = [p for path in paths for p in (path.rglob("*") if path.is_dir() else [path])]
    return sum(p.stat().st_size for p in files if p.is_file())


def test_a_killed_upload_leaves_nothing_once_the_api_restarts(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        database_url=sqlite_url,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        data_dir=tmp_path / "data",
        artifact_dir=tmp_path / "artifacts",
        auth_enabled=False,
        max_upload_bytes=256 * 1024**2,
    )
    archive = tmp_path / "big.zip"
    with zipfile.ZipFile(archive, "w") as writer:
        for index in range(FILES):
            writer.writestr(f"big/{'ab'[index % 2]}/{index}.png", os.urandom(SIZE))

    with _api(settings) as (process, url):
        answers: list[httpx.Response] = []

        def send() -> None:
            files = {"file": ("big.zip", archive.read_bytes())}
            with contextlib.suppress(httpx.TransportError):  # the server is killed
                answers.append(httpx.post(f"{url}/api/v1/datasets", files=files, timeout=120))

        sender = threading.Thread(target=send)
        sender.start()
        deadline = time.monotonic() + 60
        partial: list[Path] = []
        while not any(len(list(path.rglob("*.png"))) > 50 for path in partial):
            assert not answers, f"the upload ended before it was caught unpacking: {answers}"
            assert time.monotonic() < deadline, "the upload never began to unpack"
            partial = list(folder(settings).glob(".partial-*"))
            time.sleep(0.01)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
        sender.join(60)
    left = _leftovers(settings)
    assert {path.name.split("-")[0] for path in left} == {".upload", ".partial"}, left
    assert _size(left) > 10 * 2**20  # the archive (32 MiB) and what it had unpacked

    with _api(settings) as (_, url):
        assert _leftovers(settings) == []
        assert httpx.get(f"{url}/api/v1/datasets/uploads").json() == []
