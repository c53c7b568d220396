"""Islands: the pods that run them (one scheduler, one executor per host) and their status.

``island_children`` builds the four children of an Island, owned by it:

- ``<island>-scheduler``: a Deployment and a Service (ports 8470, gRPC, and 8472, client
  sessions) for the gang scheduler;
- ``<island>-executor``: a StatefulSet (one pod per host, started together) and its headless
  Service, which gives executor ``i`` the stable name
  ``<island>-executor-<i>.<island>-executor.<namespace>.svc``; executor 0 is the island's JAX
  coordinator.

Devices are requested per accelerator kind: TPU (``google.com/tpu``, the GKE TPU node selectors
and toleration), GPU (``nvidia.com/gpu``) or fake CPU devices (``--fake-devices N``).

Every pod is locked down by :func:`pathways_core.control.security.harden` (non-root, read-only
root, no capability, no service account token) and, with TLS on, mounts the TLS Secret. With
control tokens on, the scheduler and executors read ``PATHWAYS_CONTROL_TOKEN`` from the island's
own Secret (:func:`control_token_secret`, created by the operator, never patched). The
labels ``pathways.dev/island`` and ``pathways.dev/component`` (scheduler, executor) are stable:
the chart's NetworkPolicies select pods by them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pathways_core.accelerators import (
    GKE_TPU_TOPOLOGY_LABEL,
    AcceleratorFamily,
    accelerator_info,
)
from pathways_core.control.common import (
    ANNOTATION_SCHEDULER_ENDPOINT,
    ANNOTATION_SPEC_HASH,
    LABEL_COMPONENT,
    LABEL_ISLAND,
    LABEL_MANAGED_BY,
    MANAGER,
    Document,
    Event,
    ObjectRef,
    condition,
    generation,
    owner_reference,
    set_condition,
)
from pathways_core.control.security import (
    COMPILATION_CACHE_DIR,
    CONTROL_TOKEN_KEY,
    SESSION_KEY_KEY,
    control_token_env,
    harden,
    session_key_env,
)
from pathways_core.resources import Island

SCHEDULER_PORT = 8470
# Client sessions' stream: a fixed port, which the scheduler's Service forwards (one the
# scheduler picked at start was unreachable through the Service).
SESSION_PORT = 8472
# Not 8471: multi-host TPU hosts talk to each other there (libtpu, in the executor's pod).
EXECUTOR_PORT = 8473
COORDINATOR_PORT = 8476
HEALTH_PORT = 8477
SCHEDULER_REQUESTS = {"cpu": "250m", "memory": "512Mi"}
LIVENESS_PROBE = {
    # A process that stops answering (stopped, wedged) is restarted, taking the island down as
    # a crash does; it answers from the start, so a slow JAX start or group join is no failure.
    "httpGet": {"path": "/healthz", "port": "health"},
    "periodSeconds": 10,
    "timeoutSeconds": 5,
    "failureThreshold": 3,
}
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"


def scheduler_name(island: str) -> str:
    """Name of the scheduler's Deployment and Service."""
    return f"{island}-scheduler"


def executor_name(island: str) -> str:
    """Name of the executors' StatefulSet and headless Service."""
    return f"{island}-executor"


def executor_host(island: str, namespace: str, index: int) -> str:
    """Stable DNS name of executor ``index`` (through the headless Service)."""
    return f"{executor_name(island)}-{index}.{executor_name(island)}.{namespace}.svc"


def scheduler_endpoint(island: str, namespace: str) -> str:
    """``host:port`` of the island's scheduler Service."""
    return f"{scheduler_name(island)}.{namespace}.svc:{SCHEDULER_PORT}"


def control_secret_name(document: Document) -> str:
    """Name of the island's control-token Secret: ``<island>-control-<uid prefix>``. The
    Island's uid is part of it, so an Island deleted and created again under the same name gets
    a new Secret (and pods that name it, which roll), never the old one on its way to garbage
    collection."""
    meta = document.get("metadata") or {}
    uid = "".join(c for c in str(meta.get("uid") or "").lower() if c.isalnum())[:8]
    return f"{meta.get('name')}-control" + (f"-{uid}" if uid else "")


