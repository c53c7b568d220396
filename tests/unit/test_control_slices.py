"""Binding passes (pure): table tests and properties of ``plan_bindings``."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.accelerators import AcceleratorKind
from pathways_core.control import Stage, plan_bindings
from pathways_core.control.slices import PATIENCE, renewal_stamp

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def island(
    name: str, topology: str = "2x4", hosts: int = 2, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": 1}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": meta,
        "spec": {"acceleratorKind": "cpu-fake", "topology": topology, "hosts": hosts},
    }


def vslice(
    name: str,
    devices: int | None = None,
    *,
    priority: int = 0,
    created: int = 0,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
    generation: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "t",
        "generation": generation,
        "resourceVersion": "1",
        "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z",
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    body = {"priority": priority, **spec}
    if devices is not None:
        body["devices"] = devices
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": meta,
        "spec": body,
    }
    if status is not None:
        document["status"] = status
    return document


def bound(
    island_name: str, devices: list[int], time: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    return {
        "phase": "Bound",
        "island": island_name,
        "devices": devices,
        "boundTime": time,
        "observedGeneration": 1,
    }


def apply(slices: list[dict[str, Any]], changes: list[Any]) -> list[dict[str, Any]]:
    """The slices after storing ``changes``; deleting slices whose release is stored go."""
    by_key = {f"t/{s['metadata']['name']}": copy.deepcopy(s) for s in slices}
    for change in changes:
        by_key[change.key]["status"] = change.status
    return [
        s
        for s in by_key.values()
        if not (s["metadata"].get("deletionTimestamp") and s["status"]["phase"] == "Released")
    ]


def holders(slices: list[dict[str, Any]]) -> dict[tuple[str, int], list[str]]:
    owners: dict[tuple[str, int], list[str]] = {}
    for s in slices:
        status = s.get("status") or {}
        if status.get("phase") == "Bound":
            for device in status["devices"]:
                owners.setdefault((status["island"], device), []).append(s["metadata"]["name"])
    return owners


def phases(plan: Any) -> dict[str, tuple[str, str | None, Stage]]:
    return {
        c.key.split("/")[1]: (c.status["phase"], c.status.get("reason"), c.stage)
        for c in plan.changes
    }


def test_binds_by_priority_then_age_and_says_why_others_wait() -> None:
    plan = plan_bindings(
        [island("a")],
        [
            vslice("old", 4, created=1),
            vslice("young", 4, created=2),
            vslice("vip", 4, priority=5, created=3),
            vslice("huge", 64),
            vslice("gpu", 1, acceleratorKind="gpu-h100"),
        ],
        NOW,
    )
    assert phases(plan) == {
        "vip": ("Bound", None, Stage.BIND),
        "old": ("Bound", None, Stage.BIND),
        "young": ("Pending", "InsufficientDevices", Stage.WAIT),
        "huge": ("Pending", "ShapeDoesNotFit", Stage.WAIT),
        "gpu": ("Pending", "NoMatchingIsland", Stage.WAIT),
    }
    assert plan.devices_free == {"a": 0} and plan.bound == 2 and plan.waiting == 3
    assert {e.reason for e in plan.events} == {
        "Bound",
        "InsufficientDevices",
        "ShapeDoesNotFit",
        "NoMatchingIsland",
    }
    assert [e.type for e in plan.events if e.reason != "Bound"] == ["Warning"] * 3


def test_stored_bindings_are_restored_before_anything_is_bound() -> None:
    stored = vslice("kept", 2, status=bound("a", [0, 1]))
    plan = plan_bindings([island("a")], [stored, vslice("new", 6)], NOW)
    assert phases(plan) == {"new": ("Bound", None, Stage.BIND)}
    (change,) = plan.changes
    assert not {0, 1} & set(change.status["devices"])


def test_a_pass_over_its_own_result_changes_nothing() -> None:
    slices = [vslice("x", 4), vslice("y", 4), vslice("z", 4), vslice("shaped", shape="2x2")]
    plan = plan_bindings([island("a"), island("b")], slices, NOW)
    after = apply(slices, plan.ordered())
    again = plan_bindings([island("a"), island("b")], after, NOW)
    assert again.changes == [] and again.events == []


def test_slices_waiting_for_devices_are_not_rewritten_as_others_come_and_go() -> None:
    """Their message said how many devices the freest island had: every slice bound or
    released rewrote every waiting slice's status (100 waiting, 5 small ones bound: 400
    writes), each waking its programs."""
    islands = [island("a", topology="4x4", hosts=2)]
    slices = [vslice("holder", 8), *(vslice(f"big-{n}", 16, created=1) for n in range(20))]
    slices = apply(slices, plan_bindings(islands, slices, NOW).ordered())
    for n in range(5):
        slices = [*slices, vslice(f"small-{n}", 1, created=2 + n)]
        plan = plan_bindings(islands, slices, NOW)
        assert [c.key for c in plan.changes] == [f"t/small-{n}"]
        slices = apply(slices, plan.ordered())
    message = next(s for s in slices if s["metadata"]["name"] == "big-0")["status"]["message"]
    assert message.endswith("needs 16 free devices; no matching island has that many now")


def test_two_stored_bindings_on_one_device_the_older_keeps_it() -> None:
    slices = [
        vslice("first", 2, status=bound("a", [0, 1], "2026-01-01T00:00:01Z")),
        vslice("second", 2, status=bound("a", [1, 2], "2026-01-01T00:00:02Z")),
    ]
    plan = plan_bindings([island("a")], slices, NOW)
    assert phases(plan) == {"second": ("Preempted", "BindingConflict", Stage.RELEASE)}
    assert plan.rejected == ["t/second"] and plan.needs_another_pass
    # The next pass binds it again, away from the device it lost.
    after = apply(slices, plan.ordered())
    rebound = plan_bindings([island("a")], after, NOW)
    assert phases(rebound) == {"second": ("Bound", None, Stage.BIND)}
    assert not {0, 1} & set(rebound.changes[0].status["devices"])


def test_an_island_edited_into_an_invalid_spec_keeps_its_slices_and_binds_nothing_new() -> None:
    # hosts 3 does not divide the 2x4 mesh: the island runs as before (its pods untouched).
    broken = island("a", "2x4", hosts=3)
    slices = [
        vslice("kept", 4, status=bound("a", [0, 1, 2, 3])),
        vslice("new", 4, island="a", created=5),
    ]
    plan = plan_bindings([broken], slices, NOW)
    assert phases(plan) == {"new": ("Pending", "NoMatchingIsland", Stage.WAIT)}
    assert "spec that does not parse" in plan.changes[0].status["message"]
    assert (plan.bound, plan.waiting) == (1, 1)
    # Fixed, the island binds again around the slice it kept.
    fixed = plan_bindings([island("a")], apply(slices, plan.changes), NOW)
    assert phases(fixed) == {"new": ("Bound", None, Stage.BIND)}
    assert set(fixed.changes[0].status["devices"]) == {4, 5, 6, 7}


def test_slices_of_a_deleted_island_are_released_then_bound_elsewhere() -> None:
    slices = [vslice("s", 4, status=bound("gone", [0, 1, 2, 3]))]
    for islands in ([island("b")], [island("gone", deleting=True), island("b")]):
        plan = plan_bindings(islands, slices, NOW)
        assert phases(plan) == {"s": ("Preempted", "IslandDeleted", Stage.RELEASE)}
        rebound = plan_bindings(islands, apply(slices, plan.ordered()), NOW)
        assert rebound.changes[0].status["island"] == "b"


def test_slices_outside_a_shrunk_island_are_released() -> None:
    slices = [
        vslice("edge", 2, status=bound("a", [6, 7])),
        vslice("inside", 2, status=bound("a", [0, 1])),
    ]
    plan = plan_bindings([island("a", topology="4", hosts=1)], slices, NOW)
    assert phases(plan) == {"edge": ("Preempted", "IslandResized", Stage.RELEASE)}


def test_a_block_that_a_new_topology_of_the_same_size_breaks_is_released() -> None:
    """2x4 to 4x2: devices 0, 1, 4, 5 were a 2x2 block and are rows 0 and 2 now; the slice
    stayed bound on them."""
    block = {**bound("a", [0, 1, 4, 5]), "shape": "2x2"}
    still = {**bound("a", [2, 3, 6, 7]), "shape": "2x2"}
    slices = [vslice("v", shape="2x2", status=block), vslice("w", shape="2x2", status=still)]
    assert phases(plan_bindings([island("a")], slices, NOW)) == {}
    plan = plan_bindings([island("a", topology="4x2")], slices, NOW)
    assert phases(plan) == {
        "v": ("Preempted", "IslandResized", Stage.RELEASE),
        "w": ("Preempted", "IslandResized", Stage.RELEASE),
    }
    assert "now a 4x2 mesh, where its devices are no 2x2 block" in plan.changes[0].status["message"]
    rebound = plan_bindings([island("a", topology="4x2")], apply(slices, plan.ordered()), NOW)
    assert {c.status["phase"] for c in rebound.changes} == {"Bound"}


def test_slices_on_an_unhealthy_host_are_released_and_bound_on_healthy_devices() -> None:
    sick = island("a")
    sick["status"] = {"unhealthyHosts": [1]}  # devices 4-7
    slices = [
        vslice("hit", 2, status=bound("a", [4, 5])),
        vslice("fine", 2, status=bound("a", [0, 1])),
    ]
    plan = plan_bindings([sick], slices, NOW)
    assert phases(plan) == {"hit": ("Preempted", "HostUnhealthy", Stage.RELEASE)}
    assert plan.devices_free == {"a": 2}
    rebound = plan_bindings([sick], apply(slices, plan.ordered()), NOW)
    assert set(rebound.changes[0].status["devices"]) == {2, 3}


def test_preemption_releases_victims_first_and_never_rebinds_them_in_the_same_pass() -> None:
    slices = [
        vslice("low", 8, priority=0, status=bound("a", list(range(8)))),
        vslice("high", 4, priority=9),
    ]
    plan = plan_bindings([island("a")], slices, NOW)
    assert phases(plan) == {
        "low": ("Preempted", "Preempted", Stage.RELEASE),
        "high": ("Bound", None, Stage.BIND),
    }
    assert [c.stage for c in plan.ordered()] == [Stage.RELEASE, Stage.BIND]
    assert "t/high" in plan.ordered()[0].status["message"]
    # Next pass: the preempted slice still cannot fit and keeps saying why it lost its devices.
    again = plan_bindings([island("a")], apply(slices, plan.ordered()), NOW)
    assert again.changes == []


def inline(program: str, name: str, devices: int, **options: Any) -> dict[str, Any]:
    """A program's inline slice, as the controllers make it: labelled and owned."""
    document = vslice(f"{program}-{name}", devices, **options)
    document["metadata"]["labels"] = {"pathways.dev/program": program}
    document["metadata"]["ownerReferences"] = [
        {"kind": "PathwaysProgram", "name": program, "uid": f"uid-{program}", "controller": True}
    ]
    return document


