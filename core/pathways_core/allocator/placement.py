"""Geometry of placements: every way a block of devices can sit in an island's mesh.

Occupancy is a bitmask (bit ``d`` is device ``d``, row-major), so checking whether a placement is
free is one ``&`` of two Python integers. The tables of placements are computed once per
(island shape, block shape) and cached.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cache

from pathways_core.topology import Shape, device_id


@dataclass(frozen=True)
class Orientation:
    """A request's virtual shape laid onto the island's axes.

    ``block`` is the physical extent along each island axis; ``axes[k]`` is the virtual axis that
    physical axis ``k`` carries.
    """

    virtual: Shape
    block: Shape
    axes: tuple[int, ...]


@dataclass(frozen=True)
class PlacementTable:
    """All placements of one block shape in one mesh shape.

    For placement ``i``: ``masks[i]`` is the block's devices, ``rings[i]`` the devices adjacent to
    the block outside it, ``boundary[i]`` how many block faces' cells lie on the mesh boundary,
    ``aligned[i]`` whether the origin is a multiple of the block extents (buddy alignment keeps
    large blocks free), and ``origins[i]`` the device at the block's lowest corner.

    How snug placement ``i`` is when ``used`` devices are taken is one integer,
    ``(rings[i] & used).bit_count() * weight + ties[i]``: more of its faces against used devices
    or the mesh boundary first, then alignment, then the lowest origin (the order of the tuple
    ``(touching, aligned, -origin)``, without building one per placement).

    ``mesh_mask`` has a bit per device, ``origin_mask`` a bit per placement's origin, ``index``
    maps an origin to its placement, and ``steps`` holds each axis's (stride, extent) where the
    block spans more than one device: see ``free_placements``.
    """

    masks: tuple[int, ...]
    rings: tuple[int, ...]
    boundary: tuple[int, ...]
    aligned: tuple[bool, ...]
    origins: tuple[int, ...]
    ties: tuple[int, ...]
    weight: int
    mesh_mask: int
    origin_mask: int
    index: dict[int, int]
    steps: tuple[tuple[int, int], ...]


@cache
def orientations(virtual: Shape, mesh: Shape) -> tuple[Orientation, ...]:
    """Ways to lay ``virtual`` onto ``mesh``: padded with unit axes, axes permuted, fitting the
    mesh's extents. The identity layout comes first; duplicates of one block shape are dropped."""
    rank = len(mesh)
    if len(virtual) > rank:
        return ()
    padded = (1,) * (rank - len(virtual)) + tuple(virtual)
    offset = rank - len(virtual)
    seen: set[Shape] = set()
    result = []
    for axes in itertools.permutations(range(rank)):
        block = tuple(padded[axis] for axis in axes)
        if block in seen or any(b > m for b, m in zip(block, mesh, strict=True)):
            continue
        seen.add(block)
        # Virtual axes of the request (unit padding axes map to no virtual axis: -1).
        result.append(Orientation(tuple(virtual), block, tuple(a - offset for a in axes)))
    return tuple(result)


