"""Time-shared slices (pure): groups open, join, pass the devices on, and lose them together;
exclusive slices never touch a shared device."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.accelerators import AcceleratorKind
from pathways_core.control.common import key_of
from pathways_core.control.sharing import plan_bindings_shared
from pathways_core.control.tenants import Tenants

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def island(name: str = "isl", topology: str = "4", hosts: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": {"name": name, "generation": 1},
        "spec": {"acceleratorKind": "cpu-fake", "topology": topology, "hosts": hosts},
    }


def vslice(
    name: str,
    devices: int,
    *,
    shared: bool = True,
    created: int = 0,
    priority: int = 0,
    tenant: str = "t",
) -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {
            "name": name,
            "namespace": tenant,
            "generation": 1,
            "creationTimestamp": f"2026-01-01T00:{created // 60:02d}:{created % 60:02d}Z",
        },
        "spec": {"devices": devices, "timeShared": shared, "priority": priority},
    }


class Store:
    """Applies plans as a store would, pass after pass, until nothing changes."""

    def __init__(
        self,
        islands: list[dict[str, Any]],
        quotas: dict[str, int] | None = None,
        tenants: Tenants | None = None,
    ) -> None:
        self.islands = islands
        self.tenants = tenants
        self.quotas = {
            (tenant, AcceleratorKind.CPU_FAKE): n for tenant, n in (quotas or {}).items()
        }
        self.slices: dict[str, dict[str, Any]] = {}
        self.clock = NOW

    def add(self, document: dict[str, Any]) -> None:
        self.slices[key_of(document)] = document

    def delete(self, name: str, tenant: str = "t") -> None:
        self.slices[f"{tenant}/{name}"]["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"

    def settle(self) -> int:
        passes = 0
        for passes in range(1, 30):
            self.clock += timedelta(seconds=1)
            plan = plan_bindings_shared(
                self.islands,
                list(self.slices.values()),
                self.clock,
                self.quotas,
                tenants=self.tenants,
            )
            for change in plan.ordered():
                self.slices[change.key] = {**change.document, "status": change.status}
            for key, document in list(self.slices.items()):
                deleting = document["metadata"].get("deletionTimestamp")
                if deleting and (document.get("status") or {}).get("phase") == "Released":
                    del self.slices[key]
            if not plan.changes and not plan.needs_another_pass:
                return passes
        raise AssertionError("the plans never settled")

    def status(self, name: str, tenant: str = "t") -> dict[str, Any]:
        return self.slices[f"{tenant}/{name}"].get("status") or {}

    def devices(self, name: str, tenant: str = "t") -> list[int]:
        return self.status(name, tenant).get("devices") or []


def check_invariants(store: Store) -> None:
    """A device is held by one exclusive slice, or by time-shared slices on identical device
    lists; never both."""
    owners: dict[tuple[str, int], list[tuple[bool, tuple[int, ...]]]] = {}
    for document in store.slices.values():
        status = document.get("status") or {}
        if status.get("phase") != "Bound":
            continue
        shared = bool(document["spec"].get("timeShared"))
        for device in status["devices"]:
            held = owners.setdefault((status["island"], device), [])
            held.append((shared, tuple(status["devices"])))
    for device, holders in owners.items():
        if len(holders) > 1:
            assert all(shared for shared, _ in holders), (device, holders)
            assert len({devices for _, devices in holders}) == 1, (device, holders)
    # Each tenant is charged its exclusive slices and the groups it holds, within its quota.
    charged: dict[str, int] = {}
    for document in store.slices.values():
        status = document.get("status") or {}
        joined = any(c.get("reason") == "TimeShared" for c in status.get("conditions") or [])
        if status.get("phase") == "Bound" and not joined:
            tenant = document["metadata"]["namespace"]
            charged[tenant] = charged.get(tenant, 0) + len(status["devices"])
    for (tenant, _), limit in store.quotas.items():
        assert charged.get(tenant, 0) <= limit, (tenant, charged)


def test_four_tenants_arriving_together_share_one_group() -> None:
    store = Store([island(topology="8", hosts=2)])
    for index in range(4):
        store.add(vslice(f"tenant-{index}", 2, created=index))
    store.settle()
    assert {tuple(store.devices(f"tenant-{i}")) for i in range(4)} == {(0, 1)}
    assert store.status("tenant-0")["message"].startswith("bound to 2 devices")
    assert (
        store.status("tenant-3")["message"]
        == "time-shares 2 devices of island 'isl' with t/tenant-0"
    )
    # An exclusive slice gets other devices, and the shared ones are not free to it.
    store.add(vslice("alone", 6, shared=False, created=10))
    store.settle()
    assert set(store.devices("alone")) == {2, 3, 4, 5, 6, 7}
    check_invariants(store)


def test_a_group_of_another_size_opens_its_own_devices() -> None:
    store = Store([island(topology="8", hosts=2)])
    store.add(vslice("pair", 2))
    store.add(vslice("quad", 4, created=1))
    store.settle()
    assert not set(store.devices("pair")) & set(store.devices("quad"))
    check_invariants(store)


def test_the_oldest_member_holds_the_devices_when_the_holder_goes() -> None:
    store = Store([island(topology="4")])
    for index in range(3):
        store.add(vslice(f"s{index}", 4, created=index))
    store.settle()
    store.delete("s0")
    store.settle()
    assert "t/s0" not in store.slices
    assert store.devices("s1") == store.devices("s2") == [0, 1, 2, 3]
    # Their statuses say who holds the devices now (they named s0 still).
    assert store.status("s1")["message"] == "bound to 4 devices of island 'isl'"
    assert store.status("s2")["message"] == "time-shares 4 devices of island 'isl' with t/s1"
    bound = next(c for c in store.status("s1")["conditions"] if c["type"] == "Bound")
    assert bound["reason"] == "Bound"
    # The island is full: an exclusive slice cannot take the group's devices.
    store.add(vslice("exclusive", 1, shared=False, created=9))
    store.settle()
    assert store.status("exclusive")["phase"] == "Pending"
    store.delete("s1")
    store.delete("s2")
    store.settle()
    assert store.status("exclusive")["phase"] == "Bound"
    check_invariants(store)


def test_members_lose_the_devices_with_their_holder() -> None:
    store = Store([island(topology="4")])
    store.add(vslice("low-a", 4, created=0))
    store.add(vslice("low-b", 4, created=1))
    store.settle()
    store.add(vslice("urgent", 4, shared=False, created=2, priority=10))
    store.settle()
    assert store.status("urgent")["phase"] == "Bound"
    assert store.status("low-a")["phase"] == "Preempted"
    assert store.status("low-b")["phase"] == "Preempted"
    assert store.status("low-b")["reason"] == "SharedGroupReleased"
    check_invariants(store)


def test_other_tenants_slices_are_not_named_in_a_status() -> None:
    store = Store([island(topology="4")])
    theirs = vslice("theirs", 4, created=0)
    theirs["metadata"]["namespace"] = "other"
    store.slices[key_of(theirs)] = theirs
    store.add(vslice("mine", 4, created=1))
    store.settle()
    assert store.status("mine")["message"].endswith("with another tenant's slice")
    urgent = vslice("urgent", 4, shared=False, created=2, priority=10)
    urgent["metadata"]["namespace"] = "other"
    store.slices[key_of(urgent)] = urgent
    store.settle()
    assert store.status("mine")["message"] == (
        "the devices it time-shared with another tenant's slice were released"
    )
    preempted = store.slices["other/theirs"]["status"]["message"]
    assert preempted.startswith("preempted by other/urgent (priority 10 > 0)")


def test_a_group_is_preempted_only_by_a_priority_above_all_of_its_members() -> None:
    store = Store([island(topology="4")])
    store.add(vslice("holder", 4, created=0))
    store.settle()
    store.add(vslice("vip", 4, created=1, priority=1000))
    store.settle()
    store.add(vslice("middling", 4, shared=False, created=2, priority=50))
    store.settle()
    assert store.status("vip")["phase"] == "Bound" and store.status("holder")["phase"] == "Bound"
    assert store.status("middling")["phase"] == "Pending"
    assert store.slices["t/holder"]["spec"]["priority"] == 0  # written as it was
    store.add(vslice("urgent", 4, shared=False, created=3, priority=1001))
    store.settle()
    assert store.status("urgent")["phase"] == "Bound"
    assert store.status("vip")["reason"] == "SharedGroupReleased"
    check_invariants(store)


def of_program(program: str, document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as one of ``program``'s inline slices (labelled and owned by it)."""
    document["metadata"]["labels"] = {"pathways.dev/program": program}
    document["metadata"]["ownerReferences"] = [{"kind": "PathwaysProgram", "uid": f"u-{program}"}]
    return document