def test_a_programs_slices_are_bound_all_at_once_or_none() -> None:
    """Bound one by one, gx held 4 devices and gy 2, each waiting for 4 more for ever."""
    slices = [
        vslice("z", 2, status=bound("a", [0, 1])),
        inline("gx", "a", 4, created=1),
        inline("gx", "b", 4, created=1),
        inline("gy", "a", 2, created=2),
        inline("gy", "b", 4, created=2),
    ]
    plan = plan_bindings([island("a")], slices, NOW)
    assert phases(plan) == {
        "gx-a": ("Pending", "InsufficientDevices", Stage.WAIT),
        "gx-b": ("Pending", "InsufficientDevices", Stage.WAIT),
        "gy-a": ("Bound", None, Stage.BIND),
        "gy-b": ("Bound", None, Stage.BIND),
    }
    waiting = next(c for c in plan.changes if c.key == "t/gx-a").status["message"]
    assert waiting.startswith("its program's slice gx-b cannot be bound (InsufficientDevices:")
    assert waiting.endswith("a program's slices are bound all at once")
    assert plan.devices_free == {"a": 0}


def test_programs_queue_in_the_order_they_were_made_not_by_name() -> None:
    """Their slices, made in one pass of the controller, bound by name: the first submitted
    of four ran last."""
    first = inline("zz-first", "s", 8)
    second = inline("aa-second", "s", 8)
    first["metadata"]["annotations"] = {"pathways.dev/queued-since": "2026-01-01T00:00:14.2Z"}
    second["metadata"]["annotations"] = {"pathways.dev/queued-since": "2026-01-01T00:00:14.5Z"}
    plan = plan_bindings([island("a")], [second, first], NOW)
    assert phases(plan)["zz-first-s"][0] == "Bound"
    assert phases(plan)["aa-second-s"][0] == "Pending"


