"""Prometheus metrics of the operator (served on ``PATHWAYS_METRICS_PORT``, 9090 by default)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

SLICES = Gauge(
    "pathways_virtual_slices",
    "VirtualSlices after the last binding pass: Bound, or Pending (waiting, preempted included).",
    ["phase"],
)
DEVICES_FREE = Gauge("pathways_island_devices_free", "Devices bound to no slice.", ["island"])
DEVICES_TOTAL = Gauge("pathways_island_devices_total", "Devices of the island.", ["island"])
RECONCILE_ERRORS = Counter(
    "pathways_reconcile_errors_total", "Reconciles that raised, by resource.", ["resource"]
)
TIME_TO_BIND = Histogram(
    "pathways_time_to_bind_seconds",
    "From when the operator first saw a slice unbound to when its binding was stored.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
BINDING_PASSES = Counter("pathways_binding_passes_total", "Binding passes run.")
BINDING_PASS_SECONDS = Histogram(
    "pathways_binding_pass_seconds", "Duration of one binding pass (read, decide, write)."
)


def serve(port: int) -> object | None:
    """Serve ``/metrics`` on ``port`` (0: not at all); returns the server, to shut it down."""
    if not port:
        return None
    server, _thread = start_http_server(port)
    return server
