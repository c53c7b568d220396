"""What an island keeps of its trace: every client's entries, in the order they were reported,
within one bound for all of them.

Past the bound (``limit`` records or so), the oldest entries of the client holding the most
go first, a tenth of the bound at a time: kept in one list, one tenant's flood of small
computations let go of every other tenant's records, and a program that ran before it found
its trace empty. The end of the latest record each client lost is remembered, so whoever
reads a client's trace can tell it is incomplete; of the clients that hold no records any
more, only the marks of the latest ``limit // 10`` (at least one) to lose their last are
(many short-lived sessions otherwise grew the marks, and every trace answer, without bound).

An entry stands for one record or more (a reported program call stands for its nodes'); the
island makes the records when the trace is read.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
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
        # Clients with a mark that hold no records, the one that lost its last longest ago
        # first: beyond ``max_emptied`` of them, their marks are forgotten in that order.
        self._emptied: OrderedDict[str, None] = OrderedDict()
        self.max_emptied = max(1, limit // 10)
        self.size = 0
        """The records the trace holds or stands for."""

    def keep(self, client: str, entry: Entry, size: int, end_ns: int) -> None:
        """Add an entry of ``client`` standing for ``size`` records, the last ending at
        ``end_ns``; past the limit, let go of the oldest of the largest clients'."""
        entries = self._entries.get(client)
        if entries is None:
            entries = self._entries[client] = deque()
            self._sizes[client] = 0
            if self._emptied:
                self._emptied.pop(client, None)  # its mark now goes with its records
        entries.append((next(self._order), entry, size, end_ns))
        self._sizes[client] += size
        self.size += size
        if self.size > self.limit:
            self._trim(self.limit - self.limit // 10)

    def _trim(self, keep: int) -> None:
        # One entry at a time from the client holding the most, ties to the one that came
        # first: a max-heap of the clients built once per trim (a trim comes once every tenth
        # of the bound), not a scan of every client per entry let go (seconds under the
        # island's lock with tens of thousands of clients). A client's key is one int,
        # -size * n + rank (rank: its place among the n clients), so the heap compares ints.
        clients = list(self._sizes)
        n = len(clients)
        heap = [-size * n + rank for rank, size in enumerate(self._sizes.values())]
        heapq.heapify(heap)
        sizes, dropped = self._sizes, self._dropped
        while self.size > keep:
            top = heapq.heappop(heap)
            rank = top % n
            client = clients[rank]
            entries = self._entries[client]
            held, until = sizes[client], dropped.get(client)
            # It goes on losing while it still holds the most, with no heap work meanwhile
            # (a flooding client loses a tenth of the bound in one go).
            while True:
                _, _, size, end_ns = entries.popleft()
                held -= size
                self.size -= size
                until = end_ns if until is None else max(until, end_ns)
                if not entries or self.size <= keep or (heap and -held * n + rank > heap[0]):
                    break
            dropped[client] = until
            if entries:
                sizes[client] = held
                heapq.heappush(heap, -held * n + rank)
            else:
                del self._entries[client], sizes[client]
                self._emptied[client] = None
        while len(self._emptied) > self.max_emptied:
            forgotten, _ = self._emptied.popitem(last=False)
            del dropped[forgotten]

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
        what ended after). Of the clients holding none any more, only the latest
        ``max_emptied`` to lose their last are named."""
        return dict(self._dropped)


def in_order(snapshot: Snapshot[Entry]) -> Iterator[Entry]:
    """The entries of a snapshot in the order they were reported."""
    for _, entry in heapq.merge(*snapshot, key=lambda item: item[0]):
        yield entry