def test_a_request_waiting_past_its_patience_has_its_islands_kept_for_it() -> None:
    """Later 2-device requests were bound past an 8-device one as devices came free: with a
    steady stream it never ran."""
    running = [vslice(f"run{i}", 2, status=bound("a", [2 * i, 2 * i + 1])) for i in range(3)]
    big = vslice("big", 8, created=0)
    small = vslice("small", 2, created=30)
    urgent = vslice("urgent", 2, priority=5, created=40)
    soon = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)  # a minute after big was made
    assert phases(plan_bindings([island("a")], [*running, big, small], soon))["small"] == (
        "Bound",
        None,
        Stage.BIND,
    )
    late = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    plan = plan_bindings([island("a")], [*running, big, small, urgent], late)
    assert phases(plan)["big"] == ("Pending", "InsufficientDevices", Stage.WAIT)
    assert phases(plan)["small"] == ("Pending", "InsufficientDevices", Stage.WAIT)
    kept_for = next(c for c in plan.changes if c.key == "t/small").status["message"]
    assert kept_for == (
        "the islands it fits on ('a') are kept for an older request that has waited too long "
        "to be bound, until it is"
    )
    assert phases(plan)["urgent"] == ("Bound", None, Stage.BIND)  # a higher priority is not
    waiting = next(c for c in plan.changes if c.key == "t/big").status["message"]
    assert waiting.endswith(
        "waiting since 2026-01-01T00:00:00Z, it has the islands it fits on kept for it ('a'): "
        "nothing of its priority or lower queued after it is placed there"
    )
    # With the others gone, the devices that came free go to it.
    assert phases(plan_bindings([island("a")], [big, small], late))["big"][0] == "Bound"


