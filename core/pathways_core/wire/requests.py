"""Requests of the gRPC methods that do not parse as their method's message type.

gRPC itself answers INTERNAL (a server error) when a request deserializer raises, before the
method runs. The servers' deserializers (:func:`parser`) hand on a :class:`Malformed` instead,
so that the method wrapper can refuse it as the client's error (INVALID_ARGUMENT) naming the
message type: a unary request before the method runs (:func:`refusal`), a request stream where
the method reads it (:func:`checked`, raising :class:`MalformedRequest`).

No gRPC here: the servers' ``rpc`` modules abort the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pathways_core.wire import Cardinality, Method

#: Methods whose request is one message (the others take a stream of them).
UNARY_REQUESTS = (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM)


class MalformedRequest(ValueError):
    """A request message that does not parse as its method's type."""


class Malformed:
    """What :func:`parser` hands on for bytes that do not parse: why not."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def parser(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer for ``message_type`` returning :class:`Malformed` for bytes that
    do not parse (instead of raising)."""

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as error:  # protobuf's DecodeError and friends
            return Malformed(f"{type(error).__name__}: {error}")

    return parse


def refusal(request: Any, method: Method) -> str | None:
    """Why ``request`` of ``method`` is refused, naming its message type; ``None`` when it
    parsed."""
    if not isinstance(request, Malformed):
        return None
    name = method.request.DESCRIPTOR.full_name
    return f"malformed {name} request to {method.name}: {request.error}"


def checked(requests: Iterable[Any], method: Method) -> Iterator[Any]:
    """A request stream of ``method`` raising ``MalformedRequest`` at the first request that
    did not parse."""
    for request in requests:
        problem = refusal(request, method)
        if problem is not None:
            raise MalformedRequest(problem)
        yield request


__all__ = ["UNARY_REQUESTS", "Malformed", "MalformedRequest", "checked", "parser", "refusal"]
