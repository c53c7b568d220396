"""Island children per accelerator kind, and island status transitions (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pathways_core.control import IslandObservation, island_children, island_status, parse
from pathways_core.control.islands import (
    executor_revision,
    pod_troubles,
    ready_host_indexes,
    scheduler_replicas_ready,
    stale_executor_pods,
)
from pathways_core.resources import Island

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def island_document(kind: str, topology: str, hosts: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": {"name": "isl", "uid": "u-1", "generation": 1},
        "spec": {"acceleratorKind": kind, "topology": topology, "hosts": hosts, **spec},
    }


def children(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    island, problem = parse(document)
    assert isinstance(island, Island), problem
    return {
        f"{c['kind']}/{c['metadata']['name']}": c for c in island_children(document, island, "ns")
    }


def executor_pod(document: dict[str, Any]) -> dict[str, Any]:
    return children(document)["StatefulSet/isl-executor"]["spec"]["template"]["spec"]


def test_children_are_named_owned_and_labelled() -> None:
    made = children(island_document("cpu-fake", "2x4", 2))
    assert sorted(made) == [
        "Deployment/isl-scheduler",
        "Service/isl-executor",
        "Service/isl-scheduler",
        "StatefulSet/isl-executor",
    ]
    for child in made.values():
        assert child["metadata"]["namespace"] == "ns"
        assert child["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert child["metadata"]["labels"]["pathways.dev/island"] == "isl"
        assert len(child["metadata"]["annotations"]["pathways.dev/spec-hash"]) == 16
    statefulset = made["StatefulSet/isl-executor"]["spec"]
    assert (statefulset["replicas"], statefulset["serviceName"]) == (2, "isl-executor")
    assert statefulset["podManagementPolicy"] == "Parallel"
    headless = made["Service/isl-executor"]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    deployment = made["Deployment/isl-scheduler"]["spec"]["template"]["spec"]["containers"][0]
    assert deployment["args"][deployment["args"].index("--executor") + 1] == (
        "isl-executor-0.isl-executor.ns.svc:8473"  # not 8471: libtpu's, on multi-host TPUs
    )
    assert deployment["args"].count("--executor") == 2
    # Every port the scheduler listens on is a container port its Service forwards (clients
    # reach the session endpoint at the Service's name: a port picked at start was not).
    args = deployment["args"]
    listening = {int(args[args.index(flag) + 1]) for flag in ("--port", "--session-port")}
    assert listening == {8470, 8472}
    assert listening <= {port["containerPort"] for port in deployment["ports"]}
    service = made["Service/isl-scheduler"]["spec"]["ports"]
    assert listening == {port["port"] for port in service} == {p["targetPort"] for p in service}


def test_the_scheduler_gets_the_islands_policy_queue_bound_run_length_and_trace_bound() -> None:
    scheduler = {
        "policy": "proportional-share",
        "maxQueuedComputations": 64,
        "runLength": 16,
        "traceRecords": 5000,
    }
    made = children(island_document("cpu-fake", "1x4", 1, scheduler=scheduler))
    container = made["Deployment/isl-scheduler"]["spec"]["template"]["spec"]["containers"][0]
    flags = dict(zip(container["args"][3::2], container["args"][4::2], strict=False))
    assert flags["--policy"] == "proportional-share"
    assert (flags["--max-queued"], flags["--run-length"]) == ("64", "16")
    assert flags["--trace-limit"] == "5000"
    defaults = children(island_document("cpu-fake", "1x4", 1))["Deployment/isl-scheduler"]
    assert "--run-length" in defaults["spec"]["template"]["spec"]["containers"][0]["args"]
    _, problem = parse(island_document("cpu-fake", "1x4", 1, scheduler={"runLength": 0}))
    assert problem is not None and "runLength" in problem


def test_island_processes_are_probed_for_liveness_and_silent_executors_timed_out() -> None:
    """A stopped or wedged executor held its island's work for good: kubelet restarts one
    that does not answer GET /healthz, and the scheduler gives up on one silent too long."""
    made = children(island_document("cpu-fake", "1x4", 1, scheduler={"executorTimeoutSeconds": 9}))
    for kind in ("Deployment/isl-scheduler", "StatefulSet/isl-executor"):
        container = made[kind]["spec"]["template"]["spec"]["containers"][0]
        probe = container["livenessProbe"]
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
        assert {"name": "health", "containerPort": 8477} in container["ports"]
        assert "--health-port 8477" in " ".join(container["args"])
    scheduler = made["Deployment/isl-scheduler"]["spec"]["template"]["spec"]["containers"][0]
    assert scheduler["args"][scheduler["args"].index("--executor-timeout") + 1] == "9"
    # An executor is a ready host once its scheduler holds its stream (took it back, restarted).
    executor = made["StatefulSet/isl-executor"]["spec"]["template"]["spec"]["containers"][0]
    assert executor["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    _, problem = parse(
        island_document("cpu-fake", "1x4", 1, scheduler={"executorTimeoutSeconds": 1})
    )
    assert problem is not None and "executorTimeoutSeconds" in problem


def test_fake_cpu_executors_get_device_flags_index_and_coordinator() -> None:
    pod = executor_pod(island_document("cpu-fake", "4x4", 4))
    container = pod["containers"][0]
    script = container["args"][-1]
    assert "command" not in container and container["args"][:2] == ["sh", "-c"]
    assert '--index "$POD_INDEX"' in script
    assert '--first-device "$((POD_INDEX * 4))"' in script
    assert "--hosts 4 --coordinator isl-executor-0.isl-executor.ns.svc:8476" in script
    assert "--fake-devices 4" in script
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert "resources" not in container and "nodeSelector" not in pod


def test_single_host_islands_form_no_distributed_group() -> None:
    script = executor_pod(island_document("cpu-fake", "8", 1))["containers"][0]["args"][-1]
    assert "--hosts" not in script and "--coordinator" not in script


@pytest.mark.parametrize(
    ("kind", "topology", "hosts", "accelerator", "per_host"),
    [
        ("tpu-v5e", "4x4", 2, "tpu-v5-lite-podslice", "8"),
        ("tpu-v6e", "2x4", 1, "tpu-v6e-slice", "8"),
        ("tpu-v4", "2x2x4", 4, "tpu-v4-podslice", "4"),
        ("tpu-v5p", "2x2x2", 2, "tpu-v5p-slice", "4"),
    ],
)
def test_tpu_executors_request_tpus_on_gke_tpu_nodes(
    kind: str, topology: str, hosts: int, accelerator: str, per_host: str
) -> None:
    pod = executor_pod(island_document(kind, topology, hosts))
    container = pod["containers"][0]
    assert container["resources"] == {
        "requests": {"google.com/tpu": per_host},
        "limits": {"google.com/tpu": per_host},
    }
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    assert pod["tolerations"] == [
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "--fake-devices" not in container["args"][-1]
    names = {variable["name"] for variable in container["env"]}
    assert ("TPU_WORKER_HOSTNAMES" in names) == (hosts > 1)


def test_gpu_executors_request_gpus_and_keep_the_islands_own_placement() -> None:
    document = island_document(
        "gpu-h100",
        "8",
        1,
        placement={
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
            "resources": {"requests": {"cpu": "16", "memory": "64Gi"}},
            "priorityClassName": "high",
        },
    )
    pod = executor_pod(document)
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["resources"]["requests"] == {
        "cpu": "16",
        "memory": "64Gi",
        "nvidia.com/gpu": "8",
    }
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "pool": "h100",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"key": "dedicated", "operator": "Equal", "value": "ml"} in pod["tolerations"]
    assert pod["priorityClassName"] == "high"


def test_spec_hash_changes_with_what_the_children_want() -> None:
    before = children(island_document("cpu-fake", "2x4", 2))
    after = children(island_document("cpu-fake", "4x4", 4))
    same = children(island_document("cpu-fake", "2x4", 2))

    def hashes(made: dict[str, dict[str, Any]]) -> dict[str, str]:
        return {k: v["metadata"]["annotations"]["pathways.dev/spec-hash"] for k, v in made.items()}

    assert hashes(before) == hashes(same)
    assert hashes(before)["StatefulSet/isl-executor"] != hashes(after)["StatefulSet/isl-executor"]


def decide(document: dict[str, Any], observed: IslandObservation) -> Any:
    island, problem = parse(document)
    return island_status(
        document, island if isinstance(island, Island) else None, problem, observed, "ns", NOW
    )


@pytest.mark.parametrize(
    ("previous", "scheduler", "executors", "phase", "endpoint"),
    [
        (None, None, None, "Pending", False),
        (None, 0, 1, "Provisioning", False),
        ("Provisioning", 1, 1, "Provisioning", True),
        ("Provisioning", 1, 2, "Ready", True),
        ("Ready", 1, 1, "Degraded", True),
        ("Ready", 0, 2, "Degraded", False),
        ("Degraded", 1, 2, "Ready", True),
    ],
)
def test_island_phase_transitions(
    previous: str | None, scheduler: int | None, executors: int | None, phase: str, endpoint: bool
) -> None:
    document = island_document("cpu-fake", "2x4", 2)
    if previous:
        document["status"] = {"phase": previous}
    decision = decide(document, IslandObservation(scheduler, executors))
    assert decision.phase == phase
    assert (decision.status["schedulerEndpoint"] == "isl-scheduler.ns.svc:8470") == endpoint
    conditions = {c["type"]: c["status"] for c in decision.status["conditions"]}
    assert conditions == {
        "Ready": "True" if phase == "Ready" else "False",
        "Degraded": "True" if phase == "Degraded" else "False",
    }
    # An Event on every transition, none otherwise.
    assert [e.reason for e in decision.events] == ([phase] if previous != phase else [])
    again = dict(document, status=decision.status)
    assert decide(again, IslandObservation(scheduler, executors)).events == []


def test_invalid_island_is_pending_with_the_field_at_fault() -> None:
    decision = decide(island_document("cpu-fake", "2x4", 3), IslandObservation())
    ready = decision.status["conditions"][0]
    assert (decision.phase, ready["reason"]) == ("Pending", "InvalidSpec")
    assert "spec.hosts" in ready["message"]
    assert [e.type for e in decision.events] == ["Warning"]
    assert (
        decide(
            dict(island_document("cpu-fake", "2x4", 3), status=decision.status), IslandObservation()
        ).events
        == []
    )


def test_an_invalid_edit_of_a_running_island_keeps_it_running_as_it_was() -> None:
    document = island_document("cpu-fake", "2x4", 2)
    ready = decide(document, IslandObservation(1, 2)).status
    assert ready["phase"] == "Ready"
    # hosts 2 -> 3 does not divide the 2x4 mesh: the pods are left alone, and so is the status.
    edited = island_document("cpu-fake", "2x4", 3)
    edited["metadata"]["generation"] = 2
    decision = decide(dict(edited, status=ready), IslandObservation())
    status = decision.status
    assert (status["phase"], status["schedulerEndpoint"]) == ("Ready", ready["schedulerEndpoint"])
    assert status["observedGeneration"] == ready["observedGeneration"]
    applied = {c["type"]: c for c in status["conditions"]}["SpecApplied"]
    assert (applied["status"], applied["reason"]) == ("False", "InvalidSpec")
    assert (
        "spec.hosts" in applied["message"] and "keeps running as generation" in applied["message"]
    )
    assert [(e.type, e.reason) for e in decision.events] == [("Warning", "InvalidSpec")]
    assert decide(dict(edited, status=status), IslandObservation()).events == []
    # Fixed: applied again, and said so.
    fixed = island_document("cpu-fake", "2x4", 2)
    fixed["metadata"]["generation"] = 3
    after = decide(dict(fixed, status=status), IslandObservation(1, 2)).status
    applied = {c["type"]: c for c in after["conditions"]}["SpecApplied"]
    assert (after["phase"], after["observedGeneration"], applied["status"]) == ("Ready", 3, "True")


def test_a_refused_child_is_said_in_the_status() -> None:
    refused = IslandObservation(refused="the API server refused StatefulSet isl-executor: 422")
    new = decide(island_document("cpu-fake", "2x4", 2), refused)
    condition = new.status["conditions"][0]
    assert (new.phase, condition["type"], condition["reason"]) == (
        "Pending",
        "Ready",
        "ChildRefused",
    )
    assert "StatefulSet isl-executor: 422" in condition["message"]
    assert [e.reason for e in new.events] == ["ChildRefused"]
    running = island_document("cpu-fake", "2x4", 2)
    ready = decide(running, IslandObservation(1, 2)).status
    kept = decide(dict(running, status=ready), refused)
    assert kept.phase == "Ready" and kept.status["schedulerEndpoint"]


def pod(index: int, revision: str | None, ready: bool = True, deleting: bool = False) -> dict:
    labels = {"apps.kubernetes.io/pod-index": str(index)}
    if revision is not None:
        labels["controller-revision-hash"] = revision
    metadata: dict[str, Any] = {"name": f"isl-executor-{index}", "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": metadata, "status": status}


def statefulset(generation: int, seen: int | None, revision: str = "new") -> dict:
    status: dict[str, Any] = {} if seen is None else {"observedGeneration": seen}
    if seen is not None:
        status["updateRevision"] = revision
    return {"metadata": {"generation": generation}, "status": status}


def test_executor_pods_of_an_old_template_are_restarted_together_and_not_counted() -> None:
    # Scaled from 2 hosts to 4: pods 2 and 3 run the new template, 0 and 1 the old.
    pods = [pod(0, "old"), pod(1, "old"), pod(2, "new"), pod(3, "new", ready=False)]
    revision = executor_revision(statefulset(2, 2))
    assert revision == "new"
    assert stale_executor_pods(pods, revision) == [f"isl-executor-{i}" for i in range(4)]
    assert ready_host_indexes(pods, revision) == frozenset({2})
    # Being deleted, they are not deleted again; the new ones come up.
    going = [pod(0, "old", deleting=True), pod(1, "old", deleting=True), pod(2, "new")]
    assert stale_executor_pods(going, revision) == []
    assert ready_host_indexes(going, revision) == frozenset({2})
    # Before the StatefulSet controller saw the new spec, no pod counts and none is deleted.
    assert executor_revision(statefulset(3, 2)) == ""
    assert ready_host_indexes(pods, "") == frozenset()
    assert stale_executor_pods(pods, "") == []
    # A status without revisions (an emulator's) counts every pod, deletes none.
    assert executor_revision(statefulset(1, None)) is None
    assert ready_host_indexes(pods, None) == frozenset({0, 1, 2})
    assert stale_executor_pods(pods, None) == []


def test_stuck_pods_are_named_in_the_status_message() -> None:
    crashing = pod(0, None, ready=False)
    crashing["status"]["containerStatuses"] = [
        {
            "name": "executor",
            "restartCount": 5,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
        }
    ]
    pulling = pod(1, None, ready=False)
    pulling["status"]["containerStatuses"] = [
        {"name": "executor", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    ]
    unplaced = pod(2, None, ready=False)
    unplaced["status"]["conditions"].append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
        }
    )
    starting = pod(3, None, ready=False)  # ContainerCreating passes by itself: not said
    starting["status"]["containerStatuses"] = [
        {"name": "executor", "state": {"waiting": {"reason": "ContainerCreating"}}}
    ]
    troubles = pod_troubles([crashing, pulling, unplaced, starting])
    assert troubles == (
        "isl-executor-0: CrashLoopBackOff, 5 restarts (back-off 5m0s)",
        "isl-executor-1: ImagePullBackOff",
        "isl-executor-2: Unschedulable (0/3 nodes are available: 3 Insufficient google.com/tpu.)",
    )
    many = pod_troubles([pulling] * 5)
    assert len(many) == 4 and many[-1] == "2 more pods"
    document = island_document("cpu-fake", "4x4", 4)
    waiting = decide(document, IslandObservation(0, 0, frozenset(), troubles=troubles))
    ready = {c["type"]: c for c in waiting.status["conditions"]}["Ready"]
    assert "CrashLoopBackOff, 5 restarts" in ready["message"]
    assert "Insufficient google.com/tpu" in ready["message"]


def test_the_scheduler_counts_as_ready_once_its_rollout_is_done() -> None:
    def deployment(generation: int, seen: int, updated: int, replicas: int) -> dict:
        status = {"observedGeneration": seen, "updatedReplicas": updated, "replicas": replicas}
        return {"metadata": {"generation": generation}, "status": {**status, "readyReplicas": 1}}

    assert scheduler_replicas_ready(deployment(2, 2, 1, 1)) == 1
    assert scheduler_replicas_ready(deployment(2, 1, 1, 1)) == 0  # new spec not seen yet
    assert scheduler_replicas_ready(deployment(2, 2, 1, 2)) == 0  # the old one still runs
    assert scheduler_replicas_ready({"status": {"readyReplicas": 1}}) == 1


def test_external_island_is_ready_at_its_annotated_endpoint() -> None:
    document = island_document("cpu-fake", "4", 1)
    document["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": "10.0.0.1:8470"}
    decision = decide(document, IslandObservation())
    assert decision.external and decision.phase == "Ready"
    assert decision.status["schedulerEndpoint"] == "10.0.0.1:8470"
    assert decision.status["readyHosts"] == 1


def test_external_island_reported_down_goes_degraded_then_ready_at_its_new_endpoint() -> None:
    # The embedded supervisor reports an island it is restarting: no host and no scheduler.
    document = island_document("cpu-fake", "2x2", 2)
    document["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": "127.0.0.1:1000"}
    document["status"] = decide(document, IslandObservation()).status
    down = decide(document, IslandObservation(0, 0, frozenset()))
    assert down.external and down.phase == "Degraded"
    assert down.status["unhealthyHosts"] == [0, 1] and down.status["devicesUnhealthy"] == 4
    assert down.status["schedulerEndpoint"] is None  # programs wait: nothing answers there
    assert [(e.type, e.reason) for e in down.events] == [("Warning", "Degraded")]
    degraded = next(c for c in down.status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostsLost")
    # Restarted at a new endpoint: Ready there, with an Event, its hosts healthy again.
    document["status"] = down.status
    document["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": "127.0.0.1:2000"}
    back = decide(document, IslandObservation(1, 2, frozenset({0, 1})))
    assert back.phase == "Ready" and back.status["schedulerEndpoint"] == "127.0.0.1:2000"
    assert back.status["unhealthyHosts"] == [] and back.status["readyHosts"] == 2
    assert [(e.type, e.reason) for e in back.events] == [("Normal", "Ready")]
    # With nothing reported it stays Ready as declared (the operator's external islands).
    document["status"] = back.status
    assert decide(document, IslandObservation()).phase == "Ready"


def test_hosts_lost_after_ready_are_named_by_ordinal() -> None:
    document = island_document("cpu-fake", "4x4", 4)
    document["status"] = {"phase": "Ready"}
    decision = decide(document, IslandObservation(1, 3, frozenset({0, 2, 3})))
    assert decision.phase == "Degraded"
    assert decision.status["unhealthyHosts"] == [1] and decision.status["devicesUnhealthy"] == 4
    assert decision.status["readyHosts"] == 3
    # Before the island was ever Ready, missing hosts are still starting, not unhealthy.
    fresh = decide(
        island_document("cpu-fake", "4x4", 4), IslandObservation(1, 3, frozenset({0, 2, 3}))
    )
    assert fresh.phase == "Provisioning" and fresh.status["unhealthyHosts"] == []


def test_every_host_of_a_ready_island_whose_executor_pods_are_all_gone_is_unhealthy() -> None:
    """No pod says which hosts are ready, and the StatefulSet says none is (all its pods
    deleted at once, as a new executor template has them): its slices were bound again on
    devices of no live executor."""
    document = island_document("cpu-fake", "2x4", 2)
    document["status"] = {"phase": "Ready"}
    gone = decide(document, IslandObservation(1, 0, None))
    assert gone.phase == "Degraded"
    assert gone.status["unhealthyHosts"] == [0, 1] and gone.status["devicesUnhealthy"] == 8
    # Before it was ever Ready, it is still starting.
    fresh = decide(island_document("cpu-fake", "2x4", 2), IslandObservation(1, 0, None))
    assert fresh.phase == "Provisioning" and fresh.status["unhealthyHosts"] == []


def test_ready_host_indexes_come_from_ready_pods() -> None:
    from pathways_core.control.islands import ready_host_indexes

    def pod(index: int, ready: bool) -> dict[str, Any]:
        return {
            "metadata": {
                "name": f"isl-executor-{index}",
                "labels": {"apps.kubernetes.io/pod-index": str(index)},
            },
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    assert ready_host_indexes([]) is None
    assert ready_host_indexes([pod(0, True), pod(1, False), pod(2, True)]) == frozenset({0, 2})


def test_hosts_added_to_a_ready_island_are_provisioned_not_lost() -> None:
    """Scaled from 2 hosts to 4, it went Degraded (HostsLost, a Warning) until the new pods
    were ready."""
    two = island_document("cpu-fake", "2x4", 2)
    ready = decide(two, IslandObservation(1, 2, ready_hosts=(0, 1)))
    assert ready.phase == "Ready" and ready.status["provisionedHosts"] == 2
    four = dict(island_document("cpu-fake", "4x4", 4), status=ready.status)
    scaling = decide(four, IslandObservation(1, 2, ready_hosts=(0, 1)))
    assert (scaling.phase, scaling.status["conditions"][0]["reason"]) == (
        "Provisioning",
        "ScalingUp",
    )
    assert [e.type for e in scaling.events] == ["Normal"]
    assert scaling.status["unhealthyHosts"] == [2, 3]  # their devices are not bound yet
    # One of the first two lost meanwhile: Degraded.
    lost = decide(dict(four, status=scaling.status), IslandObservation(1, 3, ready_hosts=(0, 2, 3)))
    assert lost.phase == "Degraded" and lost.status["unhealthyHosts"] == [1]
    back = decide(dict(four, status=lost.status), IslandObservation(1, 4, ready_hosts=(0, 1, 2, 3)))
    assert back.phase == "Ready" and back.status["provisionedHosts"] == 4