def test_a_program_waiting_past_its_patience_has_all_its_islands_kept_from_when_it_waits() -> None:
    """Only the island of the slice that failed in a pass was kept: a small request took the
    other one. And a program preempted after hours of running had its islands kept at once."""
    late = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    islands = [island("a", "4", 1), island("b", "4", 1)]
    held = [vslice("x", 3, island="a", status=bound("a", [0, 1, 2]))]
    gang = [inline("gg", "g0", 4, island="a"), inline("gg", "g1", 4, island="b")]
    later = vslice("small", 1, island="b", created=50)
    plan = plan_bindings(islands, [*held, *gang, later], late)
    assert phases(plan)["small"][:2] == ("Pending", "InsufficientDevices")
    # Preempted a minute ago, it has waited a minute, not since it was made.
    lost = {
        "phase": "Preempted",
        "reason": "Preempted",
        "conditions": [
            {"type": "Bound", "status": "False", "lastTransitionTime": "2026-01-01T00:04:00Z"}
        ],
    }
    for document in gang:
        document["status"] = copy.deepcopy(lost)
    plan = plan_bindings(islands, [*held, *gang, later], late)
    assert phases(plan)["small"] == ("Bound", None, Stage.BIND)


def test_a_program_that_cannot_fit_whole_preempts_nothing() -> None:
    low = vslice("low", 8, status=bound("a", list(range(8))))
    program = [inline("hix", "a", 6, priority=100), inline("hix", "b", 4, priority=100)]
    plan = plan_bindings([island("a")], [low, *program], NOW)
    # 6 + 4 devices of 8: the first would have preempted low for nothing.
    assert phases(plan) == {
        "hix-a": ("Pending", "ProgramDoesNotFit", Stage.WAIT),
        "hix-b": ("Pending", "ProgramDoesNotFit", Stage.WAIT),
    }
    assert plan.devices_free == {"a": 0} and plan.bound == 1
    failing = next(c for c in plan.changes if c.key == "t/hix-b")
    assert failing.status["message"] == (
        "its program's 2 slices need 10 devices together, more than the islands they may use "
        "hold even when empty"
    )


def program(name: str, *inline_slices: str, uid: str | None = None) -> dict[str, Any]:
    """A PathwaysProgram with these inline slices (of 2 devices), as the store holds it."""
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": name, "namespace": "t", "uid": uid or f"uid-{name}"},
        "spec": {
            "slices": [{"name": item, "devices": 2} for item in inline_slices],
            "driver": {"source": "pass"},
        },
    }


def test_a_programs_slices_wait_until_all_of_them_exist() -> None:
    # Created one at a time (an API server's latency between them), the first alone was
    # bound, preempting others for a program that could never run.
    low = vslice("low", 8, status=bound("a", list(range(8))))
    first = inline("big", "x", 4, priority=10)
    plan = plan_bindings([island("a")], [low, first], NOW, programs=[program("big", "x", "y")])
    assert [c.key for c in plan.changes] == []  # neither bound nor preempting: no decision
    second = inline("big", "y", 16, priority=10)
    plan = plan_bindings(
        [island("a")], [low, first, second], NOW, programs=[program("big", "x", "y")]
    )
    assert phases(plan) == {
        "big-x": ("Pending", "ShapeDoesNotFit", Stage.WAIT),
        "big-y": ("Pending", "ShapeDoesNotFit", Stage.WAIT),
    }
    # Another program's slices (an older uid, a name alike) are no members of it.
    stale = program("big", "x", "y", uid="uid-older")
    plan = plan_bindings([island("a", topology="4x4", hosts=2)], [first], NOW, programs=[stale])
    assert phases(plan) == {"big-x": ("Bound", None, Stage.BIND)}


def test_a_program_that_fits_only_alone_says_so_with_real_room_and_quota() -> None:
    z = vslice("z", 4, status=bound("a", [0, 1, 2, 3]))
    slices = [z, inline("p", "a", 2), inline("p", "b", 4)]
    plan = plan_bindings([island("a")], slices, NOW)
    failing = next(c for c in plan.changes if c.key == "t/p-b")
    # Counted with p-a's tentative devices, the island looked full (0 free); it has 4.
    assert failing.status["message"] == (
        "it fits alone, but not beside its program's other slices; its program's slices need 6 "
        "devices together"
    )
    quota = plan_bindings(
        [island("a", topology="4x4")], slices, NOW, {("t", AcceleratorKind.CPU_FAKE): 8}
    )
    failing = next(c for c in quota.changes if c.key == "t/p-b").status
    assert (failing["reason"], failing["message"]) == (
        "QuotaExceeded",
        "its tenant's quota has room for it alone; its program's slices need 6 devices together",
    )
    quota = plan_bindings(
        [island("a", topology="4x4")], slices, NOW, {("t", AcceleratorKind.CPU_FAKE): 6}
    )
    failing = next(c for c in quota.changes if c.key == "t/p-b").status
    assert failing["message"].endswith("(its program's slices need 6 devices together)")
    assert "uses 4 of 6" in failing["message"]  # its program's 2 devices not counted


