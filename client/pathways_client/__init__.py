"""Pathways on Kubernetes: the client SDK.

import pathways_client as pw

with pw.connect(islands={"local": "127.0.0.1:8470"}) as cluster:
    devices = cluster.slice(devices=4)
    step = pw.function(train_step, slice=devices, in_shardings=P("x"))
    loss = step(batch).result()
"""

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
