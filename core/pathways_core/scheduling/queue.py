"""The island queue: one consistent order for every computation of an island.

Clients submit computations; the queue decides which runs next. Order within a client is always
kept (a computation may consume the outputs of the client's earlier ones, so dependencies always
point backwards in the island order and gang scheduling cannot deadlock). Between clients:

- ``fifo``: arrival order;
- ``proportional-share``: stride scheduling. Each client has a *pass*; the client with the lowest
  pass goes next and its pass advances by ``cost / weight``, so over time clients get cost in
  proportion to their weights (1:2:4:8 gives 1/15, 2/15, 4/15, 8/15): device time when an
  item's cost is its device time (the island charges its function's measured device time,
  priced by ``price`` when the item is taken, not when it was queued: work queued long ago
  pays what its function costs now; see :mod:`pathways_core.scheduling.costs`). A client
  that was idle rejoins at the current virtual time of its priority, so it cannot claim the
  time it did not use; that time is the lowest pass of the clients of that priority with work
  queued when one was last taken (not the pass of the one taken: a run's holder, or a higher
  priority's burst, raised it past clients still waiting, and a newcomer then waited behind
  them for as long as the run or the burst had lasted). With a
  ``run_length`` above 1 the client chosen keeps the devices for up to that many consecutive
  items of work (free items, such as the buffer deletions between a chain's computations, do
  not count; its pass still advances by each item, so shares over time are unchanged, but a share
  measured over a short stretch is off by up to one run). A tenant's next computation usually
  reads what its last one wrote: on fake CPU devices, whose arrays are host memory, switching
  tenants at every item had eight tenants evict each other's arrays from the host's caches
  (see benchmarks/RESULTS.md). The default, 1, interleaves item by item.

A free item goes right after the item of its client taken before it, whatever the policy: a
chain's buffer deletion then reaches the executor with the computation that reads the buffer
last, which takes the buffer over for its output (as one client alone does), instead of a turn
later.

Strictly higher priority always goes first, under both policies. The queue only orders: the
scheduler server decides when to take the next item (it bounds the work in flight), and which
items are *held* (work reading another island's buffers not made yet): a client whose next
item is held is passed over, its order kept, until it no longer is (and, as an idle client,
claims none of the time the others ran meanwhile). Islands order work on
their own, so executors waiting in island order for another island's work could wait on each
other; held work waits in the queue instead, holding no executor.

The queue is bounded twice: at most ``max_queued`` items in all, and at most
``max_queued_per_client`` of one client (so one client flooding the island cannot fill the whole
queue); and clients added with their tenant (their sessions' credentials name it) at most
``max_queued_per_tenant`` together (by default half the queue: many sessions of made-up names
fill no more than that, and other tenants' work always finds room); beyond any,
``submit`` raises :class:`QueueFull` and takes nothing. Items submitted with
``bounded=False`` (buffer deletions: tiny, and refusing them would leak memory) are never
refused and do not count against the bounds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

Item = TypeVar("Item")


DEFAULT_RUN_LENGTH = 1


class Policy(StrEnum):
    FIFO = "fifo"
    PROPORTIONAL_SHARE = "proportional-share"


class QueueFull(Exception):
    """The island (``per_client`` false), this client (``per_client`` true) or its tenant's
    clients together (``tenant`` set) hold as many queued items as they may (``limit``); the
    client should retry later."""

    def __init__(
        self, client: str, queued: int, limit: int, per_client: bool, tenant: str | None = None
    ) -> None:
        whose = f"client {client!r} already queues" if per_client else "the island already queues"
        which = "the per-client limit" if per_client else "the limit"
        if per_client and tenant is not None:
            whose = f"the clients of tenant {tenant!r} already queue"
            which = "the per-tenant limit"
        super().__init__(f"{whose} {queued} items, {which}")
        self.client, self.queued, self.limit, self.per_client = client, queued, limit, per_client
        self.tenant = tenant


@dataclass
class TenantCount:
    """Items of one tenant's clients that count against the per-tenant bound."""

    name: str
    bounded: int = 0
    clients: int = 0


class UnknownClient(KeyError):
    """A client submitted before saying hello."""


@dataclass
class ClientState(Generic[Item]):
    name: str
    weight: int
    priority: int
    # arrival, item, cost, bounded
    pending: deque[tuple[int, Item, float, bool]] = field(default_factory=deque)
    pass_value: float = 0.0
    bounded: int = 0  # pending items that count against the bounds
    group: TenantCount | None = None  # its tenant's count, with a tenant