def test_no_island_is_kept_for_a_program_that_can_never_fit() -> None:
    later = NOW + PATIENCE + timedelta(seconds=1)
    gang = [inline("big", "x", 8), inline("big", "y", 8)]
    small = vslice("small", 2, created=5)
    plan = plan_bindings([island("a")], [*gang, small], later)
    assert phases(plan)["small"] == ("Bound", None, Stage.BIND)
    assert phases(plan)["big-x"][1] == "ProgramDoesNotFit"


def test_slices_displaced_by_a_resize_keep_their_place_in_the_queue() -> None:
    slices = [
        vslice("s1", 2, created=1, status=bound("a", [6, 7])),
        vslice("s2", 4, created=2, status=bound("a", [0, 1, 2, 3])),
        vslice("young", 2, created=3),
    ]
    shrunk = island("a", topology="2x3", hosts=2)  # 6 devices: s1's are gone
    plan = plan_bindings([shrunk], slices, NOW)
    # young, queued after s1, does not take the room s1 is to be bound on in the next pass.
    assert phases(plan) == {"s1": ("Preempted", "IslandResized", Stage.RELEASE)}
    again = plan_bindings([shrunk], apply(slices, plan.ordered()), NOW)
    assert phases(again)["s1"] == ("Bound", None, Stage.BIND)
    assert phases(again)["young"][1] == "InsufficientDevices"


def test_a_preempted_slice_says_so_until_it_cannot_fit_at_all() -> None:
    preempted = {"phase": "Preempted", "reason": "Preempted", "message": "preempted by t/u"}
    v = vslice("v", 8, status=preempted)
    urgent = vslice("u", 8, priority=10, status=bound("a", list(range(8))))
    assert phases(plan_bindings([island("a")], [v, urgent], NOW)) == {}  # waits for room
    plan = plan_bindings([island("a", topology="4", hosts=1)], [v], NOW)  # it shrank
    assert phases(plan) == {"v": ("Pending", "ShapeDoesNotFit", Stage.WAIT)}


def test_the_slices_a_program_holds_go_while_another_of_its_slices_cannot_be_bound() -> None:
    """Its slice b preempted, program p held a's 4 devices while b waited."""
    slices = [
        inline("p", "a", 4, status=bound("a", [0, 1, 2, 3])),
        inline("p", "b", 4, status={"phase": "Preempted", "reason": "Preempted"}),
        vslice("urgent", 4, priority=9, status=bound("a", [4, 5, 6, 7])),
        vslice("small", 2, created=5),
    ]
    plan = plan_bindings([island("a")], slices, NOW)
    released = next(c for c in plan.changes if c.key == "t/p-a")
    assert (released.status["phase"], released.stage) == ("Pending", Stage.RELEASE)
    assert released.status["message"].startswith("devices released: its program's slice p-b")
    assert phases(plan)["small"] == ("Bound", None, Stage.BIND)  # on what p let go
    # Once there is room for both, they are bound together.
    after = [d for d in apply(slices, plan.ordered()) if d["metadata"]["name"] != "urgent"]
    after = [d for d in after if d["metadata"]["name"] != "small"]
    again = plan_bindings([island("a")], after, NOW)
    assert phases(again) == {
        "p-a": ("Bound", None, Stage.BIND),
        "p-b": ("Bound", None, Stage.BIND),
    }


def test_deleted_slice_is_released_and_its_devices_serve_a_waiting_one() -> None:
    slices = [
        vslice("leaving", 8, status=bound("a", list(range(8))), deleting=True),
        vslice(
            "waiting",
            8,
            status={"phase": "Pending", "reason": "InsufficientDevices", "observedGeneration": 1},
        ),
    ]
    plan = plan_bindings([island("a")], slices, NOW)
    assert phases(plan) == {
        "leaving": ("Released", "Deleted", Stage.RELEASE),
        "waiting": ("Bound", None, Stage.BIND),
    }


def test_changed_spec_of_a_bound_slice_releases_it() -> None:
    slices = [vslice("grown", 6, generation=2, status=bound("a", [0, 1]))]
    plan = plan_bindings([island("a")], slices, NOW)
    assert phases(plan) == {"grown": ("Pending", "SpecChanged", Stage.RELEASE)}
    rebound = plan_bindings([island("a")], apply(slices, plan.ordered()), NOW)
    assert len(rebound.changes[0].status["devices"]) == 6


def test_a_bound_slice_whose_priority_alone_changed_keeps_its_devices() -> None:
    """Released as any edit was, its devices went to the next pending slice, which it then
    preempted back: a running program whose priority was raised stopped a lower one's run."""
    first = plan_bindings([island("a")], [vslice("hi", 8, priority=10)], NOW)
    held = apply([vslice("hi", 8, priority=10)], first.ordered())
    raised = [
        {
            **held[0],
            "metadata": {**held[0]["metadata"], "generation": 2},
            "spec": {"devices": 8, "priority": 20},
        },
        vslice("lo", 4, priority=5),
    ]
    plan = plan_bindings([island("a")], raised, NOW)
    assert phases(plan) == {
        "lo": ("Pending", "InsufficientDevices", Stage.WAIT),
        "hi": ("Bound", None, Stage.WAIT),
    }
    (restated,) = [c for c in plan.changes if c.key == "t/hi"]
    assert restated.status["observedGeneration"] == 2
    assert restated.status["devices"] == held[0]["status"]["devices"]
    # Any other edit still binds again.
    grown = [{**raised[0], "spec": {"devices": 6, "priority": 20}}]
    assert phases(plan_bindings([island("a")], grown, NOW)) == {
        "hi": ("Pending", "SpecChanged", Stage.RELEASE)
    }


