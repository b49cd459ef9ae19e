"""The API process's CPU per prediction, without HTTP: the app's ASGI callable driven in
this process.

Serves the checkpoint `bench.predict_load` makes (registered as `bench@production`, a fresh
Postgres database) with `api.app.create_app`, runs its lifespan, and sends the request
forms of `bench.predict_load` (`--modes`) straight to the ASGI app from `--conc` concurrent
callers: no sockets, no uvicorn, no wrk, so the process's CPU time (every thread of it)
per request is the API's own work on the hot path, plus the socket hop to the model
process. Each form runs `--rounds` rounds of `--n` requests; the best round is reported,
since other work on the machine only ever adds to it. `--profile PREFIX` writes a cProfile
of each round (`PREFIX.<mode>.c<conc>`); its call counts are exact whatever else runs.

    .venv/bin/python -m bench.api_cpu
    .venv/bin/python -m bench.api_cpu --modes raw --conc 1,64 --profile /tmp/api

To compare two trees, run the same file in each (copy it into the other tree's bench/
when that tree lacks it, and bench/predict_load.py where that one lacks `bench_model`): it
imports the app of the tree it runs in.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.predict_load import Form, bench_model, request_form, sample_png

Message = dict[str, Any]


def scope_of(form: Form, state: dict[str, Any]) -> dict[str, Any]:
    """The ASGI scope of one request of `form`, as uvicorn would give it."""
    path, _, query = form.target.partition("?")
    headers = [(key.lower().encode(), value.encode()) for key, value in form.headers.items()]
    headers += [(b"host", b"127.0.0.1:8000"), (b"content-length", str(len(form.body)).encode())]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5555),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": headers,
        "state": dict(state),
    }


async def one(app: Any, form: Form, state: dict[str, Any]) -> int:
    """Send one request of `form` to the app; its status."""
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": form.body, "more_body": False}
        await asyncio.sleep(3600)  # a client that stays connected
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope_of(form, state), receive, send)
    return status


async def drive(app: Any, form: Form, state: dict[str, Any], n: int, conc: int) -> list[int]:
    """`n` requests of `form` from `conc` callers; their statuses."""
    numbers: Iterator[int] = iter(range(n))
    statuses: list[int] = []

    async def caller() -> None:
        for _ in numbers:
            statuses.append(await one(app, form, state))

    await asyncio.gather(*(caller() for _ in range(conc)))
    return statuses


async def measure(
    app: Any, form: Form, state: dict[str, Any], args: argparse.Namespace, conc: int
) -> tuple[float, float]:
    """One round: this process's CPU ms per request and the req/s."""
    profiler = cProfile.Profile() if args.profile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    statuses = await drive(app, form, state, args.n, conc)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{args.profile}.{form.mode}.c{conc}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if set(statuses) != {200}:
        raise RuntimeError(f"{form.mode}: answers other than 200: {sorted(set(statuses))}")
    return cpu * 1000 / args.n, args.n / wall


async def run(args: argparse.Namespace, url: str, broker: str, artifacts: Path, png: bytes) -> None:
    """Serve the app with its lifespan and measure each form at each concurrency."""
    from api.app import create_app
    from core.settings import Settings

    settings = Settings(
        database_url=url,
        broker_url=broker,
        auth_enabled=False,
        artifact_dir=artifacts,
        data_dir=artifacts.parent / "data",
    )
    app = create_app(settings)
    forms = [request_form(mode, png) for mode in args.modes.split(",")]
    async with app.router.lifespan_context(app) as state:
        state = dict(state or {})
        for form in forms:  # warm-up: starts the model, fills the caches
            await drive(app, form, state, 200, 8)
        print("mode       conc  best CPU ms/req  rounds (CPU ms/req @ req/s)")
        for form in forms:
            for conc in (int(value) for value in args.conc.split(",")):
                rounds = [await measure(app, form, state, args, conc) for _ in range(args.rounds)]
                said = "  ".join(f"{cpu:.3f}@{rate:.0f}" for cpu, rate in rounds)
                best = min(cpu for cpu, _ in rounds)
                print(f"{form.mode:<10} {conc:>4}  {best:>15.3f}  {said}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000, help="Requests per round.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="raw,multipart,v2", help="Request forms, in order.")
    parser.add_argument("--conc", default="64", help="Concurrencies, comma-separated.")
    parser.add_argument("--profile", default="", help="Write each round's cProfile here.")
    args = parser.parse_args()
    with bench_model("api-cpu-") as bench:
        png = sample_png(bench.folder).read_bytes()
        asyncio.run(run(args, bench.url, bench.broker, bench.artifacts, png))


if __name__ == "__main__":
    main()
