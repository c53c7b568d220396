"""The global allocator: binds virtual slices to physical devices of islands.

Synchronous and pure: every method is a decision over in-memory state, so the operator, the
embedded mode and the tests drive the same code. Guarantees, checked by property tests:

- no device is ever bound twice, and unhealthy devices are never newly bound;
- a request is bound whole or not at all (``Pending`` with a reason);
- per-tenant quotas (devices per accelerator kind) are never exceeded by a new binding;
- preemption evicts only strictly lower-priority slices, and the fewest of them;
- a tenant at its quota makes room in it by evicting its own strictly lower-priority slices
  of that kind (Kueue's ``withinClusterQueue: LowerPriority``), anywhere, and another tenant's
  only on the island it is bound on, for room there: none that could be spared, and of the few
  ways tried, the fewest, then the lowest priorities (those on its island preferred: they make
  room in the quota and on the island at once);
- release returns exactly the devices that were bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cache

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator.placement import (
    Orientation,
    PlacementTable,
    bits,
    compact_shapes,
    free_placements,
    orientations,
    placement_table,
    virtual_order,
)
from pathways_core.allocator.types import (
    Binding,
    Bound,
    Decision,
    IslandInventory,
    Pending,
    Rejected,
    Request,
)
from pathways_core.topology import Shape, coordinates, format_shape


@dataclass
class _IslandState:
    inventory: IslandInventory
    occupied: int = 0
    unhealthy: int = 0
    owners: dict[int, str] = field(default_factory=dict)  # device -> binding key
    masks: dict[str, int] = field(default_factory=dict)  # binding key -> its devices
    bindings: dict[str, Binding] = field(default_factory=dict)
    # Bumped whenever devices become available; a block shape that did not fit at an epoch
    # cannot fit until the epoch changes (binding only removes free space).
    epoch: int = 0
    no_fit: dict[tuple[int, ...], int] = field(default_factory=dict)
    # Devices held by bindings, by the bindings' priority: whether evicting lower priorities
    # could ever make room is known without walking the bindings.
    held: dict[int, int] = field(default_factory=dict)
    # Kept by ``refresh`` whenever ``occupied`` or ``unhealthy`` changes: every decision reads
    # them for every island it considers.
    blocked: int = field(default=0, init=False)
    free: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        self.blocked = self.occupied | self.unhealthy
        self.free = self.inventory.size - self.blocked.bit_count()

    def vacated(self, keys: Iterable[str]) -> _IslandState:
        """A copy of this island's occupancy (no bindings) with the bindings ``keys`` gone, to
        try placements on; the state itself when there are none."""
        mask = 0
        for key in keys:
            mask |= self.masks[key]
        if not mask:
            return self
        return _IslandState(
            self.inventory, occupied=self.occupied & ~mask, unhealthy=self.unhealthy
        )

    def without(self, keys: Collection[str]) -> _IslandState:
        """A copy of this island's state with the bindings ``keys`` gone (to try evictions);
        the state itself when there are none (trying placements on it changes nothing but its
        ``no_fit`` cache, which stays true of it)."""
        if not keys:
            return self
        masks = {key: mask for key, mask in self.masks.items() if key not in keys}
        occupied = 0
        for mask in masks.values():
            occupied |= mask
        return _IslandState(
            self.inventory,
            occupied=occupied,
            unhealthy=self.unhealthy,
            owners={d: key for d, key in self.owners.items() if key not in keys},
            masks=masks,
            bindings={key: b for key, b in self.bindings.items() if key not in keys},
        )


@dataclass
class _Candidates:
    """The islands a request may use, in placement order, and their kinds."""

    states: list[_IslandState]
    kinds: frozenset[AcceleratorKind]
    # Of ``states``, those a slice fits in when empty, by (shape, size): fixed by the meshes.
    fitting: dict[tuple[Shape | None, int], list[_IslandState]] = field(default_factory=dict)

    def fitting_for(self, request: Request) -> list[_IslandState]:
        key = (request.shape, request.size)
        states = self.fitting.get(key)
        if states is None:
            states = self.fitting[key] = [
                s for s in self.states if _ever_fits(request, s.inventory)
            ]
        return states


@dataclass
class _OwnCandidates:
    """A tenant's own strictly lower-priority slices of one kind, which a request of it may
    evict to make room in its quota of that kind: found once per request."""

    excess: int  # devices of them to evict for the request to fit in the quota
    ordered: list[Binding]  # the lowest priority first, then the largest (``_own_order``)
    largest: list[Binding]  # the largest first, then the lowest priority (``_size_order``)
    by_island: dict[str, list[Binding]]  # the same, by island, in the same order
    bound: tuple[int, int, int]  # no decision's cost (``_cost``) is lower


@dataclass(frozen=True)
class _Choice:
    orientation: Orientation | None  # None: scattered devices
    mask: int
    origin: int


class Allocator:
    """Binds requests to devices of islands; see the module docstring for its guarantees."""

    def __init__(self) -> None:
        self._islands: dict[str, _IslandState] = {}
        self._bindings: dict[str, Binding] = {}
        self._quotas: dict[tuple[str, AcceleratorKind], int] = {}
        self._usage: dict[tuple[str, AcceleratorKind], int] = {}
        # Each tenant's bindings by kind: a tenant at its quota looks for its own to preempt.
        self._held_by: dict[tuple[str, AcceleratorKind], dict[str, Binding]] = {}
        # And the devices they hold by priority: whether evicting its own lower priorities can
        # make room in its quota at all is known without walking them.
        self._held_priorities: dict[tuple[str, AcceleratorKind], dict[int, int]] = {}
        # Islands matching a (kind, island, selector), in placement order, and their kinds;
        # reset when islands are added, changed or removed.
        self._candidate_cache: dict[tuple[object, ...], _Candidates] = {}

    # -- inventory ---------------------------------------------------------------------------

    def add_island(self, inventory: IslandInventory) -> None:
        """Add an island, or update its labels and health if it exists with the same mesh."""
        current = self._islands.get(inventory.name)
        if current is not None:
            old = current.inventory
            if (old.kind, old.shape, old.devices_per_host) != (
                inventory.kind,
                inventory.shape,
                inventory.devices_per_host,
            ):
                raise ValueError(
                    f"island {inventory.name!r} changed its accelerators or topology; remove "
                    "it (releasing its slices) before adding it again"
                )
            current.inventory = inventory
            self._set_unhealthy(current)
            self._candidate_cache.clear()
            return
        state = _IslandState(inventory)
        self._islands[inventory.name] = state
        self._candidate_cache.clear()
        self._set_unhealthy(state)

    def remove_island(self, name: str) -> list[Binding]:
        """Remove an island; returns the bindings it held, which are dropped."""
        state = self._islands.pop(name, None)
        if state is None:
            return []
        self._candidate_cache.clear()
        displaced = list(state.bindings.values())
        for binding in displaced:
            del self._bindings[binding.key]
            self._charge(binding, state.inventory.kind, -1)
        return displaced

    def set_health(self, island: str, unhealthy: Iterable[int]) -> list[Binding]:
        """Set which devices of an island are unhealthy; returns the bindings that use any."""
        state = self._island(island)
        unhealthy = frozenset(unhealthy)
        for device in unhealthy:
            if not 0 <= device < state.inventory.size:
                raise ValueError(f"island {island!r} has no device {device}")
        state.inventory = replace(state.inventory, unhealthy=unhealthy)
        self._set_unhealthy(state)
        return [b for b in state.bindings.values() if any(d in unhealthy for d in b.devices)]

    def set_quota(self, tenant: str, kind: AcceleratorKind, limit: int | None) -> None:
        """Limit the devices of a kind a tenant may hold; ``None`` removes the limit.

        Lowering a quota below current usage evicts nothing by itself: new requests of the
        tenant wait until usage drops below the limit, except that one with a higher priority
        than some of the tenant's slices of that kind may evict them to make room in it (as
        :meth:`allocate` does whenever the tenant is at its quota), which after a lowered quota
        can be many of them.
        """
        if limit is None:
            self._quotas.pop((tenant, kind), None)
        elif limit < 0:
            raise ValueError(f"quota must be >= 0 (got {limit})")
        else:
            self._quotas[(tenant, kind)] = limit

    # -- queries -----------------------------------------------------------------------------

    @property
    def islands(self) -> list[IslandInventory]:
        return [state.inventory for state in self._islands.values()]

    def bindings(self) -> list[Binding]:
        """Every current binding."""
        return list(self._bindings.values())

    def binding(self, key: str) -> Binding | None:
        """The binding of a slice, if bound."""
        return self._bindings.get(key)

    def free_devices(self, island: str) -> int:
        """Healthy devices of an island bound to no slice."""
        return self._island(island).free

    def usage(self, tenant: str, kind: AcceleratorKind) -> int:
        """Devices of a kind a tenant holds."""
        return self._usage.get((tenant, kind), 0)

    def quota(self, tenant: str, kind: AcceleratorKind) -> int | None:
        """A tenant's limit for a kind, or ``None`` when unlimited."""
        return self._quotas.get((tenant, kind))

    # -- decisions ---------------------------------------------------------------------------

    def allocate(
        self, request: Request, *, preempt: bool = True, kept: Collection[str] = ()
    ) -> Decision:
        """Bind a request whole, or leave it pending with a reason.

        When it cannot fit and ``preempt`` is set, the fewest strictly lower-priority bindings
        whose eviction lets it fit are evicted (listed in ``Bound.preempted``), or none.
        ``kept``: islands kept for an older request, which this one may not use.
        """
        if request.key in self._bindings:
            return Bound(self._bindings[request.key])
        candidates = self._candidates(request)
        if not candidates.states:
            return Pending(request.key, "NoMatchingIsland", self._no_island_message(request))
        room = {kind: self._quota_room(request, kind) for kind in candidates.kinds}
        fitting = candidates.fitting_for(request)
        if not any(room.values()):
            decision = (
                self._preempt_own(request, fitting, kept, candidates.kinds) if preempt else None
            )
            if decision is not None:
                return decision
            return Pending(
                request.key, "QuotaExceeded", self._quota_message(request, candidates.states)
            )
        shaped = fitting if all(room.values()) else [s for s in fitting if room[s.inventory.kind]]
        if not shaped:
            return Pending(
                request.key, "ShapeDoesNotFit", self._shape_message(request, candidates.states)
            )
        if kept:
            barred = [s.inventory.name for s in shaped if s.inventory.name in kept]
            shaped = [s for s in shaped if s.inventory.name not in kept]
            if not shaped:
                names = ", ".join(sorted(repr(name) for name in barred))
                return Pending(
                    request.key,
                    "InsufficientDevices",
                    f"the islands it fits on ({names}) are kept for an older request that "
                    "has waited too long to be bound, until it is",
                )
        size = request.size
        for state in shaped:
            if state.free >= size:  # most islands of a busy fleet are skipped here
                choice = self._place(request, state, contiguous_only=True)
                if choice is not None:
                    return Bound(self._bind(request, state, choice))
        if request.shape is None:  # any free devices will do
            for state in shaped:
                choice = self._place(request, state, contiguous_only=False)
                if choice is not None:
                    return Bound(self._bind(request, state, choice))
        if preempt:
            short = [s for s in fitting if not room[s.inventory.kind]]
            full = [kind for kind, has_room in room.items() if not has_room]
            decision = self._preempt(request, shaped) or self._preempt_own(
                request, short, kept, full
            )
            if decision is not None:
                return decision
        return Pending(request.key, "InsufficientDevices", self._busy_message(request, shaped))

    def islands_for(self, request: Request) -> list[str]:
        """The islands a request fits on when they are empty (its kind, labels and shape)."""
        return [s.inventory.name for s in self._candidates(request).fitting_for(request)]

    def release(self, key: str) -> Binding | None:
        """Release a slice; returns the binding whose devices are now free (``None`` if the slice
        was not bound)."""
        binding = self._bindings.pop(key, None)
        if binding is None:
            return None
        state = self._islands[binding.island]
        self._unbind(state, binding)
        return binding

    def remap(self, key: str, avoid: Iterable[int] = ()) -> Decision:
        """Move a bound slice to other devices (migration, recovery), never onto ``avoid`` or
        unhealthy devices; it may keep healthy devices it already has. Preempts nothing. On
        failure the slice stays where it was and the decision is ``Pending``."""
        binding = self._bindings.get(key)
        if binding is None:
            return Pending(key, "NotBound", f"slice {key!r} is not bound")
        self.release(key)
        state = self._islands[binding.island]
        avoid_mask = 0
        for device in avoid:
            if 0 <= device < state.inventory.size:
                avoid_mask |= 1 << device
        state.unhealthy |= avoid_mask  # temporarily, so the search skips them
        state.refresh()
        state.epoch += 1
        try:
            # Staying on the same kind keeps the tenant's usage as it was (a lowered quota evicts
            # nothing); moving to another kind must fit that kind's quota.
            candidates = [
                s
                for s in self._candidates(binding.request).states
                if _ever_fits(binding.request, s.inventory)
                and (
                    s.inventory.kind == state.inventory.kind
                    or self._quota_room(binding.request, s.inventory.kind)
                )
            ]
            for contiguous_only in (True, False):
                for candidate in candidates:
                    choice = self._place(binding.request, candidate, contiguous_only)
                    if choice is not None:
                        return Bound(self._bind(binding.request, candidate, choice))
        finally:
            state.unhealthy = self._unhealthy_mask(state)
            state.refresh()
            state.epoch += 1
        self._restore_one(binding)
        return Pending(key, "InsufficientDevices", f"no other devices can take slice {key!r}")

    def restore(self, bindings: Iterable[Binding]) -> list[Rejected]:
        """Rebuild state from existing bindings (after a restart), before anything new is bound.

        Each binding is checked and applied in order; a binding naming an unknown island or
        device, of the wrong size or kind, or using a device already bound, is rejected (and
        reported) so that no device is ever bound twice. Quotas are not enforced here: what was
        bound stays bound.
        """
        rejected = []
        for binding in bindings:
            problem = self._restore_problem(binding)
            if problem is not None:
                rejected.append(Rejected(binding, problem))
            else:
                self._restore_one(binding)
        return rejected

    # -- internals ---------------------------------------------------------------------------

    def _candidates(self, request: Request) -> _Candidates:
        """Islands the request may use. Islands are filled in one fixed order (by name): churn
        stays in the first islands and the later ones stay whole for large slices, which binds
        more requests under load than trying the fullest island first (benchmarks/RESULTS.md)."""
        selector = request.selector.model_dump_json() if request.selector else None
        key = (request.kind, request.island, selector)
        cached = self._candidate_cache.get(key)
        if cached is None:
            states = [
                self._islands[name]
                for name in sorted(self._islands)
                if request.admits(self._islands[name].inventory)
            ]
            kinds = frozenset(s.inventory.kind for s in states)
            cached = self._candidate_cache[key] = _Candidates(states, kinds)
        return cached

    def _island(self, name: str) -> _IslandState:
        try:
            return self._islands[name]
        except KeyError:
            raise KeyError(f"unknown island {name!r}") from None

    def _unhealthy_mask(self, state: _IslandState) -> int:
        mask = 0
        for device in state.inventory.unhealthy:
            mask |= 1 << device
        return mask

    def _set_unhealthy(self, state: _IslandState) -> None:
        old = state.unhealthy
        state.unhealthy = self._unhealthy_mask(state)
        state.refresh()
        if old & ~state.unhealthy:  # some devices recovered
            state.epoch += 1

    def _quota_room(self, request: Request, kind: AcceleratorKind) -> bool:
        limit = self._quotas.get((request.tenant, kind))
        return limit is None or self._usage.get((request.tenant, kind), 0) + request.size <= limit

    def _charge(self, binding: Binding, kind: AcceleratorKind, sign: int) -> None:
        key = (binding.request.tenant, kind)
        self._usage[key] = self._usage.get(key, 0) + sign * len(binding.devices)
        held = self._held_by.setdefault(key, {})
        totals = self._held_priorities.setdefault(key, {})
        priority = binding.request.priority
        totals[priority] = totals.get(priority, 0) + sign * len(binding.devices)
        if sign > 0:
            held[binding.key] = binding
        else:
            del held[binding.key]
            if not totals[priority]:
                del totals[priority]

    def _layouts(
        self, request: Request, inventory: IslandInventory
    ) -> tuple[tuple[Orientation, ...], ...]:
        """Orientations to try, grouped by preference (most compact block shapes first)."""
        if request.shape is not None:
            return (orientations(request.shape, inventory.shape),)
        return _count_layouts(request.size, inventory.shape)

    def _place(
        self, request: Request, state: _IslandState, contiguous_only: bool
    ) -> _Choice | None:
        if state.free < request.size:
            return None
        blocked = state.blocked
        if not contiguous_only:
            if request.shape is not None:
                return None
            free = bits(((1 << state.inventory.size) - 1) & ~blocked)[: request.size]
            mask = 0
            for device in free:
                mask |= 1 << device
            return _Choice(None, mask, free[0])
        for group in self._layouts(request, state.inventory):
            best: tuple[int, Orientation, PlacementTable, int] | None = None
            for orientation in group:
                if state.no_fit.get(orientation.block) == state.epoch:
                    continue
                table = placement_table(state.inventory.shape, orientation.block)
                free = free_placements(table, blocked)
                if not free:
                    state.no_fit[orientation.block] = state.epoch
                    continue
                # Snug placements touch used devices or the mesh boundary on most faces,
                # leaving the free devices in large blocks.
                rings, ties, weight = table.rings, table.ties, table.weight
                score, index = max(
                    ((rings[i] & blocked).bit_count() * weight + ties[i], i) for i in free
                )
                if best is None or score > best[0]:
                    best = (score, orientation, table, index)
            if best is not None:
                _, orientation, table, index = best
                return _Choice(orientation, table.masks[index], table.origins[index])
        return None

    def _bind(self, request: Request, state: _IslandState, choice: _Choice) -> Binding:
        mesh = state.inventory.shape
        if choice.orientation is None:
            devices, block = tuple(bits(choice.mask)), None
        else:
            devices = virtual_order(choice.orientation, choice.origin, mesh)
            block = choice.orientation.block
        binding = Binding(request, state.inventory.name, devices, block)
        self._restore_one(binding)
        return binding

    def _restore_one(self, binding: Binding) -> None:
        state = self._islands[binding.island]
        mask = 0
        for device in binding.devices:
            mask |= 1 << device
            state.owners[device] = binding.key
        state.occupied |= mask
        state.refresh()
        priority = binding.request.priority
        state.held[priority] = state.held.get(priority, 0) + len(binding.devices)
        state.masks[binding.key] = mask
        state.bindings[binding.key] = binding
        self._bindings[binding.key] = binding
        self._charge(binding, state.inventory.kind, +1)

    def _unbind(self, state: _IslandState, binding: Binding) -> None:
        for device in binding.devices:
            del state.owners[device]
        state.occupied &= ~state.masks.pop(binding.key)
        state.refresh()
        priority = binding.request.priority
        state.held[priority] -= len(binding.devices)
        if not state.held[priority]:
            del state.held[priority]
        del state.bindings[binding.key]
        state.epoch += 1
        self._charge(binding, state.inventory.kind, -1)

    def _restore_problem(self, binding: Binding) -> str | None:
        state = self._islands.get(binding.island)
        if state is None:
            return f"island {binding.island!r} does not exist"
        if binding.key in self._bindings:
            return f"slice {binding.key!r} is already bound"
        if binding.request.kind is not None and binding.request.kind != state.inventory.kind:
            return (
                f"island {binding.island!r} has {state.inventory.kind}, not {binding.request.kind}"
            )
        if len(binding.devices) != binding.request.size:
            return f"{len(binding.devices)} devices bound for a request of {binding.request.size}"
        if len(set(binding.devices)) != len(binding.devices):
            return "the binding lists a device twice"
        for device in binding.devices:
            if not 0 <= device < state.inventory.size:
                return f"island {binding.island!r} has no device {device}"
            owner = state.owners.get(device)
            if owner is not None:
                return f"device {device} of island {binding.island!r} is already bound to {owner!r}"
        if binding.block is not None and not is_block(
            binding.devices, binding.block, state.inventory.shape
        ):
            return (
                f"its devices are not a {format_shape(binding.block)} block of island "
                f"{binding.island!r}'s {format_shape(state.inventory.shape)} mesh"
            )
        return None

    def _preempt(self, request: Request, candidates: list[_IslandState]) -> Bound | None:
        """Evict the fewest strictly lower-priority bindings that let the request fit; among
        equally few, those of the lowest priority, then the fewest devices."""
        best: tuple[tuple[int, int, int, str], _IslandState, set[str]] | None = None
        for state in candidates:
            reclaimable = sum(
                devices for priority, devices in state.held.items() if priority < request.priority
            )
            if state.free + reclaimable < request.size:
                continue
            evictable = {
                key: b for key, b in state.bindings.items() if b.request.priority < request.priority
            }
            victims = self._fewest_victims(request, state, evictable)
            if victims is None:
                continue
            cost = (*_victims_cost(victims, evictable), state.inventory.name)
            if best is None or cost < best[0]:
                best = (cost, state, victims)
        if best is None:
            return None
        _, state, victims = best
        evicted = tuple(self._evict(state, key) for key in sorted(victims))
        choice = self._place(request, state, contiguous_only=True) or self._place(
            request, state, contiguous_only=False
        )
        assert choice is not None, "eviction was computed to make room"
        return Bound(self._bind(request, state, choice), evicted)

    def _preempt_own(
        self,
        request: Request,
        candidates: list[_IslandState],
        kept: Collection[str],
        kinds: Iterable[AcceleratorKind],
    ) -> Bound | None:
        """Bind a request whose tenant's quota of an island's kind has no room, evicting some of
        the tenant's own strictly lower-priority slices of that kind (anywhere) to make room in
        the quota and, if the island is still too full, strictly lower-priority slices on it
        (any tenant's) to make room there; no victim whose eviction is not needed for one or
        the other. Of the islands where that works, the one evicting the fewest, then the
        lowest highest priority, then the fewest devices (as :meth:`_preempt`).

        ``kinds``: those of ``candidates`` whose quota has no room for the request (islands of
        other kinds are skipped). A tenant holding too little of a kind below the request's
        priority to make room in its quota costs no walk of the islands or of its slices.
        """
        excess = {}
        for kind in kinds:
            needed = self._own_excess(request, kind)
            if needed is not None:
                excess[kind] = needed
        if not excess:
            return None
        one_kind = len(excess) == 1
        own_by_kind: dict[AcceleratorKind, _OwnCandidates] = {}
        best: tuple[tuple[int, int, int, str], _IslandState, list[Binding]] | None = None
        for state in candidates:
            kind = state.inventory.kind
            if kind not in excess or state.inventory.name in kept:
                continue
            # Whether evicting every lower priority on the island could make room for it at
            # all: most islands of a busy fleet are skipped here, before any own slice is read.
            reclaimable = sum(
                devices for priority, devices in state.held.items() if priority < request.priority
            )
            if state.free + reclaimable < request.size:
                continue
            own = own_by_kind.get(kind)
            if own is None:
                own = own_by_kind[kind] = self._own_candidates(request, kind, excess[kind])
            if (
                best is not None
                and best[0][0] == 1
                and not self._one_victim_can(request, state, own, best[0][:3])
            ):
                continue
            found = self._own_decision(request, state, own)
            if found is None:
                continue
            cost = (*found[0], state.inventory.name)
            if best is None or cost < best[0]:
                best = (cost, state, found[1])
                if one_kind and found[0] == own.bound:
                    break  # no island can do better; later islands lose the tie on name
        if best is None:
            return None
        _, state, victims = best
        evicted = tuple(
            self._evict(self._islands[b.island], b.key)
            for b in sorted(victims, key=lambda b: b.key)
        )
        choice = self._place(request, state, contiguous_only=True) or self._place(
            request, state, contiguous_only=False
        )
        assert choice is not None, "eviction was computed to make room"
        return Bound(self._bind(request, state, choice), evicted)

    def _own_excess(self, request: Request, kind: AcceleratorKind) -> int | None:
        """The devices of its own the tenant must free for ``request`` to fit in its quota of
        ``kind`` (which has no room), or ``None`` when evicting all its strictly lower-priority
        slices of that kind would not do: read from per-priority totals, not the slices."""
        key = (request.tenant, kind)
        excess = self._usage.get(key, 0) + request.size - self._quotas[key]
        totals = self._held_priorities.get(key, {})
        if sum(d for priority, d in totals.items() if priority < request.priority) < excess:
            return None
        return excess

    def _own_candidates(
        self, request: Request, kind: AcceleratorKind, excess: int
    ) -> _OwnCandidates:
        """The tenant's own strictly lower-priority slices of ``kind``, found once per request
        (and only once an island could take it)."""
        key = (request.tenant, kind)
        ordered = sorted(
            (
                binding
                for binding in self._held_by[key].values()
                if binding.request.priority < request.priority
            ),
            key=_own_order,
        )
        largest = sorted(ordered, key=_size_order)
        by_island: dict[str, list[Binding]] = {}
        for binding in ordered:
            by_island.setdefault(binding.island, []).append(binding)
        # A lower bound of any decision's cost: at least as many victims as the largest of these
        # slices needed to make room in the quota, of at least their lowest priority, holding at
        # least the excess.
        fewest, freed = 0, 0
        for binding in largest:
            if freed >= excess:
                break
            fewest += 1
            freed += len(binding.devices)
        if fewest == 1:  # then exactly: the cheapest of those making room alone
            bound = min(
                (1, b.request.priority, len(b.devices)) for b in ordered if len(b.devices) >= excess
            )
        else:
            bound = (fewest, ordered[0].request.priority, excess)
        return _OwnCandidates(excess, ordered, largest, by_island, bound)

    def _one_victim_can(
        self, request: Request, state: _IslandState, own: _OwnCandidates, cost: tuple[int, ...]
    ) -> bool:
        """Whether one victim could bind ``request`` on ``state`` at less than ``cost`` (the
        cost of one victim). That victim is one of the tenant's own slices (another's makes no
        room in the quota): anywhere, if the request fits ``state`` as it is; else one on
        ``state`` making room in the quota alone."""
        for binding in own.by_island.get(state.inventory.name, ()):
            size = len(binding.devices)
            if size >= own.excess and (1, binding.request.priority, size) < cost:
                return True
        return own.bound < cost and self._fits(request, state)

    def _own_decision(
        self, request: Request, state: _IslandState, own: _OwnCandidates
    ) -> tuple[tuple[int, int, int], list[Binding]] | None:
        """The victims that bind ``request`` on ``state`` (whose kind's quota has no room), and
        their cost; ``None`` when no eviction can.

        A few orders of taking the tenant's own slices to make room in the quota are tried
        (exhausting them all is exponential): the lowest priority first (those on ``state``
        first at equal priority); those on ``state`` first (they make room there too), the
        lowest priority or the largest first, then the others the lowest priority first; and
        the largest first (the fewest for the quota). Each is completed with the fewest
        strictly lower-priority slices on ``state`` that make room there when it is still too
        full, then stripped of the victims whose eviction turned out not to be needed (no
        victim of the result can be spared); the cheapest result wins."""
        name = state.inventory.name
        here = own.by_island.get(name, [])
        orders: list[Iterable[Binding]] = [_lowest_first(here, own.ordered, name)]
        if here:
            # Lazily: each order stops as soon as the quota has room.
            orders.append(itertools.chain(here, (b for b in own.ordered if b.island != name)))
            if len(here) > 1:
                orders.append(
                    itertools.chain(
                        sorted(here, key=_size_order),
                        (b for b in own.ordered if b.island != name),
                    )
                )
        orders.append(own.largest)
        best: tuple[tuple[int, int, int], list[Binding]] | None = None
        tried: set[frozenset[str]] = set()
        # The fewest victims making room on the island, by the picks on it (orders often differ
        # only in picks elsewhere).
        room: dict[frozenset[str], list[Binding]] = {}
        for order in orders:
            picks = []
            freed = 0
            for binding in order:
                if freed >= own.excess:
                    break
                picks.append(binding)
                freed += len(binding.devices)
            keys = frozenset(b.key for b in picks)
            if keys in tried:
                continue
            tried.add(keys)
            on_island = frozenset(b.key for b in picks if b.island == name)
            more = room.get(on_island)
            if more is None:
                more = []
                if not self._fits(request, state.vacated(on_island)):
                    trial = state.without(on_island)
                    evictable = {
                        key: b
                        for key, b in trial.bindings.items()
                        if b.request.priority < request.priority
                    }
                    fewest = self._fewest_victims(request, trial, evictable)
                    if fewest is None:
                        # Every lower priority on the island, its own among them, is evictable
                        # here whatever the picks: no other way of making room in the quota helps.
                        return None
                    more = [evictable[key] for key in sorted(fewest)]
                room[on_island] = more
            victims = self._needed_only(request, state, picks + more, own.excess)
            cost = _cost(victims)
            if best is None or cost < best[0]:
                best = (cost, victims)
        return best

    def _needed_only(
        self, request: Request, state: _IslandState, victims: list[Binding], excess: int
    ) -> list[Binding]:
        """``victims`` without those whose eviction is not needed, both to make room in the
        tenant's quota (``excess`` devices of its own) and for ``request`` to fit on ``state``:
        each is put back in turn, the highest priority first, then the largest (Kueue's
        fill-back). Eviction only ever makes more room, so a victim that could not be put back
        could not be later either: no victim of the result can be."""
        name = state.inventory.name
        tenant = request.tenant
        chosen = {b.key: b for b in victims}
        freed = sum(len(b.devices) for b in victims if b.request.tenant == tenant)
        for binding in sorted(victims, key=lambda b: (-b.request.priority, -len(b.devices), b.key)):
            own = len(binding.devices) if binding.request.tenant == tenant else 0
            if freed - own < excess:
                continue
            if binding.island == name:
                trial = state.vacated(
                    k for k, b in chosen.items() if b.island == name and k != binding.key
                )
                if not self._fits(request, trial):
                    continue
            del chosen[binding.key]
            freed -= own
        return list(chosen.values())

    def _fits(self, request: Request, state: _IslandState) -> bool:
        """Whether ``request`` can be placed on ``state`` as it is (a block for a shape)."""
        return self._place(request, state, contiguous_only=request.shape is not None) is not None

    def _fewest_victims(
        self, request: Request, state: _IslandState, evictable: dict[str, Binding]
    ) -> set[str] | None:
        if request.shape is None:
            # Any devices will do: evicting the largest lower-priority slices first frees the
            # needed count with the fewest evictions.
            needed = request.size - state.free

            def freed(binding: Binding) -> int:
                return sum(1 for d in binding.devices if not state.unhealthy >> d & 1)

            single = [b for b in evictable.values() if freed(b) >= needed]
            if single:
                chosen = min(single, key=lambda b: (b.request.priority, freed(b), b.key))
                return {chosen.key}
            victims: set[str] = set()
            ordered = sorted(
                evictable.values(), key=lambda b: (-freed(b), b.request.priority, b.key)
            )
            for binding in ordered:
                if needed <= 0:
                    break
                victims.add(binding.key)
                needed -= freed(binding)
            return victims if needed <= 0 else None
        # A contiguous block is freed exactly by evicting every slice overlapping it, so the
        # fewest victims is the minimum over all placements.
        kept = state.unhealthy
        for key in state.bindings:
            if key not in evictable:
                kept |= state.masks[key]
        best: tuple[tuple[int, int, int], set[str]] | None = None
        for orientation in orientations(request.shape, state.inventory.shape):
            table = placement_table(state.inventory.shape, orientation.block)
            for index in free_placements(table, kept):
                mask = table.masks[index]
                # Walk the slices overlapping the block: each step takes the owner of the
                # lowest used device and clears all of that owner's devices.
                owners: set[str] = set()
                overlap = mask & state.occupied
                limit = best[0][0] if best is not None else len(evictable)
                while overlap and len(owners) <= limit:
                    key = state.owners[(overlap & -overlap).bit_length() - 1]
                    owners.add(key)
                    overlap &= ~state.masks[key]
                if overlap:
                    continue
                cost = _victims_cost(owners, evictable)
                if best is None or cost < best[0]:
                    best = (cost, owners)
        return None if best is None else best[1]

    def _evict(self, state: _IslandState, key: str) -> Binding:
        binding = self._bindings.pop(key)
        self._unbind(state, binding)
        return binding

    # -- messages ----------------------------------------------------------------------------

    def _no_island_message(self, request: Request) -> str:
        wanted = []
        if request.kind is not None:
            wanted.append(f"kind {request.kind}")
        if request.island is not None:
            wanted.append(f"name {request.island!r}")
        if request.selector is not None:
            wanted.append("the island selector")
        return f"no island matches {' and '.join(wanted) or 'the request'}"

    def _quota_message(self, request: Request, candidates: list[_IslandState]) -> str:
        kinds = sorted({s.inventory.kind for s in candidates})
        parts = [
            f"{kind}: uses {self.usage(request.tenant, kind)} of {self.quota(request.tenant, kind)}"
            for kind in kinds
        ]
        return (
            f"tenant {request.tenant!r} has no quota left for {request.size} more devices "
            f"({'; '.join(parts)})"
        )

    def _shape_message(self, request: Request, candidates: list[_IslandState]) -> str:
        meshes = sorted({format_shape(s.inventory.shape) for s in candidates})
        wanted = format_shape(request.shape) if request.shape else str(request.size)
        return f"a {wanted} slice does not fit in any matching island (meshes: {', '.join(meshes)})"

    def _busy_message(self, request: Request, candidates: list[_IslandState]) -> str:
        """Why a request waits for devices in use. No count that moves as other slices come
        and go: each move rewrote every waiting slice's status (100 waiting slices took 400
        writes while 5 small ones were bound), and a count from the middle of a pass was
        wrong once it ended. The islands' statuses say what each has free."""
        what = (
            f"a free {format_shape(request.shape)} block; no matching island has one"
            if request.shape
            else f"{request.size} free devices; no matching island has that many"
        )
        # Devices of lost hosts are not free either: said, or "none free" reads as all in use.
        lost = sorted(s.inventory.name for s in candidates if s.unhealthy)
        islands = f"island {lost[0]!r} has" if len(lost) == 1 else f"islands {lost} have"
        unhealthy = f"; devices of lost hosts are not free ({islands} some)" if lost else ""
        return f"needs {what} now{unhealthy}"


