"""VirtualSlices over HTTP: bound, pending, preempted, released; a restart in the middle of
binding never binds a device twice."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from datetime import UTC, datetime
from itertools import combinations

import kmock
from kube_cluster import NAMESPACE, Cluster, running_operator, wait_for
from kube_harness import mark_ready, set_executor_pods
from kube_manifests import island, program, vslice

from pathways_client.launcher import free_port
from pathways_core.control.slices import renewal_stamp


def status(cluster: Cluster, name: str, namespace: str = "team") -> dict:
    return (cluster.get("VirtualSlice", name, namespace) or {}).get("status") or {}


def phase(cluster: Cluster, name: str, namespace: str = "team") -> str | None:
    return status(cluster, name, namespace).get("phase")


def assert_no_device_bound_twice(cluster: Cluster) -> None:
    bound = [
        s for s in cluster.list("VirtualSlice") if (s.get("status") or {}).get("phase") == "Bound"
    ]
    for a, b in combinations(bound, 2):
        if a["status"]["island"] == b["status"]["island"]:
            shared = set(a["status"]["devices"]) & set(b["status"]["devices"])
            assert not shared, (a["metadata"]["name"], b["metadata"]["name"], shared)


def test_bound_pending_preempted_released(cluster: Cluster, operator) -> None:
    cluster.create(island("a", topology="2x4", hosts=2))
    cluster.create(vslice("low-1", devices=4))
    cluster.create(vslice("low-2", devices=4))
    wait_for(lambda: phase(cluster, "low-1") == phase(cluster, "low-2") == "Bound")
    assert_no_device_bound_twice(cluster)
    assert wait_for(
        lambda: (cluster.get("Island", "a").get("status") or {}).get("devicesFree") == 0
    )

    # No room: pending with a reason, and an Event.
    cluster.create(vslice("waiter", devices=4))
    pending = wait_for(lambda: (s := status(cluster, "waiter")).get("phase") == "Pending" and s)
    assert pending["reason"] == "InsufficientDevices"
    assert pending["message"].endswith("needs 4 free devices; no matching island has that many now")
    assert wait_for(lambda: cluster.events("waiter", "InsufficientDevices"))[0]["type"] == "Warning"

    # Higher priority: one low slice is preempted, with a reason and an Event.
    cluster.create(vslice("urgent", devices=4, priority=10))
    wait_for(lambda: phase(cluster, "urgent") == "Bound")
    victims = [n for n in ("low-1", "low-2") if phase(cluster, n) == "Preempted"]
    assert len(victims) == 1
    victim = status(cluster, victims[0])
    assert victim["reason"] == "Preempted" and "team/urgent" in victim["message"]
    assert victim["devices"] == []
    # The binding pass posts its Events after it has stored every status.
    wait_for(lambda: cluster.events(victims[0], "Preempted"), what="the Preempted Event")
    assert phase(cluster, "waiter") == "Pending"
    assert_no_device_bound_twice(cluster)

    # Deleting the urgent slice releases its devices (our finalizer): the preempted slice,
    # older than the waiter, gets them back.
    cluster.delete("VirtualSlice", "urgent", "team")
    wait_for(lambda: cluster.get("VirtualSlice", "urgent", "team") is None)
    assert cluster.events("urgent", "Released")
    wait_for(lambda: phase(cluster, victims[0]) == "Bound")
    assert phase(cluster, "waiter") == "Pending"
    assert_no_device_bound_twice(cluster)


def test_slice_larger_than_any_island_waits_with_one_event(cluster: Cluster, operator) -> None:
    cluster.create(island("small", topology="2x4", hosts=2))
    cluster.create(vslice("huge", devices=64))
    pending = wait_for(lambda: (s := status(cluster, "huge")).get("reason") and s)
    assert pending["phase"] == "Pending" and pending["reason"] == "ShapeDoesNotFit"
    assert "does not fit in any matching island (meshes: 2x4)" in pending["message"]
    condition = pending["conditions"][0]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Bound",
        "False",
        "ShapeDoesNotFit",
    )
    wait_for(lambda: cluster.events("huge", "ShapeDoesNotFit"))

    def writes() -> int:
        return cluster.requests_to(lambda r: r.name == "huge" and r.subresource == "status")

    before = writes()
    time.sleep(4.5)  # two resyncs: the same decision, nothing written, no new Event
    assert writes() == before
    assert len(cluster.events("huge", "ShapeDoesNotFit")) == 1


def test_restart_in_the_middle_of_binding_binds_no_device_twice(cluster: Cluster) -> None:
    release = asyncio.Event()

    async def crash_before_third_binding_lands(request: kmock.Request) -> None:
        if request.name == "s3" and request.subresource == "status":
            await release.wait()  # the operator dies while this write is in flight
            raise kmock.KubernetesError(503, "ServiceUnavailable", "the write never landed")

    cluster.call_soon(lambda: cluster.emulator.hooks.append(crash_before_third_binding_lands))
    cluster.create(island("tight", topology="2x4", hosts=2))  # 8 devices, 4 slices of 2
    for name in ("s1", "s2", "s3"):
        cluster.create(vslice(name, devices=2))
    with running_operator():
        wait_for(lambda: phase(cluster, "s1") == phase(cluster, "s2") == "Bound")
        wait_for(
            lambda: cluster.requests_to(lambda r: r.name == "s3" and r.subresource == "status")
        )
    first = {name: status(cluster, name)["devices"] for name in ("s1", "s2")}
    cluster.call_soon(release.set)
    cluster.call_soon(cluster.emulator.hooks.clear)
    assert phase(cluster, "s3") is None  # its binding never landed
    cluster.create(vslice("s4", devices=2))

    with running_operator():
        wait_for(lambda: all(phase(cluster, n) == "Bound" for n in ("s1", "s2", "s3", "s4")))
        # The stored bindings were restored before anything new was bound.
        assert {n: status(cluster, n)["devices"] for n in ("s1", "s2")} == first
        assert_no_device_bound_twice(cluster)
        devices = sorted(d for n in ("s1", "s2", "s3", "s4") for d in status(cluster, n)["devices"])
        assert devices == list(range(8))


def test_metrics_endpoint_reports_slices_devices_and_time_to_bind(cluster: Cluster) -> None:
    port = free_port()
    with running_operator(PATHWAYS_METRICS_PORT=str(port)):
        cluster.create(island("m", topology="2x4", hosts=2))
        cluster.create(vslice("fits", devices=6))
        cluster.create(vslice("later", devices=4))
        wait_for(lambda: phase(cluster, "fits") == "Bound" and phase(cluster, "later") == "Pending")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                return answer.read().decode()

        # A pass sets the island's gauges, then patches the island, then sets the slice
        # gauges (process-wide: stale from earlier tests until then): wait for all of them.
        wanted = (
            'pathways_island_devices_free{island="m"} 2.0',
            'pathways_virtual_slices{phase="Bound"} 1.0',
            'pathways_virtual_slices{phase="Pending"} 1.0',
        )

        def scraped() -> str:
            text = scrape()
            return text if all(line in text for line in wanted) else ""

        text = wait_for(scraped, what=f"the metrics {wanted}")
    assert 'pathways_virtual_slices{phase="Bound"} 1.0' in text
    assert 'pathways_virtual_slices{phase="Pending"} 1.0' in text
    assert 'pathways_island_devices_total{island="m"} 8.0' in text
    count = next(
        line for line in text.splitlines() if line.startswith("pathways_time_to_bind_seconds_count")
    )
    assert float(count.split()[-1]) >= 1
    assert "pathways_reconcile_errors_total" in text


def test_a_lost_host_moves_its_slices_to_healthy_devices(cluster: Cluster, operator) -> None:
    cluster.create(island("h", topology="2x4", hosts=2))  # host 0: devices 0-3, host 1: 4-7
    wait_for(lambda: cluster.get("StatefulSet", "h-executor", NAMESPACE))
    mark_ready(cluster, "h", NAMESPACE, scheduler=1, executors=2)
    set_executor_pods(cluster, "h", NAMESPACE, hosts=2, ready={0, 1})
    wait_for(lambda: (cluster.get("Island", "h").get("status") or {}).get("phase") == "Ready")
    cluster.create(vslice("a", devices=2))
    cluster.create(vslice("b", devices=4))
    wait_for(lambda: phase(cluster, "a") == phase(cluster, "b") == "Bound")
    on_host_1 = next(
        n
        for n in ("a", "b")
        if min(status(cluster, n)["devices"]) >= 4 or max(status(cluster, n)["devices"]) >= 4
    )

    set_executor_pods(cluster, "h", NAMESPACE, hosts=2, ready={0})  # host 1 goes down
    island_status = wait_for(
        lambda: (s := cluster.get("Island", "h").get("status") or {}).get("unhealthyHosts") and s
    )
    assert island_status["phase"] == "Degraded" and island_status["unhealthyHosts"] == [1]
    assert island_status["devicesUnhealthy"] == 4
    wait_for(lambda: cluster.events(on_host_1, "HostUnhealthy"))

    # Nothing stays on host 1; what fits on host 0 is bound there again.
    def settled() -> bool:
        slices = [status(cluster, n) for n in ("a", "b")]
        return all(s["phase"] != "Bound" or max(s["devices"]) < 4 for s in slices) and any(
            s["phase"] == "Bound" for s in slices
        )

    wait_for(settled)
    assert_no_device_bound_twice(cluster)


def test_time_shared_slices_share_devices_exclusive_ones_do_not(cluster: Cluster, operator) -> None:
    cluster.create(island("shared", topology="2x4", hosts=2))
    cluster.create(vslice("tenant-a", devices=4, timeShared=True))
    cluster.create(vslice("tenant-b", devices=4, timeShared=True))
    cluster.create(vslice("alone", devices=4))
    wait_for(lambda: all(phase(cluster, n) == "Bound" for n in ("tenant-a", "tenant-b", "alone")))
    a, b, alone = (set(status(cluster, n)["devices"]) for n in ("tenant-a", "tenant-b", "alone"))
    assert a == b and not a & alone


def test_a_program_whose_slices_arrive_apart_preempts_nobody_for_a_part(
    cluster: Cluster, operator
) -> None:
    # The API server takes a while to create its second inline slice: bound alone, the first
    # preempted low-1 for a program that can never run (its second slice fits no island).
    async def slow_second_slice(request: kmock.Request) -> None:
        data = request.data if isinstance(request.data, dict) else {}
        named = (data.get("metadata") or {}).get("name")
        if request.action == kmock.action.CREATE and named == "big-y":
            await asyncio.sleep(0.5)

    cluster.call_soon(lambda: cluster.emulator.hooks.append(slow_second_slice))
    cluster.create(island("a", topology="2x4", hosts=2))
    for name in ("low-1", "low-2"):
        cluster.create(vslice(name, devices=4))
    wait_for(lambda: phase(cluster, "low-1") == phase(cluster, "low-2") == "Bound")
    cluster.create(
        program(
            "big",
            priority=10,
            slices=[{"name": "x", "devices": 4}, {"name": "y", "devices": 16}],
            driver={"source": "pass"},
        )
    )
    waiting = wait_for(lambda: (s := status(cluster, "big-x")).get("reason") and s)
    assert waiting["phase"] == "Pending" and "its program's slice big-y" in waiting["message"]
    time.sleep(1)  # a few binding passes more
    assert phase(cluster, "low-1") == phase(cluster, "low-2") == "Bound"
    assert not cluster.events("low-1", "Preempted") and not cluster.events("low-2", "Preempted")
    assert not cluster.events("big-x", "Bound")


def test_a_slice_whose_lease_runs_out_is_released_and_its_devices_go_on(cluster: Cluster) -> None:
    """A client killed before it deleted its slice held its devices for ever. The resync is
    far off here: the binder times a pass at the lease's expiry."""
    with running_operator(PATHWAYS_RESYNC_SECONDS="600"):
        cluster.create(island("a", topology="2x4", hosts=2))
        cluster.create(vslice("kept", devices=2, leaseSeconds=5))
        cluster.create(vslice("dropped", devices=4, leaseSeconds=5))
        cluster.create(vslice("plain", devices=2))
        wait_for(lambda: all(phase(cluster, n) == "Bound" for n in ("kept", "dropped", "plain")))
        cluster.create(vslice("waiter", devices=4))
        wait_for(lambda: phase(cluster, "waiter") == "Pending")
        began = time.monotonic()
        while time.monotonic() - began < 8:  # "kept"'s holder renews it, as the API does
            stamp = renewal_stamp(datetime.now(UTC))
            renewal = {"metadata": {"annotations": {"pathways.dev/renewed-at": stamp}}}
            cluster.patch("VirtualSlice", "kept", renewal, "team")
            time.sleep(1)
        released = wait_for(lambda: (s := status(cluster, "dropped"))["phase"] == "Released" and s)
        assert released["reason"] == "LeaseExpired" and not released.get("devices")
        # Events are posted after the statuses of a pass are written.
        assert wait_for(lambda: cluster.events("dropped", "LeaseExpired"))[0]["type"] == "Warning"
        wait_for(lambda: phase(cluster, "waiter") == "Bound")
        assert phase(cluster, "kept") == phase(cluster, "plain") == "Bound"
        assert_no_device_bound_twice(cluster)