def control_token_secret(
    document: Document, namespace: str, token: str, session_key: str | None = None
) -> Document:
    """The Secret holding an island's control token (key ``token``) and, with session
    credentials on, its scheduler's session key (``session-key``), owned by the Island
    (garbage-collected with it) and immutable: the operator creates it once with a random
    ``token`` it draws, and never replaces it, since running executors keep the token they
    started with. No spec hash: the content differs at every draw."""
    if not token:
        raise ValueError("token: an island's control token must not be empty")
    data = {CONTROL_TOKEN_KEY: token}
    if session_key:
        data[SESSION_KEY_KEY] = session_key
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(document, control_secret_name(document), namespace, "control"),
        "type": "Opaque",
        "immutable": True,
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


def with_spec_hash(child: Document) -> Document:
    """The child with an annotation hashing its content, so a reconcile patches a child only
    when what it wants differs from what it last wrote."""
    digest = hashlib.sha256(json.dumps(child, sort_keys=True).encode()).hexdigest()[:16]
    child["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = digest
    return child


def _labels(island: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pathways",
        LABEL_COMPONENT: component,
        LABEL_ISLAND: island,
        LABEL_MANAGED_BY: MANAGER,
    }


def _metadata(document: Document, name: str, namespace: str, component: str) -> dict[str, Any]:
    island = document["metadata"]["name"]
    return {
        "name": name,
        "namespace": namespace,
        "labels": _labels(island, component),
        "ownerReferences": [owner_reference(document)],
    }


def _selector(island: str, component: str) -> dict[str, str]:
    return {LABEL_ISLAND: island, LABEL_COMPONENT: component}


def executor_placement(island: Island) -> dict[str, Any]:
    """Resources, node selector and tolerations of an executor pod, per accelerator kind, with
    the island's own placement added."""
    spec = island.spec
    info = accelerator_info(spec.accelerator_kind)
    devices = spec.host_devices
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    node_selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    if info.device_resource is not None:
        # Extended resources must be requested and limited alike.
        requests[info.device_resource] = limits[info.device_resource] = str(devices)
        tolerations.append(
            {"key": info.device_resource, "operator": "Exists", "effect": "NoSchedule"}
        )
    if info.node_label is not None:
        node_selector[info.node_label[0]] = info.node_label[1]
    if info.family is AcceleratorFamily.TPU:
        node_selector[GKE_TPU_TOPOLOGY_LABEL] = spec.topology
    placement = spec.placement
    node_selector.update(placement.node_selector)
    for toleration in (t.to_wire() for t in placement.tolerations):
        if toleration not in tolerations:  # one the accelerator needs, given again
            tolerations.append(toleration)
    if placement.resources is not None:
        requests = {**placement.resources.requests, **requests}
        limits = {**placement.resources.limits, **limits}
    resources = {key: value for key, value in (("requests", requests), ("limits", limits)) if value}
    return {"resources": resources, "nodeSelector": node_selector, "tolerations": tolerations}


def executor_command(island: Island, namespace: str) -> list[str]:
    """The executor's command line, given as the container's ``args`` (the image's tini runs
    it): its index comes from the pod's ordinal (the pod-index label, through the downward
    API), its first device from the index; it compiles into the cache volume."""
    spec = island.spec
    name = island.metadata.name or ""
    devices = spec.host_devices
    flags = ["--host", "0.0.0.0", "--port", str(EXECUTOR_PORT), "--health-port", str(HEALTH_PORT)]
    flags += ["--compilation-cache", COMPILATION_CACHE_DIR]
    if spec.hosts > 1:
        coordinator = f"{executor_host(name, namespace, 0)}:{COORDINATOR_PORT}"
        flags += ["--hosts", str(spec.hosts), "--coordinator", coordinator]
    if accelerator_info(spec.accelerator_kind).family is AcceleratorFamily.CPU:
        flags += ["--fake-devices", str(devices)]
    script = (
        'exec python -m pathways_executor --index "$POD_INDEX" '
        f'--first-device "$((POD_INDEX * {devices}))" ' + " ".join(flags)
    )
    return ["sh", "-c", script]


def island_children(
    document: Document,
    island: Island,
    namespace: str,
    *,
    tls_secret: str | None = None,
    control_secret: str | None = None,
    pull_secrets: Sequence[str] = (),
    session_keys: bool = False,
) -> list[Document]:
    """The Deployment, Service, StatefulSet and headless Service of an island, owned by it,
    each with a hash of its content in an annotation. Pods are hardened; ``tls_secret`` (the
    name of a ``kubernetes.io/tls`` Secret in ``namespace``) is mounted in them when set;
    ``control_secret`` (the island's :func:`control_token_secret`) gives the scheduler and the
    executors their ``PATHWAYS_CONTROL_TOKEN`` when set (unset: no token), and with
    ``session_keys`` the scheduler its ``PATHWAYS_SESSION_KEY``; ``pull_secrets`` (Secrets in
    ``namespace``) pull their image."""
    name = island.metadata.name or ""
    spec = island.spec
    image = spec.image
    placement = spec.placement
    pod_common: dict[str, Any] = {}
    if placement.priority_class_name:
        pod_common["priorityClassName"] = placement.priority_class_name
    if placement.service_account_name:
        pod_common["serviceAccountName"] = placement.service_account_name

    scheduler_args = [
        "python",
        "-m",
        "pathways_scheduler",
        "--island",
        name,
        "--policy",
        spec.scheduler.policy.value,
        "--max-queued",
        str(spec.scheduler.max_queued_computations),
        "--run-length",
        str(spec.scheduler.run_length),
        "--executor-timeout",
        str(spec.scheduler.executor_timeout_seconds),
        "--trace-limit",
        str(spec.scheduler.trace_records),
        "--host",
        "0.0.0.0",
        "--port",
        str(SCHEDULER_PORT),
        "--session-port",
        str(SESSION_PORT),
        "--health-port",
        str(HEALTH_PORT),
    ]
    for index in range(spec.hosts):
        scheduler_args += ["--executor", f"{executor_host(name, namespace, index)}:{EXECUTOR_PORT}"]
    scheduler_labels = _labels(name, "scheduler")
    # The same token in the scheduler (it sends it) and the executors (they check it).
    token_env = [control_token_env(control_secret)] if control_secret else []
    scheduler_env = [*token_env]
    if control_secret and session_keys:
        scheduler_env.append(session_key_env(control_secret))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(document, scheduler_name(name), namespace, "scheduler"),
        "spec": {
            "replicas": 1,
            # Never two schedulers: one island order needs one scheduler.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(name, "scheduler")},
            "template": {
                "metadata": {"labels": scheduler_labels},
                "spec": harden(
                    {
                        **pod_common,
                        "containers": [
                            {
                                "name": "scheduler",
                                "image": image,
                                "args": scheduler_args,
                                **({"env": scheduler_env} if scheduler_env else {}),
                                "ports": [
                                    {"name": "grpc", "containerPort": SCHEDULER_PORT},
                                    {"name": "session", "containerPort": SESSION_PORT},
                                    {"name": "health", "containerPort": HEALTH_PORT},
                                ],
                                "readinessProbe": {"tcpSocket": {"port": SCHEDULER_PORT}},
                                "livenessProbe": LIVENESS_PROBE,
                                # Requested, so node pressure does not evict the island's
                                # order first (a scheduler busy dispatching takes a core).
                                "resources": {"requests": SCHEDULER_REQUESTS},
                            }
                        ],
                    },
                    tls_secret,
                    pull_secrets,
                ),
            },
        },
    }
    scheduler_service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(document, scheduler_name(name), namespace, "scheduler"),
        "spec": {
            "selector": _selector(name, "scheduler"),
            "ports": [
                {"name": "grpc", "port": SCHEDULER_PORT, "targetPort": SCHEDULER_PORT},
                {"name": "session", "port": SESSION_PORT, "targetPort": SESSION_PORT},
            ],
        },
    }
    placed = executor_placement(island)
    env: list[dict[str, Any]] = [
        {
            "name": "POD_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}},
        }
    ]
    if accelerator_info(spec.accelerator_kind).family is AcceleratorFamily.TPU and spec.hosts > 1:
        # libtpu finds its peers of a multi-host slice from these.
        hosts = ",".join(executor_host(name, namespace, i) for i in range(spec.hosts))
        env += [
            {"name": "TPU_WORKER_HOSTNAMES", "value": hosts},
            {"name": "TPU_WORKER_ID", "valueFrom": env[0]["valueFrom"]},
        ]
    env += token_env
    container: dict[str, Any] = {
        "name": "executor",
        "image": image,
        "args": executor_command(island, namespace),
        "env": env,
        "ports": [
            {"name": "grpc", "containerPort": EXECUTOR_PORT},
            {"name": "coordinator", "containerPort": COORDINATOR_PORT},
            {"name": "health", "containerPort": HEALTH_PORT},
        ],
        # Ready once the scheduler took it (at the island's start, or back after a restart):
        # only then does a host count as ready in the island's status and get slices bound.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "health"},
            "periodSeconds": 2,
        },
        "livenessProbe": LIVENESS_PROBE,
    }
    if placed["resources"]:
        container["resources"] = placed["resources"]
    pod_spec: dict[str, Any] = {**pod_common, "containers": [container]}
    if placed["nodeSelector"]:
        pod_spec["nodeSelector"] = placed["nodeSelector"]
    if placed["tolerations"]:
        pod_spec["tolerations"] = placed["tolerations"]
    # TPU and GPU devices come from their device plugins, which need no privilege in the pod
    # (GKE >= 1.28 for TPUs): executors run locked down like every other pod.
    harden(pod_spec, tls_secret, pull_secrets)
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(document, executor_name(name), namespace, "executor"),
        "spec": {
            "replicas": spec.hosts,
            "serviceName": executor_name(name),
            # The hosts of an island form one JAX group: they must start together, and a
            # new template (more hosts, another image) replaces them together: the operator
            # deletes them all (``stale_executor_pods``). A rolling update replaced the last
            # host first, which then could not join the group the others still ran.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": _selector(name, "executor")},
            "template": {"metadata": {"labels": _labels(name, "executor")}, "spec": pod_spec},
        },
    }
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(document, executor_name(name), namespace, "executor"),
        "spec": {
            "clusterIP": "None",
            # Executors resolve executor 0 (their coordinator) before any of them is ready.
            "publishNotReadyAddresses": True,
            "selector": _selector(name, "executor"),
            "ports": [
                {"name": "grpc", "port": EXECUTOR_PORT},
                {"name": "coordinator", "port": COORDINATOR_PORT},
            ],
        },
    }
    return [with_spec_hash(c) for c in (deployment, scheduler_service, statefulset, headless)]


