"""The resource models: Island, VirtualSlice and PathwaysProgram (API group pathways.dev)."""

from pathways_core.resources.base import (
    API_GROUP,
    API_VERSION,
    GROUP_VERSION,
    Condition,
    ConditionStatus,
    FieldError,
    LabelSelector,
    Model,
    ObjectMeta,
)
from pathways_core.resources.island import (
    Island,
    IslandPhase,
    IslandSpec,
    IslandStatus,
    SchedulingPolicy,
)
from pathways_core.resources.kinds import CATEGORY, KINDS, KindInfo, PrinterColumn
from pathways_core.resources.program import (
    PathwaysProgram,
    PathwaysProgramSpec,
    PathwaysProgramStatus,
    ProgramPhase,
    RestartPolicy,
)
from pathways_core.resources.virtual_slice import (
    SlicePhase,
    SliceRequest,
    VirtualSlice,
    VirtualSliceSpec,
    VirtualSliceStatus,
)

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "CATEGORY",
    "GROUP_VERSION",
    "KINDS",
    "Condition",
    "ConditionStatus",
    "FieldError",
    "Island",
    "IslandPhase",
    "IslandSpec",
    "IslandStatus",
    "KindInfo",
    "LabelSelector",
    "Model",
    "ObjectMeta",
    "PathwaysProgram",
    "PathwaysProgramSpec",
    "PathwaysProgramStatus",
    "PrinterColumn",
    "ProgramPhase",
    "RestartPolicy",
    "SchedulingPolicy",
    "SlicePhase",
    "SliceRequest",
    "VirtualSlice",
    "VirtualSliceSpec",
    "VirtualSliceStatus",
]
