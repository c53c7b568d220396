"""Island: a group of accelerators joined by a fast interconnect, and the servers that drive it."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator

from pathways_core.accelerators import AcceleratorKind, accelerator_info
from pathways_core.resources.base import (
    DNS_1035_LABEL_PATTERN,
    GROUP_VERSION,
    Conditions,
    FieldError,
    Model,
    NameRule,
    ObjectMeta,
    ResourceRequirements,
    Toleration,
)
from pathways_core.topology import MeshShape, device_count, parse_shape

DEFAULT_IMAGE = "ghcr.io/pathways-k8s/pathways:0.1.0"
ISLAND_NAME = NameRule(
    DNS_1035_LABEL_PATTERN,
    52 - len("-executor"),
    "a lowercase RFC 1035 label (a letter, then a-z, 0-9 and '-')",
    "an island's servers are the Services <name>-scheduler and <name>-executor and the "
    "StatefulSet <name>-executor, whose name, with the hash its pods' revision label adds, "
    "has at most 52 characters",
)


class SchedulingPolicy(StrEnum):
    """How an island's scheduler orders computations of different clients."""

    FIFO = "fifo"
    PROPORTIONAL_SHARE = "proportional-share"


class IslandPlacement(Model):
    """Where and how the island's executor pods run."""

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the executor pods require, added to those the accelerator "
        "kind implies (for example cloud.google.com/gke-tpu-topology).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Tolerations of the executor pods, added to those the accelerator kind "
        "implies (for example google.com/tpu).",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Extra cpu and memory for each executor pod; device requests "
        "(google.com/tpu, nvidia.com/gpu) are set from devicesPerHost.",
    )
    priority_class_name: str | None = Field(
        default=None, description="PriorityClass of the island's pods."
    )
    service_account_name: str | None = Field(
        default=None, description="ServiceAccount the island's pods run as."
    )


class IslandScheduler(Model):
    """Settings of the island's gang scheduler."""

    policy: SchedulingPolicy = Field(
        default=SchedulingPolicy.PROPORTIONAL_SHARE,
        description="fifo runs computations in arrival order; proportional-share divides "
        "device time between clients by their programs' weights.",
    )
    max_queued_computations: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Computations queued before clients are told the island is busy.",
    )
    run_length: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="proportional-share: computations one client may run in a row before "
        "another client's turn. Above 1, tenants' data stays warm in host caches (fake CPU "
        "devices) at the cost of coarser interleaving.",
    )
    trace_records: int = Field(
        default=200_000,  # the scheduler's own default
        ge=1,
        le=10_000_000,
        description="Trace records the scheduler keeps (which computation of which client "
        "ran where and when); past it, the oldest of the client "
        "holding the most go first, and readers of the trace are told whose.",
    )
    executor_timeout_seconds: int = Field(
        default=30,
        ge=2,  # executors beat every second
        le=3600,
        description="An executor that sends nothing, not even its heartbeat (every second), "
        "for this long is taken as lost: its work fails and reads of its buffers end.",
    )


