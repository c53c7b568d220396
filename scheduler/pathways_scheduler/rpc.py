"""gRPC plumbing from the method tables of ``pathways_core.wire``.

Re-exports the message size limits so servers import one module for their gRPC needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from pathways_core.wire import Cardinality, Method, Service
from pathways_core.wire.requests import (
    UNARY_REQUESTS,
    MalformedRequest,
    checked,
    parser,
    refusal,
)
from pathways_core.wire.streams import MESSAGE_OPTIONS

_HANDLERS = {
    Cardinality.UNARY_UNARY: grpc.unary_unary_rpc_method_handler,
    Cardinality.UNARY_STREAM: grpc.unary_stream_rpc_method_handler,
    Cardinality.STREAM_UNARY: grpc.stream_unary_rpc_method_handler,
    Cardinality.STREAM_STREAM: grpc.stream_stream_rpc_method_handler,
}


def _checked(behaviour: Callable[..., Any], method: Method) -> Callable[..., Any]:
    """``behaviour`` refusing malformed requests (``pathways_core.wire.requests``): a unary
    request with INVALID_ARGUMENT before the method runs; in a request stream, as
    ``MalformedRequest`` raised where the method reads it (the method answers
    INVALID_ARGUMENT)."""
    if method.cardinality in UNARY_REQUESTS:

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            problem = refusal(request, method)
            if problem is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            return behaviour(request, context)

        return unary

    def streaming(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behaviour(checked(requests, method), context)

    return streaming


def generic_handler(service: Service, implementation: Any) -> grpc.GenericRpcHandler:
    """Route a service's methods to the same-named methods of ``implementation``; requests
    that do not parse are refused with INVALID_ARGUMENT."""
    return grpc.method_handlers_generic_handler(
        service.name,
        {
            method.name: _HANDLERS[method.cardinality](
                _checked(getattr(implementation, method.name), method),
                request_deserializer=parser(method.request),
                response_serializer=method.response.SerializeToString,
            )
            for method in service.methods
        },
    )


def stub(channel: grpc.Channel, service: Service, name: str) -> Any:
    """A callable for one method of a service on a channel."""
    method = next(m for m in service.methods if m.name == name)
    factory = getattr(channel, method.cardinality.value)
    return factory(
        service.path(name),
        request_serializer=method.request.SerializeToString,
        response_deserializer=method.response.FromString,
    )


__all__ = ["MESSAGE_OPTIONS", "MalformedRequest", "generic_handler", "stub"]
