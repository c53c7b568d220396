"""Waiting for processes the tests started indirectly (through a launcher) to stop."""

from __future__ import annotations

import os
import signal
import time

from pathways_client.embedded import _alive


def assert_all_stop(pids: list[int], seconds: float = 30.0) -> None:
    """Every process of ``pids`` stops within ``seconds``; any still running then is killed, so
    a failure leaves nothing behind either."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in pids if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"still running after {seconds:.0f} s: {survivors}"
