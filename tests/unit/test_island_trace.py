"""An island's trace: one bound for all clients, the client holding the most losing its
oldest records first, and what each lost remembered."""

from __future__ import annotations

import pytest

from pathways_core.scheduling.trace import IslandTrace, in_order


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
