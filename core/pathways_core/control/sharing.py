"""Time-shared slices: several VirtualSlices bound to the same devices of one island.

Pathways time-multiplexes devices between clients: the island's gang scheduler divides device
time between programs by weight. The exclusive allocator never binds a device twice, so
slices that ask for ``timeShared: true`` are bound in *groups*:

- the first time-shared slice of a size is bound by :func:`plan_bindings` like any slice (it
  holds the devices against exclusive slices, is charged to its tenant's quota, may preempt
  and be preempted); it is the group's *holder*;
- a later time-shared slice whose request the group answers (same island, same number of
  devices, a kind and labels it admits, the same mesh shape if one is asked) *joins* the
  group: it is bound to the same devices and charged nothing;
- when the holder goes, the oldest remaining member whose tenant's quota has room for the
  devices holds them and is charged them (each pass restores one binding per group, so the
  allocator still never sees a device twice); with no such member, the group lets them go;
- when a holder loses its devices (preempted, island deleted), every member loses them too.

Unbound time-shared slices that find no group wait for one of them to open one (one new group
per request signature per pass: the highest priority, then the oldest, whose tenant's quota
has room; one not bound gives the next its turn), so tenants that arrive together share
instead of each taking devices of their own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import IslandInventory, Request
from pathways_core.control.common import (
    Document,
    Event,
    ObjectRef,
    generation,
    is_deleting,
    key_of,
    parse,
    seen_from,
    set_condition,
    spec_of,
    timestamp,
)
from pathways_core.control.slices import (
    PATIENCE,
    BindingPlan,
    SliceChange,
    Stage,
    check_leases,
    gang_of,
    incomplete_programs,
    pending_status,
    plan_bindings,
    queued_since,
    with_program_queue_times,
)
from pathways_core.control.tenants import Refusal, Tenants
from pathways_core.resources import Island, VirtualSlice
from pathways_core.topology import parse_shape


def is_time_shared(document: Document) -> bool:
    """Whether a VirtualSlice document asks for time-shared devices."""
    return bool(spec_of(document).get("timeShared"))


def _bound_group(document: Document) -> tuple[str, tuple[int, ...]] | None:
    status = document.get("status") or {}
    if status.get("phase") != "Bound" or not status.get("island"):
        return None
    if status.get("observedGeneration") not in (None, generation(document)):
        return None  # the spec changed: plan_bindings releases it
    return status["island"], tuple(int(d) for d in status.get("devices") or ())


def _request(document: Document) -> Request | None:
    resource, _ = parse(document)
    if not isinstance(resource, VirtualSlice):
        return None
    namespace = (document.get("metadata") or {}).get("namespace") or "default"
    return Request.from_spec(
        key_of(document), resource.spec.tenant or namespace, resource.spec, resource.spec.priority
    )


def _signature(request: Request) -> tuple[Any, ...]:
    selector = request.selector.model_dump_json() if request.selector else None
    return (request.size, request.shape, request.kind, request.island, selector)


def _joined_status(document: Document, holder: Document, now: datetime) -> dict[str, Any]:
    held = holder.get("status") or {}
    old = document.get("status") or {}
    message = (
        f"time-shares {len(held.get('devices') or [])} devices of island "
        f"{held.get('island')!r} with {seen_from(key_of(holder), key_of(document))}"
    )
    return {
        "phase": "Bound",
        "island": held.get("island"),
        "shape": held.get("shape"),
        "devices": list(held.get("devices") or []),
        "hosts": list(held.get("hosts") or []),
        "reason": None,
        "message": message,
        "boundTime": timestamp(now),
        "observedGeneration": generation(document),
        "conditions": set_condition(
            list(old.get("conditions") or []),
            "Bound",
            True,
            "TimeShared",
            message,
            now,
            generation(document),
        ),
    }


@dataclass
class SharedBindingPlan(BindingPlan):
    """A plan that may need another pass for slices waiting to join a group opened in it."""

    again: bool = False

    @property
    def needs_another_pass(self) -> bool:
        """Released slices, or twins of a group opened in this pass, bind in the next one."""
        return self.again or any(change.stage is Stage.RELEASE for change in self.changes)


def plan_bindings_shared(
    islands: Sequence[Document],
    slices: Sequence[Document],
    now: datetime,
    quotas: Mapping[tuple[str, AcceleratorKind], int] | None = None,
    patience: timedelta = PATIENCE,
    tenants: Tenants | None = None,
    programs: Sequence[Document] | None = None,
    leases_since: datetime | None = None,
) -> SharedBindingPlan:
    """:func:`plan_bindings`, with time-shared slices bound in groups (see the module), of
    the slices ``tenants`` admits (see :mod:`pathways_core.control.tenants`; by default each
    tenant is named from its own namespace only): the others wait, saying why. ``quotas``
    adds to the tenants' device quotas."""
    tenants = tenants or Tenants()
    # Before the groups are made: a slice released for its lease shares devices no more.
    trusted = slices if programs is None else with_program_queue_times(slices, programs)
    leases = check_leases(trusted, now, programs or (), leases_since)
    admitted, refused, names = _admitted(leases.held, tenants)
    plan = _plan_shared(
        islands,
        admitted,
        now,
        {**tenants.quotas(names), **(quotas or {})},
        patience,
        programs,
        leases_since,
    )
    originals = {key_of(d): d for d in slices}
    plan.changes[:] = [replace(c, document=originals[c.key]) for c in plan.changes]
    plan.changes += leases.changes
    plan.events += leases.events
    plan.next_expiry = leases.next_expiry
    for document, refusal in refused:
        old = document.get("status") or {}
        new = pending_status(document, now, refusal.reason, refusal.message)
        if any(old.get(key) != new[key] for key in ("reason", "message", "observedGeneration")):
            plan.changes.append(SliceChange(key_of(document), document, new, Stage.WAIT))
        if (old.get("reason"), old.get("message")) != (refusal.reason, refusal.message):
            plan.events.append(
                Event(ObjectRef.of(document), "Warning", refusal.reason, refusal.message)
            )
    plan.waiting += len(refused)
    return plan