def test_invalid_slice_waits_with_the_field_at_fault() -> None:
    plan = plan_bindings([island("a")], [vslice("bad", 4, shape="2x4")], NOW)
    (change,) = plan.changes
    assert (change.status["phase"], change.status["reason"]) == ("Pending", "InvalidSpec")
    assert "spec.shape" in change.status["message"]


def test_quotas_hold() -> None:

    plan = plan_bindings(
        [island("a")],
        [vslice("one", 4), vslice("two", 4)],
        NOW,
        {("t", AcceleratorKind.CPU_FAKE): 4},
    )
    assert phases(plan)["two"] == ("Pending", "QuotaExceeded", Stage.WAIT)


def test_a_tenant_at_its_quota_preempts_its_own_lower_priority_slice_and_it_settles() -> None:
    quota = {("t", AcceleratorKind.CPU_FAKE): 4}
    slices = [
        vslice("batch", 4, priority=0, status=bound("a", [0, 1, 2, 3])),
        vslice("urgent", 4, priority=10, created=5),
    ]
    plan = plan_bindings([island("a"), island("b")], slices, NOW, quota)
    assert phases(plan) == {
        "batch": ("Preempted", "Preempted", Stage.RELEASE),
        "urgent": ("Bound", None, Stage.BIND),
    }
    (preempted,) = [c for c in plan.changes if c.key == "t/batch"]
    assert "preempted by t/urgent (priority 10 > 0)" in preempted.status["message"]
    # The next pass: the urgent slice keeps its devices, the batch slice waits for quota.
    settled = apply(slices, plan.changes)
    again = plan_bindings([island("a"), island("b")], settled, NOW, quota)
    assert phases(again) == {"batch": ("Pending", "QuotaExceeded", Stage.WAIT)}
    last = plan_bindings([island("a"), island("b")], apply(settled, again.changes), NOW, quota)
    assert last.changes == []


# -- properties -------------------------------------------------------------------------------

ISLANDS = [island("a", "2x4", 2), island("b", "4", 1), island("c", "2x2x2", 2)]
SIZES = {"a": 8, "b": 4, "c": 8}


