"""gRPC plumbing from the method tables of ``pathways_core.wire``.

Re-exports the stream plumbing so servers import one module for their RPC needs.
"""

from __future__ import annotations

from typing import Any

import grpc

from pathways_core.wire import Service
from pathways_core.wire.streams import MESSAGE_OPTIONS, batches


def stub(channel: grpc.Channel, service: Service, name: str) -> Any:
    """A callable for one method of a service on a channel."""
    method = next(m for m in service.methods if m.name == name)
    factory = getattr(channel, method.cardinality.value)
    return factory(
        service.path(name),
        request_serializer=method.request.SerializeToString,
        response_deserializer=method.response.FromString,
    )


__all__ = ["MESSAGE_OPTIONS", "batches", "stub"]