class IslandSpec(Model):
    """The desired island: its accelerators, their topology and how its pods are placed."""

    accelerator_kind: AcceleratorKind = Field(
        description="Kind of accelerator: tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, gpu-a100, "
        "gpu-h100, gpu-h200, gpu-b200, gpu-l4, or cpu-fake (XLA host devices, for kind "
        "clusters and tests)."
    )
    topology: MeshShape = Field(
        description="Shape of the interconnect mesh, such as 4x4 (2-D TPU v5e and v6e) or "
        "2x2x2 (3-D TPU v4 and v5p); its product is the number of devices."
    )
    hosts: int = Field(
        default=1, ge=1, le=4096, description="Number of hosts (executor pods) in the island."
    )
    devices_per_host: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Devices owned by each host; defaults to the topology's device count "
        "divided by hosts.",
    )
    image: str = Field(
        default=DEFAULT_IMAGE, min_length=1, description="Container image of the island's pods."
    )
    placement: IslandPlacement = Field(
        default_factory=IslandPlacement, description="Where the executor pods run."
    )
    scheduler: IslandScheduler = Field(
        default_factory=IslandScheduler, description="The island's gang scheduler."
    )

    @model_validator(mode="after")
    def _check_topology(self) -> Self:
        shape = parse_shape(self.topology)
        info = accelerator_info(self.accelerator_kind)
        if len(shape) not in info.mesh_ranks:
            ranks = " or ".join(f"{rank}-D" for rank in info.mesh_ranks)
            raise FieldError(
                "topology",
                f"topology {self.topology!r} has {len(shape)} axes, but {self.accelerator_kind} "
                f"meshes are {ranks}",
            )
        total = device_count(shape)
        if self.devices_per_host is None:
            if total % self.hosts:
                raise FieldError(
                    "hosts",
                    f"topology {self.topology!r} has {total} devices, which {self.hosts} hosts "
                    "cannot share evenly; set devicesPerHost or change hosts",
                )
        elif self.hosts * self.devices_per_host != total:
            raise FieldError(
                "devicesPerHost",
                f"topology {self.topology!r} has {total} devices but hosts x devicesPerHost is "
                f"{self.hosts} x {self.devices_per_host} = {self.hosts * self.devices_per_host}",
            )
        if self.host_devices > info.max_devices_per_host:
            raise FieldError(
                "devicesPerHost",
                f"{self.host_devices} devices per host exceeds the {info.max_devices_per_host} "
                f"a {self.accelerator_kind} host can have; add hosts",
            )
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        """The topology as a tuple of axis extents."""
        return parse_shape(self.topology)

    @property
    def device_total(self) -> int:
        """Number of devices in the island."""
        return device_count(self.shape)

    @property
    def host_devices(self) -> int:
        """Devices per host, explicit or derived."""
        return self.devices_per_host or self.device_total // self.hosts


class IslandPhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    READY = "Ready"
    DEGRADED = "Degraded"
    TERMINATING = "Terminating"


class IslandStatus(Model):
    """The observed island."""

    phase: IslandPhase | None = Field(
        default=None, description="Pending, Provisioning, Ready, Degraded or Terminating."
    )
    ready_hosts: int | None = Field(default=None, ge=0, description="Executor pods ready.")
    provisioned_hosts: int | None = Field(
        default=None,
        ge=0,
        description="Hosts the island had when it was last Ready: one of them not ready is "
        "lost (Degraded); a host added since is still being provisioned.",
    )
    devices_total: int | None = Field(default=None, ge=0, description="Devices in the island.")
    devices_free: int | None = Field(
        default=None, ge=0, description="Healthy devices bound to no VirtualSlice."
    )
    devices_unhealthy: int | None = Field(
        default=None, ge=0, description="Devices on hosts that are down."
    )
    unhealthy_hosts: list[int] = Field(
        default_factory=list,
        max_length=4096,
        description="Indexes of the hosts whose executor stopped being ready after the island "
        "was Ready; their devices are bound to no slice until they recover.",
    )
    scheduler_endpoint: str | None = Field(
        default=None, description="host:port of the island's gang scheduler (gRPC)."
    )
    conditions: Conditions
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status reflects."
    )


class Island(Model):
    """An island of accelerators: devices joined by a fast interconnect (a TPU slice over ICI,
    the GPUs of one NVLink domain) with one gang scheduler and one executor per host."""

    NAME_RULE: ClassVar[NameRule] = ISLAND_NAME

    api_version: Literal["pathways.dev/v1alpha1"] = GROUP_VERSION
    kind: Literal["Island"] = "Island"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: IslandSpec
    status: IslandStatus = Field(default_factory=IslandStatus)

    @model_validator(mode="after")
    def _check_name(self) -> Self:
        if problem := self.NAME_RULE.problem(self.metadata):
            raise problem
        return self
