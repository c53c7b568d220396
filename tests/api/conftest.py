"""Fixtures of the API tests: a server on loopback and a client per tenant."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
