"""The program lifecycle (pure): one table row per situation."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pathways_client.run_graph as run_graph
from pathways_core.control import (
    ChildRef,
    ProgramView,
    child_name_taken,
    reconcile_program,
    same_child,
)
from pathways_core.control.common import timestamp
from pathways_core.control.programs import island_client_name, restart_backoff

NOW = datetime(2026, 1, 1, tzinfo=UTC)
IMAGE = "pathways:test"


def program(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = {"slices": [{"name": "main", "devices": 2}], "driver": {"source": "print(1)"}, **spec}
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {
            "name": "p",
            "namespace": "t",
            "uid": "u-p",
            "generation": 1,
            "resourceVersion": "5",
        },
        "spec": body,
    }
    if status is not None:
        document["status"] = status
    return document


OWNED = {"name": "p-main", "ownerReferences": [{"uid": "u-p", "controller": True}]}
"""Metadata of program p's inline slice main, made by it."""


def bound_slice(island: str = "isl", devices: tuple[int, ...] = (2, 3)) -> dict[str, Any]:
    return {
        "metadata": OWNED,
        "spec": {"devices": 2},
        "status": {"phase": "Bound", "island": island, "devices": list(devices)},
    }


READY_ISLAND = {"isl": {"metadata": {"name": "isl"}, "status": {"schedulerEndpoint": "sched:8470"}}}


def job(outcome: str | None) -> dict[str, Any]:
    conditions = {
        "Complete": [{"type": "Complete", "status": "True"}],
        "Failed": [{"type": "Failed", "status": "True", "message": "exit 3"}],
    }
    return {
        "metadata": {"name": "p-run-1"},
        "status": {"conditions": conditions.get(outcome or "", [])},
    }


def decide(
    document: dict[str, Any],
    slices: dict[str, Any] | None = None,
    job_document: dict[str, Any] | None = None,
    islands: dict[str, Any] | None = None,
    after: float = 0.0,
) -> Any:
    """The decision ``after`` seconds past NOW."""
    return reconcile_program(
        ProgramView(document, slices or {}, job_document, islands or {}),
        NOW + timedelta(seconds=after),
        IMAGE,
    )


def test_invalid_program_fails_once() -> None:
    document = program(graph={"functions": [], "nodes": []})
    decision = decide(document)
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "InvalidSpec")
    assert [e.type for e in decision.events] == ["Warning"]
    assert decision.create == decision.delete == []
    again = decide(dict(document, status=decision.status))
    assert again.status is None and again.events == []

    # Its spec fixed before it ever ran, it starts as a new one would (it stayed Failed,
    # naming the old spec's problem beside the new generation).
    fixed = program(status=decision.status)
    fixed["metadata"]["generation"] = 2
    started = decide(fixed, {"p-main": bound_slice()}, None, READY_ISLAND)
    assert (started.status["phase"], started.status["runs"]) == ("Running", 1)
    valid = next(c for c in started.status["conditions"] if c["type"] == "Valid")
    assert (valid["status"], valid["observedGeneration"]) == ("True", 2)


def test_inline_slices_are_created_owned_by_the_program() -> None:
    document = program(priority=7, tenant="research")
    document["metadata"]["creationTimestamp"] = "2026-01-01T00:00:14.250000Z"
    decision = decide(document, {"p-main": None})
    (created,) = decision.create
    assert created["kind"] == "VirtualSlice" and created["metadata"]["name"] == "p-main"
    # It queues from the program's creation (made in one pass, slices' own times tie).
    assert created["metadata"]["annotations"] == {
        "pathways.dev/queued-since": "2026-01-01T00:00:14.250000Z"
    }
    assert created["metadata"]["ownerReferences"][0]["uid"] == "u-p"
    assert created["metadata"]["labels"]["pathways.dev/program"] == "p"
    assert created["spec"] == {"devices": 2, "priority": 7, "tenant": "research"}
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "WaitingForSlices")


def test_missing_existing_slice_is_named() -> None:
    document = program(slices=[{"name": "main", "virtualSliceName": "shared"}])
    decision = decide(document, {"shared": None})
    assert decision.create == []
    assert decision.status["reason"] == "VirtualSliceNotFound"
    assert "VirtualSlice 'shared' not found in namespace t" in decision.status["message"]
    assert decision.events[0].type == "Warning"


def test_waits_for_the_islands_scheduler() -> None:
    decision = decide(program(), {"p-main": bound_slice()}, islands={"isl": {"status": {}}})
    assert decision.status["reason"] == "WaitingForSlices"
    assert "island 'isl' has no scheduler ready" in decision.status["message"]


