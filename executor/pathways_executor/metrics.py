"""The executor's Prometheus metrics: what its Info reports (buffers and their bytes,
functions, executables, programs) and the bytes its data plane moved. Served at ``/metrics``
on the health port."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pathways_executor.server import ExecutorService

SENT = "sent"
PULLED = "pulled"


class Tally:
    """Counters added to from many threads (the data plane serves each peer from its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = defaultdict(int)

    def add(self, name: str, amount: int) -> None:
        with self._lock:
            self._values[name] += amount

    def get(self, name: str) -> int:
        with self._lock:
            return self._values[name]


class ExecutorCollector(Collector):
    """Collects the metrics of one executor."""

    def __init__(self, service: ExecutorService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        info = service.Info(None, None)
        host = str(service.index)
        gauges = {
            "pathways_executor_buffers": ("Buffers held (pending, ready or failed).", info.buffers),
            "pathways_executor_buffer_bytes": (
                "Bytes of the ready buffers' values held on this host.",
                info.buffer_bytes,
            ),
            "pathways_executor_functions": ("Functions loaded.", info.functions),
            "pathways_executor_executables": (
                "Compiled forms of the functions, one per function and device set.",
                info.executables,
            ),
            "pathways_executor_programs": ("Island programs planned.", info.programs),
        }
        for name, (documentation, value) in gauges.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["host"])
            gauge.add_metric([host], value)
            yield gauge
        counter = CounterMetricFamily(
            "pathways_executor_transfer_bytes",
            "Bytes of arrays moved over the data plane: sent to peers, pulled from them.",
            labels=["host", "direction"],
        )
        for direction in (SENT, PULLED):
            counter.add_metric([host, direction], service.tally.get(direction))
        yield counter
        counter = CounterMetricFamily(
            "pathways_executor_inputs_taken_over",
            "Inputs whose buffer a computation (their last use) took over instead of copying.",
            labels=["host"],
        )
        counter.add_metric([host], info.inputs_taken_over)
        yield counter


def renderer(service: ExecutorService) -> Callable[[], bytes]:
    """A function rendering the executor's metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExecutorCollector(service))
    return lambda: generate_latest(registry)
