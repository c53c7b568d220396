"""Fixtures of the proxy tests: one real ``pathways proxy`` process per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from proxy_harness import ProxyProcess, start_proxy, stop_proxy


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyProcess]:
    """One proxy of 4 fake CPU devices, shared by a module's tests."""
    running = start_proxy("--backend", "local", "--devices", "4")
    try:
        yield running
    finally:
        stop_proxy(running)
