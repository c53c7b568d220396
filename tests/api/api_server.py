"""Helpers of the API tests: the API served by uvicorn on loopback over an SQLite store in a
temporary folder (tests talk to it over real HTTP with httpx), and manifests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from pathways_api.app import create_app
from pathways_api.auth import TokenFile, write_tokens_file
from pathways_api.ratelimit import DEFAULT_BUDGETS
from pathways_api.service import Service
from pathways_api.store import BUSY_TIMEOUT_SECONDS, SqliteStore
from pathways_core.control.rate_limit import Budgets

TENANTS = {
    "team-a": {"tokens": ["token-a"], "quotas": {"devices": 16, "programs": 10}},
    "team-b": {"tokens": ["token-b"], "quotas": {"devices": 16, "programs": 10, "priority": 100}},
    "team-c": {"tokens": ["token-c"], "quotas": {"devices": 8, "programs": 4}},
}
MAX_BODY = 64 * 1024


@dataclass
class Server:
    """A running API server."""

    url: str
    store: SqliteStore
    stop: Callable[[], None]
    app: Any = None  # the FastAPI app, served in this process

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def serve(
    state: Path,
    rate_limits: Budgets = DEFAULT_BUDGETS,
    max_body: int = MAX_BODY,
    busy_timeout: float = BUSY_TIMEOUT_SECONDS,
) -> Server:
    """Start an API server on a free loopback port over ``state`` (its store waiting at most
    ``busy_timeout`` seconds for another writer's lock)."""
    tokens = state / "tokens.yaml"
    if not tokens.exists():
        write_tokens_file(tokens, TENANTS)
    store = SqliteStore(state / "pathways.db", busy_timeout=busy_timeout)
    app = create_app(Service(store), TokenFile(tokens), max_body=max_body, rate_limits=rate_limits)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API server did not start"
        time.sleep(0.01)
    # Ready once it answers, as a kubelet would have it: the first request also builds the
    # app's routes (FastAPI does that lazily), so two servers of one test never build theirs
    # at once from the same shared parameter annotations (seen to make pydantic warn).
    assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=30).status_code == 200

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()

    return Server(f"http://127.0.0.1:{port}", store, stop, app)


def program(name: str | None = "p", devices: int = 1, **spec: Any) -> dict[str, Any]:
    """A minimal driver program manifest."""
    metadata = {"name": name} if name else {"generateName": "job-"}
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": metadata,
        "spec": {
            "slices": [{"name": "main", "devices": devices}],
            "driver": {"source": "print('hello')"},
            **spec,
        },
    }


def vslice(name: str = "s", devices: int = 2) -> dict[str, Any]:
    """A VirtualSlice manifest."""
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The error body, checked to have the documented shape."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    assert body["error"]["message"], body
    return body["error"]