@st.composite
def snapshots(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Slices with arbitrary stored statuses: valid bindings, conflicting ones, bindings on
    islands that do not exist or outside the mesh, deleting slices, pending ones."""
    slices = []
    for index in range(draw(st.integers(0, 10))):
        size = draw(st.integers(1, 6))
        status = None
        if draw(st.booleans()):
            name = draw(st.sampled_from(["a", "b", "c", "gone"]))
            devices = draw(st.lists(st.integers(0, 9), min_size=size, max_size=size, unique=True))
            status = bound(name, devices, f"2026-01-01T00:00:{draw(st.integers(0, 59)):02d}Z")
        document = vslice(
            f"s{index}",
            size,
            priority=draw(st.integers(0, 3)),
            created=draw(st.integers(0, 59)),
            status=status,
            deleting=draw(st.booleans()) and draw(st.booleans()),
        )
        program = draw(st.sampled_from([None, "p", "q"]))
        if program is not None:  # an inline slice of a program
            document["metadata"].update(inline(program, "x", 1)["metadata"], name=f"s{index}")
        slices.append(document)
    return slices


@settings(max_examples=200, deadline=None)
@given(snapshots(), st.data())
def test_no_device_is_ever_bound_twice_whatever_part_of_a_plan_is_stored(
    slices: list[dict[str, Any]], data: st.DataObject
) -> None:
    plan = plan_bindings(ISLANDS, slices, NOW)
    releases = [c for c in plan.ordered() if c.stage is Stage.RELEASE]
    binds = [c for c in plan.ordered() if c.stage is Stage.BIND]
    # A store stores every release, then any of the bindings (the others failed).
    stored = data.draw(
        st.lists(st.sampled_from(binds), unique_by=lambda c: c.key) if binds else st.just([])
    )
    after = apply(slices, releases + stored)
    for (name, device), owners in holders(after).items():
        assert len(owners) == 1, (name, device, owners)
        assert name in SIZES and device < SIZES[name]


@settings(max_examples=100, deadline=None)
@given(snapshots(), st.sampled_from([NOW, NOW + timedelta(hours=1)]))
def test_passes_settle_and_every_slice_that_fits_alone_is_bound_or_says_why(
    slices: list[dict[str, Any]], now: datetime
) -> None:
    for _ in range(6):
        plan = plan_bindings(ISLANDS, slices, now)  # an hour on: islands kept for the oldest
        if not plan.changes:
            break
        slices = apply(slices, plan.ordered())
    assert not plan.changes, "passes did not settle"
    for s in slices:
        if s["metadata"].get("deletionTimestamp"):
            continue
        status = s["status"]
        assert status["phase"] in ("Bound", "Pending", "Preempted")
        assert status["phase"] == "Bound" or status["reason"]
    # A program's slices are all bound, or none.
    for program in ("p", "q"):
        members = [
            s["status"]["phase"] == "Bound"
            for s in slices
            if (s["metadata"].get("labels") or {}).get("pathways.dev/program") == program
            and not s["metadata"].get("deletionTimestamp")
        ]
        assert all(members) or not any(members), (program, slices)


def test_a_slice_of_its_own_cannot_jump_the_queue_with_a_queued_since_annotation() -> None:
    older = vslice("older", 8, created=1)
    forged = vslice("forged", 8, created=5)
    forged["metadata"]["annotations"] = {"pathways.dev/queued-since": "2020-01-01T00:00:00Z"}
    plan = plan_bindings([island("a")], [forged, older], NOW)
    assert phases(plan)["older"] == ("Bound", None, Stage.BIND)
    # A program's inline slice is queued when its program was made, as the operator says.
    early = inline("p", "m", 8, created=5)
    early["metadata"]["annotations"] = {"pathways.dev/queued-since": "2026-01-01T00:00:00Z"}
    plan = plan_bindings([island("a")], [early, older], NOW)
    assert phases(plan)["p-m"] == ("Bound", None, Stage.BIND)


def test_an_inline_slice_queues_from_its_programs_creation_not_its_annotation() -> None:
    """Whoever may write a slice could annotate a program's inline slice (or a slice made to
    look like one) queued since 2000, and jump the queue."""
    from pathways_core.control.sharing import plan_bindings_shared

    older = vslice("older", 8, created=1)
    forged = inline("mine", "x", 8, created=50)
    forged["metadata"]["annotations"] = {"pathways.dev/queued-since": "2000-01-01T00:00:00Z"}
    mine = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {
            "name": "mine",
            "namespace": "t",
            "uid": "uid-mine",
            "creationTimestamp": "2026-01-01T00:00:40Z",
        },
        "spec": {"slices": [{"name": "x", "devices": 8}], "driver": {"source": "pass"}},
    }
    for programs in ([mine], []):  # its program's creation; no program: its own
        plan = plan_bindings_shared([island("a")], [forged, older], NOW, programs=programs)
        assert phases(plan)["older"][0] == "Bound", programs
    # Made before the other slice, the program's slice is bound first, as its program says.
    mine["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    plan = plan_bindings_shared([island("a")], [forged, older], NOW, programs=[mine])
    assert phases(plan)["mine-x"][0] == "Bound"


# -- leases ----------------------------------------------------------------------------------


def renewed(document: dict[str, Any], at: datetime) -> dict[str, Any]:
    """``document`` as the API leaves it after a renewal at ``at``."""
    meta = {**document["metadata"], "annotations": {"pathways.dev/renewed-at": renewal_stamp(at)}}
    return {**document, "metadata": meta}


def test_a_slice_whose_lease_runs_out_is_released_for_good() -> None:
    """A client killed without deleting its slice held its devices and quota for ever."""
    leased = vslice("leased", 8, leaseSeconds=30)
    first = plan_bindings([island("a")], [leased, vslice("next", 8, created=1)], NOW)
    assert phases(first)["leased"][0] == "Bound"
    # 30 s after its creation (its lease counts from there until its first renewal).
    assert first.next_expiry == datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    held = apply([leased, vslice("next", 8, created=1)], first.ordered())
    assert phases(plan_bindings([island("a")], held, NOW + timedelta(seconds=29))) == {}

    late = plan_bindings([island("a")], held, NOW + timedelta(seconds=31))
    # Its devices go to the next slice, once their release is stored (stages in order).
    assert phases(late) == {
        "leased": ("Released", "LeaseExpired", Stage.RELEASE),
        "next": ("Bound", None, Stage.BIND),
    }
    change = late.ordered()[0]
    assert change.status["devices"] == [] and change.status["island"] is None
    assert "did not renew its lease for 30 s" in change.status["message"]
    assert ("LeaseExpired", "Warning") in [(e.reason, e.type) for e in late.events]
    assert late.next_expiry is None
    # It is never bound again, whatever comes after: not on an empty island, not renewed.
    after = apply(held, late.ordered())[:1]
    assert phases(plan_bindings([island("a")], after, NOW + timedelta(seconds=32))) == {}
    revived = renewed(after[0], NOW + timedelta(seconds=40))
    assert phases(plan_bindings([island("a")], [revived], NOW + timedelta(seconds=41))) == {}


def test_a_renewed_lease_holds_and_a_pending_slice_unrenewed_goes_too() -> None:
    holder = vslice("holder", 8, leaseSeconds=30)
    held = apply([holder], plan_bindings([island("a")], [holder], NOW).ordered())
    held = [renewed(held[0], NOW + timedelta(seconds=25))]
    plan = plan_bindings([island("a")], held, NOW + timedelta(seconds=50))
    assert phases(plan) == {}
    assert plan.next_expiry == NOW + timedelta(seconds=55)
    # A slice waiting for room goes too: bound later, it would hold devices for no one.
    waiting = vslice("waiting", 8, created=1, leaseSeconds=10)
    plan = plan_bindings([island("a")], [*held, waiting], NOW + timedelta(seconds=12))
    assert phases(plan)["waiting"] == ("Released", "LeaseExpired", Stage.WAIT)
    # A deleted slice is released as any other is, its lease run out or not.
    gone = {**held[0], "metadata": {**held[0]["metadata"], "deletionTimestamp": "x"}}
    plan = plan_bindings([island("a")], [gone], NOW + timedelta(seconds=90))
    assert phases(plan) == {"holder": ("Released", "Deleted", Stage.RELEASE)}


def test_renewal_stamps_no_renewal_wrote_count_from_the_creation() -> None:
    """Anyone who may edit a slice can write its renewal stamp: one without a time zone made
    every pass fail (comparing it raised), one at the end of time overflowed, and one far
    ahead held the slice long after its holder died."""
    leased = vslice("s", 8, leaseSeconds=30)

    def stamped(stamp: str) -> dict[str, Any]:
        meta = {**leased["metadata"], "annotations": {"pathways.dev/renewed-at": stamp}}
        return {**leased, "metadata": meta}

    created = NOW + timedelta(seconds=30)
    for stamp in ("2026-01-01T00:10:00", "9999-12-31T23:59:59Z", "2026-01-01T01:00:00Z", "x"):
        plan = plan_bindings([island("a")], [stamped(stamp)], NOW)
        assert plan.next_expiry == created, stamp
    # Ahead by less than a clock's skew, it is a renewal.
    ahead = stamped(renewal_stamp(NOW + timedelta(seconds=50)))
    assert plan_bindings([island("a")], [ahead], NOW).next_expiry == NOW + timedelta(seconds=80)


def test_editing_a_bound_slices_lease_keeps_its_devices() -> None:
    first = plan_bindings([island("a")], [vslice("s", 8, leaseSeconds=30)], NOW)
    held = apply([vslice("s", 8, leaseSeconds=30)], first.ordered())
    longer = {
        **held[0],
        "metadata": {**held[0]["metadata"], "generation": 2},
        "spec": {**held[0]["spec"], "leaseSeconds": 600},
    }
    plan = plan_bindings([island("a")], [longer], NOW + timedelta(seconds=60))
    assert phases(plan) == {"s": ("Bound", None, Stage.WAIT)}
    assert plan.next_expiry == NOW + timedelta(seconds=600)


def test_programs_hold_the_slices_they_name_and_leases_wait_for_the_controller() -> None:
    """A program naming a leased slice had it released under its run (nothing renews it), then
    waited for it for ever; and an embedded cluster's down and up released every leased slice
    on its first pass, their holders alive but unable to renew meanwhile."""
    leased = vslice("named", 8, leaseSeconds=30)
    held = apply([leased], plan_bindings([island("a")], [leased], NOW).ordered())
    later = NOW + timedelta(seconds=300)
    user = {
        "metadata": {"name": "p", "namespace": "t", "uid": "u"},
        "spec": {"slices": [{"name": "main", "virtualSliceName": "named"}]},
        "status": {"phase": "Running"},
    }
    assert phases(plan_bindings([island("a")], held, later, programs=[user])) == {}
    done = {**user, "status": {"phase": "Succeeded"}}
    assert phases(plan_bindings([island("a")], held, later, programs=[done]))["named"][:2] == (
        "Released",
        "LeaseExpired",
    )
    # A controller started 10 s ago gives the holder its lease's length to renew.
    started = later - timedelta(seconds=10)
    plan = plan_bindings([island("a")], held, later, leases_since=started)
    assert phases(plan) == {} and plan.next_expiry == started + timedelta(seconds=30)


def test_a_preempted_slice_edited_while_it_waits_says_it_saw_the_edit() -> None:
    """It kept observedGeneration 1 at generation 2: its program read "new spec is not bound
    yet" instead of why it waits, and every event on it started another binding pass."""
    waiting = {"phase": "Preempted", "reason": "Preempted", "message": "preempted by t/u"}
    edited = vslice("v", 4, status={**waiting, "observedGeneration": 1}, generation=2)
    holder = vslice("u", 8, priority=10, status=bound("a", list(range(8))))
    plan = plan_bindings([island("a")], [edited, holder], NOW)
    (change,) = [c for c in plan.changes if c.key == "t/v"]
    assert change.status == {**waiting, "observedGeneration": 2} and change.stage is Stage.WAIT
    seen = vslice("v", 4, status=change.status, generation=2)
    assert not plan_bindings([island("a")], [seen, holder], NOW).changes
