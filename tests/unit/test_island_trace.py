"""An island's trace: one bound for all clients, the client holding the most losing its
oldest records first, and what each lost remembered."""

from __future__ import annotations

import threading
from typing import NoReturn

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.scheduling import ExecutorSpec, IslandDispatcher
from pathways_core.scheduling.island import TraceRecord
from pathways_core.scheduling.trace import IslandTrace, in_order
from pathways_core.wire import pb
from pathways_scheduler import server


def test_a_flooding_client_loses_its_own_oldest_records_not_the_others() -> None:
    """Kept in one list, a tenant's flood let go of a program's trace that ran before it."""
    trace: IslandTrace[str] = IslandTrace(limit=100)
    for n in range(5):
        trace.keep("quiet", f"q{n}", 1, end_ns=n)
    for n in range(500):
        trace.keep("flood", f"f{n}", 1, end_ns=1000 + n)
    entries = list(in_order(trace.snapshot()))
    assert entries[:5] == [f"q{n}" for n in range(5)]  # all of them, first as reported
    flooded = entries[5:]
    assert flooded == [f"f{n}" for n in range(500 - len(flooded), 500)]  # its latest
    assert 90 <= trace.size <= 100
    assert trace.dropped_until_ns() == {"flood": 1000 + 500 - len(flooded) - 1}


def test_entries_standing_for_many_records_count_them_and_order_is_the_reports() -> None:
    trace: IslandTrace[str] = IslandTrace(limit=10)
    trace.keep("a", "a-call", 6, end_ns=6)
    trace.keep("b", "b0", 1, end_ns=7)
    trace.keep("a", "a1", 1, end_ns=8)
    assert list(in_order(trace.snapshot())) == ["a-call", "b0", "a1"]
    trace.keep("b", "b-call", 4, end_ns=9)  # 12 > 10: "a" (7) loses its oldest, the call
    assert list(in_order(trace.snapshot())) == ["b0", "a1", "b-call"]
    assert (trace.size, trace.dropped_until_ns()) == (6, {"a": 6})
    with pytest.raises(ValueError, match="trace limit must be >= 1"):
        IslandTrace(0)


class Name(str):
    """A client name that counts how often it is looked up (hashed): what letting go costs."""

    lookups = 0

    def __hash__(self) -> int:
        Name.lookups += 1
        return str.__hash__(self)


def test_letting_go_looks_up_a_few_clients_per_entry_not_every_client() -> None:
    """Finding the client holding the most by a scan of every client, per entry let go, held
    the island's lock for 29 s once 20,000 sessions filled the default bound."""
    clients, each = 1000, 10
    trace: IslandTrace[int] = IslandTrace(limit=clients * each)
    for n in range(clients):
        name = Name(f"session-{n}")
        for k in range(each):
            trace.keep(name, k, 1, end_ns=k)
    Name.lookups = 0
    trace.keep(Name("new"), 0, 1, end_ns=0)  # past the bound: a tenth goes
    let_go = clients * each + 1 - trace.size
    assert let_go > clients * each // 10
    # A scan per entry: about clients * let_go (a million) lookups.
    assert Name.lookups <= 10 * (clients + let_go), Name.lookups


def test_only_the_latest_marks_of_clients_holding_nothing_are_kept() -> None:
    """Never forgotten, the marks of 300,000 short sessions made a trace answer of no records
    23 MiB."""
    trace: IslandTrace[int] = IslandTrace(limit=100)
    assert trace.max_emptied == 10
    for n in range(1000):
        for k in range(4):
            trace.keep(f"session-{n}", k, 1, end_ns=n)
    marks = trace.dropped_until_ns()
    holding = {client for client in marks if trace.snapshot([client])}
    assert len(marks) - len(holding) == 10  # those holding nothing: the latest to lose all
    assert len(marks) <= trace.limit + trace.max_emptied
    emptied = sorted(set(marks) - holding, key=lambda client: int(client.split("-")[1]))
    latest = max(int(client.split("-")[1]) for client in set(marks) - holding)
    assert emptied == [f"session-{n}" for n in range(latest - 9, latest + 1)]
    # A client holding records again keeps its mark while it holds any, though more than the
    # bound of others lose their last meanwhile.
    comeback = emptied[0]
    trace.keep(comeback, 99, 1, end_ns=10**6)
    for n in range(1000, 1030):
        for k in range(4):
            trace.keep(f"session-{n}", k, 1, end_ns=n)
    now = trace.dropped_until_ns()
    assert not set(emptied) & set(now) - {comeback}  # forgotten, oldest first
    assert trace.snapshot([comeback]) and now[comeback] == marks[comeback]


