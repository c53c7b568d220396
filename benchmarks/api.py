"""Program submissions per second through the embedded REST API, against a bare FastAPI endpoint.

Both servers run in their own process with the same uvicorn settings (one worker, the default
event loop and HTTP parser, warnings-only logging, no access log), built by this file:

- ``embedded``: the app ``python -m pathways_api`` serves in embedded mode (bearer-token
  authentication, pydantic validation of the PathwaysProgram, the quota check and insert in one
  SQLite ``BEGIN IMMEDIATE`` transaction, the Idempotency-Key row, Prometheus metrics);
- ``bare``: a FastAPI app whose ``POST /v1/programs`` does nothing and answers 201: the floor
  of FastAPI + uvicorn on this machine.

The load is the same for both: ``--connections`` keep-alive HTTP/1.1 connections on loopback,
each sending the next request when the previous answer arrives, with pre-encoded requests (a
driver program of one 2-device slice, its own Idempotency-Key), so the client costs little.

    .venv/bin/python benchmarks/api.py [--requests 3000] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pathways_core.flags import at_least

PROGRAM = {
    "apiVersion": "pathways.dev/v1alpha1",
    "kind": "PathwaysProgram",
    "metadata": {"generateName": "bench-"},
    "spec": {
        "slices": [{"name": "main", "devices": 2}],
        "driver": {"source": "import pathways_client as pw\nprint(pw.connect())"},
        "weight": 2,
    },
}
TOKEN = "bench-token"


def serve(kind: str, state: Path) -> None:
    """Run one server (in this process) and print its port."""
    import socket

    import uvicorn

    if kind == "bare":
        from fastapi import FastAPI, Response

        app = FastAPI()

        @app.post("/v1/programs")
        async def submit() -> Response:
            return Response(status_code=201)

    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
        from pathways_api.__main__ import build

        app = build("embedded", state, None, 1 << 20)
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and without it every response written in two parts waits ~40 ms for a delayed ACK.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen(2048)  # connections wait in the backlog until uvicorn serves
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(
        sockets=[listener]
    )


def request_bytes(port: int, index: int) -> bytes:
    body = json.dumps(PROGRAM).encode()
    return (
        f"POST /v1/programs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Idempotency-Key: bench-{index}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def connection(
    port: int, indexes: list[int], latencies: list[float], statuses: dict[int, int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index in indexes:
            payload = request_bytes(port, index)
            began = time.perf_counter()
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - began)
            status = int(head.split(b" ", 2)[1])
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def load(port: int, requests: int, connections: int, offset: int) -> dict[str, float]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    shares = [list(range(offset + c, offset + requests, connections)) for c in range(connections)]
    began = time.perf_counter()
    await asyncio.gather(*(connection(port, share, latencies, statuses) for share in shares))
    seconds = time.perf_counter() - began
    latencies.sort()
    return {
        "per_second": requests / seconds,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1e3,
        "statuses": statuses,  # type: ignore[dict-item]
    }


def measure(kind: str, requests: int, connections: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"pathways-bench-{kind}-") as folder:
        state = Path(folder)
        (state / "tokens.yaml").write_text(
            yaml.safe_dump(
                {
                    "tenants": {
                        "bench": {
                            "tokens": [TOKEN],
                            "quotas": {"devices": 10**9, "programs": 10**9},
                        }
                    }
                }
            )
        )
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind, "--state", str(state)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert server.stdout is not None
            port = json.loads(server.stdout.readline())["port"]
            asyncio.run(load(port, 200, connections, 10**6))  # warm-up
            return asyncio.run(load(port, requests, connections, 0))
        finally:
            server.terminate()
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=at_least(1), default=3000)
    parser.add_argument("--connections", type=at_least(1), default=16)
    parser.add_argument("--serve", choices=["bare", "embedded"], help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1,000 requests")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.requests = min(arguments.requests, 1000)
    if arguments.serve:
        serve(arguments.serve, arguments.state)
        return
    results = {}
    for kind in ("bare", "embedded", "bare", "embedded"):  # interleaved: noise hits both
        result = measure(kind, arguments.requests, arguments.connections)
        if result["statuses"] != {201: arguments.requests}:  # refusals are no submissions
            sys.exit(f"{kind}: expected {arguments.requests} answers 201, got {result['statuses']}")
        best = results.get(kind)
        if best is None or result["per_second"] > best["per_second"]:
            results[kind] = result
    print(
        f"{arguments.requests} POST /v1/programs, {arguments.connections} connections (best of 2)"
    )
    print(f"{'server':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for kind in ("bare", "embedded"):
        r = results[kind]
        print(
            f"{kind:<10} {r['per_second']:8.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}  "
            f"{r['statuses']}"
        )
    ratio = results["embedded"]["per_second"] / results["bare"]["per_second"]
    print(f"embedded / bare throughput: {ratio:.2f}")
    if arguments.json:
        embedded, bare = results["embedded"], results["bare"]
        record = {
            "name": "API submissions",
            "value": embedded["per_second"],
            "baseline": bare["per_second"],
            "ratio": ratio,
            "unit": "submissions/s",
            "target": 500,
            "parameters": {
                "requests": arguments.requests,
                "connections": arguments.connections,
                "p99_ms": embedded["p99_ms"],
                "bare_p99_ms": bare["p99_ms"],
            },
        }
        arguments.json.write_text(json.dumps([record], indent=2))


if __name__ == "__main__":
    main()
