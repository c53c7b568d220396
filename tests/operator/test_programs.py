"""PathwaysPrograms over HTTP, from apply to a terminal phase. Jobs are run by a harness
standing in for kubelet and the Job controller; the end-to-end program drives a real island
(a scheduler and an executor started on loopback by the data plane's launcher)."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path
from typing import Any

import kmock
import pytest
from kube_cluster import NAMESPACE, Cluster, running_operator, wait_for
from kube_harness import JobRunner, mark_ready, set_executor_pods
from kube_manifests import island, program, vslice

from pathways_client.launcher import LocalIsland
from pathways_core.control.common import now_utc, timestamp

DRIVER = textwrap.dedent(
    """
    import json, os
    import jax, jax.numpy as jnp, numpy as np
    from pathways_client.island_client import IslandClient

    main = json.loads(os.environ["PATHWAYS_SLICES"])["main"]
    step = jax.export.export(jax.jit(lambda x: x * 2 + 1))(
        jax.ShapeDtypeStruct((4,), jnp.float32)
    )
    with IslandClient(main["scheduler"], os.environ["PATHWAYS_PROGRAM"],
                      weight=int(os.environ["PATHWAYS_WEIGHT"])) as client:
        function = client.register(step.serialize(), "step")
        device = main["devices"][-1]
        x = client.put(np.arange(4, dtype=np.float32), device=device)
        y = client.submit(function, [device], [x], 1)
        y.wait()
        result = client.get(y.outputs[0]).tolist()
    assert result == [1.0, 3.0, 5.0, 7.0], result
    print("RESULT", result, "on device", device, "of island", main["island"])
    """
)


def pstatus(cluster: Cluster, name: str, namespace: str = "team") -> dict:
    return (cluster.get("PathwaysProgram", name, namespace) or {}).get("status") or {}


def external_island(name: str, endpoint: str, topology: str = "4") -> dict:
    manifest = island(name, topology=topology, hosts=1)
    manifest["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": endpoint}
    return manifest


def test_driver_program_runs_to_succeeded_on_a_real_island(
    cluster: Cluster, operator, tmp_path: Path
) -> None:
    with LocalIsland(hosts=1, devices_per_host=4, compilation_cache=tmp_path / "xla") as local:
        endpoint = local.scheduler_endpoint
        cluster.create(external_island("local", endpoint))
        cluster.create(
            program(
                "prog",
                slices=[{"name": "main", "devices": 2}],
                driver={"source": DRIVER},
                weight=3,
                priority=5,
            )
        )
        with JobRunner(cluster, tmp_path) as jobs:
            done = wait_for(
                lambda: (
                    (s := pstatus(cluster, "prog")).get("phase") in ("Succeeded", "Failed") and s
                ),
                timeout=150,
            )
            output = jobs.outputs.get("team/prog-run-1", "")
            environment = jobs.environments["team/prog-run-1"]
    assert done["phase"] == "Succeeded", (done, output)
    assert "RESULT [1.0, 3.0, 5.0, 7.0]" in output and "of island local" in output
    assert done["runs"] == 1 and done["restarts"] == 0 and done["completionTime"]
    assert {c["type"]: c["status"] for c in done["conditions"]}["Succeeded"] == "True"
    # The SDK's connection settings, per the contracts.
    assert environment["PATHWAYS_PROGRAM"] == "team/prog"
    assert (environment["PATHWAYS_TENANT"], environment["PATHWAYS_PRIORITY"]) == ("team", "5")
    assert environment["PATHWAYS_WEIGHT"] == "3"
    main = json.loads(environment["PATHWAYS_SLICES"])["main"]
    assert main["virtualSlice"] == "prog-main" and main["island"] == "local"
    assert main["scheduler"] == endpoint
    assert len(main["devices"]) == 2 and main["shape"] is None
    # The program's inline slice was owned by it and is released once it is done.
    wait_for(lambda: cluster.get("VirtualSlice", "prog-main", "team") is None)
    assert [e["reason"] for e in cluster.events("prog")][:2] == ["WaitingForSlices", "Running"]
    # Events are posted after the status patch that reports the transition.
    wait_for(lambda: cluster.events("prog", "JobSucceeded"), what="the JobSucceeded Event")


def test_missing_slice_then_restarts_until_failed(
    cluster: Cluster, operator, tmp_path: Path
) -> None:
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(
        program(
            "flaky",
            slices=[{"name": "main", "virtualSliceName": "shared"}],
            driver={"source": "import sys; print('failing'); sys.exit(3)"},
            restartPolicy="OnFailure",
            maxRestarts=1,
        )
    )
    waiting = wait_for(lambda: (s := pstatus(cluster, "flaky")).get("reason") and s)
    assert waiting["phase"] == "Pending" and waiting["reason"] == "VirtualSliceNotFound"
    assert "VirtualSlice 'shared' not found in namespace team" in waiting["message"]
    # The Event is posted after the status patch that reports it.
    assert wait_for(lambda: cluster.events("flaky", "VirtualSliceNotFound"))[0]["type"] == "Warning"
    assert cluster.list("Job", "team") == []

    with JobRunner(cluster, tmp_path) as jobs:
        cluster.create(vslice("shared", devices=2))  # the program notices through its index
        failed = wait_for(
            lambda: (s := pstatus(cluster, "flaky")).get("phase") == "Failed" and s, timeout=60
        )
        assert sorted(jobs.started) == ["team/flaky-run-1", "team/flaky-run-2"]
    assert failed["reason"] == "JobFailed" and failed["restarts"] == 1 and failed["runs"] == 2
    assert "exited with code 3" in failed["message"] and "after 1 restarts" in failed["message"]
    assert cluster.events("flaky", "Restarting")
    # The existing slice is the user's: it stays.
    assert cluster.get("VirtualSlice", "shared", "team") is not None


def test_a_job_the_cluster_refuses_is_said_on_the_program_and_tried_again(
    cluster: Cluster, operator, tmp_path: Path
) -> None:
    """Refused (a namespace's ResourceQuota, a webhook, the API server's validation), the
    Job's creation failed in the operator's log only: the program waited for good, saying it
    was creating its slices."""
    words = 'jobs.batch "capped-run-1" is forbidden: exceeded quota: team-quota'
    refusing = [True]

    async def resource_quota(request: kmock.Request) -> None:
        data = request.data if isinstance(request.data, dict) else {}
        if (
            refusing[0]
            and request.action == kmock.action.CREATE
            and data.get("kind") == "Job"
            and (data.get("metadata") or {}).get("name") == "capped-run-1"
        ):
            raise kmock.KubernetesError(403, "Forbidden", words)

    cluster.call_soon(lambda: cluster.emulator.hooks.append(resource_quota))
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(vslice("capped-slice", devices=2))
    cluster.create(
        program(
            "capped",
            slices=[{"name": "main", "virtualSliceName": "capped-slice"}],
            driver={"source": "print('ran')"},
        )
    )
    refused = wait_for(lambda: (s := pstatus(cluster, "capped")).get("reason") == "ChildRefused"
                       and s)  # fmt: skip
    assert refused["phase"] == "Pending" and not refused.get("runs")
    assert refused["message"] == f"the cluster refused Job capped-run-1: 403: {words}"
    assert wait_for(lambda: cluster.events("capped", "ChildRefused"))[0]["type"] == "Warning"
    refusing[0] = False  # the quota has room again: the next reconcile (a resync) makes it
    with JobRunner(cluster, tmp_path) as jobs:
        wait_for(lambda: pstatus(cluster, "capped").get("phase") == "Succeeded", timeout=60)
        assert jobs.started == ["team/capped-run-1"]
    assert len(cluster.events("capped", "ChildRefused")) == 1  # said once, not every resync
    cluster.call_soon(cluster.emulator.hooks.clear)


def test_semantically_wrong_program_fails_once_with_a_reason(cluster: Cluster, operator) -> None:
    cluster.create(
        program(
            "broken",
            slices=[{"name": "main", "devices": 2}],
            graph={
                "functions": [{"name": "f", "uri": "file:///f.bin"}],
                "nodes": [{"name": "n", "function": "missing", "slice": "main"}],
            },
        )
    )
    failed = wait_for(lambda: (s := pstatus(cluster, "broken")).get("phase") and s)
    assert failed["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
    assert "graph.nodes[0].function" in failed["message"]
    assert len(wait_for(lambda: cluster.events("broken", "InvalidSpec"))) == 1
    assert cluster.list("Job", "team") == [] and cluster.list("VirtualSlice", "team") == []


def test_a_runs_job_is_made_once_though_the_status_recording_it_conflicts(
    cluster: Cluster, operator
) -> None:
    """Its status write refused (409: the program changed since it was read), the decision
    was made again from what it read next: the run's Job made a moment before was deleted as
    a run never recorded, then made again (each conflict killed a driver at its start)."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    until = [time.monotonic() + 3]

    async def conflict(request: kmock.Request) -> None:
        status = request.name == "steady" and request.subresource == "status"
        if status and time.monotonic() < until[0]:
            raise kmock.KubernetesError(409, "Conflict", "the object has been modified")

    cluster.call_soon(lambda: cluster.emulator.hooks.append(conflict))
    seen = len(list(cluster.emulator))
    sleep = {"source": "import time; time.sleep(120)"}
    cluster.create(program("steady", slices=[{"name": "main", "devices": 1}], driver=sleep))
    wait_for(lambda: pstatus(cluster, "steady").get("runs") == 1, timeout=30)
    cluster.call_soon(lambda: cluster.emulator.hooks.remove(conflict))
    jobs = [
        request
        for request in list(cluster.emulator)[seen:]
        if getattr(request.resource, "plural", None) == "jobs" and request.name == "steady-run-1"
    ]
    assert not [r for r in jobs if r.action == kmock.action.DELETE], "run 1's Job was deleted"
    assert not cluster.events("steady", "StaleJob")
    assert pstatus(cluster, "steady")["phase"] == "Running"


