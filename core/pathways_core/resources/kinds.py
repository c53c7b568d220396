"""The registry of our resource kinds: names, scope and printer columns of each."""

from __future__ import annotations

from dataclasses import dataclass

from pathways_core.resources.base import Model
from pathways_core.resources.island import Island
from pathways_core.resources.program import PathwaysProgram
from pathways_core.resources.virtual_slice import VirtualSlice

CATEGORY = "pathways"


@dataclass(frozen=True)
class PrinterColumn:
    """A column of ``kubectl get``."""

    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclass(frozen=True)
class KindInfo:
    """How one kind is named and shown in the Kubernetes API."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    namespaced: bool
    model: type[Model]
    printer_columns: tuple[PrinterColumn, ...]

    @property
    def singular(self) -> str:
        return self.kind.lower()


_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")

KINDS: dict[str, KindInfo] = {
    info.kind: info
    for info in (
        KindInfo(
            kind="Island",
            plural="islands",
            short_names=("isl",),
            # Islands are shared infrastructure, like nodes: cluster-scoped.
            namespaced=False,
            model=Island,
            printer_columns=(
                PrinterColumn(
                    "Accelerator", ".spec.acceleratorKind", description="Accelerator kind"
                ),
                PrinterColumn("Topology", ".spec.topology", description="Interconnect mesh"),
                PrinterColumn("Hosts", ".spec.hosts", "integer", "Executor hosts"),
                PrinterColumn("Ready", ".status.readyHosts", "integer", "Hosts ready"),
                PrinterColumn("Free", ".status.devicesFree", "integer", "Devices free"),
                PrinterColumn("Phase", ".status.phase", description="Island phase"),
                PrinterColumn("Scheduler", ".status.schedulerEndpoint", priority=1),
                _AGE,
            ),
        ),
        KindInfo(
            kind="VirtualSlice",
            plural="virtualslices",
            short_names=("vs", "vslice"),
            namespaced=True,
            model=VirtualSlice,
            printer_columns=(
                PrinterColumn("Devices", ".spec.devices", "integer", "Devices requested"),
                PrinterColumn("Shape", ".spec.shape", description="Mesh shape requested"),
                PrinterColumn("Accelerator", ".spec.acceleratorKind"),
                PrinterColumn("Priority", ".spec.priority", "integer"),
                PrinterColumn("Phase", ".status.phase"),
                PrinterColumn("Island", ".status.island", description="Island bound to"),
                PrinterColumn("Reason", ".status.reason", priority=1),
                _AGE,
            ),
        ),
        KindInfo(
            kind="PathwaysProgram",
            plural="pathwaysprograms",
            short_names=("pwp", "pprog"),
            namespaced=True,
            model=PathwaysProgram,
            printer_columns=(
                PrinterColumn("Phase", ".status.phase"),
                PrinterColumn("Steps", ".spec.steps", "integer", "Steps requested"),
                PrinterColumn("Done", ".status.completedSteps", "integer", "Steps completed"),
                PrinterColumn("Restarts", ".status.restarts", "integer"),
                PrinterColumn("Priority", ".spec.priority", "integer", priority=1),
                PrinterColumn("Reason", ".status.reason", priority=1),
                _AGE,
            ),
        ),
    )
}