def test_a_program_never_preempts_the_group_its_own_slice_joins() -> None:
    """Its exclusive slice preempted the group its time-shared slice was joining; the next
    pass found the program could not be bound whole and let go, the group was bound again,
    and so on for ever (a Preempted event and a killed Job every other pass)."""

    def beside_a_group(topology: str, hosts: int, shared_priority: int) -> Store:
        """A group of priority 1, then program p: 4 devices of its own and 4 time-shared."""
        store = Store([island(topology=topology, hosts=hosts)])
        store.add(vslice("group", 4, created=0, priority=1))
        store.settle()
        store.add(of_program("p", vslice("p-mine", 4, shared=False, created=1, priority=5)))
        store.add(of_program("p", vslice("p-shared", 4, created=1, priority=shared_priority)))
        store.settle()
        check_invariants(store)
        return store

    store = beside_a_group("4", 1, shared_priority=5)
    assert store.status("group")["phase"] == "Bound"
    assert store.status("p-mine")["reason"] == "InsufficientDevices"
    # Nor does its time-shared slice join while the rest of its program waits.
    assert store.status("p-shared")["reason"] == "WaitingForProgramSlices"
    # With room for its exclusive slice, the program is bound whole: its other slice joins.
    store = beside_a_group("8", 2, shared_priority=2)
    assert store.status("p-mine")["phase"] == "Bound"
    shared = store.status("p-shared")
    assert shared["message"] == "time-shares 4 devices of island 'isl' with t/group"


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["shared", "exclusive"]),
            st.integers(1, 4),
            st.integers(0, 3),
            st.sampled_from([None, "p", "q"]),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_programs_with_time_shared_slices_settle(
    steps: list[tuple[str, int, int, str | None]],
) -> None:
    """Whatever programs of exclusive and time-shared slices arrive, the passes settle (a
    program's exclusive slice and its time-shared one's group took turns for ever)."""
    store = Store([island(topology="8", hosts=2), island("small", topology="4")])
    for index, (kind, devices, priority, program) in enumerate(steps):
        document = vslice(f"s{index}", devices, shared=kind == "shared", created=index)
        document["spec"]["priority"] = priority
        store.add(of_program(program, document) if program else document)
        store.settle()
        check_invariants(store)


