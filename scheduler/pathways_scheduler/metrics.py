"""The island scheduler's Prometheus metrics, read from its dispatcher at each scrape.

Gauges of the queue (computations queued per client, in flight, sessions, executors lost,
functions and programs held), a counter of lost executors taken back (restarted) and, per
client, counters of its work (completed, failed, refused) and of the device time it held:
what a platform team graphs to see each tenant's share of an island against its weight.
Served at ``/metrics`` on the health port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pathways_core.scheduling import IslandDispatcher

if TYPE_CHECKING:
    from pathways_scheduler.server import SchedulerService


class IslandCollector(Collector):
    """Collects the metrics of one scheduler's island."""

    def __init__(self, service: SchedulerService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        island = service.island
        weights, queued, usage, totals, rejoined = service.read(_view)
        for name, (documentation, value) in totals.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["island"])
            gauge.add_metric([island], value)
            yield gauge
        taken_back = CounterMetricFamily(
            "pathways_island_executors_rejoined",
            "Lost executors taken back after a restart.",
            labels=["island"],
        )
        taken_back.add_metric([island], rejoined)
        yield taken_back
        for name, documentation, values in (
            ("pathways_island_queued", "Computations queued, by client.", queued),
            (
                "pathways_island_client_weight",
                "Each open session's weight in proportional share.",
                weights,
            ),
        ):
            gauge = GaugeMetricFamily(name, documentation, labels=["island", "client"])
            for client, value in sorted(values.items()):
                gauge.add_metric([island, client], value)
            yield gauge
        counter = CounterMetricFamily(
            "pathways_island_computations",
            "Computations and program calls by client and outcome (completed, failed, refused).",
            labels=["island", "client", "outcome"],
        )
        seconds = CounterMetricFamily(
            "pathways_island_device_seconds",
            "Device time the client's work held: run time x devices, summed over executors.",
            labels=["island", "client"],
        )
        for client, (completed, failed, refused, device_ns) in sorted(usage.items()):
            for outcome, value in (
                ("completed", completed),
                ("failed", failed),
                ("refused", refused),
            ):
                counter.add_metric([island, client, outcome], value)
            seconds.add_metric([island, client], device_ns / 1e9)
        yield counter
        yield seconds


def _view(dispatcher: IslandDispatcher) -> tuple[Any, ...]:
    """What a scrape reports, copied out of the dispatcher."""
    weights = dispatcher.queue.weights()
    queued = {client: dispatcher.queue.queued_by(client) for client in weights}
    usage = {
        client: (u.completed, u.failed, u.refused, u.device_ns)
        for client, u in dispatcher.usage.items()
    }
    totals = {
        "pathways_island_sessions": ("Client sessions open.", dispatcher.sessions),
        "pathways_island_in_flight": (
            "Computations dispatched and not finished.",
            dispatcher.in_flight,
        ),
        "pathways_island_executors_lost": (
            "Executors lost (work on them is refused until they are restarted and taken back).",
            dispatcher.executors_lost,
        ),
        "pathways_island_functions": (
            "Functions held (some open session uses them).",
            dispatcher.functions_held,
        ),
        "pathways_island_programs": (
            "Programs held (some open session uses them).",
            dispatcher.programs_held,
        ),
    }
    return weights, queued, usage, totals, dispatcher.executors_rejoined


def renderer(service: SchedulerService) -> Callable[[], bytes]:
    """A function rendering the island's metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(IslandCollector(service))
    return lambda: generate_latest(registry)
