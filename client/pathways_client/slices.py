"""Virtual slices as the SDK sees them: devices of one island, in virtual order, with a mesh."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jax.sharding import AbstractMesh, AxisType

from pathways_client.errors import SliceError

if TYPE_CHECKING:
    from pathways_client.cluster import Cluster

AXIS_NAMES = ("x", "y", "z", "w")
logger = logging.getLogger("pathways.client")


@dataclass(eq=False)
class Slice:
    """A virtual slice bound to ``devices`` (island device ids, in virtual order) of ``island``,
    laid out as a mesh of ``shape``. Use it as a context manager to release it on exit."""

    name: str
    island: str
    devices: tuple[int, ...]
    shape: tuple[int, ...]
    cluster: Cluster | None = field(default=None, repr=False)
    released: bool = field(default=False, repr=False)
    """Its devices were given back: they may be another slice's now."""
    lost: str | None = field(default=None, repr=False)
    """Why the cluster released it while this session held it (its lease ran out)."""
    uid: str | None = field(default=None, repr=False)
    """Its VirtualSlice's uid (through the API): renewed and deleted as that object only."""

    def __post_init__(self) -> None:
        if math.prod(self.shape) != len(self.devices):
            raise ValueError(
                f"slice {self.name!r} has {len(self.devices)} devices, which do not fill a mesh "
                f"of shape {list(self.shape)}"
            )

    @property
    def size(self) -> int:
        """Number of devices."""
        return len(self.devices)

    def mesh(self, axis_names: tuple[str, ...] | None = None) -> AbstractMesh:
        """The slice's devices as a JAX mesh (abstract: the devices live on the island, not in
        this process). Axes are named ``x``, ``y``, ... unless ``axis_names`` says otherwise."""
        names = axis_names or AXIS_NAMES[: len(self.shape)]
        if len(names) != len(self.shape):
            raise ValueError(
                f"slice {self.name!r} is a mesh of shape {list(self.shape)}: give "
                f"{len(self.shape)} axis name(s), not {len(names)} ({', '.join(names)})"
            )
        return AbstractMesh(self.shape, tuple(names), axis_types=(AxisType.Auto,) * len(names))

    def cluster_or_fail(self) -> Cluster:
        """The session holding this slice; SliceError once it was released."""
        if self.lost is not None:
            raise SliceError(f"slice {self.name!r} was released by the cluster: {self.lost}")
        if self.released:
            raise SliceError(
                f"slice {self.name!r} was released (its devices may be another slice's now): "
                "request a new one with cluster.slice(...)"
            )
        if self.cluster is None:
            raise RuntimeError(f"slice {self.name!r} belongs to no session")
        self.cluster.check_lease(self)
        return self.cluster

    def release(self) -> None:
        """Give the devices back (idempotent). ``SliceError`` when its VirtualSlice could not
        be deleted (the API unreachable): the message says how long it holds its devices."""
        if self.cluster is not None:
            self.cluster.release(self)

    def __enter__(self) -> Slice:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            self.release()
        except SliceError as error:
            if kind is None:
                raise
            logger.warning("%s", error)  # the error that ended the block is the one raised
