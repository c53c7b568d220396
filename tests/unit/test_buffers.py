"""The executor's buffer store: futures, reference counts, and waiting for announcements."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from pathways_executor.buffers import (
    MAX_DELETED_UNSET,
    PENDING,
    BufferError,
    BufferStore,
    root_cause,
)


def test_a_consumer_waits_for_a_buffer_produced_later() -> None:
    store = BufferStore()
    store.expect("c/b")
    threading.Timer(0.05, store.set, args=("c/b", 42)).start()
    assert store.get("c/b", timeout=5) == 42


def test_a_buffer_announced_later_is_waited_for_within_the_limit() -> None:
    store = BufferStore()
    threading.Timer(0.05, store.set, args=("c/late", "value")).start()
    assert store.get("c/late", timeout=5, appear_within=5) == "value"
    with pytest.raises(BufferError, match="unknown buffer 'c/never'"):
        store.get("c/never", timeout=1, appear_within=0.05)


def test_failures_and_timeouts_name_the_buffer_and_cause() -> None:
    store = BufferStore()
    store.fail("c/bad", RuntimeError("computation 'a' failed"))
    with pytest.raises(BufferError, match="buffer 'c/bad' failed upstream: computation 'a' failed"):
        store.get("c/bad", timeout=1)
    store.expect("c/slow")
    with pytest.raises(BufferError, match=r"'c/slow' was not ready within 0\.05 s"):
        store.get("c/slow", timeout=0.05)


def test_a_failure_passed_down_a_chain_names_only_its_first_cause() -> None:
    """Each consumer of a failed buffer fails in turn; its message names the first failure
    once, however far down the chain (also when the failure came from another executor,
    quoted inside a message of its own), so messages do not grow with the chain."""
    store = BufferStore()
    first = "computation 'a' failed on executor 0: input 0 is float32[2], expected float32[4]"
    store.fail("c/a-out", RuntimeError(first))
    messages = []
    for step in range(1, 50):
        try:
            store.get(f"c/{step - 1:03d}-out" if step > 1 else "c/a-out", timeout=1)
        except BufferError as error:
            messages.append(f"computation '{step:03d}' failed on executor 0: {error}")
        store.fail(f"c/{step:03d}-out", RuntimeError(messages[-1]))
    assert all(message.endswith(f"failed upstream: {first}") for message in messages)
    assert len(messages[-1]) == len(messages[1])
    assert root_cause(f"cannot fetch buffer 'c/x': 127.0.0.1:1: {messages[-1]}") == first
    assert root_cause("cannot fetch buffer 'c/x': connection refused") == (
        "cannot fetch buffer 'c/x': connection refused"
    )


def test_delete_waits_for_pending_uses_and_frees_exactly_once() -> None:
    store = BufferStore()
    store.set("c/b", 1)
    assert store.acquire("c/b")  # a computation will read it
    store.delete("c/b")  # the client is done with it
    assert "c/b" in store  # still held by the pending use
    assert not store.acquire("c/b")  # but no new use may start
    store.delete("c/b")  # a second delete changes nothing
    assert "c/b" in store
    store.release("c/b")
    assert "c/b" not in store and len(store) == 0
    assert not store.acquire("c/unknown")


def test_peek_gives_only_values_in_hand() -> None:
    """What a computation reads without waiting: set values. Anything else (unknown, pending,
    failed, deleted) is left to ``get``, which waits or names the cause."""
    store = BufferStore()
    store.expect("c/pending")
    store.fail("c/failed", RuntimeError("boom"))
    store.set("c/set", 7)
    store.set("c/deleted", 8)
    assert store.acquire("c/deleted")  # a pending use keeps the entry; the owner deletes it
    store.delete("c/deleted")
    assert store.peek("c/set") == 7
    for buffer_id in ("c/unknown", "c/pending", "c/failed", "c/deleted"):
        assert store.peek(buffer_id) is PENDING
    store.set("c/pending", 9)
    assert store.peek("c/pending") == 9
    store.set("c/set", 10)  # a buffer is set once
    assert store.peek("c/set") == 7


def test_outputs_that_hold_a_value_already_are_found_without_waiting() -> None:
    store = BufferStore()
    store.set("c/planted", "value")
    store.expect("c/pending")
    store.fail("c/failed", RuntimeError("no"))
    assert store.first_set(["c/pending", "c/failed", "c/new", "c/planted"]) == "c/planted"
    assert store.first_set(["c/pending", "c/new"]) is None
    store.delete("c/planted")
    assert store.first_set(["c/planted"]) is None


def test_an_upload_arriving_after_its_buffer_was_deleted_is_not_kept() -> None:
    """A client announces an upload, then sends it: its session ending in between deleted
    the buffer, and the upload, landing after, stayed on the executor for good."""
    store = BufferStore()
    store.delete("gone")  # before the upload arrived
    assert store.upload("gone", np.zeros(4)) is False
    assert len(store) == 0
    # A reader already waiting for it is told it will never be.
    store.expect("awaited")
    assert store.acquire("awaited")  # the reader's hold
    store.delete("awaited")
    assert store.upload("awaited", np.zeros(4)) is False
    with pytest.raises(BufferError, match="deleted before its upload"):
        store.expect("awaited").result(timeout=1)
    # Uploads of buffers not deleted are kept, and the memory of deletions is bounded.
    assert store.upload("kept", np.ones(2)) is True and store.peek("kept")[0] == 1
    for n in range(MAX_DELETED_UNSET + 1):
        store.delete(f"never-{n}")
    assert store.upload("never-0", np.zeros(1)) is True  # forgotten: the oldest went first


class _Call:
    """A GetArray call's context: no deadline, and its caller still there."""

    def time_remaining(self) -> None:
        return None

    def is_active(self) -> bool:
        return True


def test_a_get_asking_to_wait_longer_waits_that_long_for_the_buffer_to_be_announced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A get of work queued behind long work (announced after 30 s) failed at 30 s, saying
    the buffer was unknown, though it had asked to wait two minutes."""
    import pathways_executor.server as server
    from pathways_core.wire import pb

    monkeypatch.setattr(server, "APPEAR_WITHIN_SECONDS", 0.2)
    monkeypatch.setattr(server, "POLL_SECONDS", 0.05)
    executor = SimpleNamespace(
        runner=SimpleNamespace(buffers=BufferStore()), _waiting=threading.Semaphore(4)
    )
    threading.Timer(0.6, executor.runner.buffers.set, args=("c/late", 7)).start()
    request = pb.ArrayRequest(buffer_id="c/late", timeout_seconds=5)
    assert server.ExecutorService._wait_for(executor, request, _Call()) == 7
    # Without a longer wait asked for, an unknown buffer fails after the default.
    with pytest.raises(BufferError, match="unknown buffer 'c/never'"):
        server.ExecutorService._wait_for(executor, pb.ArrayRequest(buffer_id="c/never"), _Call())
