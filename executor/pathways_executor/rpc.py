"""gRPC plumbing from the method tables of ``pathways_core.wire``.

Re-exports the message size limits so servers import one module for their gRPC needs.
"""

from __future__ import annotations

from typing import Any

import grpc

from pathways_core.wire import Cardinality, Service
from pathways_core.wire.streams import MESSAGE_OPTIONS

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


__all__ = ["MESSAGE_OPTIONS", "generic_handler"]
