"""Who may bind what: each tenant's namespaces, highest priority and devices.

Through the REST API a tenant's objects live in its namespace, and the API checks its
priority and quota. With kubectl nothing stands between a user and ``spec.tenant`` or
``spec.priority``: anyone who may create a VirtualSlice in a namespace could charge another
tenant's quota, or preempt every other tenant with the highest priority. So binding checks
them too, against the operator's tenant policy (``PATHWAYS_TENANTS``, the chart's
``operator.tenants``):

- a tenant is named only from its namespaces (by default, the namespace of its own name):
  ``spec.tenant`` names another tenant only where that tenant lists the namespace;
- a tenant's slices ask for at most its ``maxPriority``;
- a tenant holds at most ``devices[kind]`` devices of each accelerator kind.

Tenants not listed follow the ``"*"`` entry (no limits when there is none). A slice refused
waits, saying which field is at fault; one already bound keeps its devices (a policy made
stricter evicts nothing) but defends them only at its tenant's highest priority.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from pathways_core.accelerators import AcceleratorKind
from pathways_core.resources.base import MAX_PRIORITY, DnsLabel
from pathways_core.wire.credentials import SessionGrant

DEFAULT = "*"
"""The entry tenants not listed follow."""


class _Entry(BaseModel):
    """One tenant's policy as it is written."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # Strict: JSON's true or "100" are no priority or count (the chart's schema agrees).
    namespaces: list[DnsLabel] | None = None
    max_priority: Annotated[StrictInt, Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)] | None = Field(
        None, alias="maxPriority"
    )
    devices: dict[AcceleratorKind, Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=dict)


@dataclass(frozen=True)
class TenantPolicy:
    """One tenant's limits; ``namespaces`` empty means the namespace of the tenant's name."""

    namespaces: tuple[str, ...] = ()
    max_priority: int | None = None
    devices: Mapping[AcceleratorKind, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """Why a slice may not be bound: the condition reason, and a message naming the field."""

    reason: str
    message: str


@dataclass(frozen=True)
class Tenants:
    """The tenant policy: listed tenants, and the ``"*"`` entry for the others."""

    listed: Mapping[str, TenantPolicy] = field(default_factory=dict)
    default: TenantPolicy = TenantPolicy()

    @classmethod
    def from_wire(cls, raw: Any) -> Tenants:
        """Read ``{"team-a": {"namespaces": [...], "maxPriority": 100, "devices":
        {"tpu-v5e": 64}}, "*": {...}}``; a ValueError names the entry and field at fault."""
        if not isinstance(raw, Mapping):
            raise ValueError(
                'expected a mapping of tenants, like {"team-a": {"maxPriority": 100}}, got '
                f"{type(raw).__name__}"
            )
        listed: dict[str, TenantPolicy] = {}
        default = TenantPolicy()
        for name, value in raw.items():
            if not isinstance(name, str) or not 1 <= len(name) <= 63:
                raise ValueError(f"{name!r}: expected a tenant name of 1 to 63 characters")
            if not isinstance(value, Mapping | None):
                raise ValueError(
                    f"{name}: expected a mapping of namespaces, maxPriority and devices, got "
                    f"{type(value).__name__}"
                )
            try:
                entry = _Entry.model_validate(value or {})
            except ValidationError as error:
                problem = error.errors()[0]
                parts = (name, *(p for p in problem["loc"] if p != "[key]"))
                where = ".".join(str(part) for part in parts)
                raise ValueError(f"{where}: {problem['msg']}") from None
            if name == DEFAULT and entry.namespaces is not None:
                raise ValueError(
                    f"{DEFAULT}.namespaces: the entry of tenants not listed has none (each "
                    "such tenant is named from the namespace of its own name)"
                )
            policy = TenantPolicy(
                tuple(entry.namespaces or ()), entry.max_priority, dict(entry.devices)
            )
            if name == DEFAULT:
                default = policy
            else:
                listed[name] = policy
        return cls(listed, default)

    def policy(self, tenant: str) -> TenantPolicy:
        """The limits ``tenant`` follows."""
        return self.listed.get(tenant, self.default)

    def namespaces(self, tenant: str) -> tuple[str, ...]:
        """The namespaces whose objects may name ``tenant``."""
        return self.policy(tenant).namespaces or (tenant,)

    def refusal(self, namespace: str, tenant: str, priority: int) -> Refusal | None:
        """Why a slice of ``namespace`` for ``tenant`` at ``priority`` may not be bound, or
        ``None`` when it may."""
        allowed = self.namespaces(tenant)
        if namespace not in allowed:
            return Refusal(
                "TenantNotAllowed",
                f"spec.tenant: tenant {_quoted(tenant)} may be named only from namespace(s) "
                f"{', '.join(map(_quoted, allowed))}, not {_quoted(namespace)}; leave "
                "spec.tenant out to be the namespace's own tenant, or ask the cluster's "
                "administrators to list this namespace under the tenant (operator.tenants)",
            )
        highest = self.policy(tenant).max_priority
        if highest is not None and priority > highest:
            return Refusal(
                "PriorityNotAllowed",
                f"spec.priority: {priority} is above {highest}, the highest priority of tenant "
                f"{_quoted(tenant)}; lower it to {highest} or less",
            )
        return None

    def capped(self, tenant: str, priority: int) -> int:
        """``priority``, at most ``tenant``'s highest."""
        highest = self.policy(tenant).max_priority
        return priority if highest is None else min(priority, highest)

    def held_to(self, grant: SessionGrant, namespace: str) -> SessionGrant:
        """A run's session ``grant`` as the policy lets a program of ``namespace`` have it: its
        tenant only if the namespace may name it (else the namespace's own), at most that
        tenant's highest priority. (A program's spec.tenant and spec.priority are checked
        where its slices are bound, not when it names a slice bound already.)"""
        tenant = grant.tenant if namespace in self.namespaces(grant.tenant) else namespace
        return replace(grant, tenant=tenant, priority=self.capped(tenant, grant.priority))

    def quotas(self, tenants: Iterable[str]) -> dict[tuple[str, AcceleratorKind], int]:
        """The allocator's device quotas of ``tenants``, by accelerator kind."""
        return {
            (tenant, kind): limit
            for tenant in set(tenants)
            for kind, limit in self.policy(tenant).devices.items()
        }


def _quoted(name: str) -> str:
    """A name in messages, in single quotes as is (the admission policy's CEL says the same)."""
    return f"'{name}'"
