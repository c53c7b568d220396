"""The emulated cluster of the operator tests: the emulator served on loopback from a thread of
its own, a blocking client for the tests, and helpers to wait for conditions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import kmock
from kopf.testing import KopfRunner
from kube_emulator import Emulator, declare

GV = "pathways.dev/v1alpha1"
T = TypeVar("T")
NAMESPACE = "pathways-system"
# Read when the operator module is first imported: every operator test uses these.
os.environ.setdefault("PATHWAYS_RESYNC_SECONDS", "2")
# A failed run is judged this long after its Job failed (10 s in a cluster): short, so tests of
# failures end soon, and the judgement still waits on a timer rather than the resync.
os.environ.setdefault("PATHWAYS_FAILURE_GRACE_SECONDS", "1")
os.environ.setdefault("PATHWAYS_METRICS_PORT", "0")
os.environ["PATHWAYS_NAMESPACE"] = NAMESPACE
ARGS = ["run", "-m", "pathways_operator", "--standalone", "--all-namespaces"]

PLURALS = {
    "Island": (GV, "islands", False),
    "VirtualSlice": (GV, "virtualslices", True),
    "PathwaysProgram": (GV, "pathwaysprograms", True),
    "Deployment": ("apps/v1", "deployments", True),
    "StatefulSet": ("apps/v1", "statefulsets", True),
    "Service": ("v1", "services", True),
    "ConfigMap": ("v1", "configmaps", True),
    "Secret": ("v1", "secrets", True),
    "Event": ("v1", "events", True),
    "Job": ("batch/v1", "jobs", True),
    "Pod": ("v1", "pods", True),
    "ClusterKopfPeering": ("kopf.dev/v1", "clusterkopfpeerings", False),
    "Lease": ("coordination.k8s.io/v1", "leases", True),
}


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status


class Cluster:
    """An emulated API server running in a background thread, and a blocking client of it."""

    def __init__(self) -> None:
        self.emulator = Emulator()
        declare(self.emulator)
        self.loop = asyncio.new_event_loop()
        self._started: Future[str] = Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="emulator", daemon=True)
        self._thread.start()
        self.url = self._started.result(timeout=30)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self.emulator, kmock.Server(self.emulator) as server:
                self._started.set_result(f"http://{server.host}:{server.port}")
                await self._stop.wait()
        except BaseException as error:  # surface start-up failures to the test
            if not self._started.done():
                self._started.set_exception(error)
            raise

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "test"}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
            ],
        }
        path.write_text(json.dumps(config))
        return path

    def call_soon(self, function: Callable[[], Any]) -> None:
        """Run ``function`` in the emulator's thread (for its hooks)."""
        self.loop.call_soon_threadsafe(function)

    # -- blocking client ---------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode()) from None
        return json.loads(text) if text else None

    @staticmethod
    def path(
        kind: str, namespace: str | None = None, name: str | None = None, sub: str | None = None
    ) -> str:
        api_version, plural, namespaced = PLURALS[kind]
        parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
        if namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(plural)
        parts += [p for p in (name, sub) if p]
        return "/".join(parts)

    def create(self, document: dict[str, Any]) -> dict[str, Any]:
        meta = document["metadata"]
        return self.request("POST", self.path(document["kind"], meta.get("namespace")), document)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.path(kind, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(
        self, kind: str, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return self.request("GET", self.path(kind, namespace) + query)["items"]

    def patch(
        self, kind: str, name: str, body: Any, namespace: str | None = None, sub: str | None = None
    ) -> Any:
        content = (
            "application/json-patch+json"
            if isinstance(body, list)
            else "application/merge-patch+json"
        )
        return self.request("PATCH", self.path(kind, namespace, name, sub), body, content)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> Any:
        return self.request("DELETE", self.path(kind, namespace, name))

    def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        """Events recorded about objects of this name."""
        return [
            event
            for event in self.list("Event")
            if event.get("involvedObject", {}).get("name") == name
            and (reason is None or event.get("reason") == reason)
        ]

    def requests_to(self, predicate: Callable[[kmock.Request], bool]) -> int:
        """How many requests the emulator served that match."""
        return sum(1 for request in list(self.emulator) if predicate(request))


def wait_for(check: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    value: Any = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}: last value {value!r}")


@contextlib.contextmanager
def running_operator(**environment: str) -> Iterator[KopfRunner]:
    """The operator (``kopf run -m pathways_operator`` in a thread) until the block ends; its
    exceptions fail the test."""
    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    try:
        with KopfRunner(ARGS, timeout=30) as runner:
            yield runner
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert runner.exit_code == 0, runner.output
