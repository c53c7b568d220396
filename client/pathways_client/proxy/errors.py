"""Errors a proxy session answers with: a gRPC/absl status code name and a message."""

from __future__ import annotations

_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
}


def code_number(name: str) -> int:
    """The numeric status code of ``name`` (``INVALID_ARGUMENT`` -> 3); unknown names give 2."""
    return _CODES.get(name, 2)


class ProxyError(Exception):
    """A request failed; the client gets ``code`` and ``message`` (which names the field)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