@dataclass(frozen=True)
class IslandObservation:
    """What the store shows of an island's pods: ready scheduler replicas and executor hosts
    (``None`` when the child does not exist yet), and which executor hosts are ready, by pod
    ordinal (``None`` when the pods are not known). ``refused``: the API server refused a
    child of the island's spec (which child, and why); its pods, if any, run as before.
    ``troubles``: why pods wait, as :func:`pod_troubles` says."""

    scheduler_ready: int | None = None
    executors_ready: int | None = None
    ready_hosts: frozenset[int] | None = None
    refused: str | None = None
    troubles: tuple[str, ...] = ()  # why pods are not ready, when their status says it


# The label the StatefulSet controller puts on each pod: the revision of its template.
REVISION_LABEL = "controller-revision-hash"


def executor_revision(statefulset: Document) -> str | None:
    """The template revision an executor pod must run to count as ready: the StatefulSet's
    ``updateRevision`` once its controller has seen its latest spec (``""`` before: no pod
    does yet); ``None`` when its status says nothing of revisions (any pod counts)."""
    status = statefulset.get("status") or {}
    seen = status.get("observedGeneration")
    if seen is None:
        return None
    if seen < ((statefulset.get("metadata") or {}).get("generation") or 0):
        return ""
    return status.get("updateRevision") or None


