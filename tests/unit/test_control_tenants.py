"""The tenant policy at binding (pure): a tenant is named only from its namespaces, asks for
at most its highest priority, holds at most its devices; what is refused waits saying which
field is at fault, and what is bound keeps its devices."""

from __future__ import annotations

from typing import Any

import pytest
from test_control_sharing import Store, check_invariants, island, vslice

from pathways_core.control.sharing import plan_bindings_shared
from pathways_core.control.tenants import Tenants

WIRE = {
    "vision": {"namespaces": ["vision", "vision-eval"], "maxPriority": 100},
    "speech": {"devices": {"cpu-fake": 2}},
    "*": {"maxPriority": 0},
}
POLICY = Tenants.from_wire(WIRE)


def named(document: dict[str, Any], tenant: str) -> dict[str, Any]:
    """``document`` with ``spec.tenant`` set."""
    document["spec"]["tenant"] = tenant
    return document


def test_a_tenant_is_named_only_from_its_namespaces() -> None:
    store = Store([island(topology="8")], tenants=POLICY)
    store.add(named(vslice("stolen", 2, shared=False, tenant="intruder"), "vision"))
    store.add(named(vslice("eval", 2, shared=False, tenant="vision-eval"), "vision"))
    store.add(vslice("own", 2, shared=False, tenant="intruder"))
    store.settle()
    refused = store.status("stolen", "intruder")
    assert (refused["phase"], refused["reason"], refused["devices"]) == (
        "Pending",
        "TenantNotAllowed",
        [],
    )
    assert refused["message"].startswith(
        "spec.tenant: tenant 'vision' may be named only from namespace(s) 'vision', "
        "'vision-eval', not 'intruder'"
    )
    assert store.status("eval", "vision-eval")["phase"] == "Bound"
    assert store.status("own", "intruder")["phase"] == "Bound"
    # Without a policy, each tenant is still named from its own namespace only.
    open_store = Store([island(topology="8")])
    open_store.add(named(vslice("stolen", 2, shared=False, tenant="intruder"), "vision"))
    open_store.add(named(vslice("mine", 2, shared=False, tenant="vision"), "vision"))
    open_store.settle()
    assert open_store.status("stolen", "intruder")["reason"] == "TenantNotAllowed"
    assert open_store.status("mine", "vision")["phase"] == "Bound"


def test_a_priority_above_the_tenants_highest_waits_and_preempts_nobody() -> None:
    store = Store([island(topology="4")], tenants=POLICY)
    store.add(vslice("victim", 4, shared=False, tenant="vision", priority=50))
    store.settle()
    store.add(vslice("bully", 4, shared=False, tenant="other", created=1, priority=1000))
    store.settle()
    assert store.status("victim", "vision")["phase"] == "Bound"
    bully = store.status("bully", "other")
    assert (bully["phase"], bully["reason"]) == ("Pending", "PriorityNotAllowed")
    assert bully["message"] == (
        "spec.priority: 1000 is above 0, the highest priority of tenant 'other'; lower it to "
        "0 or less"
    )
    # Lowered, it is a request like any other: it waits for room, preempting nobody.
    store.slices["other/bully"]["spec"]["priority"] = 0
    store.slices["other/bully"]["metadata"]["generation"] = 2
    store.settle()
    assert store.status("bully", "other")["reason"] == "InsufficientDevices"
    assert store.status("victim", "vision")["phase"] == "Bound"


def test_a_bound_slice_raised_above_its_cap_keeps_its_devices_but_defends_them_at_the_cap() -> None:
    store = Store([island(topology="4")], tenants=POLICY)
    store.add(vslice("held", 4, shared=False, tenant="vision", priority=10))
    store.settle()
    store.slices["vision/held"]["spec"]["priority"] = 10_000  # raised past the policy
    store.slices["vision/held"]["metadata"]["generation"] = 2
    store.settle()
    assert store.status("held", "vision")["phase"] == "Bound"
    # A request of priority 101 preempts it: it is defended at 100, not 10,000.
    store.tenants = Tenants.from_wire({**WIRE, "ops": {"maxPriority": 1000}})
    store.add(vslice("urgent", 4, shared=False, tenant="ops", created=1, priority=101))
    store.settle()
    assert store.status("urgent", "ops")["phase"] == "Bound"
    # Preempted, it may not be bound again until its priority is within the policy.
    held = store.status("held", "vision")
    assert (held["devices"], held["reason"]) == ([], "PriorityNotAllowed")


def test_device_quotas_come_from_the_policy_and_hold_for_time_shared_groups() -> None:
    store = Store([island(topology="8")], tenants=POLICY)
    store.add(vslice("first", 2, shared=False, tenant="speech"))
    store.add(vslice("second", 2, shared=False, tenant="speech", created=1))
    store.add(vslice("group", 4, tenant="speech", created=2))
    store.settle()
    assert store.status("first", "speech")["phase"] == "Bound"
    for name in ("second", "group"):
        assert store.status(name, "speech")["reason"] == "QuotaExceeded", name
    check_invariants(store)


def test_refused_slices_count_as_waiting_and_say_so_once() -> None:
    store = Store([island(topology="4")], tenants=POLICY)
    store.add(named(vslice("stolen", 2, shared=False, tenant="intruder"), "vision"))
    store.settle()
    plan = plan_bindings_shared(
        store.islands, list(store.slices.values()), store.clock, tenants=POLICY
    )
    assert (plan.changes, plan.events, plan.waiting, plan.bound) == ([], [], 1, 0)
    # Edited, still refused: its status says it saw the edit, with no second Event.
    store.slices["intruder/stolen"]["metadata"]["generation"] = 2
    plan = plan_bindings_shared(
        store.islands, list(store.slices.values()), store.clock, tenants=POLICY
    )
    assert [c.status["observedGeneration"] for c in plan.changes] == [2]
    assert plan.events == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"t": {"maxPriority": "high"}}, "t.maxPriority: "),
        ({"t": {"devices": {"tpu-v9": 1}}}, "t.devices.tpu-v9: "),
        ({"t": 5}, "t: expected a mapping of namespaces, maxPriority and devices, got int"),
        ({"*": {"namespaces": ["a"]}}, "*.namespaces: the entry of tenants not listed has none"),
        ({"": {}}, "'': expected a tenant name of 1 to 63 characters"),
        (["t"], "expected a mapping of tenants"),
    ],
)
def test_a_bad_policy_names_the_entry_and_field(raw: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        Tenants.from_wire(raw)
    assert str(raised.value).startswith(message), raised.value
