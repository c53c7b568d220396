"""The global allocator: topology-aware, all-or-nothing binding of virtual slices to devices."""

from pathways_core.allocator.allocator import Allocator, is_block
from pathways_core.allocator.resources import program_slice_name, slice_requests
from pathways_core.allocator.types import (
    Binding,
    Bound,
    Decision,
    IslandInventory,
    Pending,
    Rejected,
    Request,
)

__all__ = [
    "Allocator",
    "Binding",
    "Bound",
    "Decision",
    "IslandInventory",
    "Pending",
    "Rejected",
    "Request",
    "is_block",
    "program_slice_name",
    "slice_requests",
]
