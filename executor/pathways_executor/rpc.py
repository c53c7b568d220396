"""gRPC plumbing from the method tables of ``pathways_core.wire``."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from pathways_core.wire import Cardinality, Service

MAX_MESSAGE_BYTES = 64 << 20
MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

_HANDLERS = {
    Cardinality.UNARY_UNARY: grpc.unary_unary_rpc_method_handler,
    Cardinality.UNARY_STREAM: grpc.unary_stream_rpc_method_handler,
    Cardinality.STREAM_UNARY: grpc.stream_unary_rpc_method_handler,
    Cardinality.STREAM_STREAM: grpc.stream_stream_rpc_method_handler,
}


def generic_handler(service: Service, implementation: Any) -> grpc.GenericRpcHandler:
    """Route a service's methods to the same-named methods of ``implementation``."""
    return grpc.method_handlers_generic_handler(
        service.name,
        {
            method.name: _HANDLERS[method.cardinality](
                getattr(implementation, method.name),
                request_deserializer=method.request.FromString,
                response_serializer=method.response.SerializeToString,
            )
            for method in service.methods
        },
    )


MAX_BATCH = 512


def batches(pending: queue.Queue, wrap: Callable[[list[Any]], Any]) -> Iterator[Any]:
    """Messages for a stream: each waits for one item, then takes whatever else is queued
    (up to ``MAX_BATCH``) so a burst of work crosses the wire in one message. ``None`` ends
    the stream."""
    while (first := pending.get()) is not None:
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
            if item is None:
                pending.put(None)
                break
            batch.append(item)
        yield wrap(batch)