def test_programs_of_the_wrong_shape_fail_and_go_without_a_traceback(cluster: Cluster) -> None:
    """The index of the slices programs name raised at every event of a program whose
    ``spec.slices`` is no list of mappings (a traceback each time), and its deletion handler
    raised too: kopf retried it for good and the program stayed Terminating."""
    shapes = {"g-int": 5, "g-item": [{"name": "m", "virtualSliceName": ["x"]}]}
    with running_operator() as runner:
        for name, slices in shapes.items():
            cluster.create(program(name, slices=slices, driver={"source": "pass"}))
        for name in shapes:
            failed = wait_for(lambda n=name: (s := pstatus(cluster, n)).get("phase") and s)
            assert (failed["phase"], failed["reason"]) == ("Failed", "InvalidSpec")
            assert "slices" in failed["message"]
        for name in shapes:
            cluster.delete("PathwaysProgram", name, "team")
        for name in shapes:
            wait_for(lambda n=name: cluster.get("PathwaysProgram", n, "team") is None)
    assert "Traceback" not in runner.output


def test_suspend_resume_and_cleanup(cluster: Cluster, operator, tmp_path: Path) -> None:
    cluster.create(external_island("far", "127.0.0.1:1", topology="2x2"))
    cluster.create(
        program(
            "long",
            slices=[{"name": "main", "shape": "2x2"}],
            driver={"source": "import time; time.sleep(120)"},
        )
    )
    with JobRunner(cluster, tmp_path) as jobs:
        wait_for(lambda: pstatus(cluster, "long").get("phase") == "Running")
        wait_for(lambda: "team/long-run-1" in jobs.started)
        cluster.patch("PathwaysProgram", "long", {"spec": {"suspend": True}}, "team")
        suspended = wait_for(
            lambda: (s := pstatus(cluster, "long")).get("phase") == "Suspended" and s
        )
        assert suspended["reason"] == "Suspended"
        # The run stops and the slice's devices go back.
        wait_for(lambda: cluster.get("Job", "long-run-1", "team") is None)
        wait_for(lambda: cluster.get("VirtualSlice", "long-main", "team") is None)
        wait_for(lambda: cluster.events("long", "Suspended"))
        # A Job of a run the status never recorded (its decision's status write failed, the
        # program suspended meanwhile) is deleted: it ran on released slices, and resumed,
        # the program took it for its next run.
        stray = cluster.get("Job", "long-run-1", "team") or {}
        uid = cluster.get("PathwaysProgram", "long", "team")["metadata"]["uid"]
        cluster.create(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {
                    "name": "long-run-2",
                    "namespace": "team",
                    "labels": {"pathways.dev/program": "long", "pathways.dev/run": "2"},
                    "ownerReferences": [
                        {
                            "apiVersion": "pathways.dev/v1alpha1",
                            "kind": "PathwaysProgram",
                            "name": "long",
                            "uid": uid,
                            "controller": True,
                        }
                    ],
                },
                "spec": {"template": {"spec": {"containers": [{"name": "x", "image": "x"}]}}},
                "status": {"conditions": [{"type": "Complete", "status": "True"}]},
            }
        )
        wait_for(lambda: cluster.get("Job", "long-run-2", "team") is None)
        assert not stray

        cluster.patch("PathwaysProgram", "long", {"spec": {"suspend": False}}, "team")
        resumed = wait_for(
            lambda: (
                (s := pstatus(cluster, "long")).get("phase") == "Running" and s["runs"] == 2 and s
            )
        )
        assert resumed["slices"][0]["phase"] == "Bound"
        job = wait_for(lambda: cluster.get("Job", "long-run-2", "team"))
        shape = json.loads(job["spec"]["template"]["spec"]["containers"][0]["env"][-1]["value"])
        assert shape["main"]["shape"] == [2, 2]
        owner = job["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("PathwaysProgram", "long")

        cluster.delete("PathwaysProgram", "long", "team")
        wait_for(lambda: cluster.get("PathwaysProgram", "long", "team") is None)
        assert cluster.get("Job", "long-run-2", "team") is None
        wait_for(lambda: cluster.get("VirtualSlice", "long-main", "team") is None)


def test_a_deleted_programs_resync_ends_with_it(
    cluster: Cluster, operator, caplog: pytest.LogCaptureFixture
) -> None:
    """kopf stops a program's resync daemon when the program goes; one left behind would
    reconcile a program that no longer exists every resync, for as long as the operator runs
    (one more per program ever deleted)."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    names = [f"gone-{index}" for index in range(3)]
    for name in names:
        cluster.create(program(name, slices=[{"name": "main", "virtualSliceName": "absent"}]))
    for name in names:
        wait_for(lambda name=name: pstatus(cluster, name).get("reason"))
    time.sleep(2.5)  # a resync of each has begun its wait
    for name in names:
        cluster.delete("PathwaysProgram", name, "team")
    for name in names:
        wait_for(lambda name=name: cluster.get("PathwaysProgram", name, "team") is None)

    def reads_of_deleted(request: kmock.Request) -> bool:
        url = str(request.url)
        return "/pathwaysprograms/gone-" in url and str(request.method).upper().endswith("GET")

    reads = cluster.requests_to(reads_of_deleted)
    time.sleep(5)  # two resync intervals
    assert cluster.requests_to(reads_of_deleted) == reads
    # Ended quietly: not a warning per deleted object.
    assert not [m for m in caplog.messages if "did not exit in time" in m or "is cancelled" in m]


def test_graph_program_runs_the_graph_runner_with_its_spec_mounted(
    cluster: Cluster, operator
) -> None:
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(
        program(
            "graph",
            slices=[{"name": "main", "devices": 1}],
            graph={
                "functions": [{"name": "f", "uri": "file:///f.bin"}],
                "nodes": [{"name": "n", "function": "f", "slice": "main"}],
            },
        )
    )
    job = wait_for(lambda: cluster.get("Job", "graph-run-1", "team"))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's tini entrypoint runs the args
    assert container["args"] == [
        "python",
        "-m",
        "pathways_client.run_graph",
        "--spec",
        "/etc/pathways/program.json",
    ]
    assert job["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] == "graph-graph"
    config = cluster.get("ConfigMap", "graph-graph", "team")
    assert json.loads(config["data"]["program.json"])["graph"]["nodes"][0]["function"] == "f"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_preempted_program_stops_its_run_and_runs_again(cluster: Cluster, operator) -> None:
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(
        program(
            "low",
            slices=[{"name": "main", "devices": 4}],
            driver={"source": "import time; time.sleep(120)"},
        )
    )
    wait_for(lambda: cluster.get("Job", "low-run-1", "team"))
    cluster.create(vslice("urgent", devices=4, priority=100))
    (event,) = wait_for(lambda: cluster.events("low", "SlicesLost"))
    assert event["type"] == "Warning" and "preempted by team/urgent" in event["message"]
    wait_for(lambda: cluster.get("Job", "low-run-1", "team") is None)
    # The Job goes first; the status follows in a separate (possibly retried) patch.
    stopped = wait_for(
        lambda: "Preempted" in (s := pstatus(cluster, "low")).get("message", "") and s
    )
    assert stopped["phase"] == "Pending"
    running = next(c for c in stopped["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"]) == ("False", "SlicesLost")
    cluster.delete("VirtualSlice", "urgent", "team")
    again = wait_for(lambda: (s := pstatus(cluster, "low")).get("runs") == 2 and s)
    assert again["phase"] == "Running" and again["restarts"] == 0
    assert cluster.get("Job", "low-run-2", "team") is not None


def test_program_waits_for_its_islands_scheduler(cluster: Cluster, operator) -> None:
    cluster.create(island("late", topology="4", hosts=1))  # its pods never become ready here
    cluster.create(
        program("patient", slices=[{"name": "main", "devices": 2}], driver={"source": "pass"})
    )
    waiting = wait_for(
        lambda: "no scheduler ready" in (s := pstatus(cluster, "patient")).get("message", "") and s
    )
    assert waiting["phase"] == "Pending" and cluster.list("Job", "team") == []
    # The island gets a scheduler: the program hears of it through the island's slices.
    cluster.patch(
        "Island",
        "late",
        {"metadata": {"annotations": {"pathways.dev/scheduler-endpoint": "10.0.0.9:8470"}}},
    )
    job = wait_for(lambda: cluster.get("Job", "patient-run-1", "team"))
    slices = json.loads(job["spec"]["template"]["spec"]["containers"][0]["env"][-1]["value"])
    assert slices["main"]["scheduler"] == "10.0.0.9:8470"


def test_edits_to_a_running_program_are_applied_and_a_deleted_job_fails_it(
    cluster: Cluster, operator
) -> None:
    """Edits were observed (observedGeneration moved) but the run went on as it was; a Job
    deleted by hand started the next run under restartPolicy Never, and no Event said why."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(
        program(
            "edited",
            slices=[{"name": "main", "devices": 2}],
            driver={"source": "import time; time.sleep(120)"},
        )
    )
    wait_for(lambda: cluster.get("Job", "edited-run-1", "team"))

    def environment(job: dict) -> dict:
        container = job["spec"]["template"]["spec"]["containers"][0]
        return {item["name"]: item["value"] for item in container["env"]}

    cluster.patch("PathwaysProgram", "edited", {"spec": {"weight": 5}}, "team")
    second = wait_for(lambda: cluster.get("Job", "edited-run-2", "team"))
    assert environment(second)["PATHWAYS_WEIGHT"] == "5"
    assert cluster.get("Job", "edited-run-1", "team") is None
    (event,) = wait_for(lambda: cluster.events("edited", "SpecChanged"))
    assert "run 1 stopped: the spec changed (generation 2)" in event["message"]
    assert pstatus(cluster, "edited")["restarts"] == 0

    # An inline slice's new size: the slice is bound again, then the next run starts on it.
    cluster.patch(
        "PathwaysProgram", "edited", {"spec": {"slices": [{"name": "main", "devices": 4}]}}, "team"
    )
    third = wait_for(lambda: cluster.get("Job", "edited-run-3", "team"))
    slices = json.loads(environment(third)["PATHWAYS_SLICES"])
    assert len(slices["main"]["devices"]) == 4
    assert cluster.get("VirtualSlice", "edited-main", "team")["spec"]["devices"] == 4
    status = wait_for(lambda: (s := pstatus(cluster, "edited")).get("runs") == 3 and s)
    assert status["phase"] == "Running" and status["observedGeneration"] == 3

    cluster.delete("Job", "edited-run-3", "team")
    failed = wait_for(lambda: (s := pstatus(cluster, "edited")).get("phase") == "Failed" and s)
    assert (failed["reason"], failed["message"]) == (
        "JobDeleted",
        "run 3: its Job edited-run-3 was deleted",
    )
    assert cluster.get("Job", "edited-run-4", "team") is None
    wait_for(lambda: cluster.get("VirtualSlice", "edited-main", "team") is None)


