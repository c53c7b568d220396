"""VirtualSlice: a tenant's request for devices, bound by the allocator to one island."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal, Self

from pydantic import Field, model_validator

from pathways_core.accelerators import AcceleratorKind
from pathways_core.resources.base import (
    DNS_SUBDOMAIN_PATTERN,
    GROUP_VERSION,
    Conditions,
    FieldError,
    LabelSelector,
    Model,
    ObjectMeta,
    Priority,
    TenantName,
)
from pathways_core.topology import MeshShape, device_count, parse_shape

MIN_LEASE_SECONDS = 5
MAX_LEASE_SECONDS = 86400
DEFAULT_LEASE_SECONDS = 60
"""The lease of the slices clients make through the API (the SDK, the proxy): how long the
cluster keeps one once its client stops renewing it (killed, frozen or cut off)."""


class SliceRequest(Model):
    """What devices a slice needs: a count or a mesh shape, of a kind, on selected islands."""

    devices: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description="Number of devices. Placed as a compact block when possible.",
    )
    shape: MeshShape | None = Field(
        default=None,
        description="Virtual mesh shape, such as 2x4: the slice gets a contiguous sub-mesh of "
        "one island with this shape (axes may be permuted).",
    )
    accelerator_kind: AcceleratorKind | None = Field(
        default=None, description="Accelerator kind required; any kind when empty."
    )
    island: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description="Name of the one Island to bind on; any island when empty.",
    )
    island_selector: LabelSelector | None = Field(
        default=None, description="Labels the Island must carry."
    )
    time_shared: bool = Field(
        default=False,
        description="Share devices with other time-shared slices of the same size instead of "
        "holding them alone: the island's scheduler divides device time between their "
        "programs by weight (proportional share). Never shares with exclusive slices.",
    )

    def _check_size(self) -> None:
        if self.devices is None and self.shape is None:
            raise FieldError("devices", "set devices (a count) or shape (a mesh such as 2x4)")
        if self.devices is not None and self.shape is not None:
            shaped = device_count(parse_shape(self.shape))
            if shaped != self.devices:
                raise FieldError(
                    "shape",
                    f"devices is {self.devices} but shape {self.shape!r} has {shaped} devices; "
                    "set one of them",
                )

    @property
    def device_total(self) -> int:
        """Number of devices requested."""
        if self.shape is not None:
            return device_count(parse_shape(self.shape))
        assert self.devices is not None
        return self.devices


class VirtualSliceSpec(SliceRequest):
    """The desired slice."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "has(self.devices) || has(self.shape)", "message": "set devices or shape"}
            ]
        }
    }

    tenant: TenantName | None = Field(
        default=None, description="Tenant whose quota is charged; defaults to the namespace."
    )
    priority: Priority = Field(
        default=0, description="Higher priority slices may preempt strictly lower priority ones."
    )
    lease_seconds: int | None = Field(
        default=None,
        ge=MIN_LEASE_SECONDS,
        le=MAX_LEASE_SECONDS,
        description="Release the slice (phase Released, reason LeaseExpired) once its holder "
        "has not renewed it (POST /v1/virtualslices/NAME/renew) for this many seconds, so a "
        "client that dies without deleting it frees its devices. Held until deleted when empty.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        self._check_size()
        return self


class SlicePhase(StrEnum):
    PENDING = "Pending"
    BOUND = "Bound"
    RELEASED = "Released"
    PREEMPTED = "Preempted"


class VirtualSliceStatus(Model):
    """Where the slice is bound, or why it is not."""

    phase: SlicePhase | None = Field(
        default=None, description="Pending, Bound, Released or Preempted."
    )
    island: str | None = Field(default=None, description="Island the slice is bound to.")
    shape: str | None = Field(
        default=None, description="Physical shape of the bound block, such as 4x2."
    )
    devices: list[int] = Field(
        default_factory=list,
        max_length=65536,
        description="Physical device ids of the island (row-major in its topology), in the "
        "slice's virtual order.",
    )
    hosts: list[int] = Field(
        default_factory=list,
        max_length=65536,
        description="Indexes of the island's hosts the devices live on.",
    )
    reason: str | None = Field(
        default=None, description="Why the slice is pending or was preempted (one CamelCase word)."
    )
    message: str | None = Field(default=None, description="Details for humans.")
    bound_time: datetime | None = Field(default=None, description="When the slice was bound.")
    conditions: Conditions
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status reflects."
    )
    placement: str | None = Field(
        default=None,
        max_length=64,
        description="Digest of the spec the binding answers, all but its priority: an edit of "
        "the priority alone keeps the binding.",
    )


class VirtualSlice(Model):
    """A tenant's virtual slice: N devices or a mesh of devices, bound one-to-one to physical
    devices of one island by the global resource manager."""

    api_version: Literal["pathways.dev/v1alpha1"] = GROUP_VERSION
    kind: Literal["VirtualSlice"] = "VirtualSlice"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: VirtualSliceSpec
    status: VirtualSliceStatus = Field(default_factory=VirtualSliceStatus)
