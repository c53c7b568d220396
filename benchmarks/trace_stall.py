"""How one tenant's API calls fare while another reads a large program trace, and how long the
reads take.

    .venv/bin/python benchmarks/trace_stall.py [--records 180000] [--readers 8]

An API server (uvicorn on loopback over an SQLite store, as ``tests/api`` start it) holds a
program of tenant A with one run's trace of ``--records`` records. ``--readers`` clients of A
read the whole trace at once (page by page, as ``pathways trace`` does), while a client of
tenant B calls ``GET /v1/me`` every 50 ms; printed: the readers' wall time, B's median and
worst latency before (quiet) and during the reads, and the process's peak RSS. The baseline is
the same script run against an older checkout (``PYTHONPATH`` at its packages).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=180_000)
    parser.add_argument("--readers", type=int, default=8)
    arguments = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "api"))
    from api_server import program, serve  # the tests' server

    server = serve(Path(tempfile.mkdtemp(prefix="trace-stall-")))
    with server.client("token-a") as client:
        assert client.post("/v1/programs", json=program("big")).status_code == 201
    records = [
        {"seq": n, "client": "c", "name": f"node-{n}", "devices": [0, 1], "executor": 0,
         "start_ns": n * 1000, "end_ns": n * 1000 + 500, "ok": True, "island": "island-0"}
        for n in range(arguments.records)
    ]  # fmt: skip
    server.store.store_trace("team-a", "big", 1, records)
    stop, latencies = threading.Event(), []

    def poll() -> None:
        with server.client("token-b") as other:
            while not stop.is_set():
                began = time.perf_counter()
                assert other.get("/v1/me").status_code == 200
                latencies.append(time.perf_counter() - began)
                time.sleep(0.05)

    def read() -> None:
        with server.client("token-a") as reader:
            got, token = 0, None
            while True:
                query = {"continue": token} if token else {}
                body = reader.get("/v1/programs/big/trace", params=query).json()
                got += len(body["records"])
                token = body.get("continue")
                if not token:
                    break
            assert got == arguments.records, got

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1)
    quiet = list(latencies)
    began = time.perf_counter()
    readers = [threading.Thread(target=read) for _ in range(arguments.readers)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join()
    elapsed = time.perf_counter() - began
    stop.set()
    poller.join()
    loaded = latencies[len(quiet) :]
    print(
        json.dumps(
            {
                "reads_s": round(elapsed, 2),
                "other_quiet_p50_ms": round(statistics.median(quiet) * 1e3, 1),
                "other_loaded_p50_ms": round(statistics.median(loaded) * 1e3, 1),
                "other_loaded_max_ms": round(max(loaded) * 1e3, 1),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            }
        )
    )
    server.stop()


if __name__ == "__main__":
    main()
