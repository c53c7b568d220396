"""Fixtures of the API tests: a server on loopback and a client per tenant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import Server, serve


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = serve(tmp_path)
    yield running
    running.stop()


@pytest.fixture
def a(server: Server) -> Iterator[httpx.Client]:
    with server.client("token-a") as client:
        yield client


@pytest.fixture
def b(server: Server) -> Iterator[httpx.Client]:
    with server.client("token-b") as client:
        yield client


@pytest.fixture(params=["sqlite", "kubernetes"])
def either_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The API over each store in turn (``backends.Backend``), for rules both must keep."""
    from backends import backend  # (imports the emulator only for the tests that use it)

    with backend(request.param, tmp_path) as running:
        yield running
