"""Placement tables (``pathways_core.allocator.placement``): the shortcuts the allocator takes
through them agree with testing every placement one by one."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from pathways_core.allocator.placement import free_placements, placement_table
from pathways_core.topology import device_id


@st.composite
def tables_and_used(draw: st.DrawFn):
    """A mesh of rank 1-3 (up to 512 devices), a block inside it, and devices in use."""
    rank = draw(st.integers(1, 3))
    mesh = tuple(draw(st.integers(1, 8)) for _ in range(rank))
    block = tuple(draw(st.integers(1, extent)) for extent in mesh)
    size = math.prod(mesh)
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0]))
    used = sum(1 << d for d in range(size) if draw(st.floats(0, 1)) < density)
    return mesh, block, placement_table(mesh, block), used


@given(tables_and_used())
def test_each_placement_holds_its_blocks_cells_and_its_ring_the_cells_next_to_them(case) -> None:
    mesh, block, table, _ = case
    origins = itertools.product(*(range(m - b + 1) for m, b in zip(mesh, block, strict=True)))
    for index, origin in enumerate(origins):
        cells = {
            tuple(o + d for o, d in zip(origin, delta, strict=True))
            for delta in itertools.product(*map(range, block))
        }
        neighbours = {
            (*cell[:axis], cell[axis] + step, *cell[axis + 1 :])
            for cell in cells
            for axis in range(len(mesh))
            for step in (-1, 1)
            if 0 <= cell[axis] + step < mesh[axis]
        }
        assert table.origins[index] == device_id(origin, mesh)
        assert table.masks[index] == sum(1 << device_id(c, mesh) for c in cells)
        assert table.rings[index] == sum(1 << device_id(c, mesh) for c in neighbours - cells)


@given(tables_and_used())
def test_free_placements_are_those_that_share_no_device_with_the_used_ones(case) -> None:
    _, _, table, used = case
    expected = [i for i, mask in enumerate(table.masks) if not mask & used]
    assert free_placements(table, used) == expected


@given(tables_and_used())
def test_a_placements_score_orders_as_touching_faces_then_alignment_then_lowest_origin(
    case,
) -> None:
    _, _, table, used = case
    by_score = sorted(
        range(len(table.masks)),
        key=lambda i: (table.rings[i] & used).bit_count() * table.weight + table.ties[i],
    )
    by_tuple = sorted(
        range(len(table.masks)),
        key=lambda i: (
            (table.rings[i] & used).bit_count() + table.boundary[i],
            table.aligned[i],
            -table.origins[i],
        ),
    )
    assert by_score == by_tuple
