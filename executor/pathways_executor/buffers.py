"""The executor's buffer store: every buffer is a future, reference-counted.

A buffer is created pending when a computation that produces it is accepted (or when a consumer
asks for it first), set when the value exists (a ``jax.Array``, itself asynchronous, or a host
array), or failed with the producer's error so that every consumer fails fast with the cause.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any


class BufferError(Exception):
    """A buffer is unknown, failed, or did not arrive in time."""


PENDING: Any = object()  # ``peek``: the buffer has no value to use at once

# Separates a failed buffer's id from the first failure that caused it. A consumer of a failed
# buffer fails in turn; naming only that first failure keeps every message of a failed chain
# the same length, instead of each one quoting all of its predecessors' (a 128-step chain's
# last message would otherwise hold 127 nested ones).
UPSTREAM = " failed upstream: "


def root_cause(message: str) -> str:
    """The first failure behind a failure message: what follows its ``UPSTREAM`` marker
    (wherever it is, as inside a message quoted from another executor), or the whole message
    when it is the first failure itself."""
    _, marker, root = message.partition(UPSTREAM)
    return root if marker else message


@dataclass
class _Entry:
    future: Future[Any] = field(default_factory=Future)
    # The value once set, for ``peek`` (the future's own lock is not needed to read it).
    value: Any = PENDING
    # One reference for the owner (released by a client's delete) plus one per pending use.
    references: int = 1
    deleted: bool = False


MAX_DELETED_UNSET = 65_536
"""Ids of buffers deleted before they were set that a store remembers (the latest)."""


class BufferStore:
    """Buffers by id; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._appeared = threading.Condition(self._lock)
        self._entries: dict[str, _Entry] = {}
        # Buffers deleted before they were set: an upload of one arriving after is dropped
        # (a client announces an upload first; its session ending meanwhile deleted it, and
        # the upload, landing after, was kept for good). The latest MAX_DELETED_UNSET.
        self._deleted_unset: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, buffer_id: str) -> bool:
        with self._lock:
            return buffer_id in self._entries

    def usage(self) -> tuple[int, int]:
        """How many buffers are held (pending, ready or failed) and the bytes of the ready
        ones' values held by this process (every addressable shard of a device array)."""
        with self._lock:
            futures = [entry.future for entry in self._entries.values()]
        held = 0
        for future in futures:
            if future.done() and future.exception() is None:
                held += _bytes_held(future.result())
        return len(futures), held

    def ids(self) -> list[str]:
        """The buffers held (pending, ready or failed), not deleted."""
        with self._lock:
            return [i for i, entry in self._entries.items() if not entry.deleted]

    def expect(self, buffer_id: str) -> Future[Any]:
        """The future of a buffer, created pending if it does not exist yet."""
        return self._entry(buffer_id).future

    def first_set(self, buffer_ids: Iterable[str]) -> str | None:
        """The first of ``buffer_ids`` that holds a value already, if any: a computation about
        to write it would have its output dropped (``set`` keeps the first value), and the
        value there served in its place (an executor takes uploads of any id)."""
        for buffer_id in buffer_ids:
            if self.peek(buffer_id) is not PENDING:
                return buffer_id
        return None

    def _entry(self, buffer_id: str) -> _Entry:
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None:
                entry = self._entries[buffer_id] = _Entry()
                self._appeared.notify_all()
            return entry

    def set(self, buffer_id: str, value: Any) -> None:
        entry = self._entry(buffer_id)
        if not entry.future.done():
            entry.value = value
            entry.future.set_result(value)

    def peek(self, buffer_id: str) -> Any:
        """The value of a buffer that is set and not deleted, else ``PENDING`` (unknown,
        pending, failed or deleted: ``get`` says which). Never waits: a computation whose
        inputs are all in hand reads them with this alone."""
        entry = self._entries.get(buffer_id)  # one dict read: atomic, no lock needed
        if entry is None or entry.deleted:
            return PENDING
        return entry.value

    def fail(self, buffer_id: str, error: BaseException) -> None:
        future = self.expect(buffer_id)
        if not future.done():
            future.set_exception(error)

    def acquire(self, buffer_id: str) -> bool:
        """Hold a buffer for a pending use; False if it is unknown."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None or entry.deleted:
                return False
            entry.references += 1
            return True

    def release(self, buffer_id: str) -> None:
        """End a pending use (or, for the owner, delete): frees the buffer at zero."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None:
                return
            entry.references -= 1
            if entry.references <= 0:
                del self._entries[buffer_id]

    def delete(self, buffer_id: str) -> None:
        """The owner's delete: the buffer goes once no pending use holds it."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if entry is None or not entry.future.done():
                self._deleted_unset[buffer_id] = None
                if len(self._deleted_unset) > MAX_DELETED_UNSET:
                    self._deleted_unset.popitem(last=False)
            if entry is None or entry.deleted:
                return
            entry.deleted = True
        self.release(buffer_id)

    def forget_pending(self, buffer_id: str, future: Future[Any]) -> bool:
        """Drop a buffer expected through ``future`` that nothing uses yet (a prefetch that
        failed: the work's own pull tries again); ``False`` if it is set, failed, deleted or
        held by a use (then it is theirs)."""
        with self._lock:
            entry = self._entries.get(buffer_id)
            if (
                entry is None
                or entry.future is not future
                or future.done()
                or entry.deleted
                or entry.references > 1
            ):
                return False
            del self._entries[buffer_id]
            return True

    def upload(self, buffer_id: str, value: Any) -> bool:
        """A client's upload; ``False`` (nothing kept, readers failed) if the buffer was
        deleted before it arrived."""
        with self._lock:
            early = self._deleted_unset.pop(buffer_id, PENDING) is not PENDING
        if not early:
            self.set(buffer_id, value)
            return True
        if buffer_id in self:  # a reader waits for it: it will never be
            self.fail(buffer_id, BufferError(f"buffer {buffer_id!r} was deleted before its upload"))
        return False

    def ready(self, buffer_id: str) -> bool:
        """Whether ``get`` would return (or raise) at once: the buffer is set or failed."""
        with self._lock:
            entry = self._entries.get(buffer_id)
        return entry is not None and entry.future.done()

    def get(self, buffer_id: str, timeout: float | None, appear_within: float = 0.0) -> Any:
        """The value of a buffer, waiting for it; raises ``BufferError`` naming the cause.

        ``appear_within`` is how long a buffer this executor has not heard of yet may take to
        be announced: another executor or a client may ask before this executor has received
        the command that produces it.
        """
        with self._lock:
            self._appeared.wait_for(lambda: buffer_id in self._entries, appear_within)
            entry = self._entries.get(buffer_id)
        if entry is None:
            raise BufferError(unknown(buffer_id))
        try:
            return entry.future.result(timeout)
        except FutureTimeout:
            raise BufferError(f"{not_ready(buffer_id)} {timeout} s") from None
        except BufferError:
            raise
        except Exception as error:  # the producer's failure, or one before it
            raise BufferError(f"buffer {buffer_id!r}{UPSTREAM}{root_cause(str(error))}") from error


def unknown(buffer_id: str) -> str:
    """How an error saying ``buffer_id`` was not announced in the time asked starts (its
    producer may not have been sent yet)."""
    return f"unknown buffer {buffer_id!r}"


def not_ready(buffer_id: str) -> str:
    """How an error saying ``buffer_id`` was not ready in the time asked starts (the wait may
    be asked again; its producer has not failed)."""
    return f"buffer {buffer_id!r} was not ready within"


def _bytes_held(value: Any) -> int:
    """Bytes of a buffer's value in this process: a device array's addressable shards (each
    device's copy counts), a host array's bytes."""
    try:
        shards = getattr(value, "addressable_shards", None)
        if shards is not None:
            return sum(int(shard.data.nbytes) for shard in shards)
        return int(getattr(value, "nbytes", 0))
    except Exception:  # a deleted array: it holds nothing
        return 0
