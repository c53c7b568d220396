"""Rate limits as token buckets: a pure state machine (the caller passes the time in).

Each key (for the REST API: a tenant and its budget, mutating requests or reads) has a bucket
holding at most ``burst`` tokens, refilled at ``rate`` tokens per second. A request takes one
token, or is refused with how long until one is there (``retry_after``). A refused request takes
nothing, so a client that waits ``retry_after`` is served. Keys are independent: one tenant
spending its budget never slows another.

A :class:`Limit` with ``rate == 0`` is no limit at all. Buckets that refilled to ``burst`` are
the same as new ones, so they are forgotten when there are many keys (memory stays bounded by
the keys active within ``burst / rate`` seconds).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

# Float arithmetic: a client waiting exactly ``retry_after`` must find its token there.
_EPSILON = 1e-9


class LimitError(ValueError):
    """A limit is malformed; the message says what is expected."""


@dataclass(frozen=True)
class Limit:
    """``rate`` requests per second on average, at most ``burst`` at once; ``rate == 0``
    disables the limit."""

    rate: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not math.isfinite(self.rate) or self.rate < 0:
            raise LimitError(
                f"a rate is a finite number of requests per second >= 0, not {self.rate}"
            )
        if self.rate > 0 and self.burst < 1:
            raise LimitError(f"a burst is a whole number of requests >= 1, not {self.burst}")

    @property
    def enabled(self) -> bool:
        """Whether requests are limited at all."""
        return self.rate > 0

    def describe(self) -> str:
        """The limit in words, for error messages."""
        if not self.enabled:
            return "unlimited"
        return f"{self.rate:g} requests/s (bursts of {self.burst})"

    @classmethod
    def parse(cls, text: str) -> Limit:
        """``RATE`` or ``RATE,BURST`` (requests per second, then the largest burst); ``0``
        disables the limit. Without a burst, one second's worth of requests (at least 1)."""
        parts = [part.strip() for part in str(text).split(",")]
        if len(parts) not in (1, 2) or not all(parts):
            raise LimitError(f"expected RATE or RATE,BURST (such as 100,5000), not {text!r}")
        try:
            rate = float(parts[0])
        except ValueError:
            raise LimitError(
                f"the rate {parts[0]!r} is not a number of requests per second"
            ) from None
        if len(parts) == 2:
            try:
                burst = int(parts[1])
            except ValueError:
                raise LimitError(f"the burst {parts[1]!r} is not a whole number") from None
        else:
            burst = max(1, math.ceil(rate)) if math.isfinite(rate) else 1
        return cls(rate, burst)

    def __str__(self) -> str:
        return f"{self.rate:g},{self.burst}" if self.enabled else "0"


@dataclass(frozen=True)
class Decision:
    """A request's fate: allowed, or refused until ``retry_after`` seconds from now."""

    allowed: bool
    retry_after: float = 0.0
    remaining: int = 0  # whole tokens left after this request


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """One token bucket per key, all with the same :class:`Limit`."""

    def __init__(self, limit: Limit, max_keys: int = 10_000) -> None:
        self.limit = limit
        self.max_keys = max_keys
        self._buckets: dict[Hashable, _Bucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: Hashable, now: float, cost: float = 1.0) -> Decision:
        """Take ``cost`` tokens from ``key``'s bucket at time ``now`` (seconds, any epoch, but
        one clock); refused requests take nothing."""
        limit = self.limit
        if not limit.enabled:
            return Decision(True, 0.0, limit.burst)
        if cost > limit.burst:
            raise LimitError(f"a request costing {cost} can never fit a burst of {limit.burst}")
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(limit.burst), now)
        self._refill(bucket, now)
        if bucket.tokens + _EPSILON >= cost:
            bucket.tokens = max(0.0, bucket.tokens - cost)
            return Decision(True, 0.0, int(bucket.tokens + _EPSILON))
        return Decision(False, (cost - bucket.tokens) / limit.rate, 0)

    def tokens(self, key: Hashable, now: float) -> float:
        """Tokens ``key`` holds at ``now`` (a full bucket for an unknown key)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return float(self.limit.burst)
        elapsed = max(0.0, now - bucket.updated)
        return min(float(self.limit.burst), bucket.tokens + elapsed * self.limit.rate)

    def _refill(self, bucket: _Bucket, now: float) -> None:
        # A clock that steps back refills nothing (and never takes tokens away).
        elapsed = max(0.0, now - bucket.updated)
        bucket.tokens = min(float(self.limit.burst), bucket.tokens + elapsed * self.limit.rate)
        bucket.updated = max(bucket.updated, now)

    def _forget_full(self, now: float) -> None:
        full = [key for key in self._buckets if self.tokens(key, now) >= self.limit.burst]
        for key in full:
            del self._buckets[key]


@dataclass(frozen=True)
class Budgets:
    """The two budgets of a tenant: mutating requests (create, cancel, delete) and reads, so
    that polling cannot starve submissions and a burst of submissions cannot starve reads."""

    mutating: Limit
    read: Limit


class TenantRateLimiter:
    """Per-tenant token buckets for mutating requests and reads (see :class:`Budgets`)."""

    def __init__(self, budgets: Budgets, max_tenants: int = 10_000) -> None:
        self.budgets = budgets
        self._buckets = {
            "mutating": TokenBuckets(budgets.mutating, max_tenants),
            "read": TokenBuckets(budgets.read, max_tenants),
        }

    def take(self, tenant: str, mutating: bool, now: float) -> Decision:
        """One request of ``tenant`` at ``now``."""
        return self._buckets["mutating" if mutating else "read"].take(tenant, now)

    def limit(self, mutating: bool) -> Limit:
        """The limit of a budget."""
        return self.budgets.mutating if mutating else self.budgets.read