def _lists_of_slices(request: kmock.Request) -> bool:
    plural = getattr(request.resource, "plural", None)
    watch = str(request.params.get("watch", "")).lower() in ("true", "1")
    return plural == "virtualslices" and not request.name and not watch


def test_slices_released_together_for_their_leases_give_their_devices_on_at_once(
    cluster: Cluster,
) -> None:
    """The pass once ran in each slice's lease daemon, which kopf cancelled as the slice it
    released stopped matching its filter: the waiters stayed Pending until the resync, and
    most LeaseExpired Events were never posted."""
    with running_operator(PATHWAYS_RESYNC_SECONDS="600"):
        cluster.create(island("a", topology="4x4", hosts=2))
        for index in range(8):
            cluster.create(vslice(f"leased-{index}", devices=1, leaseSeconds=5))
            cluster.create(vslice(f"plain-{index}", devices=1))
        wait_for(
            lambda: (
                all(
                    phase(cluster, s["metadata"]["name"]) == "Bound"
                    for s in cluster.list("VirtualSlice")
                )
                and len(cluster.list("VirtualSlice")) == 16
            )
        )
        for index in range(8):
            cluster.create(vslice(f"waiter-{index}", devices=1))
        wait_for(lambda: all(phase(cluster, f"waiter-{i}") == "Pending" for i in range(8)))
        wait_for(
            lambda: all(phase(cluster, f"waiter-{i}") == "Bound" for i in range(8)),
            timeout=20,
            what="the waiters bound once the leases ran out",
        )
        for index in range(8):
            assert status(cluster, f"leased-{index}")["reason"] == "LeaseExpired"
            wait_for(lambda i=index: cluster.events(f"leased-{i}", "LeaseExpired"))
        assert_no_device_bound_twice(cluster)


