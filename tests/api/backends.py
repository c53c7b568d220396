"""The API over each of its stores, called in-process, for tests that hold both to one rule:
the embedded SQLite store, and the Kubernetes store against the operator tests' emulated API
server (``tests/operator/kube_emulator.py``, served on loopback from a thread of its own)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import kmock

from pathways_api.app import create_app
from pathways_api.auth import Tenant, TokenFile, write_tokens_file
from pathways_api.kube_store import KubernetesStore
from pathways_api.service import Service
from pathways_api.store import SqliteStore

# After the rest: shadows nothing (the operator tests import it the same way).
sys.path.append(str(Path(__file__).parents[1] / "operator"))
from kube_emulator import Emulator, declare

TOKENS = {"token-a": "team-a", "token-b": "team-b"}


class Backend:
    """The app over one store, on an event loop of its own (the Kubernetes store's HTTP
    client belongs to it); ``finalize`` removes what a deletion marked, as the embedded
    manager does once an object is released (the emulator, with no finalizers, removes it at
    once)."""

    def __init__(self, name: str, service: Service, authenticator: Any) -> None:
        self.name = name
        self.store = service.store
        self.loop = asyncio.new_event_loop()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(service, authenticator)),
            base_url="http://api",
        )

    def call(self, token: str, method: str, path: str, **arguments: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **arguments.pop("headers", {})}
        return self.run(self.client.request(method, path, headers=headers, **arguments))

    def run(self, work: Any) -> Any:
        return self.loop.run_until_complete(work)

    def finalize(self, kind: str, namespace: str, name: str) -> None:
        if isinstance(self.store, SqliteStore):
            self.store.remove(kind, namespace, name)

    def close(self) -> None:
        self.run(self.client.aclose())
        if isinstance(self.store, KubernetesStore):
            self.run(self.store.http.aclose())
        self.loop.close()


class ServiceAccounts:
    """Tokens to tenants without TokenReview (the reviews are not what is tested here)."""

    def __init__(self, store: KubernetesStore) -> None:
        self.store = store

    async def authenticate(self, token: str) -> Tenant:
        return Tenant(TOKENS[token], self.store.quotas)


@contextmanager
def emulated_api_server() -> Iterator[str]:
    """The emulated Kubernetes API server's URL while it runs."""
    emulator = Emulator()
    declare(emulator)
    loop = asyncio.new_event_loop()
    started: Future[str] = Future()
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        stop.append(asyncio.Event())
        try:
            async with emulator, kmock.Server(emulator) as server:
                started.set_result(f"http://{server.host}:{server.port}")
                await stop[0].wait()
        except BaseException as error:
            if not started.done():
                started.set_exception(error)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        if stop:
            loop.call_soon_threadsafe(stop[0].set)
        thread.join(timeout=10)


@contextmanager
def backend(kind: str, state: Path) -> Iterator[Backend]:
    """The API over the store ``kind`` (``sqlite`` or ``kubernetes``)."""
    if kind == "sqlite":
        tokens = write_tokens_file(
            state / "tokens.yaml", {tenant: {"tokens": [t]} for t, tenant in TOKENS.items()}
        )
        running = Backend(kind, Service(SqliteStore(state / "pathways.db")), TokenFile(tokens))
        try:
            yield running
        finally:
            running.close()
        return
    with emulated_api_server() as url:
        store = KubernetesStore(url, token=None)
        running = Backend(kind, Service(store, "kubernetes"), ServiceAccounts(store))
        try:
            yield running
        finally:
            running.close()
