"""The Open Inference Protocol's infer over gRPC against HTTP's /v2, from Triton's clients.

Makes and registers the ResNet-20 checkpoint of `bench.predict_load` (`bench`, aliased
`production`, in a fresh Postgres database dropped at the end), serves the API with
uvicorn in a subprocess with gRPC on a port of its own (GRPC_PORT; auth off unless
--auth), and sends single-image requests, a 32x32 PNG as a BYTES input (`IMAGE_BYTES`),
for --seconds at each concurrency: ModelInfer with `tritonclient.grpc` and POST
/v2/models/bench@production/infer in the binary form with `tritonclient.http`. Each
concurrent client is a process of its own (one client, one request at a time), so the
clients share no GIL. It prints req/s and p50/p99 latency per protocol and concurrency.

    .venv/bin/python -m bench.grpc_infer
    .venv/bin/python -m bench.grpc_infer --seconds 5 --concurrency 1,8 --auth
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import numpy as np

from bench.predict_load import api_server, bench_model, sample_png
from tests.services import free_port

MODEL = "bench@production"
PROTOCOLS = ("grpc", "http")


def client_loop(
    protocol: str, url: str, png: bytes, key: str | None, seconds: float
) -> list[float]:
    """One client's request latencies (s) over `seconds`, after one request unmeasured."""
    import tritonclient.grpc as grpc_client
    import tritonclient.http as http_client

    module = grpc_client if protocol == "grpc" else http_client
    client = module.InferenceServerClient(url=url)
    tensor = module.InferInput("IMAGE_BYTES", [1], "BYTES")
    data = np.array([png], dtype=np.object_)
    if protocol == "http":
        tensor.set_data_from_numpy(data, binary_data=True)
        output = [module.InferRequestedOutput("PROBABILITIES", binary_data=True)]
    else:
        tensor.set_data_from_numpy(data)
        output = [module.InferRequestedOutput("PROBABILITIES")]
    auth = {} if key is None else {"authorization" if protocol == "grpc" else "Authorization": key}
    client.infer(MODEL, [tensor], outputs=output, headers=dict(auth))
    latencies = []
    deadline = time.perf_counter() + seconds
    while (started := time.perf_counter()) < deadline:
        client.infer(MODEL, [tensor], outputs=output, headers=dict(auth))
        latencies.append(time.perf_counter() - started)
    client.close()
    return latencies


def measure(
    protocol: str, url: str, png: bytes, key: str | None, concurrency: int, seconds: float
) -> tuple[float, float, float]:
    """req/s, p50 ms and p99 ms of `concurrency` clients, each a process of its own."""
    spawn = multiprocessing.get_context("spawn")  # no gRPC state carried across a fork
    with spawn.Pool(concurrency) as pool:
        runs = pool.starmap(client_loop, [(protocol, url, png, key, seconds)] * concurrency)
    latencies = np.array([value for run in runs for value in run])
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000
    return len(latencies) / seconds, float(p50), float(p99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8, help="Per protocol and concurrency.")
    parser.add_argument("--concurrency", default="1,8", help="Client counts, comma-separated.")
    parser.add_argument("--auth", action="store_true", help="Serve with API keys required.")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    load_before = os.getloadavg()[0]
    with bench_model("resnet-grpc-bench-") as bench:
        key = bench.bearer() if args.auth else None
        grpc_port = free_port()
        env = bench.env(auth=args.auth) | {"GRPC_PORT": str(grpc_port)}
        png = sample_png(bench.folder).read_bytes()
        headers = {} if key is None else {"Authorization": key}
        with api_server(env, headers) as base:
            http_url = base.removeprefix("http://").removesuffix("/api/v1")
            urls = {"grpc": f"127.0.0.1:{grpc_port}", "http": http_url}
            print("| protocol | concurrency | req/s | p50 ms | p99 ms |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for level in levels:
                for protocol in PROTOCOLS:
                    rate, p50, p99 = measure(
                        protocol, urls[protocol], png, key, level, args.seconds
                    )
                    print(f"| {protocol} | {level} | {rate:.0f} | {p50:.1f} | {p99:.1f} |")
    # Other processes on these cores skew every figure above: say how busy it was.
    print(f"\nload average (1 min) at start {load_before:.2f}, at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
