"""Binding VirtualSlices to devices: one pure pass from a snapshot of Islands and VirtualSlices
to the status each slice should have.

Every pass rebuilds the allocator from the bindings stored in the slices' statuses before it
binds anything new, so the store is the only state: a controller that restarts (or a standby
replica that takes over) loses nothing and never binds a device twice.

The changes of a pass come in stages that the store must apply in order, stopping at the first
failure:

1. ``RELEASE``: slices losing devices (preempted, on a deleted or resized island, released on
   deletion). A slice that loses its devices is never re-bound in the same pass, so a device
   only moves to another slice once its release is stored.
2. ``BIND``: new bindings, on devices free in the store (or released in stage 1).
3. ``WAIT``: reasons of slices that stay pending.

A slice with ``spec.leaseSeconds`` is held only while its holder renews it (the API writes the
renewal time to the ``pathways.dev/renewed-at`` annotation): a pass after the lease ran out
releases it for good (``Released``, reason ``LeaseExpired``), so a client killed without
deleting its slices does not hold their devices and quota for ever. The plan says when the
next lease runs out (``next_expiry``), for the controller to run a pass then.

A program's inline slices are bound together or not at all (a *gang*): bound one by one, two
programs each held part of what they needed and waited for the rest for ever, and one that
could never fit preempted others for a part it could not use. A gang that cannot be bound
whole takes nothing (what it would have preempted keeps its devices), and members bound
before (the others of one preempted) let theirs go, until all can be bound at once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import (
    Allocator,
    Binding,
    Bound,
    IslandInventory,
    Pending,
    Request,
    is_block,
    program_slice_name,
)
from pathways_core.control.common import (
    ANNOTATION_QUEUED_SINCE,
    ANNOTATION_RENEWED_AT,
    LABEL_PROGRAM,
    Document,
    Event,
    ObjectRef,
    entry_name,
    generation,
    is_deleting,
    key_of,
    parse,
    parse_time,
    seen_from,
    set_condition,
    slice_entries,
    spec_of,
    timestamp,
)
from pathways_core.control.islands import unhealthy_devices
from pathways_core.resources import Island, PathwaysProgram, VirtualSlice, VirtualSliceSpec
from pathways_core.topology import format_shape, parse_shape

DEFAULT_NAMESPACE = "default"
# How long a request may wait for room while later, smaller ones of its priority or lower are
# bound past it; then the islands it fits on are kept for it.
PATIENCE = timedelta(minutes=2)


class Stage(IntEnum):
    """Order in which a pass's changes must be stored."""

    RELEASE = 0
    BIND = 1
    WAIT = 2


@dataclass(frozen=True)
class SliceChange:
    """A new status for one slice. ``document`` is the slice as seen by the pass: a store that
    supports it should write only if the slice has not changed since (its resourceVersion)."""

    key: str
    document: Document
    status: dict[str, Any]
    stage: Stage


