"""High availability: two replicas of the real entrypoint with kopf peering. One serves, the
other stands by, and takes over when the first stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kube_cluster import NAMESPACE, Cluster, wait_for
from kube_manifests import island, vslice


def replica(
    tmp_path: Path, name: str, priority: int, environment: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    kopf = Path(sys.executable).with_name("kopf")
    process = subprocess.Popen(
        [
            str(kopf),
            "run",
            "-m",
            "pathways_operator",
            "--all-namespaces",
            "--peering=pathways",
            f"--priority={priority}",
        ],
        env={
            **os.environ,
            "PATHWAYS_METRICS_PORT": "0",
            "PATHWAYS_NAMESPACE": NAMESPACE,
            **(environment or {}),
        },
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    return process, log


def peers(cluster: Cluster) -> dict:
    return (cluster.get("ClusterKopfPeering", "pathways") or {}).get("status") or {}


def paused(log: Path) -> bool:
    decisions = [line for line in log.read_text().splitlines() if " operations " in line]
    return not decisions or "Pausing operations" in decisions[-1]


def bound(cluster: Cluster, name: str) -> bool:
    return ((cluster.get("VirtualSlice", name, "team") or {}).get("status") or {}).get(
        "phase"
    ) == "Bound"


def test_standby_replica_takes_over(cluster: Cluster, tmp_path: Path) -> None:
    cluster.create(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "pathways"},
        }
    )
    active, active_log = replica(tmp_path, "active", 20)
    standby, standby_log = replica(tmp_path, "standby", 10)
    try:
        # Both replicas registered; the standby is paused (from the start, or once it saw the
        # active one: kopf starts paused and logs only when it changes its mind).
        wait_for(lambda: len(peers(cluster)) == 2, 60)
        wait_for(lambda: paused(standby_log), 30)
        # The active one resumes once it has seen its peers (on a loaded machine that can come
        # after the standby's log is checked).
        wait_for(lambda: not paused(active_log), 30)
        cluster.create(island("ha", topology="2x4", hosts=2))
        cluster.create(vslice("first", devices=4))
        wait_for(lambda: bound(cluster, "first"), 60)
        # The standby watched nothing and wrote nothing while the active replica served.
        assert "Handler 'slice_event' succeeded" not in standby_log.read_text()

        active.send_signal(signal.SIGINT)  # a rollout: the active replica leaves the peering
        assert active.wait(timeout=60) == 0
        cluster.create(vslice("second", devices=4))
        wait_for(lambda: bound(cluster, "second"), 90)
        first = cluster.get("VirtualSlice", "first", "team")["status"]["devices"]
        second = cluster.get("VirtualSlice", "second", "team")["status"]["devices"]
        assert not set(first) & set(second)
        assert not paused(standby_log)
    finally:
        for process in (active, standby):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=60)


def test_a_standby_takes_over_from_a_killed_replica_within_the_peering_lifetime(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A replica killed outright leaves its peering entry behind: kopf's default lifetime
    (60 s) left the cluster unserved for a minute."""
    peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering"}
    cluster.create({**peering, "metadata": {"name": "pathways"}})
    lifetime = {"PATHWAYS_PEERING_LIFETIME_SECONDS": "15"}
    active, active_log = replica(tmp_path, "active", 20, lifetime)
    standby, standby_log = replica(tmp_path, "standby", 10, lifetime)
    try:
        wait_for(lambda: len(peers(cluster)) == 2, 60)
        assert {peer["lifetime"] for peer in peers(cluster).values()} == {15}
        wait_for(lambda: paused(standby_log), 30)
        wait_for(lambda: not paused(active_log), 30)
        cluster.create(island("ha", topology="2x4", hosts=2))
        active.kill()  # no goodbye: its entry stays until its lifetime runs out
        active.wait(timeout=30)
        killed = time.monotonic()
        cluster.create(vslice("after", devices=4))
        wait_for(lambda: bound(cluster, "after"), 60)
        # The lifetime, the standby's own touch, and a binding pass on a shared machine.
        assert time.monotonic() - killed < 15 + 15
    finally:
        for process in (active, standby):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                process.wait(timeout=60)
