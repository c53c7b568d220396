"""Pathways on Kubernetes: the client SDK.

import pathways_client as pw

with pw.connect(islands={"local": "127.0.0.1:8470"}) as cluster:
    devices = cluster.slice(devices=4)
    step = pw.function(train_step, slice=devices, in_shardings=P("x"))
    loss = step(batch).result()

The names below are imported when first used: the CLI and the helpers the embedded manager
starts (``pathways get``, a run's trace) import no JAX, which took a second and a half each.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathways_client import checkpoint, elastic
    from pathways_client.cluster import Cluster, connect
    from pathways_client.errors import (
        ConnectError,
        DeletedError,
        NodeFailed,
        PathwaysError,
        SliceError,
    )
    from pathways_client.functions import CompiledFunction, function
    from pathways_client.futures import ArrayFuture, put
    from pathways_client.programs import Program, program
    from pathways_client.slices import Slice

_WHERE = {
    "ArrayFuture": "futures",
    "Cluster": "cluster",
    "CompiledFunction": "functions",
    "ConnectError": "errors",
    "DeletedError": "errors",
    "NodeFailed": "errors",
    "PathwaysError": "errors",
    "Program": "programs",
    "Slice": "slices",
    "SliceError": "errors",
    "checkpoint": None,
    "connect": "cluster",
    "elastic": None,
    "function": "functions",
    "program": "programs",
    "put": "futures",
}
"""Each public name's module (None: the name is a module of the package)."""

__all__ = [
    "ArrayFuture",
    "Cluster",
    "CompiledFunction",
    "ConnectError",
    "DeletedError",
    "NodeFailed",
    "PathwaysError",
    "Program",
    "Slice",
    "SliceError",
    "checkpoint",
    "connect",
    "elastic",
    "function",
    "program",
    "put",
]


def __getattr__(name: str) -> Any:
    """A public name, or a module of the package (``pw.futures``), imported when first used."""
    module = _WHERE.get(name)
    if module is None:
        try:
            value: Any = importlib.import_module(f"pathways_client.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"pathways_client.{name}":
                raise
            raise AttributeError(f"module 'pathways_client' has no attribute {name!r}") from None
    else:
        value = getattr(importlib.import_module(f"pathways_client.{module}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