def _admitted(
    slices: Sequence[Document], tenants: Tenants
) -> tuple[list[Document], list[tuple[Document, Refusal]], set[str]]:
    """The slices ``tenants`` lets be bound (a bound one as the allocator sees it: at most its
    tenant's highest priority), those it refuses, with why, and the tenants of those it
    lets be bound (whose quotas apply)."""
    admitted: list[Document] = []
    refused: list[tuple[Document, Refusal]] = []
    names: set[str] = set()
    for document in slices:
        request = None if is_deleting(document) else _request(document)
        if request is None:
            admitted.append(document)  # plan_bindings releases or reports it
            continue
        status = document.get("status") or {}
        if status.get("phase") == "Bound" and status.get("island"):
            capped = tenants.capped(request.tenant, request.priority)
            admitted.append(_at_priority(document, capped))
            names.add(request.tenant)
            continue
        namespace = (document.get("metadata") or {}).get("namespace") or "default"
        refusal = tenants.refusal(namespace, request.tenant, request.priority)
        if refusal is None:
            admitted.append(document)
            names.add(request.tenant)
        else:
            refused.append((document, refusal))
    return admitted, refused, names


def _plan_shared(
    islands: Sequence[Document],
    slices: Sequence[Document],
    now: datetime,
    quotas: Mapping[tuple[str, AcceleratorKind], int],
    patience: timedelta,
    programs: Sequence[Document] | None,
    leases_since: datetime | None,
) -> SharedBindingPlan:
    # Of every slice: plan_bindings sees only some of the time-shared ones.
    incomplete = incomplete_programs(programs or (), slices)

    def planned(some: Sequence[Document]) -> BindingPlan:
        return plan_bindings(
            islands,
            some,
            now,
            quotas,
            patience,
            programs,
            incomplete=incomplete,
            leases_since=leases_since,
        )

    shared = [d for d in slices if is_time_shared(d) and not is_deleting(d)]
    if not shared:
        return SharedBindingPlan(**vars(planned(slices)))
    passed: list[Document] = [d for d in slices if not is_time_shared(d) or is_deleting(d)]
    inventories: dict[str, IslandInventory] = {}
    for document in islands:
        island, _ = parse(document)
        if isinstance(island, Island) and not is_deleting(document):
            inventories[island.metadata.name or ""] = IslandInventory.from_island(island)
    charges = _Charges(quotas or {}, inventories, passed)

    groups: dict[tuple[str, tuple[int, ...]], list[Document]] = defaultdict(list)
    unbound: list[Document] = []
    for document in shared:
        group = _bound_group(document)
        if group is None:
            unbound.append(document)
        else:
            groups[group].append(document)
    for documents in groups.values():
        # The holder first: the one that did not join (or, its holder gone, the oldest).
        documents.sort(
            key=lambda d: (
                _joined(d),
                (d.get("status") or {}).get("boundTime") or "",
                key_of(d),
            )
        )
    successions = sorted(group for group, documents in groups.items() if _joined(documents[0]))
    for group, documents in groups.items():
        if group not in successions:
            charges.charge(documents[0], group[0])
    unpaid: list[Document] = []
    for group in successions:
        # The holder has gone: the oldest member that may be charged the devices holds them.
        documents = groups[group]
        payer = next((d for d in documents if charges.has_room(d, [group[0]])), None)
        if payer is None:
            unpaid.extend(groups.pop(group))
            continue
        documents.remove(payer)
        documents.insert(0, payer)
        charges.charge(payer, group[0])
    holders: dict[tuple[str, tuple[int, ...]], Document] = {}
    members: dict[tuple[str, tuple[int, ...]], list[Document]] = {}
    for group, documents in groups.items():
        holders[group], members[group] = documents[0], documents[1:]

    joins: list[tuple[Document, Document]] = []
    requests = {key_of(d): _request(d) for d in unbound}
    unbound.sort(key=lambda d: _opening_order(d, requests[key_of(d)]))
    # Unbound slices that join no group, by signature: one of each may open a group.
    candidates: dict[tuple[Any, ...], list[Document]] = defaultdict(list)
    for document in unbound:
        request = requests[key_of(document)]
        if request is None:
            passed.append(document)  # plan_bindings reports the invalid spec
            continue
        holder = next(
            (
                holders[group]
                for group in sorted(holders)
                if group[0] in inventories
                and len(group[1]) == request.size
                and request.admits(inventories[group[0]])
                and (
                    request.shape is None
                    or (
                        (spec_of(holders[group]).get("shape") is not None)
                        and parse_shape(holders[group]["spec"]["shape"]) == request.shape
                    )
                )
            ),
            None,
        )
        if holder is not None:
            joins.append((document, holder))
        else:
            candidates[_signature(request)].append(document)

    # A holder as the allocator sees it: at the highest priority of its group and of those
    # about to join it, so a program never preempts the group its own slice joins (it did,
    # then found it could not be bound whole and let the group be bound again, for ever).
    gangs = _gang_priorities(slices)
    for group, holder in holders.items():
        joining = [
            _at_priority(d, gangs.get(gang_of(d) or "", _priority(d)))
            for d, joined in joins
            if joined is holder
        ]
        passed.append(_with_group_priority(holder, [holder, *members[group], *joining]))

    # Per signature, the first that its tenant may be charged opens a group; one that is not
    # bound (its program cannot be, say) gives the next its turn, or those behind it waited
    # for ever on an empty island.
    failed: set[str] = set()
    for _ in range(MAX_OPENING_TRIES):
        openers = {
            signature: opener
            for signature, documents in candidates.items()
            if (opener := _opener([d for d in documents if key_of(d) not in failed], charges))
        }
        tried = [d for documents in candidates.values() for d in documents if key_of(d) in failed]
        plan = planned([*passed, *openers.values(), *tried])
        unopened = {key_of(d) for d in openers.values()} - set(plan.newly_bound)
        turns = [
            signature
            for signature, opener in openers.items()
            if key_of(opener) in unopened
            and any(key_of(d) not in failed | unopened for d in candidates[signature])
        ]
        if not turns:
            break
        failed |= unopened
    opened = {key_of(d) for d in openers.values()}
    twins = [
        d
        for documents in candidates.values()
        for d in documents
        if key_of(d) not in opened and key_of(d) not in failed
    ]
    # Changes carry the holders as they are, not as the allocator saw them.
    originals = {key_of(holder): holder for holder in holders.values()}
    plan.changes[:] = [
        replace(change, document=originals[change.key]) if change.key in originals else change
        for change in plan.changes
    ]
    for document in unpaid:
        _release(plan, document, now, "QuotaExceeded", _UNPAID)
    released = {change.key for change in plan.changes if change.stage is Stage.RELEASE}
    for group, holder in holders.items():
        if key_of(holder) not in released:
            continue
        for member in members[group]:
            holder_seen = seen_from(key_of(holder), key_of(member))
            message = f"the devices it time-shared with {holder_seen} were released"
            _release(plan, member, now, "SharedGroupReleased", message)
    for group, holder in holders.items():
        if key_of(holder) in released:
            continue
        # Statuses naming a holder that has gone say who holds the devices now.
        if _joined(holder):
            devices = len((holder.get("status") or {}).get("devices") or [])
            island_name = (holder.get("status") or {}).get("island")
            message = f"bound to {devices} devices of island {island_name!r}"
            restated = _restated(holder, "Bound", message, now)
            plan.changes.append(SliceChange(key_of(holder), holder, restated, Stage.BIND))
        for member in members[group]:
            message = _joined_status(member, holder, now)["message"]
            if (member.get("status") or {}).get("message") != message:
                restated = _restated(member, "TimeShared", message, now)
                plan.changes.append(SliceChange(key_of(member), member, restated, Stage.BIND))
    again = any(key_of(holder) in released for _, holder in joins)
    joins = [(document, holder) for document, holder in joins if key_of(holder) not in released]
    for document in _unbound_programs(joins, slices, plan, incomplete):
        joins = [(d, holder) for d, holder in joins if d is not document]
        old = document.get("status") or {}
        new = pending_status(document, now, "WaitingForProgramSlices", _TOGETHER)
        if old.get("phase") != "Preempted" and not _says(old, new):
            plan.changes.append(SliceChange(key_of(document), document, new, Stage.WAIT))
            if old.get("reason") != new["reason"]:
                event = Event(ObjectRef.of(document), "Normal", new["reason"], _TOGETHER)
                plan.events.append(event)
    for document, holder in joins:
        status = _joined_status(document, holder, now)
        plan.changes.append(SliceChange(key_of(document), document, status, Stage.BIND))
        plan.newly_bound.append(key_of(document))
        plan.events.append(Event(ObjectRef.of(document), "Normal", "Bound", status["message"]))
    opened_now = {k for k in plan.newly_bound} & {key_of(d) for d in unbound}
    for document in twins:
        old = document.get("status") or {}
        if old.get("phase") == "Preempted":
            continue  # keeps saying why it lost its devices, as plan_bindings does
        if old.get("phase") != "Pending" or old.get("reason") != "WaitingForSharedGroup":
            plan.changes.append(
                SliceChange(key_of(document), document, _pending(document, now), Stage.WAIT)
            )
    if twins and opened_now:
        again = True  # the twins join the groups opened in this pass on the next one
    return SharedBindingPlan(**vars(plan), again=again)