def test_a_renamed_inline_slice_is_released_and_a_taken_name_never_taken_over(
    cluster: Cluster, operator
) -> None:
    """The old inline slice held its devices until the program was deleted; an inline slice
    whose name was another program's slice rewrote it (two programs did so to each other in a
    loop)."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    sleep = {"source": "import time; time.sleep(120)"}
    cluster.create(program("a", slices=[{"name": "b-main", "devices": 2}], driver=sleep))
    wait_for(lambda: cluster.get("Job", "a-run-1", "team"))
    cluster.create(program("a-b", slices=[{"name": "main", "devices": 1}], driver=sleep))
    taken = wait_for(lambda: (s := pstatus(cluster, "a-b")).get("reason") == "SliceNameTaken" and s)
    assert "VirtualSlice a-b-main exists and is not this program's" in taken["message"]
    assert "PathwaysProgram a" in taken["message"]
    assert cluster.get("VirtualSlice", "a-b-main", "team")["spec"]["devices"] == 2
    assert cluster.get("VirtualSlice", "a-b-main", "team")["metadata"]["generation"] == 1
    # Deleted, the refused program takes nothing of the other's with it (it took the slice).
    cluster.delete("PathwaysProgram", "a-b", "team")
    wait_for(lambda: cluster.get("PathwaysProgram", "a-b", "team") is None)
    kept = cluster.get("VirtualSlice", "a-b-main", "team")
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")
    assert pstatus(cluster, "a")["phase"] == "Running"
    cluster.create(program("a-b", slices=[{"name": "main", "devices": 1}], driver=sleep))
    wait_for(lambda: pstatus(cluster, "a-b").get("reason") == "SliceNameTaken")

    cluster.patch(
        "PathwaysProgram", "a", {"spec": {"slices": [{"name": "work", "devices": 2}]}}, "team"
    )
    wait_for(lambda: cluster.get("VirtualSlice", "a-b-main", "team") is None)
    wait_for(lambda: cluster.get("Job", "a-run-2", "team"))
    assert cluster.get("VirtualSlice", "a-work", "team")["status"]["phase"] == "Bound"
    # Its name free, the other program makes its own slice.
    wait_for(lambda: cluster.get("Job", "a-b-run-1", "team"))


def _users(kind: str, name: str, **content: Any) -> dict:
    """An object of the user's (no owner, no program label) in the programs' namespace."""
    api_version = "batch/v1" if kind == "Job" else "v1"
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "team"},
        **content,
    }


def test_a_users_configmap_of_the_graphs_name_is_never_rewritten_or_deleted(
    cluster: Cluster, operator, tmp_path: Path
) -> None:
    """A user's ConfigMap named <program>-graph was rewritten with the graph (its keys gone)
    by a graph program, and deleted by a driver program at its second run."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(_users("ConfigMap", "train-graph", data={"step": "the user's bytes"}))
    with JobRunner(cluster, tmp_path):
        cluster.create(
            program(
                "train",
                slices=[{"name": "main", "devices": 1}],
                driver={"source": "import sys; sys.exit(1)"},
                restartPolicy="OnFailure",
                maxRestarts=1,
            )
        )
        wait_for(lambda: pstatus(cluster, "train").get("runs") == 2, timeout=60)
        wait_for(lambda: pstatus(cluster, "train").get("phase") == "Failed", timeout=60)
    assert cluster.get("ConfigMap", "train-graph", "team")["data"] == {"step": "the user's bytes"}

    graph = {
        "functions": [{"name": "f", "configMapKeyRef": {"name": "graph-graph", "key": "step"}}],
        "nodes": [{"name": "n", "function": "f", "slice": "main"}],
    }
    cluster.create(_users("ConfigMap", "graph-graph", data={"step": "the user's bytes"}))
    cluster.create(program("graph", slices=[{"name": "main", "devices": 1}], graph=graph))
    taken = wait_for(lambda: (s := pstatus(cluster, "graph")).get("reason") == "ChildNameTaken"
                     and s)  # fmt: skip
    assert taken["phase"] == "Pending" and not taken.get("runs")
    assert taken["message"] == (
        "ConfigMap graph-graph exists and is not this program's (it belongs to no program): "
        "the program needs that name; delete or rename that ConfigMap, or rename the program"
    )
    assert wait_for(lambda: cluster.events("graph", "ChildNameTaken"))[0]["type"] == "Warning"
    time.sleep(3)  # resyncs (every 2 s here) leave it as it is, and start no run
    assert cluster.get("ConfigMap", "graph-graph", "team")["data"] == {"step": "the user's bytes"}
    assert cluster.get("Job", "graph-run-1", "team") is None
    assert len(cluster.events("graph", "ChildNameTaken")) == 1

    cluster.delete("ConfigMap", "graph-graph", "team")  # the name is free: the run starts
    wait_for(lambda: cluster.get("Job", "graph-run-1", "team"))
    made = cluster.get("ConfigMap", "graph-graph", "team")
    assert list(made["data"]) == ["program.json"]
    assert made["metadata"]["ownerReferences"][0]["name"] == "graph"