def scheduler_replicas_ready(deployment: Document) -> int:
    """Ready replicas of the scheduler Deployment, counted only once every replica runs its
    latest template (during a rollout the old scheduler, with the old executors, answers)."""
    status = deployment.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    seen = status.get("observedGeneration")
    if seen is None:
        return ready
    generation_ = (deployment.get("metadata") or {}).get("generation") or 0
    replicas = int(status.get("replicas") or 0)
    if seen < generation_ or int(status.get("updatedReplicas") or 0) < replicas:
        return 0
    return ready


def _live(pod: Document) -> bool:
    return not (pod.get("metadata") or {}).get("deletionTimestamp")


def _revision(pod: Document) -> str | None:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL)


# Container waiting reasons that do not pass by themselves: the pod needs someone to look.
STUCK_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
MAX_TROUBLES = 3
_TROUBLE_CHARS = 240


def pod_troubles(pods: list[Document]) -> tuple[str, ...]:
    """Why an island's pods are not running, where their status says so: a container stuck
    (crash-looping, its image not pulled, its config wrong) or the pod not schedulable, as
    ``<pod>: <reason> (<message>)``; at most ``MAX_TROUBLES`` of them, then how many more."""
    troubles = []
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name") or ""):
        if not _live(pod):
            continue
        name = (pod.get("metadata") or {}).get("name") or "?"
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_REASONS:
                restarts = int(container.get("restartCount") or 0)
                said = f"{name}: {waiting['reason']}"
                if restarts:
                    said += f", {restarts} restart{'s' if restarts != 1 else ''}"
                if waiting.get("message"):
                    said += f" ({waiting['message']})"
                troubles.append(said[:_TROUBLE_CHARS])
                break
        else:
            for condition_ in status.get("conditions") or []:
                if (
                    condition_.get("type") == "PodScheduled"
                    and condition_.get("status") == "False"
                    and condition_.get("reason") == "Unschedulable"
                ):
                    said = f"{name}: Unschedulable ({condition_.get('message') or ''})"
                    troubles.append(said[:_TROUBLE_CHARS])
    if len(troubles) > MAX_TROUBLES:
        more = len(troubles) - MAX_TROUBLES
        troubles = [*troubles[:MAX_TROUBLES], f"{more} more pod{'s' if more > 1 else ''}"]
    return tuple(troubles)