class OneAtATime:
    """The trace's rule as first written: one entry at a time from the client holding the most
    (the first to come among equals); and of clients holding nothing, the latest
    ``max(1, limit // 10)`` marks."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self.entries: dict[str, list[tuple[int, str, int, int]]] = {}
        self.sizes: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.emptied: list[str] = []
        self.order = 0

    def keep(self, client: str, entry: str, size: int, end_ns: int) -> None:
        if client not in self.entries:
            self.entries[client], self.sizes[client] = [], 0
            if client in self.emptied:
                self.emptied.remove(client)
        self.entries[client].append((self.order, entry, size, end_ns))
        self.order += 1
        self.sizes[client] += size
        self.size += size
        if self.size <= self.limit:
            return
        while self.size > self.limit - self.limit // 10:
            largest = max(self.sizes, key=self.sizes.__getitem__)
            _, _, lost, end = self.entries[largest].pop(0)
            self.sizes[largest] -= lost
            self.size -= lost
            self.dropped[largest] = max(self.dropped.get(largest, end), end)
            if not self.entries[largest]:
                del self.entries[largest], self.sizes[largest]
                self.emptied.append(largest)
        while len(self.emptied) > max(1, self.limit // 10):
            del self.dropped[self.emptied.pop(0)]

    def in_order(self) -> list[str]:
        return [entry for _, entry, _, _ in sorted(e for es in self.entries.values() for e in es)]


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 40),
    steps=st.lists(
        st.tuples(st.integers(0, 6), st.integers(1, 5), st.integers(-5, 100)), max_size=300
    ),
)
def test_letting_go_is_one_entry_at_a_time_from_the_client_holding_the_most(
    limit: int, steps: list[tuple[int, int, int]]
) -> None:
    """The heap of clients keeps the rule: the same entries go, and the same marks stay."""
    trace: IslandTrace[str] = IslandTrace(limit)
    model = OneAtATime(limit)
    for n, (client, size, end_ns) in enumerate(steps):
        trace.keep(f"c{client}", f"e{n}", size, end_ns)
        model.keep(f"c{client}", f"e{n}", size, end_ns)
        assert list(in_order(trace.snapshot())) == model.in_order()
        assert (trace.size, trace.dropped_until_ns()) == (model.size, model.dropped)


class Refused(Exception):
    """What a gRPC context's ``abort`` raises."""


class Context:
    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Refused(code, details)


def test_a_trace_answer_counts_the_marks_it_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records filled the whole answer and the marks came on top (an answer of no records
    and 300,000 sessions' marks took 23 MiB); marks alone beyond an answer are refused."""
    service = server.SchedulerService.__new__(server.SchedulerService)
    service._lock = threading.Lock()
    service.dispatcher = IslandDispatcher([ExecutorSpec(0, "h:0", (0,))], trace_limit=100)
    for n in range(300):
        client = f"session-{n:04d}-" + "x" * 200
        for k in range(2):
            seq = 2 * n + k
            record = TraceRecord(seq, f"{client}/{k}", client, "f", (0,), 0, seq, seq + 1, True)
            service.dispatcher._keep(record, 1)
    whole = service.GetTrace(pb.TraceRequest(), Context())
    assert len(whole.dropped_until_ns) > 50 and len(whole.records) > 50
    limit = whole.ByteSize() // 2
    monkeypatch.setattr(server, "MAX_TRACE_ANSWER_BYTES", limit)
    capped = service.GetTrace(pb.TraceRequest(), Context())
    assert capped.ByteSize() <= limit
    assert 0 < len(capped.records) < len(whole.records)
    assert capped.records[-1].seq == whole.records[-1].seq  # the newest
    for record in whole.records[: len(whole.records) - len(capped.records)]:
        assert capped.dropped_until_ns[record.client] >= record.end_ns  # left out: said so
    monkeypatch.setattr(server, "MAX_TRACE_ANSWER_BYTES", 1000)
    with pytest.raises(Refused) as refused:
        service.GetTrace(pb.TraceRequest(), Context())
    assert refused.value.args[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "TraceRequest.clients" in refused.value.args[1]
    one = whole.records[-1].client
    mine = service.GetTrace(pb.TraceRequest(clients=[one]), Context())
    assert {record.client for record in mine.records} == {one}
