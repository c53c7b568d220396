"""Per-tenant rate limits of the API: the pure token buckets of
:mod:`pathways_core.control.rate_limit` applied to authenticated callers.

Each tenant has two budgets, per API process (an API of N replicas admits up to N times as much):

- **mutating** requests (POST, PUT, PATCH, DELETE): ``PATHWAYS_API_RATE_LIMIT``, default
  ``100,5000`` (100 requests per second, bursts of 5000);
- **reads** (GET, HEAD, ...): ``PATHWAYS_API_READ_RATE_LIMIT``, default ``1000,10000``.

Both are ``RATE`` or ``RATE,BURST``; ``0`` disables a budget. Over budget, a request gets 429
``RateLimited`` with a ``Retry-After`` header (whole seconds) before anything is done, so
retrying it is always safe. Probes (``/healthz``, ``/readyz``) and ``/metrics`` are not limited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from pathways_api import metrics
from pathways_api.errors import RateLimited
from pathways_core.control.rate_limit import Budgets, Limit, LimitError, TenantRateLimiter

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
RATE_LIMIT_ENV = "PATHWAYS_API_RATE_LIMIT"
READ_RATE_LIMIT_ENV = "PATHWAYS_API_READ_RATE_LIMIT"
DEFAULT_BUDGETS = Budgets(mutating=Limit(100, 5000), read=Limit(1000, 10000))


def budgets_from(
    environment: Mapping[str, str],
    mutating: str | None = None,
    read: str | None = None,
) -> Budgets:
    """The budgets from flags (``mutating``, ``read``) or else the environment, or else the
    defaults; raises ``ValueError`` naming the setting at fault."""
    chosen = []
    for flag, name, variable, default in (
        (mutating, "--rate-limit", RATE_LIMIT_ENV, DEFAULT_BUDGETS.mutating),
        (read, "--read-rate-limit", READ_RATE_LIMIT_ENV, DEFAULT_BUDGETS.read),
    ):
        text, source = (flag, name) if flag is not None else (environment.get(variable), variable)
        if text is None or not text.strip():
            chosen.append(default)
            continue
        try:
            chosen.append(Limit.parse(text))
        except LimitError as error:
            raise ValueError(f"{source}: {error}") from None
    return Budgets(*chosen)


class ApiRateLimiter:
    """Checks each authenticated request against its tenant's budget."""

    def __init__(
        self, budgets: Budgets = DEFAULT_BUDGETS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budgets = budgets
        self._limiter = TenantRateLimiter(budgets)
        self._clock = clock

    def check(self, tenant: str, method: str) -> None:
        """Count one request of ``tenant``; raises :class:`RateLimited` when over budget."""
        mutating = method.upper() in MUTATING_METHODS
        decision = self._limiter.take(tenant, mutating, self._clock())
        if decision.allowed:
            return
        budget = "mutating" if mutating else "read"
        metrics.rate_limited(tenant, budget)
        limit = self._limiter.limit(mutating)
        wait = decision.retry_after
        kind = "mutating requests (POST, PUT, PATCH, DELETE)" if mutating else "reads"
        raise RateLimited(
            f"tenant {tenant!r} is over its rate limit for {kind} of {limit.describe()}; "
            f"nothing was done: retry after {wait:.2f} s",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
