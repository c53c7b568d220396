"""Wire messages (protobuf) and the gRPC method tables of the scheduler and executor services.

The tables are plain data so that every component builds its servers and stubs from one
definition without this package importing gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pathways_core.wire import pathways_pb2 as pb


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
        # One long-lived stream per client: registrations, computations and deletions in,
        # queued/completed/failed events out.
        Method("Session", Cardinality.STREAM_STREAM, pb.ClientBatch, pb.ClientEventBatch),
        Method("Info", Cardinality.UNARY_UNARY, pb.Empty, pb.IslandInfo),
        Method("GetTrace", Cardinality.UNARY_UNARY, pb.Empty, pb.Trace),
    ),
)

EXECUTOR = Service(
    "pathways.v1.Executor",
    (
        # The island scheduler's ordered command stream, and the executor's events back.
        Method("Execute", Cardinality.STREAM_STREAM, pb.CommandBatch, pb.EventBatch),
        Method("PutArray", Cardinality.STREAM_UNARY, pb.ArrayChunk, pb.Ack),
        Method("GetArray", Cardinality.UNARY_STREAM, pb.ArrayRequest, pb.ArrayChunk),
        Method("Info", Cardinality.UNARY_UNARY, pb.Empty, pb.ExecutorInfo),
    ),
)

__all__ = ["EXECUTOR", "SCHEDULER", "Cardinality", "Method", "Service", "pb"]
