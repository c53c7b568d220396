"""The proxy's sessions: host buffer lookups end when the session does, shapes are the client's
own, and a request before Init says so."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.island import IslandSession
from pathways_client.proxy.session import HostBuffers
from pathways_client.proxy.types import from_host_buffer


def test_closing_wakes_threads_waiting_for_a_buffer_never_stored() -> None:
    # A client that died mid-upload: its session's workers waited out their 120 s each.
    buffers = HostBuffers()
    answers: list[object] = []
    waiter = threading.Thread(target=lambda: answers.append(buffers.lookup(7, 60.0)))
    waiter.start()
    time.sleep(0.2)  # waiting in lookup, no coroutine waiting beside it
    buffers.close("session 1 has ended")
    waiter.join(10)
    assert not waiter.is_alive()
    assert answers == ["session 1 has ended"]


@pytest.mark.parametrize("shape", [(-1, 4), (-4,), (2, -1)])
def test_a_negative_dimension_is_refused_not_inferred(shape: tuple[int, ...]) -> None:
    data = np.arange(8, dtype=np.float32).view(np.uint8)
    with pytest.raises(ProxyError, match="dimensions must be 0 or more"):
        from_host_buffer(data, np.dtype(np.float32), shape, None)


def test_a_device_named_before_init_is_said_to_need_init() -> None:
    # A Compile before Init read "device id 0 is not a device of this session (0..-1)".
    from types import SimpleNamespace

    session = IslandSession(
        SimpleNamespace(prefix="proxy"), SimpleNamespace(number=1, protocol=None)
    )
    try:
        with pytest.raises(ProxyError) as raised:
            session.island_device(0, "compile_options.device_assignment")
    finally:
        session.close()
    assert (raised.value.code, raised.value.message) == (
        "FAILED_PRECONDITION",
        "the session has not been initialized (Init)",
    )


def test_a_session_remembers_its_latest_deleted_handles_only(monkeypatch) -> None:
    """Every handle deleted was kept for the session's life: two a step of a training loop
    (an upload and a read), 62.5 MiB a million, with no buffer held."""
    from pathways_client.proxy import session

    monkeypatch.setattr(session, "DELETED_KEPT", 3)
    buffers = HostBuffers()
    for handle in range(1, 11):
        assert buffers.store(handle, np.zeros(1, np.uint8)) == ""
        buffers.take(handle, 1.0)
    assert len(buffers._deleted) == 3
    assert buffers.lookup(10, 0.0) == "host buffer handle 10 was deleted"  # at once
