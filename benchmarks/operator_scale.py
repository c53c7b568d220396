"""Binding throughput of the operator: 500 VirtualSlices across 16 islands, through an API server.

The API server is the tests' emulated one (kmock's KubernetesEmulator with the subclass in
``tests/operator/kube_emulator.py``) on loopback; the operator runs as the real entrypoint,
``kopf run -m pathways_operator``, in a process of its own. The benchmark creates the slices one
by one over HTTP and watches them: a slice's time to bind runs from its create call's answer to
the watch event showing it Bound.

Baseline (the floor), measured in the same run on the same server: the same number of bare
create calls of the same slices with no operator running. Reported: the time to create and bind
all slices against the floor (their ratio), p50/p99 time to bind, and the operator's binding
passes (each reads all islands and slices once).

    python benchmarks/operator_scale.py [--slices 500] [--islands 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "operator"))

from kube_cluster import Cluster  # noqa: E402
from kube_manifests import island, vslice  # noqa: E402

from pathways_client.launcher import free_port  # noqa: E402
from pathways_core.flags import at_least  # noqa: E402


class BoundWatcher:
    """Follows a watch of VirtualSlices and records when each is first seen Bound."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.bound_at: dict[str, float] = {}
        self._done = threading.Event()
        host, port = cluster.url.removeprefix("http://").split(":")
        rv = cluster.request("GET", cluster.path("VirtualSlice", namespace))["metadata"][
            "resourceVersion"
        ]
        self._connection = http.client.HTTPConnection(host, int(port), timeout=600)
        self._connection.request(
            "GET", f"{cluster.path('VirtualSlice', namespace)}?watch=true&resourceVersion={rv}"
        )
        self._response = self._connection.getresponse()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, AttributeError, ValueError):  # closed at the end
            self._follow()

    def _follow(self) -> None:
        for line in self._response:
            if not line.strip():
                continue
            event = json.loads(line)
            raw = event.get("object") or {}
            if (raw.get("status") or {}).get("phase") == "Bound":
                self.bound_at.setdefault(raw["metadata"]["name"], time.perf_counter())

    def close(self) -> None:
        self._connection.close()


def create_all(cluster: Cluster, names: list[str], namespace: str) -> dict[str, float]:
    created = {}
    for name in names:
        cluster.create(vslice(name, namespace=namespace, devices=1))
        created[name] = time.perf_counter()
    return created


def wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("pathways_binding_passes_total") or line.startswith(
            "pathways_time_to_bind_seconds_count"
        ):
            name, value = line.split()
            values[name] = float(value)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=at_least(1), default=500)
    parser.add_argument("--islands", type=at_least(1), default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.slices > args.islands * 32:
        parser.error("--slices: at most 32 per island (4x8 islands, one device per slice)")

    cluster = Cluster()
    workdir = Path(tempfile.mkdtemp(prefix="operator-scale-"))
    kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")

    # The floor: bare creates on the same server, nobody reconciling.
    names = [f"s{index:04d}" for index in range(args.slices)]
    began = time.perf_counter()
    create_all(cluster, names, "floor")
    floor = time.perf_counter() - began
    for name in names:
        cluster.delete("VirtualSlice", name, "floor")

    metrics_port = free_port()
    environment = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PATHWAYS_NAMESPACE": "pathways-system",
        "PATHWAYS_METRICS_PORT": str(metrics_port),
        "PATHWAYS_RESYNC_SECONDS": "60",
    }
    log = (workdir / "operator.log").open("w")
    kopf = Path(sys.executable).with_name("kopf")
    operator = subprocess.Popen(
        [
            str(kopf),
            "run",
            "-m",
            "pathways_operator",
            "--standalone",
            "--all-namespaces",
            "--quiet",
        ],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for index in range(args.islands):
            cluster.create(island(f"island-{index:02d}", topology="4x8", hosts=4))
        wait(
            lambda: (
                all(
                    (i.get("status") or {}).get("devicesFree") == 32 for i in cluster.list("Island")
                )
                and len(cluster.list("Island")) == args.islands
            ),
            120,
            "the islands",
        )
        watcher = BoundWatcher(cluster, "bench")
        served_before = len(list(cluster.emulator))
        began = time.perf_counter()
        created = create_all(cluster, names, "bench")
        wait(lambda: len(watcher.bound_at) == args.slices, 600, "every slice to be bound")
        total = max(watcher.bound_at.values()) - began
        # API requests the operator made per slice while binding (the benchmark's own
        # creates excluded).
        per_slice = (len(list(cluster.emulator)) - served_before - args.slices) / args.slices
        watcher.close()
        passes = scrape(metrics_port)
        slices = cluster.list("VirtualSlice", "bench")
        owners: dict[tuple[str, int], str] = {}
        for item in slices:
            for device in item["status"]["devices"]:
                key = (item["status"]["island"], device)
                assert key not in owners, f"device bound twice: {key}"
                owners[key] = item["metadata"]["name"]
    finally:
        operator.terminate()
        operator.wait(timeout=30)
        cluster.close()
        log.close()
    shutil.rmtree(workdir)  # (kept when it failed: the operator's log is there)

    latencies = sorted(watcher.bound_at[name] - created[name] for name in names)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    # One record in the bench format: slices bound per second against bare creates per second.
    result = {
        "name": "operator: VirtualSlices created and bound",
        "value": round(args.slices / total, 1),
        "baseline": round(args.slices / floor, 1),
        "ratio": round(floor / total, 3),
        "unit": "slices/s",
        "target": None,
        "parameters": {
            "slices": args.slices,
            "islands": args.islands,
            "floor_seconds": round(floor, 3),
            "operator_seconds": round(total, 3),
            "time_to_bind_p50_ms": round(p50 * 1000, 1),
            "time_to_bind_p99_ms": round(p99 * 1000, 1),
            "binding_passes": int(passes.get("pathways_binding_passes_total", 0)),
            "operator_requests_per_slice": round(per_slice, 1),
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    print(f"{args.slices} slices on {args.islands} islands (4x8 each), one device per slice")
    print(f"  floor: {args.slices} bare creates          {floor:8.2f} s")
    print(
        f"  operator: create + bind all            {total:8.2f} s  ({total / floor:.2f}x the floor)"
    )
    measured = result["parameters"]
    p50_ms, p99_ms = measured["time_to_bind_p50_ms"], measured["time_to_bind_p99_ms"]
    print(f"  time to bind: p50 {p50_ms} ms, p99 {p99_ms} ms")
    print(
        f"  binding passes: {measured['binding_passes']}; operator API requests per slice: "
        f"{measured['operator_requests_per_slice']}; no device bound twice"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
