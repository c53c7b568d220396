"""Reconciliation decisions shared by the Kubernetes operator and the embedded mode.

Pure functions from a snapshot of stored resources (plain JSON documents) to what the store
should hold next: slice bindings (:func:`plan_bindings`), island children and status
(:func:`island_children`, :func:`island_status`) and the program lifecycle
(:func:`reconcile_program`), each with the Events of its transitions. No I/O: the caller reads
the snapshot and applies the decision, in the order the decision says.
"""

from pathways_core.control.common import (
    ANNOTATION_SCHEDULER_ENDPOINT,
    ANNOTATION_SPEC_HASH,
    LABEL_ISLAND,
    LABEL_PROGRAM,
    Document,
    Event,
    ObjectRef,
    is_deleting,
    key_of,
    parse,
    timestamp,
)
from pathways_core.control.islands import (
    IslandDecision,
    IslandObservation,
    executor_name,
    external_endpoint,
    island_children,
    island_status,
    scheduler_endpoint,
    scheduler_name,
)
from pathways_core.control.programs import (
    ChildRef,
    ProgramDecision,
    ProgramView,
    child_name_taken,
    connection_settings,
    graph_config_map_name,
    job_name,
    program_job,
    reconcile_program,
    refused_child,
    same_child,
    slice_names,
)
from pathways_core.control.slices import BindingPlan, SliceChange, Stage, plan_bindings

__all__ = [
    "ANNOTATION_SCHEDULER_ENDPOINT",
    "ANNOTATION_SPEC_HASH",
    "LABEL_ISLAND",
    "LABEL_PROGRAM",
    "BindingPlan",
    "ChildRef",
    "Document",
    "Event",
    "IslandDecision",
    "IslandObservation",
    "ObjectRef",
    "ProgramDecision",
    "ProgramView",
    "SliceChange",
    "Stage",
    "child_name_taken",
    "connection_settings",
    "executor_name",
    "external_endpoint",
    "graph_config_map_name",
    "is_deleting",
    "island_children",
    "island_status",
    "job_name",
    "key_of",
    "parse",
    "plan_bindings",
    "program_job",
    "reconcile_program",
    "refused_child",
    "same_child",
    "scheduler_endpoint",
    "scheduler_name",
    "slice_names",
    "timestamp",
]
