"""Mesh shapes: parsing, formatting and coordinates of devices in an island's mesh.

A mesh shape is written ``4x4`` or ``2x2x2``: the extent of each axis of an island's
interconnect or of a slice's virtual mesh. Devices are numbered in row-major order of the mesh
(the last axis varies fastest), which is also the order in which they are split among hosts.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, Field

MESH_SHAPE_PATTERN = r"^[1-9][0-9]{0,3}(x[1-9][0-9]{0,3}){0,2}$"
_MESH_SHAPE_RE = re.compile(MESH_SHAPE_PATTERN)

Shape = tuple[int, ...]


def parse_shape(text: str) -> Shape:
    """Parse ``"2x4"`` into ``(2, 4)``; raise ``ValueError`` naming what was expected."""
    if not isinstance(text, str) or not _MESH_SHAPE_RE.match(text):
        raise ValueError(
            f"expected a mesh shape of 1 to 3 positive integers joined by 'x', such as "
            f"'8', '4x4' or '2x2x2' (got {text!r})"
        )
    return tuple(int(part) for part in text.split("x"))


def format_shape(shape: Shape) -> str:
    """Format ``(2, 4)`` as ``"2x4"``."""
    return "x".join(str(extent) for extent in shape)


def device_count(shape: Shape) -> int:
    """Number of devices in a mesh of this shape."""
    return math.prod(shape)


def coordinates(device: int, shape: Shape) -> Shape:
    """Mesh coordinates of a device id (row-major)."""
    coords = []
    for extent in reversed(shape):
        device, coord = divmod(device, extent)
        coords.append(coord)
    return tuple(reversed(coords))


def device_id(coords: Shape, shape: Shape) -> int:
    """Device id (row-major) of mesh coordinates."""
    index = 0
    for coord, extent in zip(coords, shape, strict=True):
        index = index * extent + coord
    return index


def _validate_mesh_shape(text: str) -> str:
    parse_shape(text)
    return text


MeshShape = Annotated[
    str,
    # The pattern is for the CRD; the validator enforces it with a message naming the format.
    Field(json_schema_extra={"pattern": MESH_SHAPE_PATTERN}),
    AfterValidator(_validate_mesh_shape),
]
"""A mesh shape written as a string (``4x4``), validated on the wire and in the models."""