def test_ready_program_starts_run_one_with_the_sdk_settings() -> None:
    decision = decide(
        program(weight=4, steps=10, activeDeadlineSeconds=60),
        {"p-main": bound_slice()},
        islands=READY_ISLAND,
    )
    (created,) = decision.create
    assert created["kind"] == "Job" and created["metadata"]["name"] == "p-run-1"
    assert created["spec"]["backoffLimit"] == 0 and created["spec"]["activeDeadlineSeconds"] == 60
    # A driver evicted by a disruption (a node drained) is started again, not failed.
    (rule,) = created["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    container = created["spec"]["template"]["spec"]["containers"][0]
    # The Pathways image's tini entrypoint stays: the command is given as args.
    assert "command" not in container and container["image"] == IMAGE
    assert container["args"] == ["python", "-c", "print(1)"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["PATHWAYS_PROGRAM"] == "t/p" and env["PATHWAYS_TENANT"] == "t"
    assert env["PATHWAYS_WEIGHT"] == "4" and env["PATHWAYS_PRIORITY"] == "0"
    assert env["PATHWAYS_STEPS"] == "10"
    assert json.loads(env["PATHWAYS_SLICES"]) == {
        "main": {
            "virtualSlice": "p-main",
            "island": "isl",
            "scheduler": "sched:8470",
            "devices": [2, 3],
            "shape": None,
        }
    }
    assert (decision.status["phase"], decision.status["runs"]) == ("Running", 1)
    assert decision.status["startTime"] == "2026-01-01T00:00:00Z"
    assert [e.reason for e in decision.events] == ["Running"]


def test_a_program_is_one_island_client_no_other_tenants_program_can_be() -> None:
    # With '-', tenant team's a-x and tenant team-a's x were one client.
    assert island_client_name("team/a-x") != island_client_name("team-a/x")
    assert island_client_name("team-a/x") == "team-a.x"


def test_a_drivers_own_variables_cannot_replace_those_of_the_run() -> None:
    spoofed = program(driver={"source": "x", "env": [{"name": "PATHWAYS_PROGRAM", "value": "o/x"}]})
    decision = decide(spoofed, {"p-main": bound_slice()}, islands=READY_ISLAND)
    assert decision.status["reason"] == "InvalidSpec"
    assert (
        "spec.driver.env[0].name: PATHWAYS_PROGRAM is set by Pathways"
        in (decision.status["message"])
    )
    # Variables of its own come before Pathways' ones, which win over a name set twice.
    own = program(driver={"source": "x", "env": [{"name": "MODE", "value": "fast"}]})
    (created,) = decide(own, {"p-main": bound_slice()}, islands=READY_ISLAND).create
    names = [item["name"] for item in created["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert names[0] == "MODE" and names[1:3] == ["PATHWAYS_RUN", "PATHWAYS_PROGRAM"]


def test_a_checkpoint_claim_is_mounted_with_a_folder_of_the_programs_own() -> None:
    """Without a volume a driver's checkpoints lived in its pod and went with it: every run
    began from the first step."""
    claimed = program(driver={"source": "x", "checkpointClaim": "team-checkpoints"})
    (created,) = decide(claimed, {"p-main": bound_slice()}, islands=READY_ISLAND).create
    pod = created["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "team-checkpoints"}} in (
        pod["volumes"]
    )
    assert {"name": "checkpoints", "mountPath": "/var/lib/pathways/checkpoints"} in (
        container["volumeMounts"]
    )
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["PATHWAYS_CHECKPOINT_DIR"] == "/var/lib/pathways/checkpoints/p/u-p"
    # The variable comes from the claim or from env, never both.
    both = program(
        driver={
            "source": "x",
            "checkpointClaim": "team-checkpoints",
            "env": [{"name": "PATHWAYS_CHECKPOINT_DIR", "value": "/elsewhere"}],
        }
    )
    decision = decide(both, {"p-main": bound_slice()}, islands=READY_ISLAND)
    assert (
        "spec.driver.env[0].name: PATHWAYS_CHECKPOINT_DIR is set from checkpointClaim"
        in (decision.status["message"])
    )
    bad = program(driver={"source": "x", "checkpointClaim": "Not_A_Claim"})
    decision = decide(bad, {"p-main": bound_slice()}, islands=READY_ISLAND)
    assert "spec.driver.checkpointClaim" in decision.status["message"]


def test_running_program_with_its_slices_changes_nothing() -> None:
    first = decide(program(), {"p-main": bound_slice()}, islands=READY_ISLAND)
    running = program(status=first.status)
    decision = decide(running, {"p-main": bound_slice()}, job(None), READY_ISLAND)
    assert decision.status is None and decision.create == decision.delete == decision.events == []


def test_losing_a_slice_stops_the_run() -> None:
    running = program(status={"phase": "Running", "runs": 1})
    lost = {"p-main": {"metadata": OWNED, "status": {"phase": "Preempted", "reason": "Preempted"}}}
    decision = decide(running, lost, job(None), READY_ISLAND)
    assert decision.delete == [ChildRef("batch/v1", "Job", "t", "p-run-1")]
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "SlicesLost")


def test_success_releases_the_inline_slices() -> None:
    decision = decide(
        program(status={"phase": "Running", "runs": 1}, steps=5),
        {"p-main": bound_slice()},
        job("Complete"),
        READY_ISLAND,
    )
    assert decision.status["phase"] == "Succeeded" and decision.status["completedSteps"] == 5
    assert decision.delete == [ChildRef("pathways.dev/v1alpha1", "VirtualSlice", "t", "p-main")]
    assert [s["phase"] for s in decision.status["slices"]] == ["Released"]
    # Terminal stays terminal.
    after = decide(program(status=decision.status), {"p-main": None}, job("Complete"), READY_ISLAND)
    assert after.status is None and after.create == []


def test_failure_without_restarts_fails_the_program() -> None:
    decision = decide(
        program(status={"phase": "Running", "runs": 1}),
        {"p-main": bound_slice()},
        job("Failed"),
        READY_ISLAND,
    )
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "JobFailed")
    assert "exit 3" in decision.status["message"]
    # What the driver printed last, quoted by the Job, is shown, never obeyed by a terminal.
    loud = job("Failed")
    loud["status"]["conditions"][0]["message"] = "\x1b[2J\x1b[31mexit 3"
    decision = decide(
        program(status={"phase": "Running", "runs": 1}),
        {"p-main": bound_slice()},
        loud,
        READY_ISLAND,
    )
    assert decision.status["message"].endswith("the Job failed: \\x1b[2J\\x1b[31mexit 3")


def test_failure_with_restarts_left_starts_the_next_run() -> None:
    document = program(
        status={"phase": "Running", "runs": 1, "restarts": 0},
        restartPolicy="OnFailure",
        maxRestarts=2,
    )
    decision = decide(document, {"p-main": bound_slice()}, job("Failed"), READY_ISLAND)
    assert [c["metadata"]["name"] for c in decision.create] == ["p-run-2"]
    assert (decision.status["runs"], decision.status["restarts"], decision.status["phase"]) == (
        2,
        1,
        "Running",
    )
    assert [e.reason for e in decision.events] == ["Restarting", "Running"]
    exhausted = program(
        status={"phase": "Running", "runs": 3, "restarts": 2},
        restartPolicy="OnFailure",
        maxRestarts=2,
    )
    assert (
        decide(exhausted, {"p-main": bound_slice()}, job("Failed"), READY_ISLAND).status["phase"]
        == "Failed"
    )


def test_the_deadline_is_the_programs_not_each_runs() -> None:
    """A run past it failed and OnFailure started the next with a fresh deadline: a 3 s
    program ran 15 s over three runs."""
    past = job("Failed")
    past["status"]["conditions"][0].update(reason="DeadlineExceeded", message="too long")
    document = program(
        status={"phase": "Running", "runs": 1, "restarts": 0, "startTime": "2026-01-01T00:00:00Z"},
        restartPolicy="OnFailure",
        maxRestarts=2,
        activeDeadlineSeconds=3,
    )
    decision = decide(document, {"p-main": bound_slice()}, past, READY_ISLAND)
    assert decision.create == [] and decision.status["phase"] == "Failed"
    assert "after" not in decision.status["message"]  # no restart was allowed
    # A run started after an ordinary failure gets what is left of it; none left, none starts.
    failed = program(
        status={"phase": "Running", "runs": 1, "restarts": 0, "startTime": timestamp(NOW)},
        restartPolicy="OnFailure",
        maxRestarts=2,
        activeDeadlineSeconds=60,
    )
    later = decide(failed, {"p-main": bound_slice()}, job("Failed"), READY_ISLAND, after=45)
    (created,) = later.create
    assert created["spec"]["activeDeadlineSeconds"] == 15
    late = decide(failed, {"p-main": bound_slice()}, job("Failed"), READY_ISLAND, after=61)
    assert late.create == [] and late.status["reason"] == "DeadlineExceeded"


def test_a_run_ended_is_judged_once_however_long_the_next_waits_for_slices() -> None:
    """Each look at the failed Job while the next run waited for its slice counted another
    restart: one lost run used up all ten and failed the program. A run that ended as its
    slice was lost is an interruption (no restart, whatever the policy), judged once; one
    that failed on slices as it found them is a restart, counted once."""
    waiting_slice = {"metadata": OWNED, "spec": {"devices": 2}, "status": {}}
    status: dict[str, Any] = {"phase": "Running", "runs": 1, "restarts": 0}
    events = []
    for _ in range(5):
        document = program(status=status, restartPolicy="OnFailure", maxRestarts=10)
        decision = decide(document, {"p-main": waiting_slice}, job("Failed"), READY_ISLAND)
        status = decision.status or status
        events += [e.reason for e in decision.events]
    assert (status["phase"], status["runs"], status["restarts"]) == ("Pending", 1, 0)
    assert status["restartedRun"] == 1 and events.count("RunInterrupted") == 1
    assert "Restarting" not in events
    # Bound again: the next run starts; its own failure counts a restart, once.
    document = program(status=status, restartPolicy="OnFailure", maxRestarts=10)
    decision = decide(document, {"p-main": bound_slice()}, job("Failed"), READY_ISLAND)
    assert [c["metadata"]["name"] for c in decision.create] == ["p-run-2"]
    assert (decision.status["runs"], decision.status["restarts"]) == (2, 0)
    failed_again = program(status=decision.status, restartPolicy="OnFailure", maxRestarts=10)
    second = job("Failed") | {"metadata": {"name": "p-run-2"}}
    again = decide(failed_again, {"p-main": bound_slice()}, second, READY_ISLAND)
    assert (again.status["runs"], again.status["restarts"], again.status["restartedRun"]) == (
        3,
        1,
        2,
    )


def test_suspend_stops_the_run_and_releases_the_slices() -> None:
    document = program(status={"phase": "Running", "runs": 1}, suspend=True)
    decision = decide(document, {"p-main": bound_slice()}, job(None), READY_ISLAND)
    assert decision.delete == [
        ChildRef("batch/v1", "Job", "t", "p-run-1"),
        ChildRef("pathways.dev/v1alpha1", "VirtualSlice", "t", "p-main"),
    ]
    assert decision.status["phase"] == "Suspended"
    # Its status says the slices went (it went on showing them Bound, and SlicesReady True).
    assert decision.status["slices"] == [
        {"name": "main", "virtualSliceName": "p-main", "phase": "Released"}
    ]
    ready = next(c for c in decision.status["conditions"] if c["type"] == "SlicesReady")
    assert (ready["status"], ready["reason"]) == ("False", "Released")
    resumed = decide(program(status=decision.status), {"p-main": None})
    assert resumed.status["phase"] == "Pending" and resumed.create[0]["kind"] == "VirtualSlice"


def test_graph_programs_mount_their_spec_for_the_graph_runner() -> None:
    graph = {
        "functions": [
            {"name": "f", "uri": "file:///f.bin"},
            {"name": "g", "configMapKeyRef": {"name": "weights", "key": "g.jaxexport"}},
            {"name": "h", "configMapKeyRef": {"name": "weights", "key": "h.jaxexport"}},
        ],
        "nodes": [
            {"name": "n", "function": "f", "slice": "main"},
            {"name": "m", "function": "g", "slice": "main", "inputs": [{"node": "n"}]},
            {"name": "o", "function": "h", "slice": "main", "inputs": [{"node": "m"}]},
        ],
    }
    document = program(driver=None, graph=graph)
    del document["spec"]["driver"]
    decision = decide(document, {"p-main": bound_slice()}, islands=READY_ISLAND)
    (config_map,) = decision.apply  # created, or replaced by the spec of this run
    (created,) = decision.create
    assert (
        config_map["kind"] == "ConfigMap"
        and json.loads(config_map["data"]["program.json"])["graph"]["nodes"][0]["function"] == "f"
    )
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container
    assert container["args"] == [
        "python",
        "-m",
        "pathways_client.run_graph",
        "--spec",
        "/etc/pathways/program.json",
    ]
    assert {"name": "program", "mountPath": "/etc/pathways", "readOnly": True} in container[
        "volumeMounts"
    ]
    # configMapKeyRef artifacts: each ConfigMap of the namespace mounted where the runner
    # reads them (they were never mounted: such a program could not run).
    pod = created["spec"]["template"]["spec"]
    assert {"name": "artifacts-0", "configMap": {"name": "weights"}} in pod["volumes"]
    mount = {
        "name": "artifacts-0",
        "mountPath": "/etc/pathways-artifacts/weights",
        "readOnly": True,
    }
    assert mount in container["volumeMounts"]
    assert run_graph.ARTIFACTS_DIR == "/etc/pathways-artifacts"


def test_decisions_are_deterministic() -> None:
    view = ({"p-main": bound_slice()}, None, READY_ISLAND)
    assert decide(program(), *view) == decide(program(), *view)


def test_a_slice_bound_again_elsewhere_under_a_running_job_stops_that_run() -> None:
    # Run 1 started on devices [2, 3] of isl; between two looks the slice was released (its
    # host was lost) and bound again on another island: the run talks to devices it no longer
    # holds, so it stops and the next run starts on the new binding (not counted a restart).
    started = decide(program(), {"p-main": bound_slice()}, islands=READY_ISLAND)
    (created,) = started.create
    running = program(status=started.status, restartPolicy="Never")
    islands = {**READY_ISLAND, "other": {"status": {"schedulerEndpoint": "other:8470"}}}
    moved = {"p-main": bound_slice("other", (0, 1))}
    decision = decide(running, moved, dict(created, status={"active": 1}), islands)
    assert decision.delete == [ChildRef("batch/v1", "Job", "t", "p-run-1")]
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "SlicesMoved")
    assert "slice 'main' was bound again elsewhere" in decision.status["message"]
    assert decision.status["restarts"] == 0
    # With the Job gone, run 2 starts at once on the new binding.
    after = decide(program(status=decision.status, restartPolicy="Never"), moved, None, islands)
    (second,) = after.create
    env = {
        e["name"]: e["value"] for e in second["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert json.loads(env["PATHWAYS_SLICES"])["main"]["island"] == "other"
    assert env["PATHWAYS_RUN"] == "2" and after.status["runs"] == 2
    # The same binding at the same endpoint: the run goes on.
    same = decide(running, {"p-main": bound_slice()}, dict(created, status={"active": 1}), islands)
    assert same.delete == [] and same.status is None
    # The same devices, the island restarted at another endpoint: said so, not "elsewhere".
    restarted = {"isl": {"metadata": {"name": "isl"}, "status": {"schedulerEndpoint": "new:8470"}}}
    again = decide(
        running, {"p-main": bound_slice()}, dict(created, status={"active": 1}), restarted
    )
    assert again.delete == [ChildRef("batch/v1", "Job", "t", "p-run-1")]
    assert "slice 'main' is on island 'isl', restarted at a new endpoint" in again.status["message"]


def env_of(created_job: dict[str, Any]) -> dict[str, str]:
    container = created_job["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container["env"]}


def test_a_run_whose_job_was_deleted_by_hand_is_a_failed_run() -> None:
    """Deleting a running program's Job started the next run, under restartPolicy Never too,
    and no Event said why."""
    running = {"phase": "Running", "runs": 1, "restarts": 0}
    never = decide(program(status=running), {"p-main": bound_slice()}, None, READY_ISLAND)
    assert never.create == []
    assert (never.status["phase"], never.status["reason"]) == ("Failed", "JobDeleted")
    assert never.status["message"] == "run 1: its Job p-run-1 was deleted"
    assert [(e.type, e.reason) for e in never.events] == [("Warning", "JobDeleted")]
    on_failure = program(status=running, restartPolicy="OnFailure", maxRestarts=3)
    restarted = decide(on_failure, {"p-main": bound_slice()}, None, READY_ISLAND)
    assert [c["metadata"]["name"] for c in restarted.create] == ["p-run-2"]
    assert (restarted.status["runs"], restarted.status["restarts"]) == (2, 1)
    assert "run 1 failed (its Job p-run-1 was deleted); restart 1 of 3" in [
        e.message for e in restarted.events
    ]
    # A run this decision stopped itself is recorded before its Job goes: not a failure.
    stopped = {"phase": "Pending", "reason": "SlicesLost", "runs": 1, "restarts": 0}
    again = decide(program(status=stopped), {"p-main": bound_slice()}, None, READY_ISLAND)
    assert [c["metadata"]["name"] for c in again.create] == ["p-run-2"]
    assert again.status["restarts"] == 0


def test_an_edit_of_what_a_run_is_made_from_starts_the_next_run_from_it() -> None:
    """Edits were observed (observedGeneration moved) but never applied to the running run."""
    started = decide(program(weight=1), {"p-main": bound_slice()}, islands=READY_ISLAND)
    (created,) = started.create
    active = dict(created, status={"active": 1})
    edited = program(status=started.status, weight=4)
    edited["metadata"]["generation"] = 2
    decision = decide(edited, {"p-main": bound_slice()}, active, READY_ISLAND)
    assert decision.delete == [ChildRef("batch/v1", "Job", "t", "p-run-1")]
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "SpecChanged")
    assert decision.status["message"] == (
        "run 1 stopped: the spec changed (generation 2); the next run starts from it"
    )
    assert decision.status["restarts"] == 0 and decision.status["observedGeneration"] == 2
    edited["status"] = decision.status
    after = decide(edited, {"p-main": bound_slice()}, None, READY_ISLAND)
    (second,) = after.create
    assert env_of(second)["PATHWAYS_WEIGHT"] == "4" and after.status["runs"] == 2
    # Edits applied live stop nothing: the restart policy and its limit are read at a failure.
    policy = program(status=started.status, weight=1, restartPolicy="OnFailure", maxRestarts=5)
    unchanged = decide(policy, {"p-main": bound_slice()}, active, READY_ISLAND)
    assert unchanged.delete == [] and unchanged.create == []
    # A Job made before runs were annotated is never taken for stale.
    legacy = dict(active, metadata={"name": "p-run-1"})
    assert (
        decide(
            edited | {"status": started.status}, {"p-main": bound_slice()}, legacy, READY_ISLAND
        ).delete
        == []
    )


def test_an_inline_slice_edited_is_bound_again_before_the_next_run() -> None:
    started = decide(program(), {"p-main": bound_slice()}, islands=READY_ISLAND)
    (created,) = started.create
    active = dict(created, status={"active": 1})
    bigger = program(status=started.status, slices=[{"name": "main", "devices": 4}])
    decision = decide(bigger, {"p-main": bound_slice()}, active, READY_ISLAND)
    (applied,) = decision.apply
    assert applied["metadata"]["name"] == "p-main" and applied["spec"]["devices"] == 4
    assert decision.delete == [ChildRef("batch/v1", "Job", "t", "p-run-1")]
    assert decision.status["reason"] == "SpecChanged"
    # The slice's new spec not bound yet (its old binding still in its status): wait.
    bigger["status"] = decision.status
    rebinding = {
        "metadata": {**OWNED, "generation": 2},
        "spec": {"devices": 4},
        "status": {"phase": "Bound", "island": "isl", "devices": [2, 3], "observedGeneration": 1},
    }
    waiting = decide(bigger, {"p-main": rebinding}, None, READY_ISLAND)
    assert waiting.create == [] and waiting.apply == []
    assert waiting.status["reason"] == "WaitingForSlices"
    assert "VirtualSlice p-main's new spec is not bound yet" in waiting.status["message"]
    rebound = dict(rebinding, status={**rebinding["status"], "observedGeneration": 2})
    rebound["status"]["devices"] = [0, 1, 2, 3]
    (second,) = decide(bigger, {"p-main": rebound}, None, READY_ISLAND).create
    assert json.loads(env_of(second)["PATHWAYS_SLICES"])["main"]["devices"] == [0, 1, 2, 3]
    # Defaults the API server fills in are no difference.
    defaulted = dict(rebound, spec={"devices": 4, "priority": 0, "timeShared": False})
    assert decide(bigger, {"p-main": defaulted}, None, READY_ISLAND).apply == []


def test_a_deadline_shortened_under_a_running_run_stops_it() -> None:
    started = decide(program(), {"p-main": bound_slice()}, islands=READY_ISLAND)
    (created,) = started.create
    shortened = program(status=started.status, activeDeadlineSeconds=30)
    view = ProgramView(
        shortened, {"p-main": bound_slice()}, dict(created, status={"active": 1}), READY_ISLAND
    )
    assert reconcile_program(view, NOW + timedelta(seconds=10), IMAGE).delete == []
    late = reconcile_program(view, NOW + timedelta(seconds=31), IMAGE)
    assert ChildRef("batch/v1", "Job", "t", "p-run-1") in late.delete
    assert (late.status["phase"], late.status["reason"]) == ("Failed", "DeadlineExceeded")


def test_a_cancelled_program_says_so() -> None:
    """It read "suspended", like one to be resumed; only an annotation told them apart."""
    document = program(status={"phase": "Running", "runs": 1}, suspend=True)
    document["metadata"]["annotations"] = {"pathways.dev/cancelled": "true"}
    decision = decide(document, {"p-main": bound_slice()}, job(None), READY_ISLAND)
    assert (decision.status["phase"], decision.status["reason"]) == ("Suspended", "Cancelled")
    assert "delete it to submit it again" in decision.status["message"]
    assert [e.reason for e in decision.events] == ["Cancelled"]
    # Cancelled is for good: suspend cleared by a client other than the API (which refuses
    # to resume it) started it again.
    cleared = program(status=decision.status)
    cleared["metadata"]["annotations"] = {"pathways.dev/cancelled": "true"}
    again = decide(cleared, {"p-main": bound_slice()}, None, READY_ISLAND)
    assert again.create == [] and (again.status or decision.status)["reason"] == "Cancelled"


def test_an_inline_slice_name_taken_by_another_is_never_taken_over() -> None:
    """Program a's inline b-main is program a-b's main: each rewrote the other's slice in a
    loop; an inline name equal to a user's VirtualSlice rewrote it, then deleted it."""
    theirs = {
        "metadata": {
            "name": "p-main",
            "ownerReferences": [
                {"kind": "PathwaysProgram", "name": "q", "uid": "u-q", "controller": True}
            ],
        },
        "spec": {"devices": 8},
        "status": {"phase": "Bound", "island": "isl", "devices": list(range(8))},
    }
    decision = decide(program(), {"p-main": theirs}, islands=READY_ISLAND)
    assert decision.create == decision.apply == decision.delete == []
    assert (decision.status["phase"], decision.status["reason"]) == ("Pending", "SliceNameTaken")
    assert (
        "VirtualSlice p-main exists and is not this program's (it belongs to PathwaysProgram q)"
        in decision.status["message"]
    )
    # Ended, it deletes what it made only.
    done = decide(program(status={"phase": "Succeeded", "runs": 1}), {"p-main": theirs})
    assert done.delete == []


def test_an_inline_slice_the_spec_no_longer_names_is_deleted() -> None:
    """Renamed main -> work, p-main held its devices until the program was deleted."""
    renamed = program(
        status={"phase": "Running", "runs": 1}, slices=[{"name": "work", "devices": 2}]
    )
    view = ProgramView(
        renamed, {"p-work": None}, job(None), READY_ISLAND, {"p-main": bound_slice()}
    )
    decision = reconcile_program(view, NOW, IMAGE)
    assert ChildRef("pathways.dev/v1alpha1", "VirtualSlice", "t", "p-main") in decision.delete


def test_an_invalid_edit_stops_the_run_and_releases_its_slices() -> None:
    """The program went Failed/InvalidSpec while its Job ran on, on devices given to others."""
    broken = program(status={"phase": "Running", "runs": 1}, graph={"functions": [], "nodes": []})
    view = ProgramView(broken, {}, job(None), READY_ISLAND, {"p-main": bound_slice()})
    decision = reconcile_program(view, NOW, IMAGE)
    assert decision.delete == [
        ChildRef("batch/v1", "Job", "t", "p-run-1"),
        ChildRef("pathways.dev/v1alpha1", "VirtualSlice", "t", "p-main"),
    ]
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "InvalidSpec")
    running = next(c for c in decision.status["conditions"] if c["type"] == "Running")
    assert running["status"] == "False"


def test_a_deadline_edited_under_a_running_run_moves_its_jobs_and_suspension_resets_it() -> None:
    """Extended or removed, the Job kept its old deadline and the program failed at it; time
    suspended counted against it; one deadline ended JobFailed or DeadlineExceeded by who saw
    it first."""
    from pathways_core.control.programs import JobDeadline

    started = decide(
        program(activeDeadlineSeconds=10), {"p-main": bound_slice()}, islands=READY_ISLAND
    )
    (created,) = started.create
    assert created["spec"]["activeDeadlineSeconds"] == 10
    active = dict(created, status={"active": 1, "startTime": started.status["startTime"]})
    ref = ChildRef("batch/v1", "Job", "t", "p-run-1")
    for edit, seconds in (({"activeDeadlineSeconds": 3600}, 3600), ({}, None)):
        edited = program(status=started.status, **edit)
        decision = decide(edited, {"p-main": bound_slice()}, active, READY_ISLAND)
        assert decision.deadline == JobDeadline(ref, seconds) and decision.delete == []
    same = program(status=started.status, activeDeadlineSeconds=10)
    assert decide(same, {"p-main": bound_slice()}, active, READY_ISLAND).deadline is None
    # A run past it on the Job controller's count ends as on the program's.
    past = job("Failed")
    past["status"]["conditions"][0].update(reason="DeadlineExceeded")
    ended = decide(same, {"p-main": bound_slice()}, past, READY_ISLAND)
    assert (ended.status["phase"], ended.status["reason"]) == ("Failed", "DeadlineExceeded")
    # Suspended, it counts again from the next start, as a Job's.
    suspended = decide(
        program(status=started.status, activeDeadlineSeconds=10, suspend=True),
        {"p-main": bound_slice()},
        active,
        READY_ISLAND,
    )
    assert "startTime" not in suspended.status
    resumed = reconcile_program(
        ProgramView(
            program(status=suspended.status, activeDeadlineSeconds=10),
            {"p-main": bound_slice()},
            None,
            READY_ISLAND,
        ),
        NOW + timedelta(seconds=60),
        IMAGE,
    )
    (second,) = resumed.create
    assert second["spec"]["activeDeadlineSeconds"] == 10 and resumed.status["phase"] == "Running"


def test_a_program_edited_from_a_graph_to_a_driver_drops_its_graph() -> None:
    """The ConfigMap of its graph stayed until the program was deleted. It goes only if the
    program owns it: a user's ConfigMap of that name was deleted at a driver's second run."""
    edited = program(status={"phase": "Pending", "reason": "SpecChanged", "runs": 1})
    decision = decide(edited, {"p-main": bound_slice()}, None, READY_ISLAND)
    assert ChildRef("v1", "ConfigMap", "t", "p-graph", owner="u-p") in decision.delete
    assert [c["metadata"]["name"] for c in decision.create] == ["p-run-2"]


def test_a_child_whose_name_another_object_holds_is_said_not_taken_over() -> None:
    """Which existing object is a child as made before (its controller is the program), and
    what the program says of one that is not: once, with an Event, looked at again."""
    document = program(status={"phase": "Pending", "runs": 1, "restarts": 1})
    decision = decide(document, {"p-main": bound_slice()}, None, READY_ISLAND)
    (made,) = decision.create
    assert same_child(made, {"metadata": {"ownerReferences": OWNED["ownerReferences"]}})
    other = {"kind": "PathwaysProgram", "name": "q", "uid": "u-q", "controller": True}
    for existing in ({"metadata": {}}, {"metadata": {"ownerReferences": [other]}}):
        assert not same_child(made, existing)
    taken = child_name_taken(document, made, {"metadata": {"ownerReferences": [other]}})
    assert taken.status is not None and taken.status["runs"] == 1  # run 2 did not start
    assert (taken.status["phase"], taken.status["reason"]) == ("Pending", "ChildNameTaken")
    assert taken.status["message"].startswith(
        "Job p-run-2 exists and is not this program's (it belongs to PathwaysProgram q)"
    )
    assert [(e.type, e.reason) for e in taken.events] == [("Warning", "ChildNameTaken")]
    assert taken.recheck_after is not None  # its deletion is no event of the program's
    document["status"] = taken.status  # said already: nothing to write, no second Event
    again = child_name_taken(document, made, {"metadata": {"ownerReferences": [other]}})
    assert again.status is None and not again.events


def failed_at(moment: datetime, **condition: Any) -> dict[str, Any]:
    """Run 1's Job, failed at ``moment`` (as the Job controller stamps its condition)."""
    ended = job("Failed")
    ended["status"]["conditions"][0].update(lastTransitionTime=timestamp(moment), **condition)
    return ended


def test_a_deadline_reported_first_as_a_failure_target_ends_the_program_unrestarted() -> None:
    """Kubernetes 1.31's Job controller says FailureTarget (DeadlineExceeded) while the pod
    terminates, and Failed only after: the program ended JobFailed, or restarted once."""
    ended = job(None)
    ended["status"]["conditions"] = [
        {"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"}
    ]
    document = program(
        status={"phase": "Running", "runs": 1, "restarts": 0, "startTime": timestamp(NOW)},
        restartPolicy="OnFailure",
        maxRestarts=3,
        activeDeadlineSeconds=60,
    )
    decision = decide(document, {"p-main": bound_slice()}, ended, READY_ISLAND)
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert decision.status["restarts"] == 0 and decision.create == []
    assert "Restarting" not in [e.reason for e in decision.events]


def test_a_failed_run_is_judged_once_its_islands_had_time_to_report_a_lost_host() -> None:
    """A driver whose executor died fails its Job at once; the executor's pod is reported
    unready seconds later. Judged at once, the program failed (restartPolicy Never) or used a
    restart for what was its island's loss."""
    document = program(status={"phase": "Running", "runs": 1, "restarts": 0})
    ended = failed_at(NOW - timedelta(seconds=3))
    early = decide(document, {"p-main": bound_slice()}, ended, READY_ISLAND)
    assert (early.status["phase"], early.status["reason"]) == ("Running", "RunEnded")
    assert early.recheck_after == 7.0 and early.create == early.delete == []
    assert "judged in 7 s" in early.status["message"]
    # The island reports the slice's host lost: an interruption, whatever the policy.
    lost = {"isl": {"status": {"schedulerEndpoint": "sched:8470", "unhealthyHosts": [1]}}}
    on_host = bound_slice() | {"status": bound_slice()["status"] | {"hosts": [1]}}
    held = program(status=early.status)
    interrupted = decide(held, {"p-main": on_host}, ended, lost)
    assert (interrupted.status["phase"], interrupted.status["reason"]) == (
        "Pending",
        "WaitingForSlices",
    )
    assert "island 'isl' lost host 1" in interrupted.status["message"]
    assert interrupted.status["restarts"] == 0 and interrupted.create == []
    (event,) = [e for e in interrupted.events if e.reason == "RunInterrupted"]
    assert "island 'isl' lost host 1, under its slice 'main'" in event.message
    # Its host back: the next run starts.
    back = decide(program(status=interrupted.status), {"p-main": on_host}, ended, READY_ISLAND)
    assert [c["metadata"]["name"] for c in back.create] == ["p-run-2"]
    # No report within the grace: a failure, judged as the policy says.
    late = decide(held, {"p-main": bound_slice()}, ended, READY_ISLAND, after=8)
    assert (late.status["phase"], late.status["reason"]) == ("Failed", "JobFailed")
    assert late.recheck_after is None


def test_a_run_failed_on_a_restarted_island_is_interrupted() -> None:
    """Its island's scheduler answers at a new endpoint: the run's driver lost it."""
    started = decide(program(), {"p-main": bound_slice()}, islands=READY_ISLAND)
    (created,) = started.create
    created["status"] = failed_at(NOW)["status"]
    moved = {"isl": {"status": {"schedulerEndpoint": "sched-2:8470"}}}
    decision = decide(
        program(status=started.status), {"p-main": bound_slice()}, created, moved, after=1
    )
    (event,) = [e for e in decision.events if e.reason == "RunInterrupted"]
    assert "restarted at a new endpoint" in event.message
    assert [c["metadata"]["name"] for c in decision.create] == ["p-run-2"]


def test_a_loss_after_a_run_failed_does_not_make_it_an_interruption() -> None:
    """Suspended, or its slice preempted, while its failure waited to be judged, a run that
    failed (restartPolicy Never) was judged interrupted and run again."""
    failed = failed_at(NOW)
    # Preempted a second after the run failed: not what ended it.
    preempted = {
        "metadata": OWNED,
        "spec": {"devices": 2},
        "status": {
            "phase": "Preempted",
            "reason": "Preempted",
            "conditions": [
                {
                    "type": "Bound",
                    "status": "False",
                    "reason": "Preempted",
                    "lastTransitionTime": timestamp(NOW + timedelta(seconds=1)),
                }
            ],
        },
    }
    judged = decide(
        program(status={"phase": "Running", "runs": 1}), {"p-main": preempted}, failed, after=11
    )
    assert (judged.status["phase"], judged.status["reason"]) == ("Failed", "JobFailed")
    # Preempted before it failed: that ended it.
    preempted["status"]["conditions"][0]["lastTransitionTime"] = timestamp(NOW)
    ended = decide(
        program(status={"phase": "Running", "runs": 1}), {"p-main": preempted}, failed, after=11
    )
    assert "RunInterrupted" in [e.reason for e in ended.events]
    # Suspended while its failure waits: judged first (held, then failed), never run again.
    suspended = program(status={"phase": "Running", "runs": 1}, suspend=True)
    held = decide(
        suspended, {"p-main": bound_slice()}, failed_at(NOW - timedelta(seconds=1)), READY_ISLAND
    )
    assert (held.status["phase"], held.status["reason"]) == ("Running", "RunEnded")
    assert held.delete == []  # its slice is kept until then
    retried = program(
        status={"phase": "Running", "runs": 1}, suspend=True, restartPolicy="OnFailure"
    )
    later = decide(retried, {"p-main": bound_slice()}, failed, READY_ISLAND, after=11)
    assert (later.status["phase"], later.status["restarts"]) == ("Suspended", 1)
    assert later.create == []


def test_a_run_failed_past_the_deadline_is_not_said_to_restart() -> None:
    """A Restarting Event, a restart counted, then DeadlineExceeded in the same decision."""
    document = program(
        status={"phase": "Running", "runs": 1, "restarts": 0, "startTime": timestamp(NOW)},
        restartPolicy="OnFailure",
        maxRestarts=3,
        activeDeadlineSeconds=4,
    )
    decision = decide(document, {"p-main": bound_slice()}, failed_at(NOW), READY_ISLAND, after=12)
    assert (decision.status["phase"], decision.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert decision.status["restarts"] == 0
    assert "Restarting" not in [e.reason for e in decision.events]


def test_a_job_a_failed_status_write_left_is_taken_by_the_run_it_is() -> None:
    """Run 1's Job was made, then the status write recording the run failed (a conflict):
    the next decision deleted the Job as a run never recorded and made it again (a driver
    killed at its start, for each conflict)."""
    document = program(status={"phase": "Pending", "runs": 0})
    (made,) = decide(document, {"p-main": bound_slice()}, None, READY_ISLAND).create
    made["status"] = {}  # running
    jobs = {"p-run-1": made}

    def decide_with(document: dict[str, Any]) -> Any:
        view = ProgramView(document, {"p-main": bound_slice()}, None, READY_ISLAND, {}, jobs)
        return reconcile_program(view, NOW, IMAGE)

    again = decide_with(document)
    assert [child["metadata"]["name"] for child in again.create] == ["p-run-1"]  # taken as made
    assert again.delete == [] and again.status["runs"] == 1
    # A run it will not start (suspended meanwhile), or one of another spec: its Job goes.
    for changed in (program(status={"runs": 0}, suspend=True), program({"runs": 0}, weight=7)):
        decision = decide_with(changed)
        assert ChildRef("batch/v1", "Job", "t", "p-run-1") in decision.delete
        assert "p-run-1" not in [child["metadata"]["name"] for child in decision.create]


def test_a_job_of_no_recorded_run_is_deleted_before_its_name_is_used() -> None:
    """A decision made run 2's Job, then its status write failed (the user suspended the
    program meanwhile): the next decision never saw that Job, which ran on released slices,
    and on resume creating run 2 found it and took it (finished) for the new run."""

    def made(run: int, outcome: str | None, owner: str = "u-p") -> dict[str, Any]:
        document = job(outcome)
        document["metadata"] = {
            "name": f"p-run-{run}",
            "ownerReferences": [{"uid": owner, "controller": True}],
        }
        return document

    running = {"phase": "Running", "reason": "Running", "runs": 1, "restarts": 0}
    first, stray = made(1, "Failed"), made(2, None)
    jobs = {"p-run-1": first, "p-run-2": stray}

    def decide_with(document: dict[str, Any], jobs: dict[str, Any]) -> Any:
        view = ProgramView(document, {"p-main": bound_slice()}, first, READY_ISLAND, {}, jobs)
        return reconcile_program(view, NOW + timedelta(seconds=60), IMAGE)

    suspended = decide_with(
        program(status=dict(running), suspend=True, restartPolicy="OnFailure"), jobs
    )
    assert ChildRef("batch/v1", "Job", "t", "p-run-2") in suspended.delete
    assert suspended.status["phase"] == "Suspended"
    # Resumed while it is still being deleted: run 2 waits for the name rather than take it.
    stray["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    stray["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    resumed = decide_with(program(status=suspended.status, restartPolicy="OnFailure"), jobs)
    assert resumed.create == [] and resumed.recheck_after is not None
    assert (resumed.status["phase"], resumed.status["reason"]) == ("Pending", "StaleJob")
    assert "Job p-run-2 of no run of this program" in resumed.status["message"]
    gone = decide_with(
        program(status=resumed.status, restartPolicy="OnFailure"), {"p-run-1": first}
    )
    assert [child["metadata"]["name"] for child in gone.create] == ["p-run-2"]


def test_a_job_of_an_earlier_program_of_the_name_is_never_taken_for_a_run() -> None:
    """Deleted and made again under its name, the new program found the old one's p-run-1
    (not yet garbage-collected) when creating its own, and reported its outcome as its run's."""
    earlier = job("Complete")
    earlier["metadata"]["ownerReferences"] = [{"uid": "u-earlier", "controller": True}]
    view = ProgramView(
        program(), {"p-main": bound_slice()}, None, READY_ISLAND, {}, {"p-run-1": earlier}
    )
    decision = reconcile_program(view, NOW, IMAGE)
    assert decision.create == [] and decision.status["reason"] == "StaleJob"
    assert ChildRef("batch/v1", "Job", "t", "p-run-1") in decision.delete
    # Already counted as run 1 (made before this check existed): not its outcome either.
    running = {"phase": "Running", "reason": "Running", "runs": 1}
    view = ProgramView(
        program(status=running),
        {"p-main": bound_slice()},
        earlier,
        READY_ISLAND,
        {},
        {"p-run-1": earlier},
    )
    decision = reconcile_program(view, NOW, IMAGE)
    assert decision.status["phase"] != "Succeeded"


def test_the_deadline_counts_while_a_started_program_waits_for_its_slices() -> None:
    """A program whose slice was preempted under its run waited Pending past its deadline for
    ever: it was checked only when a run started or a Job ran."""
    status = {
        "phase": "Pending",
        "reason": "SlicesLost",
        "runs": 1,
        "startTime": timestamp(NOW),
    }
    preempted = {
        "metadata": OWNED,
        "spec": {"devices": 2},
        "status": {"phase": "Preempted", "reason": "Preempted"},
    }
    document = program(status=status, activeDeadlineSeconds=60)
    waiting = decide(document, {"p-main": preempted}, after=20)
    assert waiting.recheck_after == 40  # decided again when it runs out, with no event
    assert (waiting.status or status)["phase"] == "Pending"
    late = decide(document, {"p-main": preempted}, after=61)
    assert (late.status["phase"], late.status["reason"]) == ("Failed", "DeadlineExceeded")
    assert ChildRef("pathways.dev/v1alpha1", "VirtualSlice", "t", "p-main") in late.delete
    # Never started: the deadline has not begun.
    fresh = decide(program(activeDeadlineSeconds=60), {"p-main": preempted}, after=7200)
    assert fresh.status["phase"] == "Pending" and fresh.recheck_after is None


def test_restarts_back_off_as_a_jobs_pods_do() -> None:
    """A crash-looping driver was started again every failure grace (10 s) for as many
    restarts as it was allowed."""
    failed = job("Failed")
    status = {"phase": "Running", "reason": "Running", "runs": 2, "restarts": 1}
    failed["metadata"]["name"] = "p-run-2"
    document = program(status=status, restartPolicy="OnFailure", maxRestarts=5)
    judged = decide(document, {"p-main": bound_slice()}, failed, READY_ISLAND)
    # The second restart waits a failure grace (10 s) more: 20 s after its run failed.
    assert (judged.status["phase"], judged.status["reason"]) == ("Pending", "BackOff")
    assert judged.create == [] and judged.recheck_after == 10
    assert judged.status["restarts"] == 2 and "run 3 starts at" in judged.status["message"]
    assert any("in 10 s" in event.message for event in judged.events)
    later = program(status=judged.status, restartPolicy="OnFailure", maxRestarts=5)
    waiting = decide(later, {"p-main": bound_slice()}, failed, READY_ISLAND, after=4)
    assert waiting.create == [] and waiting.recheck_after == 6
    started = decide(later, {"p-main": bound_slice()}, failed, READY_ISLAND, after=10)
    assert [child["metadata"]["name"] for child in started.create] == ["p-run-3"]
    assert "nextRunTime" not in started.status
    assert [restart_backoff(n, 10) for n in (1, 2, 3, 4, 9)] == [0, 10, 30, 70, 360]
