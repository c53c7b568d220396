"""Mesh geometry for the allocator tests, written independently of the allocator's own code."""

from __future__ import annotations

Shape = tuple[int, ...]


def coords(device: int, mesh: Shape) -> Shape:
    """Row-major coordinates of a device id in a mesh."""
    out = []
    for extent in reversed(mesh):
        device, c = divmod(device, extent)
        out.append(c)
    return tuple(reversed(out))
