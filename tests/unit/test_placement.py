"""Placement tables (``pathways_core.allocator.placement``): the shortcuts the allocator takes
through them agree with testing every placement one by one."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pathways_core.allocator.placement import free_placements, placement_table


@st.composite
def tables_and_used(draw: st.DrawFn):
    """A mesh of rank 1-3 (up to 512 devices), a block inside it, and devices in use."""
    rank = draw(st.integers(1, 3))
    mesh = tuple(draw(st.integers(1, 8)) for _ in range(rank))
    block = tuple(draw(st.integers(1, extent)) for extent in mesh)
    size = math.prod(mesh)
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0]))
    used = sum(1 << d for d in range(size) if draw(st.floats(0, 1)) < density)
    return placement_table(mesh, block), used


@given(tables_and_used())
def test_free_placements_are_those_that_share_no_device_with_the_used_ones(case) -> None:
    table, used = case
    expected = [i for i, mask in enumerate(table.masks) if not mask & used]
    assert free_placements(table, used) == expected


@given(tables_and_used())
def test_a_placements_score_orders_as_touching_faces_then_alignment_then_lowest_origin(
    case,
) -> None:
    table, used = case
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