def test_a_users_job_of_a_runs_name_is_never_taken_for_the_run(
    cluster: Cluster, operator, tmp_path: Path
) -> None:
    """A user's Job named <program>-run-1 was taken for run 1 (its creation answered 409),
    then the program failed: 'its Job train-run-1 was deleted', its driver never run."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    template = {"spec": {"containers": [{"name": "c", "image": "busybox"}],
                         "restartPolicy": "Never"}}  # fmt: skip
    cluster.create(_users("Job", "train-run-1", spec={"template": template}))
    cluster.create(
        program("train", slices=[{"name": "main", "devices": 1}], driver={"source": "pass"})
    )
    taken = wait_for(lambda: (s := pstatus(cluster, "train")).get("reason") == "ChildNameTaken"
                     and s)  # fmt: skip
    assert taken["phase"] == "Pending" and not taken.get("runs")
    assert taken["message"].startswith("Job train-run-1 exists and is not this program's")
    time.sleep(3)
    users = cluster.get("Job", "train-run-1", "team")
    assert not users["metadata"].get("ownerReferences")
    assert pstatus(cluster, "train")["phase"] == "Pending"

    cluster.delete("Job", "train-run-1", "team")
    with JobRunner(cluster, tmp_path) as jobs:
        wait_for(lambda: pstatus(cluster, "train").get("phase") == "Succeeded", timeout=60)
        assert jobs.started == ["team/train-run-1"]
    assert pstatus(cluster, "train")["runs"] == 1


def test_a_deadline_edited_under_a_running_run_moves_its_jobs(cluster: Cluster, operator) -> None:
    """Extended, the Job kept its old deadline, and the program failed at it."""
    cluster.create(external_island("far", "127.0.0.1:1"))
    cluster.create(
        program(
            "timed",
            slices=[{"name": "main", "devices": 1}],
            driver={"source": "import time; time.sleep(120)"},
            activeDeadlineSeconds=600,
        )
    )
    job = wait_for(lambda: cluster.get("Job", "timed-run-1", "team"))
    assert job["spec"]["activeDeadlineSeconds"] == 600
    cluster.patch("PathwaysProgram", "timed", {"spec": {"activeDeadlineSeconds": 3600}}, "team")
    wait_for(
        lambda: (
            cluster.get("Job", "timed-run-1", "team")["spec"].get("activeDeadlineSeconds") == 3600
        )
    )
    cluster.patch("PathwaysProgram", "timed", {"spec": {"activeDeadlineSeconds": None}}, "team")
    wait_for(
        lambda: "activeDeadlineSeconds" not in cluster.get("Job", "timed-run-1", "team")["spec"]
    )
    assert pstatus(cluster, "timed")["runs"] == 1


def test_kubectl_users_stay_within_their_tenants_policy(cluster: Cluster) -> None:
    # kubectl writes spec.tenant and spec.priority itself: the operator's tenant policy decides.
    policy = {"team": {"maxPriority": 10}, "*": {"maxPriority": 0}}
    cluster.create(external_island("far", "127.0.0.1:1", topology="8"))
    with running_operator(PATHWAYS_TENANTS=json.dumps(policy)):
        cluster.create(vslice("spoof", namespace="intruder", devices=4, tenant="team"))
        cluster.create(vslice("bully", namespace="intruder", devices=4, priority=100))
        cluster.create(
            program(
                "high",
                priority=50,
                slices=[{"name": "main", "devices": 4}],
                driver={"source": "pass"},
            )
        )
        spoof = wait_for(lambda: (s := sstatus(cluster, "spoof", "intruder")).get("reason") and s)
        assert (spoof["phase"], spoof["reason"]) == ("Pending", "TenantNotAllowed")
        assert spoof["message"].startswith(
            "spec.tenant: tenant 'team' may be named only from namespace(s) 'team', not 'intruder'"
        )
        (event,) = wait_for(lambda: cluster.events("spoof", "TenantNotAllowed"))
        assert event["type"] == "Warning"
        bully = wait_for(lambda: (s := sstatus(cluster, "bully", "intruder")).get("reason") and s)
        assert (bully["phase"], bully["reason"]) == ("Pending", "PriorityNotAllowed")
        # A program above its tenant's priority says so, naming its slice and the field.
        waiting = wait_for(
            lambda: "PriorityNotAllowed" in (s := pstatus(cluster, "high")).get("message", "") and s
        )
        assert (
            waiting["phase"] == "Pending"
            and "spec.priority: 50 is above 10" in (waiting["message"])
        )
        assert cluster.list("Job", "team") == []
        # Lowered within the policy, both bind (the island has room for both).
        cluster.patch("PathwaysProgram", "high", {"spec": {"priority": 10}}, "team")
        cluster.patch("VirtualSlice", "bully", {"spec": {"priority": 0}}, "intruder")
        wait_for(lambda: cluster.get("Job", "high-run-1", "team"))
        wait_for(lambda: sstatus(cluster, "bully", "intruder").get("phase") == "Bound")
        assert sstatus(cluster, "spoof", "intruder")["reason"] == "TenantNotAllowed"


def sstatus(cluster: Cluster, name: str, namespace: str = "team") -> dict:
    return (cluster.get("VirtualSlice", name, namespace) or {}).get("status") or {}


def test_a_run_failed_by_its_islands_lost_host_is_interrupted_not_failed(
    cluster: Cluster,
) -> None:
    """The driver's stream to a dead executor breaks at once and its Job fails; the executor's
    pod is reported unready a few readiness probes later. Judged at once, the program failed
    (restartPolicy Never) for what was its island's loss."""
    with running_operator(PATHWAYS_FAILURE_GRACE_SECONDS="5"):
        cluster.create(island("isl", topology="2x4", hosts=2))
        wait_for(lambda: cluster.get("StatefulSet", "isl-executor", NAMESPACE))
        mark_ready(cluster, "isl", NAMESPACE, scheduler=1, executors=2)
        set_executor_pods(cluster, "isl", NAMESPACE, 2, {0, 1})
        wait_for(lambda: (cluster.get("Island", "isl").get("status") or {}).get("phase") == "Ready")
        cluster.create(
            program(
                "p",
                slices=[{"name": "main", "devices": 8}],
                driver={"source": "import time; time.sleep(999)"},
            )
        )
        wait_for(lambda: pstatus(cluster, "p").get("phase") == "Running")
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
            "lastTransitionTime": timestamp(now_utc()),
        }
        cluster.patch("Job", "p-run-1", {"status": {"failed": 1, "conditions": [failed]}}, "team")
        held = wait_for(lambda: (s := pstatus(cluster, "p")).get("reason") == "RunEnded" and s)
        assert held["phase"] == "Running" and "judged in" in held["message"]
        set_executor_pods(cluster, "isl", NAMESPACE, 2, {0})  # host 1's pod is reported unready
        (event,) = wait_for(lambda: cluster.events("p", "RunInterrupted"))
        assert "not counted a failure" in event["message"], event
        waiting = pstatus(cluster, "p")
        assert waiting["phase"] == "Pending" and waiting["restarts"] == 0
        set_executor_pods(cluster, "isl", NAMESPACE, 2, {0, 1})  # back
        again = wait_for(lambda: (s := pstatus(cluster, "p")).get("runs") == 2 and s)
        assert again["phase"] == "Running" and again["restarts"] == 0
        # A failure with the island whole is the program's: judged after the grace.
        failed["lastTransitionTime"] = timestamp(now_utc())
        cluster.patch("Job", "p-run-2", {"status": {"failed": 1, "conditions": [failed]}}, "team")
        ended = wait_for(lambda: (s := pstatus(cluster, "p")).get("phase") == "Failed" and s)
        assert ended["reason"] == "JobFailed" and ended["runs"] == 2