def test_a_lease_held_by_a_program_or_shortened_is_timed_by_the_pass(cluster: Cluster) -> None:
    """A slice a running program names is held by it, with no lease to time: its daemon ran
    a pass every second, for ever. A lease shortened took effect only at its old expiry."""
    with running_operator(PATHWAYS_RESYNC_SECONDS="600"):
        cluster.create(island("a", topology="2x4", hosts=2))
        cluster.create(vslice("named", devices=2, leaseSeconds=5))
        cluster.create(
            program(
                "holder",
                slices=[{"name": "main", "virtualSliceName": "named"}],
                driver={"source": "import time; time.sleep(600)"},
            )
        )
        cluster.create(vslice("long", devices=2, leaseSeconds=600))
        wait_for(lambda: phase(cluster, "named") == phase(cluster, "long") == "Bound")
        time.sleep(6)  # past the named slice's lease: nobody renews it
        before = cluster.requests_to(_lists_of_slices)
        time.sleep(4)
        assert cluster.requests_to(_lists_of_slices) - before <= 1
        assert phase(cluster, "named") == "Bound"

        cluster.patch("VirtualSlice", "long", {"spec": {"leaseSeconds": 5}}, "team")
        released = wait_for(
            lambda: (s := status(cluster, "long"))["phase"] == "Released" and s, timeout=15
        )
        assert released["reason"] == "LeaseExpired"

        # The program gone, its slice's lease counts again: it ran out long ago.
        cluster.delete("PathwaysProgram", "holder", "team")
        wait_for(lambda: status(cluster, "named").get("reason") == "LeaseExpired", timeout=15)


def test_renewal_stamps_no_renewal_wrote_block_no_one(cluster: Cluster) -> None:
    """Anyone who may edit a slice can write its renewed-at annotation: one without a time
    zone made every binding pass fail (no slice of any tenant was bound), one at the end of
    time overflowed, and the slice could no longer be deleted."""
    with running_operator(PATHWAYS_RESYNC_SECONDS="600"):
        cluster.create(island("a", topology="2x4", hosts=2))
        stamps = {"naive": "2030-01-01T00:00:00", "end-of-time": "9999-12-31T23:59:59Z"}
        for name, stamp in stamps.items():
            leased = vslice(name, devices=2, leaseSeconds=600)
            leased["metadata"]["annotations"] = {"pathways.dev/renewed-at": stamp}
            cluster.create(leased)
        cluster.create(vslice("other", devices=2))
        wait_for(lambda: all(phase(cluster, n) == "Bound" for n in (*stamps, "other")))
        for name in stamps:
            cluster.delete("VirtualSlice", name, "team")
            wait_for(lambda n=name: cluster.get("VirtualSlice", n, "team") is None)
        assert_no_device_bound_twice(cluster)