def stale_executor_pods(pods: list[Document], revision: str | None) -> list[str]:
    """Executor pods to delete so that the island's hosts run its latest template together:
    all of them (not being deleted already) once any runs another revision; none while the
    revision is not known."""
    live = [pod for pod in pods if _live(pod)]
    if not revision or all(_revision(pod) in (None, revision) for pod in live):
        return []
    return sorted((pod.get("metadata") or {}).get("name") or "" for pod in live)


def ready_host_indexes(pods: list[Document], revision: str | None = None) -> frozenset[int] | None:
    """Ordinals of the executor pods whose Ready condition is True (``None``: no pods), of
    ``revision`` when it is given (a pod of an older template is on its way out)."""
    if not pods:
        return None
    ready = set()
    for pod in pods:
        if revision is not None and (_revision(pod) != revision or not _live(pod)):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        index = (
            labels.get(POD_INDEX_LABEL)
            or (pod.get("metadata") or {}).get("name", "").rsplit("-", 1)[-1]
        )
        conditions = (pod.get("status") or {}).get("conditions") or []
        if index.isdigit() and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        ):
            ready.add(int(index))
    return frozenset(ready)


def unhealthy_devices(document: Document, island: Island) -> frozenset[int]:
    """Devices of the hosts an island's status reports unhealthy."""
    per_host = island.spec.host_devices
    hosts = ((document.get("status") or {}).get("unhealthyHosts")) or []
    return frozenset(
        device
        for host in hosts
        if isinstance(host, int) and 0 <= host < island.spec.hosts
        for device in range(host * per_host, (host + 1) * per_host)
    )


