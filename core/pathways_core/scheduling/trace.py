"""What an island keeps of its trace: every client's entries, in the order they were reported,
within one bound for all of them.

Past the bound (``limit`` records or so), the oldest entries of the client holding the most
go first, a tenth of the bound at a time: kept in one list, one tenant's flood of small
computations let go of every other tenant's records, and a program that ran before it found
its trace empty. The end of the latest record each client lost is remembered, so whoever
reads a client's trace can tell it is incomplete.

An entry stands for one record or more (a reported program call stands for its nodes'); the
island makes the records when the trace is read.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from typing import Generic, TypeVar

DEFAULT_TRACE_LIMIT = 200_000
"""Records an island keeps by default (the scheduler's ``--trace-limit``)."""

Entry = TypeVar("Entry")
# A snapshot: per client, its entries with their place in the report order.
Snapshot = tuple[tuple[tuple[int, Entry], ...], ...]


class IslandTrace(Generic[Entry]):
    """Trace entries per client, at most about ``limit`` records in all (see the module)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"trace limit must be >= 1 (got {limit})")
        self.limit = limit
        self._entries: dict[str, deque[tuple[int, Entry, int, int]]] = {}
        self._sizes: dict[str, int] = {}
        self._order = itertools.count()
        self._dropped: dict[str, int] = {}
        self.size = 0
        """The records the trace holds or stands for."""

    def keep(self, client: str, entry: Entry, size: int, end_ns: int) -> None:
        """Add an entry of ``client`` standing for ``size`` records, the last ending at
        ``end_ns``; past the limit, let go of the oldest of the largest clients'."""
        self._entries.setdefault(client, deque()).append((next(self._order), entry, size, end_ns))
        self._sizes[client] = self._sizes.get(client, 0) + size
        self.size += size
        if self.size > self.limit:
            self._trim(self.limit - self.limit // 10)

    def _trim(self, keep: int) -> None:
        while self.size > keep:
            largest = max(self._sizes, key=self._sizes.__getitem__)
            entries = self._entries[largest]
            _, _, size, end_ns = entries.popleft()
            self._sizes[largest] -= size
            self.size -= size
            self._dropped[largest] = max(self._dropped.get(largest, end_ns), end_ns)
            if not entries:
                del self._entries[largest], self._sizes[largest]

    def snapshot(self, clients: Collection[str] = ()) -> Snapshot[Entry]:
        """The entries now (of ``clients`` only, if any), cheap to take (under the island's
        lock): :func:`in_order` puts them in the report order outside it."""
        return tuple(
            tuple((order, entry) for order, entry, _, _ in entries)
            for client, entries in self._entries.items()
            if not clients or client in clients
        )

    def dropped_until_ns(self) -> Mapping[str, int]:
        """Per client that lost records: the end of the latest one it lost (its trace holds
        what ended after)."""
        return dict(self._dropped)


def in_order(snapshot: Snapshot[Entry]) -> Iterator[Entry]:
    """The entries of a snapshot in the order they were reported."""
    for _, entry in heapq.merge(*snapshot, key=lambda item: item[0]):
        yield entry