@cache
def compact_shapes(count: int, mesh: Shape) -> tuple[tuple[Shape, ...], ...]:
    """Block shapes of ``count`` devices that fit ``mesh``, grouped from most to least compact
    (smallest sum of extents first)."""
    rank = len(mesh)
    shapes: set[Shape] = set()

    def split(remaining: int, axis: int, prefix: Shape) -> None:
        if axis == rank - 1:
            if remaining <= mesh[axis]:
                shapes.add((*prefix, remaining))
            return
        for extent in range(1, min(remaining, mesh[axis]) + 1):
            if remaining % extent == 0:
                split(remaining // extent, axis + 1, (*prefix, extent))

    split(count, 0, ())
    groups: dict[int, list[Shape]] = {}
    for shape in sorted(shapes):
        groups.setdefault(sum(shape), []).append(shape)
    return tuple(tuple(groups[key]) for key in sorted(groups))


@cache
def placement_table(mesh: Shape, block: Shape) -> PlacementTable:
    """Every placement of ``block`` inside ``mesh`` (no wrap-around).

    Built from whole masks: a placement's devices are the block at the mesh's first device
    shifted by its origin's id (a block inside the mesh never wraps), and its ring is its mask
    moved one step either way along each axis, from the devices that have a neighbour there.
    """
    size = math.prod(mesh)
    first = 0
    for delta in itertools.product(*(range(extent) for extent in block)):
        first |= 1 << device_id(delta, mesh)
    faces = [math.prod(block) // extent for extent in block]
    masks, rings, boundary, aligned, origins = [], [], [], [], []
    for origin in itertools.product(*(range(m - b + 1) for m, b in zip(mesh, block, strict=True))):
        at = device_id(origin, mesh)
        mask = first << at
        ring = 0
        for stride, has_before, has_after in _axis_steps(mesh):
            ring |= (mask & has_before) >> stride | (mask & has_after) << stride
        masks.append(mask)
        rings.append(ring & ~mask)
        boundary.append(
            sum(
                face * ((o == 0) + (o + b == m))
                for face, o, b, m in zip(faces, origin, block, mesh, strict=True)
            )
        )
        aligned.append(all(o % b == 0 for o, b in zip(origin, block, strict=True)))
        origins.append(at)
    # aligned * size + (size - 1 - origin) < weight: a face more always scores higher.
    weight = 2 * size
    ties = tuple(
        touching * weight + is_aligned * size + size - 1 - origin
        for touching, is_aligned, origin in zip(boundary, aligned, origins, strict=True)
    )
    return PlacementTable(
        masks=tuple(masks),
        rings=tuple(rings),
        boundary=tuple(boundary),
        aligned=tuple(aligned),
        origins=tuple(origins),
        ties=ties,
        weight=weight,
        mesh_mask=(1 << size) - 1,
        origin_mask=sum(1 << origin for origin in origins),
        index={origin: i for i, origin in enumerate(origins)},
        steps=tuple(
            (stride, extent)
            for (stride, _, _), extent in zip(_axis_steps(mesh), block, strict=True)
            if extent > 1
        ),
    )


@cache
def _axis_steps(mesh: Shape) -> tuple[tuple[int, int, int], ...]:
    """Per axis of ``mesh``: its stride, and the devices with a neighbour before and after
    along it."""
    size = math.prod(mesh)
    steps = []
    for axis, extent in enumerate(mesh):
        stride = math.prod(mesh[axis + 1 :])
        before = after = 0
        for device in range(size):
            coordinate = device // stride % extent
            if coordinate > 0:
                before |= 1 << device
            if coordinate < extent - 1:
                after |= 1 << device
        steps.append((stride, before, after))
    return tuple(steps)


def free_placements(table: PlacementTable, used: int) -> list[int]:
    """Indexes (ascending) of the placements none of whose devices are in ``used``.

    Found with a few shifts of whole masks instead of testing every placement: after the
    pass over an axis, bit ``d`` is set when the devices ``d``, ``d + stride``, ... up to the
    block's extent along it were all set before it, so after every axis it is set when the
    whole block from origin ``d`` is free. Only origins whose block lies inside the mesh count.
    """
    free = table.mesh_mask & ~used
    for stride, extent in table.steps:
        before = free
        for step in range(1, extent):
            free &= before >> (step * stride)
    return [table.index[origin] for origin in bits(free & table.origin_mask)]


def virtual_order(orientation: Orientation, origin: int, mesh: Shape) -> tuple[int, ...]:
    """Physical device ids of a placed block, listed in the slice's virtual (row-major) order."""
    # Stepping one unit along virtual axis v moves the device id by the stride of the physical
    # axis carrying v.
    strides = [math.prod(mesh[k + 1 :]) for k in range(len(mesh))]
    virtual_strides = [0] * len(orientation.virtual)
    for k, axis in enumerate(orientation.axes):
        if axis >= 0:
            virtual_strides[axis] = strides[k]
    ids = [origin]
    for extent, stride in zip(orientation.virtual, virtual_strides, strict=True):
        ids = [base + step * stride for base in ids for step in range(extent)]
    return tuple(ids)


def bits(mask: int) -> list[int]:
    """Indexes of the set bits of ``mask``, ascending."""
    result = []
    while mask:
        low = mask & -mask
        result.append(low.bit_length() - 1)
        mask ^= low
    return result