@dataclass
class IslandDecision:
    """The status an island should have, and the Events of its transitions."""

    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    external: bool = False

    @property
    def phase(self) -> str:
        return self.status["phase"]


def external_endpoint(document: Document) -> str | None:
    """The scheduler endpoint of an island that runs outside the cluster, if it is one."""
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_SCHEDULER_ENDPOINT) or None


def island_status(
    document: Document,
    island: Island | None,
    problem: str | None,
    observed: IslandObservation,
    namespace: str,
    now: datetime,
) -> IslandDecision:
    """The island's phase, ready hosts, scheduler endpoint and conditions.

    Pending until its pods exist, Provisioning until the scheduler and every executor are
    ready, Ready, then Degraded when a host is lost. An island whose scheduler endpoint is
    given by annotation runs elsewhere and is Ready as declared, unless ``observed`` reports
    its hosts (the embedded mode's supervisor does): then it goes Degraded and Ready again
    like any island, at the annotated endpoint.
    """
    old = document.get("status") or {}
    conditions = list(old.get("conditions") or [])
    gen = generation(document)
    ref = ObjectRef.of(document)
    status: dict[str, Any] = {"observedGeneration": gen}
    refusal = (
        ("InvalidSpec", problem or "invalid spec")
        if island is None
        else ("ChildRefused", observed.refused)
        if observed.refused
        else None
    )
    if refusal is not None:
        return _refused_status(document, refusal, now)
    assert island is not None
    hosts = island.spec.hosts
    endpoint = external_endpoint(document)
    external = endpoint is not None
    known: frozenset[int] | None = None
    # An external island is Ready as declared, unless whoever runs it reports what it sees
    # (the embedded supervisor does, while it restarts a lost island).
    reported = observed != IslandObservation()
    if external and not reported:
        ready_hosts, scheduler_ready = hosts, True
    else:
        ready_hosts = min(observed.executors_ready or 0, hosts)
        if observed.ready_hosts is not None:
            known = frozenset(h for h in observed.ready_hosts if 0 <= h < hosts)
            ready_hosts = len(known)
        elif observed.executors_ready == 0:
            # No pods to tell which hosts are ready, and none is: every host is lost (its
            # slices were bound again on an island with no executor, all its pods deleted).
            known = frozenset()
        scheduler_ready = bool(observed.scheduler_ready)
        if not external:
            endpoint = scheduler_endpoint(island.metadata.name or "", namespace)
    all_ready = scheduler_ready and ready_hosts == hosts
    was_ready = old.get("phase") in ("Ready", "Degraded") or old.get("provisionedHosts") is not None
    # Hosts the island had when last Ready (all of them, for a status from before this was
    # recorded); one added since and not ready yet is being provisioned, not lost.
    provisioned = hosts if all_ready else min(hosts, int(old.get("provisionedHosts") or hosts))
    # Hosts not ready after the island was Ready: their devices must not be bound.
    unhealthy = sorted(set(range(hosts)) - known) if was_ready and known is not None else []
    lost = (
        not scheduler_ready
        or any(host < provisioned for host in unhealthy)
        or (known is None and ready_hosts < provisioned)
    )
    if all_ready:
        phase, reason = "Ready", "AllHostsReady"
        message = f"scheduler and {hosts}/{hosts} executors ready"
    elif was_ready and not lost:
        phase, reason = "Provisioning", "ScalingUp"
        message = f"{ready_hosts}/{hosts} executors ready: hosts {provisioned}..{hosts - 1} added"
    elif was_ready:
        phase, reason = "Degraded", "HostsLost"
        message = (
            f"{ready_hosts}/{hosts} executors ready"
            f"{'' if scheduler_ready else ', scheduler not ready'}"
        )
    elif observed.executors_ready is None and observed.scheduler_ready is None:
        phase, reason, message = "Pending", "Creating", "creating the island's pods"
    else:
        phase, reason = "Provisioning", "WaitingForPods"
        message = (
            f"{ready_hosts}/{hosts} executors ready, scheduler "
            f"{'ready' if scheduler_ready else 'not ready'}"
        )
    if external and phase == "Ready":
        reason, message = "External", f"the island runs outside the cluster at {endpoint}"
    elif phase != "Ready" and observed.troubles:
        message = f"{message}; {'; '.join(observed.troubles)}"
    status.update(
        phase=phase,
        readyHosts=ready_hosts,
        provisionedHosts=provisioned if was_ready or all_ready else None,
        unhealthyHosts=unhealthy,
        devicesUnhealthy=len(unhealthy) * island.spec.host_devices,
        devicesTotal=island.spec.device_total,
        # Programs wait for an endpoint: publish it once the scheduler answers.
        schedulerEndpoint=endpoint if scheduler_ready else None,
    )
    conditions = set_condition(conditions, "Ready", all_ready, reason, message, now, gen)
    conditions = set_condition(
        conditions,
        "Degraded",
        phase == "Degraded",
        reason if phase == "Degraded" else "NotDegraded",
        message if phase == "Degraded" else "",
        now,
        gen,
    )
    if condition(conditions, "SpecApplied") is not None:  # said while an edit was refused
        conditions = set_condition(conditions, "SpecApplied", True, "Applied", "", now, gen)
    status["conditions"] = conditions
    decision = IslandDecision(status, external=external)
    if old.get("phase") != phase:
        kind = "Warning" if phase == "Degraded" else "Normal"
        decision.events.append(Event(ref, kind, phase, message))
    return decision


