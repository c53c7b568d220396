"""The executor's buffer store: futures, reference counts, and waiting for announcements."""

from __future__ import annotations

import threading

import pytest

from pathways_executor.buffers import PENDING, BufferError, BufferStore, root_cause


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
