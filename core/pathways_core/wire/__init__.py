"""Wire messages (protobuf) and the gRPC method tables of the scheduler and executor services.

The hot streams are not gRPC methods: client sessions and the scheduler's command streams are
framed protobuf over raw TCP (``pathways_core.wire.streams``), at the ``session_endpoint`` of
``IslandInfo`` and the ``control_endpoint`` of ``ExecutorInfo``.

The tables are plain data so that every component builds its servers and stubs from one
definition without this package importing gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pathways_core.wire import pathways_pb2 as pb
from pathways_core.wire.arrays import ChunkCodec


class Cardinality(StrEnum):
    UNARY_UNARY = "unary_unary"
    UNARY_STREAM = "unary_stream"
    STREAM_UNARY = "stream_unary"
    STREAM_STREAM = "stream_stream"


@dataclass(frozen=True)
class Method:
    name: str
    cardinality: Cardinality
    request: type
    response: type


@dataclass(frozen=True)
class Service:
    name: str
    methods: tuple[Method, ...]

    def path(self, method: str) -> str:
        return f"/{self.name}/{method}"


SCHEDULER = Service(
    "pathways.v1.Scheduler",
    (
        Method("Info", Cardinality.UNARY_UNARY, pb.Empty, pb.IslandInfo),
        Method("GetTrace", Cardinality.UNARY_UNARY, pb.TraceRequest, pb.Trace),
    ),
)

EXECUTOR = Service(
    "pathways.v1.Executor",
    (
        # Array bytes are not copied through protobuf messages (see wire.arrays).
        Method("PutArray", Cardinality.STREAM_UNARY, ChunkCodec, pb.Ack),
        Method("GetArray", Cardinality.UNARY_STREAM, pb.ArrayRequest, ChunkCodec),
        Method("Info", Cardinality.UNARY_UNARY, pb.Empty, pb.ExecutorInfo),
    ),
)

__all__ = ["EXECUTOR", "SCHEDULER", "Cardinality", "Method", "Service", "pb"]
