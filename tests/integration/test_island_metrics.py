"""The island's Prometheus metrics, scraped from real processes: per client, the computations
completed, failed and refused and the device time held; the queue; each executor's buffers
and the bytes its data plane moved."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from conftest import executor_infos, export, f32
from conftest import increment as increment_of
from prometheus_client.parser import text_string_to_metric_families

from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland, Process
from pathways_core.wire import pb

INCREMENT = increment_of()


def scrape(process: Process) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A process's metrics: (sample name, sorted labels) -> value."""
    answer = httpx.get(f"http://127.0.0.1:{process.health_port}/metrics", timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(metrics, name: str, **labels: str) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


def test_the_scheduler_counts_each_clients_work_and_device_time(island: LocalIsland) -> None:
    scheduler = island.scheduler
    assert scheduler is not None
    name = island.name
    matmul = export(lambda x: x @ x, f32(256, 256))
    with (
        IslandClient(island.scheduler_endpoint, "metrics-light", weight=1) as light,
        IslandClient(island.scheduler_endpoint, "metrics-heavy", weight=3) as heavy,
    ):
        increment = light.register(INCREMENT, "increment")
        x = light.put(np.zeros(4, np.float32), device=0)
        for _ in range(5):
            light.submit(increment, [0], [x], 1).wait(30)
        wrong = light.put(np.zeros((2, 2), np.float32), device=0)
        with pytest.raises(IslandError):
            light.submit(increment, [0], [wrong], 1).wait(30)  # fails on the executor
        with pytest.raises(IslandError):
            light.submit(increment, [0], ["metrics-light/never-made"], 1).wait(30)  # refused
        square = heavy.register(matmul, "square")
        y = heavy.put(np.ones((256, 256), np.float32), device=4)
        heavy.submit(square, [4], [y], 1).wait(60)
        metrics = scrape(scheduler)
        records = light.trace()
        assert value(metrics, "pathways_island_sessions", island=name) >= 2
        assert (
            value(metrics, "pathways_island_client_weight", island=name, client="metrics-heavy")
            == 3
        )
        for client in ("metrics-light", "metrics-heavy"):
            assert value(metrics, "pathways_island_queued", island=name, client=client) == 0
    counted = {
        outcome: value(
            metrics,
            "pathways_island_computations_total",
            island=name,
            client="metrics-light",
            outcome=outcome,
        )
        for outcome in ("completed", "failed", "refused")
    }
    assert counted == {"completed": 5, "failed": 1, "refused": 1}
    light_seconds = value(
        metrics, "pathways_island_device_seconds_total", island=name, client="metrics-light"
    )
    heavy_seconds = value(
        metrics, "pathways_island_device_seconds_total", island=name, client="metrics-heavy"
    )
    assert light_seconds > 0 and heavy_seconds > 0
    # The light client's device time is its trace's: run time x devices, record by record.
    traced = sum(
        (r.end_ns - r.start_ns) * len(r.devices) for r in records if r.client == "metrics-light"
    )
    assert light_seconds == pytest.approx(traced / 1e9)
    # Sessions ended: their usage stays, their queue and weight go.
    after = scrape(scheduler)
    assert (
        value(
            after,
            "pathways_island_computations_total",
            island=name,
            client="metrics-light",
            outcome="completed",
        )
        == 5
    )
    assert (
        "pathways_island_client_weight",
        (("client", "metrics-heavy"), ("island", name)),
    ) not in after
    assert value(after, "pathways_island_in_flight", island=name) == 0
    assert value(after, "pathways_island_executors_lost", island=name) == 0


def test_executors_report_their_buffers_and_the_bytes_they_moved(island: LocalIsland) -> None:
    first, second = island.executors
    before = [scrape(process) for process in (first, second)]
    with IslandClient(island.scheduler_endpoint, "metrics-moves") as client:
        increment = client.register(export(lambda x: x + 1, f32(1024)), "increment-4k")
        x = client.put(np.zeros(1024, np.float32), device=0)
        a = client.submit(increment, [0], [x], 1)  # on executor 0
        b = client.submit(increment, [4], [a.outputs[0]], 1)  # executor 1 pulls a's 4 KiB
        b.wait(30)
        infos = executor_infos(island)
        now = [scrape(process) for process in (first, second)]
    for index, (metrics, info) in enumerate(zip(now, infos, strict=True)):
        host = str(index)
        assert value(metrics, "pathways_executor_functions", host=host) == info.functions
        assert value(metrics, "pathways_executor_executables", host=host) == info.executables
        assert value(metrics, "pathways_executor_buffers", host=host) >= 1

    def moved(metrics, host: str, direction: str) -> float:
        return value(
            metrics, "pathways_executor_transfer_bytes_total", host=host, direction=direction
        )

    assert moved(now[0], "0", "sent") - moved(before[0], "0", "sent") >= 4096
    assert moved(now[1], "1", "pulled") - moved(before[1], "1", "pulled") >= 4096


def test_an_unknown_path_is_404_and_healthz_still_answers(island: LocalIsland) -> None:
    scheduler = island.scheduler
    assert scheduler is not None
    base = f"http://127.0.0.1:{scheduler.health_port}"
    assert httpx.get(f"{base}/nothing", timeout=10).status_code == 404
    assert httpx.get(f"{base}/healthz", timeout=10).text == "ok"
    assert "pathways_island_sessions" in httpx.get(f"{base}/metrics?x=1", timeout=10).text


def test_a_hello_again_changes_the_sessions_weight(island: LocalIsland) -> None:
    scheduler = island.scheduler
    assert scheduler is not None
    with IslandClient(island.scheduler_endpoint, "metrics-reweigh", weight=1) as client:
        client._send(pb.ClientMessage(hello=pb.Hello(client=client.client, weight=8, priority=0)))
        # The session's messages are applied in order: once a registration after the hello is
        # answered, the hello was applied.
        client.register(INCREMENT, "increment")
        labels = (("client", "metrics-reweigh"), ("island", island.name))
        assert scrape(scheduler)[("pathways_island_client_weight", labels)] == 8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"weight": 0}, "weight: expected an int from 1"),
        ({"weight": -5}, "weight: expected an int from 1"),
        ({"weight": 2**40}, "weight: expected an int from 1"),
        ({"priority": 2**31}, "priority: expected a 32-bit int"),
        ({"weight": 1.5}, "weight: expected an int"),
    ],
)
def test_a_weight_or_priority_out_of_range_is_refused_naming_it(
    island: LocalIsland, options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        IslandClient(island.scheduler_endpoint, "metrics-bad", **options)