_TOGETHER = (
    "its program's other slices are not all bound; a program's slices are bound all at once "
    "(this one joins a time-shared group with them)"
)


def _unbound_programs(
    joins: Sequence[tuple[Document, Document]],
    slices: Sequence[Document],
    plan: BindingPlan,
    incomplete: Collection[str],
) -> list[Document]:
    """The slices about to join a group whose program's other slices are not all bound
    after ``plan`` (nor joining too): they wait with them, as :func:`plan_bindings` binds a
    program's slices all at once or none."""
    released = {change.key for change in plan.changes if change.stage is Stage.RELEASE}
    joining = {key_of(document) for document, _ in joins}
    bound = set(plan.newly_bound) | joining
    for document in slices:
        status = document.get("status") or {}
        if status.get("phase") == "Bound" and key_of(document) not in released:
            bound.add(key_of(document))
    gangs: dict[str, list[str]] = defaultdict(list)
    for document in slices:
        gang = gang_of(document)
        if gang is not None and not is_deleting(document):
            gangs[gang].append(key_of(document))
    waiting = []
    for document, _ in joins:
        gang = gang_of(document)
        if gang is not None and (gang in incomplete or not set(gangs[gang]) <= bound):
            waiting.append(document)
    return waiting


def _says(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a waiting slice's status already says what ``new`` does."""
    keys = ("phase", "reason", "message", "observedGeneration")
    return all(old.get(key) == new[key] for key in keys)


_UNPAID = (
    "the slice holding the devices it time-shared is gone, and no slice left in the group may "
    "be charged them: its tenant's quota has no room; it will be bound again when it has"
)


def _release(
    plan: BindingPlan, document: Document, now: datetime, reason: str, message: str
) -> None:
    """Add to ``plan`` the release of a time-shared slice's devices, saying why."""
    status = dict(document.get("status") or {})
    status.update(
        phase="Preempted",
        island=None,
        shape=None,
        devices=[],
        hosts=[],
        reason=reason,
        message=message,
        boundTime=None,
    )
    status["conditions"] = set_condition(
        list(status.get("conditions") or []),
        "Bound",
        False,
        reason,
        message,
        now,
        generation(document),
    )
    plan.changes.append(SliceChange(key_of(document), document, status, Stage.RELEASE))
    plan.events.append(Event(ObjectRef.of(document), "Warning", reason, message))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


MAX_OPENING_TRIES = 4
"""Binding passes a plan tries at most, giving the next slice its turn to open a group when
the one before it was not bound."""


def _opener(documents: Sequence[Document], charges: _Charges) -> Document | None:
    """The slice that opens a group of its signature: the first (in opening order) whose
    tenant may be charged the devices, else the first."""
    return next((d for d in documents if charges.has_room(d)), documents[0] if documents else None)


def _opening_order(document: Document, request: Request | None) -> tuple[Any, ...]:
    """Unbound slices in the order plan_bindings would bind them: priority, age, name."""
    priority = request.priority if request is not None else 0
    return (-priority, queued_since(document) or _EPOCH, key_of(document))


class _Charges:
    """Devices charged to each tenant's quota, by accelerator kind: exclusive slices' and
    group holders' (members are charged nothing)."""

    def __init__(
        self,
        quotas: Mapping[tuple[str, AcceleratorKind], int],
        inventories: Mapping[str, IslandInventory],
        exclusive: Sequence[Document],
    ) -> None:
        self.quotas = quotas
        self.inventories = inventories
        self.used: dict[tuple[str, AcceleratorKind], int] = defaultdict(int)
        if quotas:
            for document in exclusive:
                status = document.get("status") or {}
                if status.get("phase") == "Bound" and not is_deleting(document):
                    self.charge(document, status.get("island"))

    def charge(self, document: Document, island: str | None) -> None:
        """Charge a bound slice's devices to its tenant."""
        request = _request(document) if self.quotas else None
        if request is not None and island in self.inventories:
            self.used[(request.tenant, self.inventories[island].kind)] += request.size

    def has_room(self, document: Document, islands: Sequence[str] | None = None) -> bool:
        """Whether the slice's tenant may be charged its devices on one of ``islands`` (by
        default, of the islands it may use)."""
        request = _request(document) if self.quotas else None
        if request is None:
            return True
        names = islands if islands is not None else list(self.inventories)
        for name in names:
            inventory = self.inventories.get(name)
            if inventory is None or not request.admits(inventory):
                continue
            limit = self.quotas.get((request.tenant, inventory.kind))
            if limit is None or self.used[(request.tenant, inventory.kind)] + request.size <= limit:
                return True
        return False


def _restated(document: Document, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """A bound slice's status saying ``message`` (its binding unchanged)."""
    status = dict(document.get("status") or {})
    status["message"] = message
    status["conditions"] = set_condition(
        list(status.get("conditions") or []),
        "Bound",
        True,
        reason,
        message,
        now,
        generation(document),
    )
    return status


def _joined(document: Document) -> bool:
    """Whether a slice's status says it joined another's group (``TimeShared``)."""
    conditions = (document.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Bound" and c.get("reason") == "TimeShared" for c in conditions)


def _priority(document: Document) -> int:
    return int(spec_of(document).get("priority") or 0)


def _gang_priorities(slices: Sequence[Document]) -> dict[str, int]:
    """Each program's priority, as :func:`plan_bindings` binds its slices: their highest."""
    priorities: dict[str, int] = {}
    for document in slices:
        gang = gang_of(document)
        if gang is not None:
            priorities[gang] = max(priorities.get(gang, _priority(document)), _priority(document))
    return priorities


def _with_group_priority(holder: Document, group: Sequence[Document]) -> Document:
    """The holder as the allocator sees it: at the highest priority of its group, since
    preempting it evicts them all (a priority-50 slice took a group holding a priority-1000
    member from its priority-0 holder)."""
    return _at_priority(holder, max(_priority(d) for d in group))


def _at_priority(document: Document, priority: int) -> Document:
    """``document`` with ``spec.priority`` set to ``priority`` (itself if it has it)."""
    spec = document.get("spec") or {}
    if priority == int(spec.get("priority") or 0):
        return document
    return {**document, "spec": {**spec, "priority": priority}}


def _pending(document: Document, now: datetime) -> dict[str, Any]:
    old = document.get("status") or {}
    message = "waiting for a time-shared group of its size to open"
    return {
        **old,
        "phase": "Pending",
        "reason": "WaitingForSharedGroup",
        "message": message,
        "observedGeneration": generation(document),
        "conditions": set_condition(
            list(old.get("conditions") or []),
            "Bound",
            False,
            "WaitingForSharedGroup",
            message,
            now,
            generation(document),
        ),
    }
