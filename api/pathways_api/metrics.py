"""Prometheus metrics of the API, on its own registry (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = CONTENT_TYPE_LATEST

REQUESTS = Counter(
    "pathways_api_requests",
    "HTTP requests by method, route and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "pathways_api_request_seconds",
    "Time to answer a request, by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
    registry=REGISTRY,
)
RATE_LIMITED = Counter(
    "pathways_api_rate_limited",
    "Requests refused because their tenant was over its rate limit, by tenant and budget.",
    ["tenant", "budget"],
    registry=REGISTRY,
)


def observe(method: str, route: str, status: int, seconds: float) -> None:
    """Count one answered request."""
    REQUESTS.labels(method, route, str(status)).inc()
    LATENCY.labels(route).observe(seconds)


def exposition() -> bytes:
    """The metrics in the Prometheus text format."""
    return generate_latest(REGISTRY)


def rate_limited(tenant: str, budget: str) -> None:
    """Count one request refused by a tenant's rate limit (``budget``: mutating or read)."""
    RATE_LIMITED.labels(tenant, budget).inc()