def _victims_cost(victims: set[str], evictable: dict[str, Binding]) -> tuple[int, int, int]:
    """Fewest victims first, then the lowest highest priority among them, then fewest devices."""
    return (
        len(victims),
        max((evictable[key].request.priority for key in victims), default=-(2**62)),
        sum(len(evictable[key].devices) for key in victims),
    )


def _cost(victims: list[Binding]) -> tuple[int, int, int]:
    """:func:`_victims_cost` of a list of bindings."""
    return _victims_cost({b.key for b in victims}, {b.key: b for b in victims})


def _own_order(binding: Binding) -> tuple[int, int, str]:
    """The order in which a tenant's own slices are taken to make room in its quota: the lowest
    priority first, then the largest (fewer evictions), then by key."""
    return (binding.request.priority, -len(binding.devices), binding.key)


def _size_order(binding: Binding) -> tuple[int, int, str]:
    """The largest first, then the lowest priority, then by key."""
    return (-len(binding.devices), binding.request.priority, binding.key)


def _lowest_first(here: list[Binding], ordered: list[Binding], island: str) -> Iterator[Binding]:
    """``ordered`` (in :func:`_own_order`) with those on ``island`` (``here``, in the same
    order) moved ahead of the others of their priority, without sorting again."""
    others = (b for b in ordered if b.island != island)
    index = 0
    for binding in others:
        while index < len(here) and here[index].request.priority <= binding.request.priority:
            yield here[index]
            index += 1
        yield binding
    yield from here[index:]


def _ever_fits(request: Request, inventory: IslandInventory) -> bool:
    """Whether the request fits in the island when all its devices are free."""
    if request.shape is not None:
        return bool(orientations(request.shape, inventory.shape))
    return request.size <= inventory.size


@cache
def _count_layouts(count: int, mesh: Shape) -> tuple[tuple[Orientation, ...], ...]:
    # A count request's devices are listed in the row-major order of the block it gets.
    return tuple(
        tuple(Orientation(block, block, tuple(range(len(block)))) for block in group)
        for group in compact_shapes(count, mesh)
    )


def is_block(devices: Sequence[int], block: Shape, mesh: Shape) -> bool:
    """Whether ``devices`` are exactly a ``block`` of ``mesh`` (no wrap-around): an island
    whose topology changed at the same size leaves a bound slice on devices that are not."""
    if len(block) != len(mesh):
        return False
    points = [coordinates(device, mesh) for device in devices]
    extents = tuple(max(axis) - min(axis) + 1 for axis in zip(*points, strict=True))
    return extents == tuple(block) and len(set(points)) == len(devices)
