"""Token-bucket rate limits (pure, time passed in): parsing, refusals with exact retry times,
independent tenants and budgets, bounded memory, and the bucket's invariants under any timing."""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.control.rate_limit import (
    Budgets,
    Limit,
    LimitError,
    TenantRateLimiter,
    TokenBuckets,
)


@pytest.mark.parametrize(
    ("text", "rate", "burst", "enabled"),
    [
        ("100,5000", 100, 5000, True),
        ("100", 100, 100, True),
        (" 2.5 , 3 ", 2.5, 3, True),
        ("0.2", 0.2, 1, True),
        ("0", 0, 1, False),
        ("0,10", 0, 10, False),
    ],
)
def test_limits_parse_rate_and_burst(text: str, rate: float, burst: int, enabled: bool) -> None:
    limit = Limit.parse(text)
    assert (limit.rate, limit.burst, limit.enabled) == (rate, burst, enabled)
    assert Limit.parse(str(limit)).enabled == enabled


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "RATE or RATE,BURST"),
        ("1,2,3", "RATE or RATE,BURST"),
        ("fast", "'fast' is not a number"),
        ("10,many", "'many' is not a whole number"),
        ("10,2.5", "'2.5' is not a whole number"),
        ("-1", ">= 0"),
        ("inf", "finite"),
        ("nan", "finite"),
        ("10,0", "burst is a whole number of requests >= 1"),
    ],
)
def test_malformed_limits_say_what_is_expected(text: str, message: str) -> None:
    with pytest.raises(LimitError, match=message):
        Limit.parse(text)


def test_a_burst_then_refusals_with_the_exact_wait() -> None:
    buckets = TokenBuckets(Limit(rate=2, burst=3))
    assert [buckets.take("a", 10.0).allowed for _ in range(3)] == [True, True, True]
    refused = buckets.take("a", 10.0)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(0.5)  # one token every 1/2 s
    # Refusals take nothing: waiting what was asked is enough, and not a bit less.
    assert not buckets.take("a", 10.0 + 0.49).allowed
    assert buckets.take("a", 10.0 + 0.5).allowed
    assert not buckets.take("a", 10.0 + 0.5).allowed


def test_the_bucket_refills_to_its_burst_and_no_further() -> None:
    buckets = TokenBuckets(Limit(rate=100, burst=5))
    for _ in range(5):
        buckets.take("a", 0.0)
    assert buckets.tokens("a", 3600.0) == 5
    assert sum(buckets.take("a", 3600.0).allowed for _ in range(10)) == 5


def test_keys_are_independent() -> None:
    buckets = TokenBuckets(Limit(rate=1, burst=1))
    assert buckets.take("a", 0.0).allowed
    assert not buckets.take("a", 0.0).allowed
    assert buckets.take("b", 0.0).allowed


def test_a_disabled_limit_allows_everything() -> None:
    buckets = TokenBuckets(Limit(0))
    assert all(buckets.take("a", 0.0).allowed for _ in range(10_000))
    assert len(buckets) == 0


def test_a_clock_stepping_back_mints_no_tokens() -> None:
    buckets = TokenBuckets(Limit(rate=1, burst=1))
    assert buckets.take("a", 100.0).allowed
    assert not buckets.take("a", 50.0).allowed
    assert not buckets.take("a", 100.5).allowed
    assert buckets.take("a", 101.0).allowed


def test_a_request_larger_than_the_burst_is_an_error() -> None:
    with pytest.raises(LimitError, match="never fit"):
        TokenBuckets(Limit(rate=1, burst=2)).take("a", 0.0, cost=3)


def test_memory_is_bounded_by_the_active_keys() -> None:
    buckets = TokenBuckets(Limit(rate=10, burst=1), max_keys=100)
    for n in range(1000):
        buckets.take(f"tenant-{n}", now=float(n))  # each key refilled by the next second
    assert len(buckets) <= 100
    # A key still waiting for tokens is never forgotten (forgetting would hand it a burst).
    busy = TokenBuckets(Limit(rate=1, burst=1), max_keys=2)
    busy.take("a", 0.0)
    busy.take("b", 0.0)
    busy.take("c", 0.0)
    assert not busy.take("a", 0.0).allowed


def test_tenants_have_separate_budgets_for_mutating_requests_and_reads() -> None:
    limiter = TenantRateLimiter(Budgets(mutating=Limit(1, 2), read=Limit(1, 3)))
    assert [limiter.take("a", True, 0.0).allowed for _ in range(3)] == [True, True, False]
    # Reads still go through: polling and submissions do not starve each other.
    assert [limiter.take("a", False, 0.0).allowed for _ in range(4)] == [True, True, True, False]
    assert limiter.take("b", True, 0.0).allowed
    assert limiter.limit(True).describe() == "1 requests/s (bursts of 2)"


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.1, 1000),
    burst=st.integers(1, 50),
    steps=st.lists(st.floats(0, 2), min_size=1, max_size=200),
)
def test_no_window_admits_more_than_its_burst_plus_its_refill(rate, burst, steps) -> None:
    buckets = TokenBuckets(Limit(rate, burst))
    now, admitted = 0.0, []
    for step in steps:
        now += step
        decision = buckets.take("a", now)
        assert 0 <= buckets.tokens("a", now) <= burst + 1e-9
        if decision.allowed:
            admitted.append(now)
        else:
            assert decision.retry_after > 0
            # The wait is enough: a take right then is allowed (tried on a copy).
            assert copy.deepcopy(buckets).take("a", now + decision.retry_after).allowed
    for first in range(len(admitted)):
        for last in range(first, len(admitted)):
            window = admitted[last] - admitted[first]
            assert last - first + 1 <= burst + rate * window + 1e-6


@settings(max_examples=100, deadline=None)
@given(rate=st.floats(0.1, 100), burst=st.integers(1, 20), gap=st.floats(0, 100))
def test_an_idle_key_gets_at_most_its_burst(rate, burst, gap) -> None:
    buckets = TokenBuckets(Limit(rate, burst))
    buckets.take("a", 0.0)
    allowed = sum(buckets.take("a", gap).allowed for _ in range(burst + 5))
    assert allowed == min(burst, math.floor(burst - 1 + rate * gap + 1e-9))