def test_a_member_takes_the_devices_over_only_if_its_tenant_has_quota_for_them() -> None:
    # A member is charged nothing; the one that holds the devices after the holder is charged
    # them all, so it must be a member whose tenant's quota has room.
    store = Store([island(topology="4")], quotas={"poor": 2})
    store.add(vslice("holder", 4, created=0, tenant="rich"))
    store.add(vslice("s", 4, created=1, tenant="poor"))
    store.add(vslice("s", 4, created=2, tenant="wealthy"))
    store.settle()
    store.delete("holder", "rich")
    store.settle()
    assert store.status("s", "wealthy")["message"] == "bound to 4 devices of island 'isl'"
    assert store.status("s", "poor")["message"] == (
        "time-shares 4 devices of island 'isl' with another tenant's slice"
    )
    # Without a member that may pay, the group lets the devices go.
    store.delete("s", "wealthy")
    store.settle()
    assert store.status("s", "poor")["phase"] == "Preempted"
    assert store.status("s", "poor")["reason"] == "QuotaExceeded"
    assert "no slice left in the group may be charged them" in store.status("s", "poor")["message"]
    assert store.devices("s", "poor") == []


def test_a_group_is_opened_by_the_request_that_can_be_bound() -> None:
    # The first of two requests alike would wait for ever where the second binds: over its
    # tenant's quota, or of a priority too low to preempt.
    store = Store([island(topology="4")], quotas={"poor": 2})
    store.add(vslice("busy", 4, shared=False, priority=5))
    store.settle()
    store.add(vslice("low", 4, created=1))
    store.add(vslice("high", 4, created=2, priority=10))
    store.add(vslice("s", 4, created=3, tenant="poor"))
    store.settle()
    assert store.status("busy")["phase"] == "Preempted"
    assert (
        store.devices("high") == store.devices("low") == store.devices("s", "poor") == [0, 1, 2, 3]
    )
    assert store.status("low")["message"] == "time-shares 4 devices of island 'isl' with t/high"

    store = Store([island(topology="4")], quotas={"poor": 2})
    store.add(vslice("s", 4, created=0, tenant="poor"))
    store.add(vslice("s", 4, created=1, tenant="rich"))
    store.settle()
    assert store.status("s", "rich")["message"] == "bound to 4 devices of island 'isl'"
    assert store.status("s", "poor")["phase"] == "Bound"
    check_invariants(store)


