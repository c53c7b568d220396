"""Islands over HTTP: kopf runs the operator against the emulated API server."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable

import kmock
from kube_cluster import NAMESPACE, Cluster, running_operator, wait_for
from kube_harness import mark_ready, set_executor_pods
from kube_manifests import island, vslice

SYSTEM = NAMESPACE


def status(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> dict:
    return (cluster.get(kind, name, namespace) or {}).get("status") or {}


def is_patch_of(name: str) -> Callable[[kmock.Request], bool]:
    return lambda request: request.name == name and str(request.method).upper().endswith("PATCH")


def settled(count: Callable[[], int], quiet: float = 1.0, timeout: float = 10.0) -> int:
    """``count`` once it has not changed for ``quiet`` seconds (at most ``timeout``: a count
    that keeps moving is returned as it is then, for the caller to catch)."""
    deadline = time.monotonic() + timeout
    value = count()
    while time.monotonic() < deadline:
        time.sleep(quiet)
        if (now := count()) == value:
            break
        value = now
    return value


def children(cluster: Cluster, name: str) -> dict[str, dict]:
    found = {}
    for kind in ("Deployment", "StatefulSet", "Service"):
        for item in cluster.list(kind, SYSTEM, f"pathways.dev/island={name}"):
            found[f"{kind}/{item['metadata']['name']}"] = item
    return found


def test_island_lifecycle_create_ready_scale_degrade_delete(cluster: Cluster, operator) -> None:
    created = cluster.create(island("alpha", topology="2x4", hosts=2))
    made = wait_for(lambda: len(children(cluster, "alpha")) == 4 and children(cluster, "alpha"))
    assert sorted(made) == [
        "Deployment/alpha-scheduler",
        "Service/alpha-executor",
        "Service/alpha-scheduler",
        "StatefulSet/alpha-executor",
    ]
    for child in made.values():  # owned by the island, garbage-collected with it
        owner = child["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "Island",
            created["metadata"]["uid"],
            True,
        )
    executors = made["StatefulSet/alpha-executor"]
    assert executors["spec"]["replicas"] == 2
    assert made["Service/alpha-executor"]["spec"]["clusterIP"] == "None"
    script = executors["spec"]["template"]["spec"]["containers"][0]["args"][-1]
    assert "--fake-devices 4" in script and "--hosts 2" in script
    assert f"--coordinator alpha-executor-0.alpha-executor.{SYSTEM}.svc:8476" in script
    provisioning = wait_for(
        lambda: status(cluster, "Island", "alpha").get("phase") == "Provisioning"
    )
    assert provisioning
    assert status(cluster, "Island", "alpha").get("schedulerEndpoint") is None

    # kubelet's part: the pods become ready.
    mark_ready(cluster, "alpha", SYSTEM, scheduler=1, executors=2)
    # devicesFree is written by the binding pass, apart from the island's own status patch.
    ready = wait_for(
        lambda: (
            (s := status(cluster, "Island", "alpha")).get("phase") == "Ready"
            and "devicesFree" in s
            and s
        )
    )
    assert ready["readyHosts"] == 2 and ready["devicesTotal"] == 8 and ready["devicesFree"] == 8
    assert ready["schedulerEndpoint"] == f"alpha-scheduler.{SYSTEM}.svc:8470"
    assert {c["type"]: c["status"] for c in ready["conditions"]} == {
        "Ready": "True",
        "Degraded": "False",
    }
    assert wait_for(lambda: cluster.events("alpha", "Ready"))

    # A host is lost: Degraded, with an Event.
    mark_ready(cluster, "alpha", SYSTEM, scheduler=1, executors=1)
    degraded = wait_for(
        lambda: (s := status(cluster, "Island", "alpha")).get("phase") == "Degraded" and s
    )
    assert degraded["readyHosts"] == 1
    assert wait_for(
        lambda: [e for e in cluster.events("alpha", "Degraded") if e["type"] == "Warning"]
    )

    # Scale to 4 hosts: the StatefulSet and the scheduler's executor list follow.
    cluster.patch("Island", "alpha", {"spec": {"topology": "4x4", "hosts": 4}})
    scaled = wait_for(
        lambda: (
            (s := cluster.get("StatefulSet", "alpha-executor", SYSTEM))["spec"]["replicas"] == 4
            and s
        )
    )
    deployment = cluster.get("Deployment", "alpha-scheduler", SYSTEM)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args.count("--executor") == 4
    assert "--hosts 4" in scaled["spec"]["template"]["spec"]["containers"][0]["args"][-1]
    assert wait_for(lambda: status(cluster, "Island", "alpha").get("devicesTotal") == 16)

    # Delete: the children go, then the island.
    cluster.delete("Island", "alpha")
    wait_for(lambda: cluster.get("Island", "alpha") is None, what="the island to go")
    assert children(cluster, "alpha") == {}


def test_tpu_island_children_request_tpus_on_matching_nodes(cluster: Cluster, operator) -> None:
    cluster.create(island("tpu", kind="tpu-v5e", topology="4x4", hosts=2))
    statefulset = wait_for(lambda: cluster.get("StatefulSet", "tpu-executor", SYSTEM))
    pod = statefulset["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["google.com/tpu"] == "8"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert "--fake-devices" not in container["args"][-1]


def test_semantically_wrong_island_gets_a_condition_and_one_event(
    cluster: Cluster, operator
) -> None:
    # Passes the CRD schema, but 2 hosts x 3 devices is not a 2x4 mesh.
    cluster.create(island("bad", topology="2x4", hosts=2, devicesPerHost=3))
    ready = wait_for(
        lambda: next(
            (
                c
                for c in status(cluster, "Island", "bad").get("conditions", [])
                if c["type"] == "Ready"
            ),
            None,
        )
    )
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.devicesPerHost" in ready["message"]
    assert children(cluster, "bad") == {}
    events = wait_for(lambda: cluster.events("bad", "InvalidSpec"))
    # Resyncs (every 2 s here) decide the same and record nothing new: no endless retries.
    # Counted from once the handling is over: kopf's own bookkeeping patch may land after the
    # event (one CI run in many saw it, 3 patches against 2).
    writes = settled(lambda: cluster.requests_to(is_patch_of("bad")))
    time.sleep(4.5)
    assert len(cluster.events("bad", "InvalidSpec")) == len(events) == 1
    assert cluster.requests_to(is_patch_of("bad")) == writes


def condition_of(cluster: Cluster, name: str, type_: str) -> dict | None:
    conditions = status(cluster, "Island", name).get("conditions", [])
    return next((c for c in conditions if c["type"] == type_), None)


def test_an_invalid_edit_leaves_a_running_island_and_its_slices_alone(
    cluster: Cluster, operator
) -> None:
    cluster.create(island("steady", topology="2x4", hosts=2))
    wait_for(lambda: len(children(cluster, "steady")) == 4)
    mark_ready(cluster, "steady", SYSTEM, scheduler=1, executors=2)
    ready = wait_for(
        lambda: (s := status(cluster, "Island", "steady")).get("phase") == "Ready" and s
    )
    cluster.create(vslice("held", devices=4))
    bound = wait_for(
        lambda: (s := status(cluster, "VirtualSlice", "held", "team")).get("phase") == "Bound" and s
    )
    executors = cluster.get("StatefulSet", "steady-executor", SYSTEM)["spec"]
    # hosts 3 does not divide the 2x4 mesh (the CRD's schema lets it through).
    cluster.patch("Island", "steady", {"spec": {"hosts": 3}})
    refused = wait_for(lambda: condition_of(cluster, "steady", "SpecApplied"))
    assert (refused["status"], refused["reason"]) == ("False", "InvalidSpec")
    assert "spec.hosts" in refused["message"]
    wait_for(lambda: cluster.events("steady", "InvalidSpec"), what="the InvalidSpec Event")
    kept = status(cluster, "Island", "steady")
    assert (kept["phase"], kept["schedulerEndpoint"]) == ("Ready", ready["schedulerEndpoint"])
    time.sleep(2.5)  # a resync and a binding pass later: nothing moved
    assert status(cluster, "VirtualSlice", "held", "team")["devices"] == bound["devices"]
    assert status(cluster, "VirtualSlice", "held", "team")["phase"] == "Bound"
    assert cluster.get("StatefulSet", "steady-executor", SYSTEM)["spec"] == executors
    # Fixed: applied again.
    cluster.patch("Island", "steady", {"spec": {"hosts": 2}})
    applied = wait_for(
        lambda: (c := condition_of(cluster, "steady", "SpecApplied")) and c["status"] == "True"
    )
    assert applied
    assert status(cluster, "VirtualSlice", "held", "team")["devices"] == bound["devices"]


def test_executors_of_an_old_template_are_restarted_together(cluster: Cluster, operator) -> None:
    cluster.create(island("roll", topology="2x4", hosts=2))
    wait_for(lambda: len(children(cluster, "roll")) == 4)
    executors = cluster.get("StatefulSet", "roll-executor", SYSTEM)
    assert executors["spec"]["updateStrategy"] == {"type": "OnDelete"}
    for index in range(2):
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"roll-executor-{index}",
                    "namespace": SYSTEM,
                    "labels": {
                        "pathways.dev/island": "roll",
                        "pathways.dev/component": "executor",
                        "apps.kubernetes.io/pod-index": str(index),
                        "controller-revision-hash": "roll-executor-old",
                    },
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        )
    # The StatefulSet controller's part: it saw a new template; the pods still run the old.
    generation = executors["metadata"]["generation"]
    cluster.patch(
        "StatefulSet",
        "roll-executor",
        {
            "status": {
                "observedGeneration": generation,
                "updateRevision": "roll-executor-new",
                "readyReplicas": 2,
            }
        },
        SYSTEM,
    )
    wait_for(
        lambda: not cluster.list("Pod", SYSTEM, "pathways.dev/island=roll"),
        what="the old executor pods to be deleted",
    )
    # They do not count as ready hosts meanwhile.
    assert status(cluster, "Island", "roll").get("phase") != "Ready"


def test_a_slice_is_not_bound_again_on_an_island_whose_executor_pods_are_all_gone(
    cluster: Cluster, operator
) -> None:
    """All executor pods deleted at once (as a new template has them): with no pod to say
    which hosts were ready, none was taken as lost, and the slice was bound again on devices
    of no live executor."""
    cluster.create(island("gone", topology="2x4", hosts=2))
    wait_for(lambda: cluster.get("StatefulSet", "gone-executor", SYSTEM))
    set_executor_pods(cluster, "gone", SYSTEM, 2, {0, 1})
    mark_ready(cluster, "gone", SYSTEM, scheduler=1, executors=2)
    wait_for(lambda: status(cluster, "Island", "gone").get("phase") == "Ready")
    cluster.create(vslice("all", devices=8))
    wait_for(lambda: status(cluster, "VirtualSlice", "all", "team").get("phase") == "Bound")
    for index in range(2):
        cluster.delete("Pod", f"gone-executor-{index}", SYSTEM)
    cluster.patch("StatefulSet", "gone-executor", {"status": {"readyReplicas": 0}}, SYSTEM)
    lost = wait_for(
        lambda: (s := status(cluster, "Island", "gone")).get("unhealthyHosts") == [0, 1] and s,
        what="both hosts unhealthy",
    )
    assert lost["phase"] == "Degraded" and lost["devicesUnhealthy"] == 8
    wait_for(
        lambda: status(cluster, "VirtualSlice", "all", "team").get("phase") == "Preempted",
        what="the slice preempted",
    )
    time.sleep(2)  # a resync or two: it stays unbound
    assert status(cluster, "VirtualSlice", "all", "team").get("phase") != "Bound"


def test_hand_edits_of_what_the_operator_owns_are_undone(cluster: Cluster, operator) -> None:
    cluster.create(island("owned", topology="2x4", hosts=2))
    wait_for(lambda: len(children(cluster, "owned")) == 4)
    executors = cluster.get("StatefulSet", "owned-executor", SYSTEM)
    image = executors["spec"]["template"]["spec"]["containers"][0]["image"]
    # kubectl scale --replicas=0; kubectl set image ... evil:latest
    cluster.patch("StatefulSet", "owned-executor", {"spec": {"replicas": 0}}, SYSTEM)
    scheduler = cluster.get("Deployment", "owned-scheduler", SYSTEM)
    containers = scheduler["spec"]["template"]["spec"]["containers"]
    hijacked = [{**containers[0], "image": "evil:latest"}, *containers[1:]]
    cluster.patch(
        "Deployment",
        "owned-scheduler",
        {"spec": {"template": {"spec": {"containers": hijacked}}}},
        SYSTEM,
    )

    def restored() -> bool:
        statefulset = cluster.get("StatefulSet", "owned-executor", SYSTEM)
        deployment = cluster.get("Deployment", "owned-scheduler", SYSTEM)
        return (
            statefulset["spec"]["replicas"] == 2
            and deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
        )

    assert wait_for(restored, what="the operator to undo the edits")


def test_external_island_publishes_its_endpoint_without_pods(cluster: Cluster, operator) -> None:
    manifest = island("laptop", topology="4", hosts=1)
    manifest["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": "127.0.0.1:9999"}
    cluster.create(manifest)
    ready = wait_for(
        lambda: (s := status(cluster, "Island", "laptop")).get("phase") == "Ready" and s
    )
    assert ready["schedulerEndpoint"] == "127.0.0.1:9999" and ready["readyHosts"] == 1
    assert children(cluster, "laptop") == {}


def test_deleting_an_island_moves_its_slices_with_a_reason(cluster: Cluster, operator) -> None:
    cluster.create(island("a-first", topology="4", hosts=1))
    cluster.create(vslice("work", devices=4))
    bound = wait_for(
        lambda: (s := status(cluster, "VirtualSlice", "work", "team")).get("phase") == "Bound" and s
    )
    assert bound["island"] == "a-first"
    cluster.create(island("b-second", topology="4", hosts=1))
    wait_for(lambda: status(cluster, "Island", "b-second").get("devicesFree") == 4)
    cluster.delete("Island", "a-first")
    moved = wait_for(
        lambda: (
            (s := status(cluster, "VirtualSlice", "work", "team")).get("island") == "b-second" and s
        )
    )
    assert moved["phase"] == "Bound"
    # The binding pass posts its Events after it has stored every status.
    wait_for(lambda: cluster.events("work", "IslandDeleted"), what="the IslandDeleted Event")


def test_each_island_gets_its_own_control_token_secret(cluster: Cluster) -> None:
    """With PATHWAYS_CONTROL_TOKENS, the operator creates one Secret per island, owned by it,
    before its pods; the scheduler and executors read the token from it; resyncs keep the same
    token (the operator creates it once, and never patches it); the Secret goes with its
    island. Without the setting, no Secret and no token."""

    def is_secret_post(request: kmock.Request) -> bool:
        return str(request.method).upper().endswith("POST") and "/secrets" in str(request.url)

    def is_island_read(request: kmock.Request) -> bool:
        return str(request.method).upper().endswith("GET") and "/islands/" in str(request.url)

    def is_secret_write(request: kmock.Request) -> bool:
        method = str(request.method).upper()
        return "/secrets" in str(request.url) and not method.endswith(("POST", "GET"))

    with running_operator(PATHWAYS_CONTROL_TOKENS="true"):
        alpha = cluster.create(island("alpha", topology="2x4", hosts=2))
        beta = cluster.create(island("beta", topology="4", hosts=1))
        made = {
            name: wait_for(
                lambda name=name: cluster.list("Secret", SYSTEM, f"pathways.dev/island={name}"),
                what=f"{name}'s control Secret",
            )
            for name in ("alpha", "beta")
        }
        tokens = {}
        for name, document in (("alpha", alpha), ("beta", beta)):
            (secret,) = made[name]
            uid = document["metadata"]["uid"]
            assert secret["metadata"]["name"] == f"{name}-control-{uid.replace('-', '')[:8]}"
            owner = secret["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("Island", name, uid)
            assert secret["immutable"] is True
            tokens[name] = base64.b64decode(secret["data"]["token"]).decode()
            assert len(tokens[name]) >= 43  # secrets.token_urlsafe(32)
            reference = {"name": secret["metadata"]["name"], "key": "token"}
            pods = wait_for(
                lambda name=name: len(children(cluster, name)) == 4 and children(cluster, name)
            )
            for kind in (f"Deployment/{name}-scheduler", f"StatefulSet/{name}-executor"):
                env = pods[kind]["spec"]["template"]["spec"]["containers"][0]["env"]
                found = [e for e in env if e["name"] == "PATHWAYS_CONTROL_TOKEN"]
                assert found == [
                    {"name": "PATHWAYS_CONTROL_TOKEN", "valueFrom": {"secretKeyRef": reference}}
                ]
        assert tokens["alpha"] != tokens["beta"]  # one island's token opens no other island

        # Resyncs (every 2 s here) keep the first token and do not create it again (each a
        # 409 through admission and the audit log, every resync of every island).
        posts = cluster.requests_to(is_secret_post)
        reads = cluster.requests_to(is_island_read)
        wait_for(lambda: cluster.requests_to(is_island_read) >= reads + 4, what="two resyncs")
        assert cluster.requests_to(is_secret_post) == posts
        (kept,) = cluster.list("Secret", SYSTEM, "pathways.dev/island=alpha")
        assert base64.b64decode(kept["data"]["token"]).decode() == tokens["alpha"]
        assert cluster.requests_to(is_secret_write) == 0  # never patched, replaced or deleted

        cluster.delete("Island", "alpha")
        wait_for(lambda: cluster.get("Island", "alpha") is None, what="the island to go")
        assert cluster.list("Secret", SYSTEM, "pathways.dev/island=alpha") == []
        assert len(cluster.list("Secret", SYSTEM, "pathways.dev/island=beta")) == 1

    with running_operator():
        cluster.create(island("gamma", topology="4", hosts=1))
        pods = wait_for(lambda: len(children(cluster, "gamma")) == 4 and children(cluster, "gamma"))
        for kind in ("Deployment/gamma-scheduler", "StatefulSet/gamma-executor"):
            env = pods[kind]["spec"]["template"]["spec"]["containers"][0].get("env", [])
            assert all(e["name"] != "PATHWAYS_CONTROL_TOKEN" for e in env)
        assert cluster.list("Secret", SYSTEM, "pathways.dev/island=gamma") == []


def test_islands_resyncs_share_their_binding_passes(cluster: Cluster, operator) -> None:
    """A binding pass reads every island, slice and program of the cluster: each island's
    resync ran one of its own, N islands N passes per interval (the resync is 2 s here)."""
    for index in range(4):  # spread over the interval, as islands made at different times
        manifest = island(f"far-{index}", topology="4", hosts=1)
        manifest["metadata"]["annotations"] = {
            "pathways.dev/scheduler-endpoint": f"127.0.0.1:{index + 1}"
        }
        cluster.create(manifest)
        time.sleep(0.5)

    def passes(request: kmock.Request) -> bool:  # a pass lists every slice of the cluster
        return str(request.url.path) == "/apis/pathways.dev/v1alpha1/virtualslices"

    time.sleep(2)  # the creations' own passes are done
    before = cluster.requests_to(passes)
    time.sleep(6)  # 3 intervals: 12 passes before, at most one per half interval now
    assert cluster.requests_to(passes) - before <= 7
