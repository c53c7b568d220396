"""The chart's pre-delete hook (``python -m pathways_operator.uninstall``) against the emulated
API server: a release's islands are deleted while the operator runs, and waited for."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from kube_cluster import NAMESPACE, Cluster, running_operator, wait_for
from kube_manifests import island, program, vslice

from pathways_core.control.common import FINALIZER

RELEASE = "app.kubernetes.io/instance"


def labelled(name: str, release: str) -> dict[str, Any]:
    document = island(name, topology="4", hosts=1)
    document["metadata"]["labels"] = {RELEASE: release}
    return document


def uninstall(release: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pathways_operator.uninstall",
            f"--selector={RELEASE}={release}",
            f"--timeout={timeout:g}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def scheduler_of(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.get("Deployment", f"{name}-scheduler", NAMESPACE)


def test_the_releases_islands_are_deleted_and_waited_for_others_stay(cluster: Cluster) -> None:
    with running_operator():
        for name, release in (("rel-a", "rel"), ("rel-b", "rel"), ("other", "another")):
            cluster.create(labelled(name, release))
        for name in ("rel-a", "rel-b", "other"):
            wait_for(lambda name=name: scheduler_of(cluster, name), what=f"{name}'s scheduler")
        done = uninstall("rel", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "deleting 2 islands: rel-a, rel-b" in done.stdout
        assert "deleted 2 islands" in done.stdout
        # Gone when it returned: their finalizer ran, and removed their pods' owners.
        assert cluster.get("Island", "rel-a") is None and cluster.get("Island", "rel-b") is None
        assert scheduler_of(cluster, "rel-a") is None and scheduler_of(cluster, "rel-b") is None
        assert cluster.get("Island", "other") is not None and scheduler_of(cluster, "other")
        again = uninstall("rel", timeout=60)  # a retried hook finds nothing left to do
        assert again.returncode == 0 and "nothing to delete" in again.stdout


def test_without_the_operator_it_fails_saying_what_to_check(cluster: Cluster) -> None:
    with running_operator():
        cluster.create(labelled("stuck", "rel"))
        wait_for(lambda: scheduler_of(cluster, "stuck"), what="the island's scheduler")
    # The operator is gone: nothing runs the island's finalizer.
    done = uninstall("rel", timeout=1)
    assert done.returncode == 1
    assert "still there after 1 s: stuck" in done.stdout, done.stdout
    assert "check that it runs" in done.stdout and "finalizers" in done.stdout
    left = cluster.get("Island", "stuck")
    assert left is not None and left["metadata"].get("deletionTimestamp")


def test_a_bad_timeout_is_refused_naming_the_option() -> None:
    done = uninstall("rel", timeout=0)
    assert done.returncode == 2 and "--timeout: expected seconds above 0, got 0" in done.stderr


def release_finalizers(timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pathways_operator.uninstall",
            "--finalizers",
            f"--selector={RELEASE}=rel,app.kubernetes.io/component=operator",
            f"--namespace={NAMESPACE}",
            f"--timeout={timeout:g}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_after_the_operator_is_gone_its_finalizers_are_taken_off(cluster: Cluster) -> None:
    """Programs and slices kept the operator's finalizer once it was uninstalled: deleted
    later, each (and its namespace's deletion) waited for good for an operator that was
    gone."""
    with running_operator():
        cluster.create(labelled("far", "rel"))
        cluster.create(vslice("kept", devices=1))
        sleep = {"source": "import time; time.sleep(60)"}
        cluster.create(program("held", slices=[{"name": "main", "devices": 1}], driver=sleep))
        for kind, name in (("VirtualSlice", "kept"), ("PathwaysProgram", "held")):
            wait_for(
                lambda kind=kind, name=name: (
                    FINALIZER
                    in (cluster.get(kind, name, "team") or {})
                    .get("metadata", {})
                    .get("finalizers", [])
                ),
                what=f"{name}'s finalizer",
            )
    # Its pod is still there (terminating): nothing is taken off, it would put it back.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pw-operator-0",
            "namespace": NAMESPACE,
            "labels": {RELEASE: "rel", "app.kubernetes.io/component": "operator"},
        },
        "spec": {"containers": [{"name": "operator", "image": "pathways"}]},
    }
    cluster.create(pod)
    early = release_finalizers(timeout=1)
    assert early.returncode == 1 and "pods are still there after 1 s (pw-operator-0)" in (
        early.stdout
    )
    assert FINALIZER in cluster.get("VirtualSlice", "kept", "team")["metadata"]["finalizers"]
    cluster.delete("Pod", "pw-operator-0", NAMESPACE)
    done = release_finalizers(timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "took the operator's finalizer off 1 PathwaysPrograms" in done.stdout
    assert "took the operator's finalizer off 2 VirtualSlices" in done.stdout  # (its inline one)
    for kind, name in (("VirtualSlice", "kept"), ("PathwaysProgram", "held")):
        cluster.delete(kind, name, "team")
        wait_for(lambda kind=kind, name=name: cluster.get(kind, name, "team") is None)