def _refused_status(document: Document, refusal: tuple[str, str], now: datetime) -> IslandDecision:
    """The status of an island whose spec cannot be applied (``refusal``: ``InvalidSpec``, or
    ``ChildRefused`` by the API server, and why). One that ran keeps running as its last
    applied spec made it: its pods are left alone, so its status (endpoint, hosts, the
    generation it observed) stays, with ``SpecApplied`` False saying why; its slices keep
    their devices. One that never ran waits, Pending, ``Ready`` False."""
    reason, message = refusal
    old = document.get("status") or {}
    conditions = list(old.get("conditions") or [])
    gen = generation(document)
    ran = old.get("provisionedHosts") is not None or bool(old.get("schedulerEndpoint"))
    if ran:
        kept = old.get("observedGeneration")
        message = f"{message}; the island keeps running as generation {kept} specified"
        status = {**old}
        status["conditions"] = set_condition(
            conditions, "SpecApplied", False, reason, message, now, gen
        )
        said = condition(conditions, "SpecApplied") or {}
        repeated = said.get("status") == "False" and said.get("reason") == reason
    else:
        status = {"observedGeneration": gen, "phase": "Pending", "readyHosts": 0}
        status["schedulerEndpoint"] = None
        status["conditions"] = set_condition(conditions, "Ready", False, reason, message, now, gen)
        said = condition(conditions, "Ready") or {}
        repeated = old.get("phase") == "Pending" and said.get("reason") == reason
    decision = IslandDecision(status)
    if not repeated:
        decision.events.append(Event(ObjectRef.of(document), "Warning", reason, message))
    return decision