def test_a_group_is_opened_by_the_next_request_when_the_first_ones_program_cannot_be_bound() -> (
    None
):
    """A time-shared slice waited for ever on an empty island behind one whose program had
    another slice that could never fit."""
    store = Store([island(topology="4")])
    never = vslice("never-t", 4, created=0)
    too_big = vslice("never-e", 5, shared=False, created=0)
    for document in (never, too_big):
        document["metadata"]["labels"] = {"pathways.dev/program": "never"}
        document["metadata"]["ownerReferences"] = [{"kind": "PathwaysProgram", "uid": "u-n"}]
        store.add(document)
    store.add(vslice("fine", 4, created=2))
    store.settle()
    assert store.status("fine")["message"] == "bound to 4 devices of island 'isl'"
    assert store.status("never-e")["phase"] == "Pending"
    check_invariants(store)


def test_without_time_shared_slices_the_plan_is_plan_bindings() -> None:
    store = Store([island(topology="4")])
    store.add(vslice("a", 2, shared=False))
    store.add(vslice("b", 2, shared=False, created=1))
    store.add(vslice("c", 2, shared=False, created=2))
    store.settle()
    assert store.status("c")["reason"] == "InsufficientDevices"
    check_invariants(store)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add-shared", "add-exclusive", "delete"]),
            st.integers(1, 4),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_no_device_is_held_by_an_exclusive_slice_and_another_and_quotas_hold(
    steps: list[tuple[str, int, int]],
) -> None:
    store = Store([island(topology="8", hosts=2)], quotas={"a": 4, "b": 2})
    for index, (action, devices, priority) in enumerate(steps):
        if action == "delete":
            alive = [
                k for k, d in store.slices.items() if not d["metadata"].get("deletionTimestamp")
            ]
            if alive:
                tenant, name = alive[index % len(alive)].split("/")
                store.delete(name, tenant)
        else:
            store.add(
                vslice(
                    f"s{index}",
                    devices,
                    shared=action == "add-shared",
                    created=index,
                    priority=priority,
                    tenant="tab"[index % 3],
                )
            )
        store.settle()
        check_invariants(store)


def test_a_holder_whose_lease_runs_out_leaves_its_group_to_the_others() -> None:
    store = Store([island(topology="4")])
    holder = vslice("s0", 4, created=0)
    holder["spec"]["leaseSeconds"] = 10
    store.add(holder)
    store.add(vslice("s1", 4, created=1))
    store.settle()
    assert store.devices("s0") == store.devices("s1") == [0, 1, 2, 3]
    store.clock += timedelta(seconds=60)  # long past the lease: its holder is gone
    store.settle()
    assert (store.status("s0")["phase"], store.status("s0")["reason"]) == (
        "Released",
        "LeaseExpired",
    )
    assert store.devices("s0") == []
    assert store.status("s1")["message"] == "bound to 4 devices of island 'isl'"
    check_invariants(store)


def test_a_slice_whose_spec_is_not_a_mapping_is_invalid_and_stops_no_other() -> None:
    """An object the API server took without its schema (spec a list, a string, a number)
    raised in the pass before it was parsed: nothing anywhere was bound or released."""
    store = Store([island(topology="4")])
    store.add(vslice("fine", 2))
    for name, spec in (("list", [1, 2]), ("text", "x"), ("number", 3)):
        odd = vslice(name, 1)
        odd["spec"] = spec
        store.add(odd)
    store.settle()
    assert store.status("fine")["phase"] == "Bound"
    for name in ("list", "text", "number"):
        assert store.status(name)["reason"] == "InvalidSpec", name