@dataclass
class BindingPlan:
    """What one pass decided."""

    changes: list[SliceChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    devices_free: dict[str, int] = field(default_factory=dict)
    devices_total: dict[str, int] = field(default_factory=dict)
    bound: int = 0
    waiting: int = 0
    newly_bound: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    """Stored bindings the pass refused (unknown island, device outside the mesh, a device
    bound twice); each such slice is released in stage 1."""
    next_expiry: datetime | None = None
    """When the first lease of a slice still held runs out: a pass then releases it."""

    @property
    def needs_another_pass(self) -> bool:
        """Slices released in this pass wait for the next one to be bound again."""
        return any(change.stage is Stage.RELEASE for change in self.changes)

    def ordered(self) -> list[SliceChange]:
        """The changes in the order they must be stored."""
        return sorted(self.changes, key=lambda change: change.stage)


def _namespace(document: Document) -> str:
    return (document.get("metadata") or {}).get("namespace") or DEFAULT_NAMESPACE


def _stored_binding(document: Document, request: Request) -> Binding | None:
    status = document.get("status") or {}
    if status.get("phase") != "Bound" or not status.get("island"):
        return None
    devices = tuple(int(device) for device in status.get("devices") or ())
    shape = status.get("shape")
    try:
        block = parse_shape(shape) if shape else None
    except ValueError:
        block = None
    return Binding(request, status["island"], devices, block)


def queued_since(document: Document) -> datetime | None:
    """When a slice joined the queue: its program's creation for an inline slice, else its
    own. Among equal priorities the earlier is bound first."""
    meta = document.get("metadata") or {}
    # Only an inline slice's says when: on a slice of its own it would jump the queue.
    own = gang_of(document) is None
    since = None if own else (meta.get("annotations") or {}).get(ANNOTATION_QUEUED_SINCE)
    return parse_time(since) or parse_time(meta.get("creationTimestamp"))


def with_program_queue_times(
    slices: Sequence[Document], programs: Sequence[Document]
) -> list[Document]:
    """The slices, each inline one queued since its program's creation as ``programs`` say,
    not as its annotation says (whoever may write a slice could set that, and jump the
    queue); one of no program listed queues from its own creation."""
    created = {
        f"{_namespace(p)}/{(p.get('metadata') or {}).get('name')}/"
        f"{(p.get('metadata') or {}).get('uid')}": (p.get("metadata") or {}).get(
            "creationTimestamp"
        )
        for p in programs
    }
    trusted: list[Document] = []
    for document in slices:
        gang = gang_of(document)
        meta = document.get("metadata") or {}
        annotations = dict(meta.get("annotations") or {})
        if gang is not None and created.get(gang):
            annotations[ANNOTATION_QUEUED_SINCE] = created[gang]
        else:
            annotations.pop(ANNOTATION_QUEUED_SINCE, None)
        if annotations == (meta.get("annotations") or {}):
            trusted.append(document)
        else:
            trusted.append({**document, "metadata": {**meta, "annotations": annotations}})
    return trusted


def waiting_since(document: Document) -> datetime | None:
    """Since when an unbound slice has waited for devices: since it last lost them (preempted,
    released) or was first seen unbound, else since it was queued."""
    status = document.get("status") or {}
    bound = next((c for c in status.get("conditions") or [] if c.get("type") == "Bound"), None)
    if bound is not None and bound.get("status") == "False":
        return parse_time(bound.get("lastTransitionTime")) or queued_since(document)
    return queued_since(document)


def _at(request: Request, priority: int | None) -> Request:
    """``request`` at ``priority`` (unchanged when ``None``)."""
    return request if priority is None else replace(request, priority=priority)


def gang_of(document: Document) -> str | None:
    """The program whose inline slice this is (its label, and an owner reference to it), as
    ``namespace/program/uid``; ``None`` for a slice of its own."""
    meta = document.get("metadata") or {}
    program = (meta.get("labels") or {}).get(LABEL_PROGRAM)
    owner = next(
        (
            reference.get("uid")
            for reference in meta.get("ownerReferences") or []
            if reference.get("kind") == "PathwaysProgram"
        ),
        None,
    )
    return f"{_namespace(document)}/{program}/{owner}" if program and owner else None


def placement(spec: VirtualSliceSpec) -> str:
    """Digest of what a slice's binding answers: its spec but for its priority (which decides
    only who may preempt whom) and its lease (how long it is held unrenewed)."""
    wire = {k: v for k, v in spec.to_wire().items() if k not in ("priority", "leaseSeconds")}
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()[:16]


def _status(
    document: Document,
    phase: str,
    now: datetime,
    *,
    reason: str | None = None,
    message: str | None = None,
    binding: Binding | None = None,
    inventory: IslandInventory | None = None,
    answers: str | None = None,
) -> dict[str, Any]:
    """A complete slice status; fields of the old status that no longer apply are cleared."""
    old = document.get("status") or {}
    bound = binding is not None
    status: dict[str, Any] = {
        "phase": phase,
        "island": binding.island if binding else None,
        "shape": format_shape(binding.block) if binding and binding.block else None,
        "devices": list(binding.devices) if binding else [],
        "hosts": sorted({inventory.host_of(d) for d in binding.devices})
        if binding and inventory
        else [],
        "reason": reason,
        "message": message,
        "boundTime": timestamp(now) if bound else None,
        "observedGeneration": generation(document),
        "placement": answers if binding else None,
    }
    status["conditions"] = set_condition(
        list(old.get("conditions") or []),
        "Bound",
        bound,
        "Bound" if bound else (reason or phase),
        message or "",
        now,
        generation(document),
    )
    return status


def pending_status(document: Document, now: datetime, reason: str, message: str) -> dict[str, Any]:
    """The status of a slice that waits for ``reason`` (holding no devices)."""
    return _status(document, "Pending", now, reason=reason, message=message)


# How far ahead of the controller's clock a renewal stamp may be (the API's clock may run ahead).
MAX_CLOCK_SKEW = timedelta(seconds=60)


def renewal_stamp(moment: datetime) -> str:
    """How a renewal time is written (to the microsecond: a lease is a few seconds)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_expiry(document: Document, now: datetime) -> datetime | None:
    """When a slice's lease runs out: ``spec.leaseSeconds`` after its last renewal (or its
    creation); ``None`` for a slice without a lease. A renewal stamp later than ``now`` by
    more than MAX_CLOCK_SKEW was not written by a renewal (anyone who may edit the slice can
    write one): the lease counts from the slice's creation."""
    seconds = spec_of(document).get("leaseSeconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds <= 0:
        return None
    meta = document.get("metadata") or {}
    renewed = parse_time((meta.get("annotations") or {}).get(ANNOTATION_RENEWED_AT))
    if renewed is not None and renewed > now + MAX_CLOCK_SKEW:
        renewed = None
    start = renewed or parse_time(meta.get("creationTimestamp"))
    try:
        return start + timedelta(seconds=seconds) if start is not None else None
    except OverflowError:  # a creation stamp at the end of time: the lease never runs out
        return None


def lease_expired(document: Document) -> bool:
    """Whether a slice was released because its lease ran out (for good: a renewal after it
    is refused, and the slice is never bound again)."""
    status = document.get("status") or {}
    return status.get("phase") == "Released" and status.get("reason") == "LeaseExpired"


@dataclass
class Leases:
    """What the slices' leases decide in a pass: see :func:`check_leases`."""

    held: list[Document]
    changes: list[SliceChange]
    events: list[Event]
    next_expiry: datetime | None


def check_leases(
    slices: Sequence[Document],
    now: datetime,
    programs: Sequence[Document] = (),
    since: datetime | None = None,
) -> Leases:
    """Release the slices whose lease ran out by ``now``; ``held``: the others, those
    released for it before left out (they are done with, whatever their spec says).

    A slice a program names (``virtualSliceName``) is held by it while the program is not
    finished: nothing renews it then. No lease runs out sooner than its length after
    ``since``, when the controller began: while no controller (or API) ran, as an embedded
    cluster's ``down``, holders could renew nothing."""
    leases = Leases([], [], [], None)
    named = _named_by_programs(programs)
    for document in slices:
        if lease_expired(document) and not is_deleting(document):
            continue
        expiry = None if is_deleting(document) else lease_expiry(document, now)
        if expiry is not None and key_of(document) in named:
            expiry = None
        if expiry is not None and since is not None:
            seconds = timedelta(seconds=document["spec"]["leaseSeconds"])
            expiry = max(expiry, since + seconds)
        if expiry is None:
            leases.held.append(document)
        elif expiry > now:
            leases.held.append(document)
            leases.next_expiry = min(expiry, leases.next_expiry or expiry)
        else:
            seconds = document["spec"]["leaseSeconds"]
            message = (
                f"its holder did not renew its lease for {seconds} s (it ran out at "
                f"{timestamp(expiry)}): devices released; create a new slice"
            )
            status = document.get("status") or {}
            stage = Stage.RELEASE if status.get("devices") else Stage.WAIT
            leases.changes.append(
                SliceChange(
                    key_of(document),
                    document,
                    _status(document, "Released", now, reason="LeaseExpired", message=message),
                    stage,
                )
            )
            leases.events.append(Event(ObjectRef.of(document), "Warning", "LeaseExpired", message))
    return leases


def held_slices(program: Document) -> frozenset[str]:
    """The VirtualSlices (names in its namespace) that ``program`` holds: those it names
    (``virtualSliceName``) while it is not finished nor being deleted."""
    status = program.get("status") or {}
    if is_deleting(program) or status.get("phase") in ("Succeeded", "Failed"):
        return frozenset()
    return frozenset(
        name for item in slice_entries(program) if (name := entry_name(item, "virtualSliceName"))
    )


def _named_by_programs(programs: Sequence[Document]) -> set[str]:
    """The slices (``namespace/name``) that unfinished programs name."""
    return {f"{_namespace(p)}/{name}" for p in programs for name in held_slices(p)}


def _same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    keys = ("phase", "island", "devices", "reason", "message", "observedGeneration")
    return all((old.get(k) or None) == (new.get(k) or None) for k in keys)


def plan_bindings(
    islands: Sequence[Document],
    slices: Sequence[Document],
    now: datetime,
    quotas: Mapping[tuple[str, AcceleratorKind], int] | None = None,
    patience: timedelta = PATIENCE,
    programs: Sequence[Document] | None = None,
    *,
    incomplete: Collection[str] | None = None,
    leases_since: datetime | None = None,
) -> BindingPlan:
    """Decide every slice's status from a snapshot of all Islands and VirtualSlices (and the
    PathwaysPrograms, whose inline slices are bound only once they all exist; or
    ``incomplete``: the programs, as :func:`incomplete_programs` names them, whose do not).

    Deterministic: the same snapshot gives the same plan. Stored bindings are restored first,
    oldest first (so if two slices claim a device, the one bound earlier keeps it); then
    unbound slices are bound by priority (highest first), then age, then name, preempting
    strictly lower priorities when they cannot fit. Slices losing their devices in a pass
    (preempted, on a resized or deleted island, on a lost host) are bound again in the next
    one; until then nothing that ranks after them is bound, so they keep their place.
    """
    plan = BindingPlan()
    leases = check_leases(slices, now, programs or (), leases_since)
    slices = leases.held
    plan.changes += leases.changes
    plan.events += leases.events
    plan.next_expiry = leases.next_expiry
    allocator = Allocator()
    inventories: dict[str, IslandInventory] = {}
    # Islands whose spec was edited into one that does not parse: they run as before, so
    # their slices keep their devices, and nothing new is bound there until it is fixed.
    frozen: set[str] = set()
    for document in sorted(islands, key=key_of):
        if is_deleting(document):
            continue
        island, _ = parse(document)
        if isinstance(island, Island):
            inventory = replace(
                IslandInventory.from_island(island), unhealthy=unhealthy_devices(document, island)
            )
            inventories[inventory.name] = inventory
            allocator.add_island(inventory)
        else:
            frozen.add((document.get("metadata") or {}).get("name") or "")
    for (tenant, kind), limit in (quotas or {}).items():
        allocator.set_quota(tenant, kind, limit)

    def change(document: Document, status: dict[str, Any], stage: Stage) -> None:
        plan.changes.append(SliceChange(key_of(document), document, status, stage))

    def event(document: Document, type_: str, reason: str, message: str) -> None:
        plan.events.append(Event(ObjectRef.of(document), type_, reason, message))

    restorable: list[tuple[str, str, Binding, Document]] = []
    queue: list[tuple[Request, Document]] = []
    placements: dict[str, str] = {}
    restated: dict[str, Document] = {}
    kept_frozen = 0  # bound on a frozen island
    for document in slices:
        status = document.get("status") or {}
        if is_deleting(document):
            if status.get("phase") != "Released":
                change(
                    document,
                    _status(document, "Released", now, reason="Deleted", message="slice deleted"),
                    Stage.RELEASE,
                )
                event(document, "Normal", "Released", "devices released: the slice is deleted")
            continue
        resource, problem = parse(document)
        if not isinstance(resource, VirtualSlice):
            new = _status(document, "Pending", now, reason="InvalidSpec", message=problem)
            if not _same(status, new):
                change(document, new, Stage.RELEASE if status.get("devices") else Stage.WAIT)
                event(document, "Warning", "InvalidSpec", problem or "invalid spec")
            continue
        namespace = _namespace(document)
        key = f"{namespace}/{resource.metadata.name}"
        request = Request.from_spec(
            key, resource.spec.tenant or namespace, resource.spec, resource.spec.priority
        )
        stored = _stored_binding(document, request)
        placements[key] = placement(resource.spec)
        edited = status.get("observedGeneration") not in (None, generation(document))
        if stored is not None and edited and status.get("placement") == placements[key]:
            # Its priority alone changed: it keeps its devices (released, they went to the
            # next pending slice, which the slice then preempted back), if it still may.
            restated[key] = document
        elif stored is not None and edited:
            # The spec changed under a bound slice: its binding no longer answers it.
            change(
                document,
                _status(
                    document,
                    "Pending",
                    now,
                    reason="SpecChanged",
                    message="the slice's spec changed; it will be bound again",
                ),
                Stage.RELEASE,
            )
            event(document, "Normal", "SpecChanged", "devices released to bind the new spec")
            continue
        if stored is not None and stored.island in frozen:
            kept_frozen += 1
        elif stored is not None:
            restorable.append((status.get("boundTime") or "", key, stored, document))
        else:
            queue.append((request, document))

    # A program's slices share its priority (the highest of theirs, were they to differ):
    # none of them may preempt another, and each is preempted only by what may preempt all.
    priorities: dict[str, int] = {}
    for request, document in [*queue, *((b.request, d) for _, _, b, d in restorable)]:
        gang = gang_of(document)
        if gang is not None:
            priorities[gang] = max(priorities.get(gang, request.priority), request.priority)
    if priorities:
        queue = [(_at(r, priorities.get(gang_of(d) or "")), d) for r, d in queue]
        restorable = [
            (t, k, replace(b, request=_at(b.request, priorities.get(gang_of(d) or ""))), d)
            for t, k, b, d in restorable
        ]
    restorable.sort(key=lambda item: (item[0], item[1]))
    documents: dict[str, Document] = {}
    displaced: list[tuple[Request, Document]] = []  # lost their devices in this pass
    restored_requests: dict[str, Request] = {}
    for _, key, binding, document in restorable:
        documents[key] = document
        restored_requests[key] = binding.request
        inventory = inventories.get(binding.island)
        lost = sorted(set(binding.devices) & inventory.unhealthy) if inventory else []
        if lost:
            hosts = sorted({inventory.host_of(device) for device in lost}) if inventory else []
            message = (
                f"host(s) {hosts} of island {binding.island!r} are down; the slice will be "
                "bound again on healthy devices"
            )
            change(
                document,
                _status(document, "Preempted", now, reason="HostUnhealthy", message=message),
                Stage.RELEASE,
            )
            event(document, "Warning", "HostUnhealthy", message)
            displaced.append((binding.request, document))
            continue
        rejected = allocator.restore([binding])
        if rejected:
            plan.rejected.append(key)
            inventory = inventories.get(binding.island)
            if inventory is None:
                reason = "IslandDeleted"
                message = f"island {binding.island!r} is gone; the slice will be bound again"
            elif any(device >= inventory.size for device in binding.devices):
                reason = "IslandResized"
                message = (
                    f"island {binding.island!r} now has {inventory.size} devices; the slice "
                    "will be bound again"
                )
            elif binding.block is not None and not is_block(
                binding.devices, binding.block, inventory.shape
            ):
                reason = "IslandResized"
                message = (
                    f"island {binding.island!r} is now a {format_shape(inventory.shape)} mesh, "
                    f"where its devices are no {format_shape(binding.block)} block; the slice "
                    "will be bound again"
                )
            else:
                reason = "BindingConflict"
                message = (
                    f"stored binding refused ({rejected[0].message}); the slice will be bound again"
                )
            change(
                document,
                _status(document, "Preempted", now, reason=reason, message=message),
                Stage.RELEASE,
            )
            event(document, "Warning", reason, message)
            displaced.append((binding.request, document))

    queue.sort(key=lambda item: (-item[0].priority, queued_since(item[1]) or now, item[0].key))
    decided, let_go = _decide_queue(
        allocator,
        queue,
        documents,
        now,
        patience,
        inventories=inventories,
        restored_requests=restored_requests,
        incomplete=(
            incomplete_programs(programs or (), slices) if incomplete is None else incomplete
        ),
        displaced=displaced,
    )
    for document, reason, message in let_go:
        change(
            document,
            _status(document, "Pending", now, reason=reason, message=message),
            Stage.RELEASE,
        )
        event(document, "Normal", "WaitingForProgramSlices", message)

    for request, document, decision in decided:
        status = document.get("status") or {}
        if isinstance(decision, Bound):
            binding = decision.binding
            inventory = inventories[binding.island]
            message = f"bound to {len(binding.devices)} devices of island {binding.island!r}"
            change(
                document,
                _status(
                    document,
                    "Bound",
                    now,
                    message=message,
                    binding=binding,
                    inventory=inventory,
                    answers=placements[request.key],
                ),
                Stage.BIND,
            )
            plan.newly_bound.append(request.key)
            event(document, "Normal", "Bound", f"{message}: {list(binding.devices)}")
            for victim in decision.preempted:
                victim_document = documents[victim.key]
                message = (
                    f"preempted by {seen_from(request.key, victim.key)} (priority "
                    f"{request.priority} > {victim.request.priority}); waiting to be bound again"
                )
                change(
                    victim_document,
                    _status(victim_document, "Preempted", now, reason="Preempted", message=message),
                    Stage.RELEASE,
                )
                event(victim_document, "Warning", "Preempted", message)
            continue
        if status.get("phase") == "Preempted" and decision.reason in (
            "InsufficientDevices",
            status.get("reason"),
        ):
            # It keeps saying why it lost its devices while it waits for room, and that it
            # saw an edit (its program read "new spec not bound yet", and every event on it
            # started another pass).
            if status.get("observedGeneration") not in (None, generation(document)):
                change(document, {**status, "observedGeneration": generation(document)}, Stage.WAIT)
            continue
        assert isinstance(decision, Pending)
        if decision.reason == "NoMatchingIsland" and request.island in frozen:
            decision = Pending(
                decision.key,
                decision.reason,
                f"island {request.island!r} has a spec that does not parse (see its status): "
                "it runs as before, and nothing new is bound there until it is fixed",
            )
        new = _status(document, "Pending", now, reason=decision.reason, message=decision.message)
        if not _same(status, new):
            change(document, new, Stage.WAIT)
            if status.get("reason") != decision.reason:
                event(document, "Warning", decision.reason, decision.message)

    # Slices whose priority alone changed and that kept their devices say they saw it (one
    # released or preempted in this pass says so instead).
    changed = {c.key for c in plan.changes}
    for document in restated.values():
        if key_of(document) not in changed:
            status = document.get("status") or {}
            change(document, {**status, "observedGeneration": generation(document)}, Stage.WAIT)

    plan.devices_total = {name: inventory.size for name, inventory in inventories.items()}
    plan.devices_free = {name: allocator.free_devices(name) for name in inventories}
    plan.bound = len(allocator.bindings()) + kept_frozen
    plan.waiting = sum(1 for document in slices if not is_deleting(document)) - plan.bound
    return plan


def _rank(request: Request, document: Document, now: datetime) -> tuple[Any, ...]:
    """A request's place in the queue: priority (highest first), then age, then name."""
    return (-request.priority, queued_since(document) or now, request.key)


def incomplete_programs(programs: Sequence[Document], slices: Sequence[Document]) -> set[str]:
    """The programs (``namespace/name/uid``, as their inline slices' gang) some of whose inline
    slices do not exist yet: created one at a time, the first alone was bound (preempting
    others) for a program that could not run."""
    present: dict[str, set[str]] = {}
    for document in slices:
        gang = gang_of(document)
        if gang is not None and not is_deleting(document):
            present.setdefault(gang, set()).add((document.get("metadata") or {}).get("name"))
    incomplete: set[str] = set()
    for document in programs:
        program, _ = parse(document)
        uid = (document.get("metadata") or {}).get("uid")
        if is_deleting(document) or not isinstance(program, PathwaysProgram) or not uid:
            continue
        name = program.metadata.name or ""
        gang = f"{_namespace(document)}/{name}/{uid}"
        inline = {
            program_slice_name(name, item.name)
            for item in program.spec.slices
            if item.virtual_slice_name is None
        }
        if inline - present.get(gang, set()):
            incomplete.add(gang)
    return incomplete


def _fits_empty(
    inventories: Mapping[str, IslandInventory], requests: Sequence[Request], healthy: bool = False
) -> bool:
    """Whether the requests could all be bound at once were every island empty (their lost
    hosts still lost, unless ``healthy``): a program that never could is told so, and no
    island is kept for requests that cannot fit there now."""
    allocator = Allocator()
    for inventory in inventories.values():
        allocator.add_island(replace(inventory, unhealthy=frozenset()) if healthy else inventory)
    return all(isinstance(allocator.allocate(r, preempt=False), Bound) for r in requests)


def _decide_queue(
    allocator: Allocator,
    queue: Sequence[tuple[Request, Document]],
    restored: Mapping[str, Document],
    now: datetime,
    patience: timedelta,
    *,
    inventories: Mapping[str, IslandInventory],
    restored_requests: Mapping[str, Request],
    incomplete: Collection[str],
    displaced: Sequence[tuple[Request, Document]],
) -> tuple[list[tuple[Request, Document, Bound | Pending]], list[tuple[Document, str, str]]]:
    """Bind the queue (in its order) program by program, all of a program's slices or none
    (see the module); ``restored``: the slices bound before, restored in ``allocator``.

    Returns each queued slice's decision, and the restored slices of programs not bound whole
    that let their devices go (with the reason and message they are Pending with). A slice
    with no decision keeps its status: one of a program whose inline slices do not all exist
    yet (``incomplete``), or one ranking after a slice that lost its devices in this pass
    (``displaced``, or preempted here), which it must not overtake.
    Islands a request waited past ``patience`` for are kept for it, if it could fit there at
    all: no request of its priority or lower queued after it is placed on them (a stream of
    small requests kept a large one waiting for ever)."""
    gangs: dict[str, list[tuple[Request, Document]]] = {}
    for request, document in queue:
        gangs.setdefault(gang_of(document) or request.key, []).append((request, document))
    held: dict[str, list[str]] = {}  # a program's slices bound before
    for key, document in restored.items():
        gang = gang_of(document)
        if gang in gangs and allocator.binding(key) is not None:
            held.setdefault(gang, []).append(key)
    decided: list[tuple[Request, Document, Bound | Pending]] = []
    let_go: list[tuple[Document, str, str]] = []
    kept: dict[str, int] = {}  # island -> the priority it is kept at
    # Nothing ranking after a slice that lost its devices in this pass is bound before it.
    behind = min((_rank(r, d, now) for r, d in displaced), default=None)
    for gang, group in gangs.items():
        if behind is not None and _rank(*group[0], now) > behind:
            continue
        if gang in incomplete:
            continue  # its program's other slices are being created: bound with them
        priority = group[0][0].priority
        barred = frozenset(name for name, level in kept.items() if level >= priority)
        decisions: list[Bound | Pending] = []
        for request, _ in group:
            decisions.append(allocator.allocate(request, preempt=True, kept=barred))
            if not isinstance(decisions[-1], Bound):
                break
        failed = decisions[-1]
        taken = [decision for decision in decisions if isinstance(decision, Bound)]
        requests = [request for request, _ in group] + [
            restored_requests[key] for key in held.get(gang, [])
        ]
        whole = len(requests) > 1
        if isinstance(failed, Bound):
            for victim in (v for decision in taken for v in decision.preempted):
                rank = _rank(victim.request, restored[victim.key], now)
                behind = rank if behind is None else min(behind, rank)
            decided += [(r, d, x) for (r, d), x in zip(group, decisions, strict=True)]
            continue
        if whole:
            # What it took goes back (what it preempted keeps its devices) before its
            # message is made: counted with them, the room and quota it saw were not there.
            for decision in taken:
                allocator.release(decision.binding.request.key)
            allocator.restore([victim for decision in taken for victim in decision.preempted])
            failed = _gang_failure(
                allocator, failed, group[len(decisions) - 1][0], requests, barred
            )
        busy = failed.reason == "InsufficientDevices"
        if busy and whole and not _fits_empty(inventories, requests, healthy=True):
            total = sum(request.size for request in requests)
            failed = Pending(
                failed.key,
                "ProgramDoesNotFit",
                f"its program's {len(requests)} slices need {total} devices together, more "
                "than the islands they may use hold even when empty",
            )
            busy = False
        since = max(waiting_since(document) or now for _, document in group)
        names: set[str] = set()
        if busy and now - since > patience and _fits_empty(inventories, requests):
            # Every island the program needs (not only the one it failed on), but those
            # kept already for an older request.
            names = {n for request, _ in group for n in allocator.islands_for(request)} - barred
        if names:
            for name in names:
                kept[name] = max(kept.get(name, priority), priority)
            failed = Pending(
                failed.key,
                failed.reason,
                f"{failed.message}; waiting since {timestamp(since)}, it has the islands it fits "
                f"on kept for it ({', '.join(sorted(map(repr, names)))}): nothing of its "
                "priority or lower queued after it is placed there",
            )
        if not whole:
            decided.append((group[0][0], group[0][1], failed))
            continue
        failing = key_of(group[len(decisions) - 1][1]).rsplit("/", 1)[1]
        together = (
            f"its program's slice {failing} cannot be bound ({failed.reason}: "
            f"{failed.message}); a program's slices are bound all at once"
        )
        for key in held.get(gang, []):
            if allocator.release(key) is not None:  # not preempted in this pass
                let_go.append((restored[key], failed.reason, f"devices released: {together}"))
        for request, document in group:
            mine = request.key == failed.key
            decided.append(
                (
                    request,
                    document,
                    failed if mine else Pending(request.key, failed.reason, together),
                )
            )
    return decided, let_go


def _gang_failure(
    allocator: Allocator,
    failed: Pending,
    request: Request,
    gang: Sequence[Request],
    kept: Collection[str],
) -> Pending:
    """Why ``request``, the slice of a program that ``failed`` to be bound with the others,
    waits, for the same reason: said of it alone (nothing of its program taken: counted with
    them, the room and quota it saw were not there), with the devices the program needs."""
    together = f"its program's slices need {sum(r.size for r in gang)} devices together"
    alone = allocator.allocate(request, preempt=False, kept=kept)
    if isinstance(alone, Bound):
        allocator.release(request.key)
    elif alone.reason == failed.reason:
        return Pending(request.key, failed.reason, f"{alone.message} ({together})")
    if failed.reason == "QuotaExceeded":
        message = f"its tenant's quota has room for it alone; {together}"
    else:
        message = f"it fits alone, but not beside its program's other slices; {together}"
    return Pending(request.key, failed.reason, message)
