"""Requests of the allocator from resources: VirtualSlices and programs' inline slices."""

from __future__ import annotations

from pathways_core.allocator.types import Request
from pathways_core.resources import Model, PathwaysProgram, VirtualSlice

DEFAULT_NAMESPACE = "default"


def program_slice_name(program: str, slice_name: str) -> str:
    """Name of the VirtualSlice created for a program's inline slice (deterministic, so a
    reconcile that runs twice finds what the first created)."""
    return f"{program}-{slice_name}"


def slice_requests(resource: Model) -> list[Request]:
    """The allocator requests a resource makes: one for a VirtualSlice, one per inline slice of
    a PathwaysProgram (slices naming an existing VirtualSlice make none), none otherwise.

    Keys are ``namespace/name`` of the VirtualSlice; the tenant defaults to the namespace.
    """
    if isinstance(resource, VirtualSlice):
        namespace = resource.metadata.namespace or DEFAULT_NAMESPACE
        key = f"{namespace}/{resource.metadata.name}"
        tenant = resource.spec.tenant or namespace
        return [Request.from_spec(key, tenant, resource.spec, resource.spec.priority)]
    if isinstance(resource, PathwaysProgram):
        namespace = resource.metadata.namespace or DEFAULT_NAMESPACE
        tenant = resource.spec.tenant or namespace
        return [
            Request.from_spec(
                f"{namespace}/{program_slice_name(resource.metadata.name or '', item.name)}",
                tenant,
                item,
                resource.spec.priority,
            )
            for item in resource.spec.slices
            if item.virtual_slice_name is None
        ]
    return []
