"""What the allocator takes and gives: islands, requests, bindings and decisions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from pathways_core.accelerators import AcceleratorKind
from pathways_core.resources import Island, LabelSelector, SliceRequest
from pathways_core.topology import Shape, device_count, parse_shape


@dataclass(frozen=True)
class IslandInventory:
    """An island as the allocator sees it: a mesh of devices of one kind, some unhealthy."""

    name: str
    kind: AcceleratorKind
    shape: Shape
    devices_per_host: int
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    unhealthy: frozenset[int] = frozenset()

    @cached_property
    def size(self) -> int:
        return device_count(self.shape)

    def host_of(self, device: int) -> int:
        """Index of the host owning a device (hosts own consecutive row-major device ids)."""
        return device // self.devices_per_host

    @classmethod
    def from_island(cls, island: Island) -> IslandInventory:
        """The inventory of an Island resource (all devices healthy)."""
        if island.metadata.name is None:
            raise ValueError("an Island needs metadata.name")
        spec = island.spec
        return cls(
            name=island.metadata.name,
            kind=spec.accelerator_kind,
            shape=spec.shape,
            devices_per_host=spec.host_devices,
            labels=MappingProxyType(dict(island.metadata.labels)),
        )


@dataclass(frozen=True)
class Request:
    """A request for devices. ``key`` names the slice (``namespace/name``); exactly one of
    ``count`` and ``shape`` is set."""

    key: str
    tenant: str
    count: int | None = None
    shape: Shape | None = None
    kind: AcceleratorKind | None = None
    island: str | None = None
    selector: LabelSelector | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.count is None) == (self.shape is None):
            raise ValueError("a request has exactly one of count and shape")
        if self.size < 1:
            raise ValueError("a request needs at least one device")

    @cached_property
    def size(self) -> int:
        """Number of devices requested."""
        return self.count if self.shape is None else device_count(self.shape)  # type: ignore[return-value]

    def admits(self, island: IslandInventory) -> bool:
        """Whether the request may be placed on this island (kind, name and labels)."""
        return (
            (self.kind is None or self.kind == island.kind)
            and (self.island is None or self.island == island.name)
            and (self.selector is None or self.selector.matches(dict(island.labels)))
        )

    @classmethod
    def from_spec(cls, key: str, tenant: str, spec: SliceRequest, priority: int = 0) -> Request:
        """The request of a VirtualSlice spec (or a program's inline slice)."""
        shape = parse_shape(spec.shape) if spec.shape is not None else None
        return cls(
            key=key,
            tenant=tenant,
            count=None if shape is not None else spec.devices,
            shape=shape,
            kind=spec.accelerator_kind,
            island=spec.island,
            selector=spec.island_selector,
            priority=priority,
        )


@dataclass(frozen=True)
class Binding:
    """A request bound to devices of one island, listed in the slice's virtual order.

    ``block`` is the physical shape of the contiguous block, or ``None`` when a count request
    could only be placed on scattered devices.
    """

    request: Request
    island: str
    devices: tuple[int, ...]
    block: Shape | None

    @property
    def key(self) -> str:
        return self.request.key


@dataclass(frozen=True)
class Bound:
    """The request was bound; ``preempted`` lists bindings evicted to make room."""

    binding: Binding
    preempted: tuple[Binding, ...] = ()


@dataclass(frozen=True)
class Pending:
    """The request stays unbound: ``reason`` is one CamelCase word, ``message`` says why."""

    key: str
    reason: str
    message: str


Decision = Bound | Pending


@dataclass(frozen=True)
class Rejected:
    """A binding refused while restoring state, and why."""

    binding: Binding
    message: str