class IslandQueue(Generic[Item]):
    """Orders items of many clients by a policy; see the module docstring."""

    def __init__(
        self,
        policy: Policy | str = Policy.FIFO,
        max_queued: int = 4096,
        max_queued_per_client: int | None = None,
        run_length: int = DEFAULT_RUN_LENGTH,
        price: Callable[[Item], float] | None = None,
        max_queued_per_tenant: int | None = None,
    ) -> None:
        """``price``, if given, is an item's cost when it is taken (instead of the cost it
        was submitted with); free items (submitted at no cost) stay free."""
        if max_queued < 1:
            raise ValueError(f"max_queued must be >= 1 (got {max_queued})")
        if run_length < 1:
            raise ValueError(f"run_length must be >= 1 (got {run_length})")
        if max_queued_per_client is not None and max_queued_per_client < 1:
            raise ValueError(f"max_queued_per_client must be >= 1 (got {max_queued_per_client})")
        self.policy = Policy(policy)
        self.max_queued = max_queued
        self.max_queued_per_client = min(max_queued, max_queued_per_client or max_queued)
        if max_queued_per_tenant is not None and max_queued_per_tenant < 1:
            raise ValueError(f"max_queued_per_tenant must be >= 1 (got {max_queued_per_tenant})")
        self.max_queued_per_tenant = min(
            max_queued,
            max_queued_per_tenant or max(self.max_queued_per_client, max_queued // 2),
        )
        self._clients: dict[str, ClientState[Item]] = {}
        self._tenants: dict[str, TenantCount] = {}
        self._arrivals = 0
        self._queued = 0
        self._bounded = 0
        self._virtual_time: dict[int, float] = {}  # per priority
        # Clients per priority: a priority's virtual time goes with its last client (one entry
        # per priority ever served otherwise).
        self._at_priority: dict[int, int] = {}
        self.run_length = run_length
        self._last: ClientState[Item] | None = None  # the client of the current run
        self._run = 0  # items of work it took in a row
        self._price = price

    @property
    def queued(self) -> int:
        """Items waiting."""
        return self._queued

    def queued_by(self, client: str) -> int:
        """Items of ``client`` waiting that count against the bounds."""
        state = self._clients.get(client)
        return 0 if state is None else state.bounded

    def weights(self) -> dict[str, int]:
        """Each client's weight."""
        return {name: state.weight for name, state in self._clients.items()}

    def last(self, client: str) -> Item | None:
        """The client's most recently submitted item still waiting, if any."""
        state = self._clients.get(client)
        return state.pending[-1][1] if state is not None and state.pending else None

    def waiting(self) -> Iterator[tuple[str, Item]]:
        """Every item waiting, with its client (in no particular order)."""
        for state in self._clients.values():
            for _, item, _, _ in state.pending:
                yield state.name, item

    def add_client(
        self, name: str, weight: int = 1, priority: int = 0, tenant: str | None = None
    ) -> None:
        """Register a client (or update its weight and priority: it keeps how far it ran
        ahead of its priority's virtual time, as device time, at the new one's). Clients of
        one ``tenant`` share the per-tenant bound (the tenant is set when a client is added)."""
        if weight < 1:
            raise ValueError(f"weight must be >= 1 (got {weight})")
        state = self._clients.get(name)
        if state is None:
            now = self._virtual_time.get(priority, 0.0)
            state = self._clients[name] = ClientState(name, weight, priority, pass_value=now)
            if tenant is not None:
                group = self._tenants.get(tenant)
                if group is None:
                    group = self._tenants[tenant] = TenantCount(tenant)
                group.clients += 1
                state.group = group
            self._at_priority[priority] = self._at_priority.get(priority, 0) + 1
        elif (weight, priority) != (state.weight, state.priority):
            # Each priority has its own virtual time, and a pass means something against its
            # own: kept as it was, a client raised to a priority whose time ran far ahead
            # took the devices for as long (or, behind, waited as long). What carries over is
            # how far it ran ahead of its priority (never a credit: behind, it was idle, and
            # an idle client rejoins at the virtual time), as device time: rescaled to the
            # new weight (as stride scheduling does, Waldspurger & Weihl 1995), or a client
            # that ran a long item at a high weight and then lowered it ran the next one as
            # cheaply.
            ahead = state.pass_value - self._virtual_time.get(state.priority, 0.0)
            now = self._virtual_time.get(priority, 0.0)
            state.pass_value = now + max(0.0, ahead) * state.weight / weight
            if priority != state.priority:
                self._leave_priority(state.priority)
                self._at_priority[priority] = self._at_priority.get(priority, 0) + 1
            state.weight, state.priority = weight, priority

    def _leave_priority(self, priority: int) -> None:
        left = self._at_priority[priority] - 1
        if left:
            self._at_priority[priority] = left
        else:  # no client left to compare passes with: a newcomer starts anew
            del self._at_priority[priority]
            self._virtual_time.pop(priority, None)

    def remove_client(self, name: str) -> list[Item]:
        """Forget a client; returns its items that never ran."""
        state = self._clients.pop(name, None)
        if state is None:
            return []
        self._leave_priority(state.priority)
        if state is self._last:
            self._last = None
        self._queued -= len(state.pending)
        self._bounded -= state.bounded
        group = state.group
        if group is not None:
            group.bounded -= state.bounded
            group.clients -= 1
            if not group.clients:
                del self._tenants[group.name]
        return [item for _, item, _, _ in state.pending]

    def submit(self, client: str, item: Item, cost: float = 1.0, bounded: bool = True) -> None:
        """Queue an item behind the client's earlier ones. Raises ``QueueFull`` when the client
        holds ``max_queued_per_client`` items, its tenant's clients ``max_queued_per_tenant``
        or the island ``max_queued`` (unless ``bounded`` is false), ``UnknownClient`` before
        ``add_client``."""
        state = self._clients.get(client)
        if state is None:
            raise UnknownClient(client)
        if bounded:
            if self._bounded >= self.max_queued:
                raise QueueFull(client, self._bounded, self.max_queued, False)
            if state.bounded >= self.max_queued_per_client:
                raise QueueFull(client, state.bounded, self.max_queued_per_client, True)
            group = state.group
            if group is not None and group.bounded >= self.max_queued_per_tenant:
                limit = self.max_queued_per_tenant
                raise QueueFull(client, group.bounded, limit, True, group.name)
        if not state.pending:
            # An idle client rejoins at the current virtual time of its priority.
            now = self._virtual_time.get(state.priority, 0.0)
            state.pass_value = max(state.pass_value, now)
        state.pending.append((self._arrivals, item, cost, bounded))
        self._arrivals += 1
        self._queued += 1
        if bounded:
            state.bounded += 1
            if state.group is not None:
                state.group.bounded += 1
            self._bounded += 1

    def next(self, held: Callable[[Item], bool] | None = None) -> tuple[str, Item] | None:
        """Take the item that runs next, or ``None`` when nothing is queued (or all that is
        queued is held: clients whose next item ``held`` says is are passed over)."""
        free = self.next_free()
        if free is not None:
            return free
        ready = []
        for state in self._clients.values():
            if not state.pending:
                continue
            if held is not None and held(state.pending[0][1]):
                # Held is idle: as an idle client rejoins, it claims none of the time the
                # others ran meanwhile (released, it took the devices for as long).
                now = self._virtual_time.get(state.priority, 0.0)
                state.pass_value = max(state.pass_value, now)
                continue
            ready.append(state)
        if not ready:
            return None
        top = max(state.priority for state in ready)
        ready = [state for state in ready if state.priority == top]
        if self.policy is Policy.FIFO:
            chosen = min(ready, key=lambda s: s.pending[0][0])
        else:
            chosen = min(ready, key=lambda s: (s.pass_value, s.pending[0][0]))
            now = self._virtual_time.get(top, 0.0)
            self._virtual_time[top] = max(now, chosen.pass_value)  # the lowest waiting pass
            last = self._last
            # ``ready`` holds the top priority only: a higher one ends the run.
            if self._run < self.run_length and any(state is last for state in ready):
                chosen = last
        return self._take(chosen)

    def next_free(self) -> tuple[str, Item] | None:
        """Take the free item (of no cost) queued right behind the item taken last, if there
        is one: it goes at once, whatever the policy and priorities, as it takes no device
        time. A chain's buffer deletion then travels with the computation that reads the
        buffer last, which may take the buffer over for its output."""
        last = self._last
        if last is None or not last.pending or last.pending[0][2] > 0:
            return None
        return self._take(last)

    def _take(self, chosen: ClientState[Item]) -> tuple[str, Item]:
        _, item, cost, bounded = chosen.pending.popleft()
        if cost > 0 and self._price is not None:
            cost = self._price(item)
        # A run is of work: free items (a chain's buffer deletions, one per computation) do
        # not count toward it, or a chain's runs would hold half the computations asked for.
        self._run = (self._run if chosen is self._last else 0) + int(cost > 0)
        self._last = chosen
        chosen.pass_value += cost / chosen.weight
        self._queued -= 1
        if bounded:
            chosen.bounded -= 1
            if chosen.group is not None:
                chosen.group.bounded -= 1
            self._bounded -= 1
        return chosen.name, item
