"""The bulk data plane's framing: how array bytes move between processes over raw TCP.

Large arrays skip the control plane's per-message copies. A connection carries requests one
after the other, each followed by its reply (peers keep their connections between transfers):

    request:  u32 length, JSON {"buffer": id, "timeout": seconds}
    reply:    u32 length, JSON {"dtype": ..., "shape": [...], "regions": [[start, stop, nbytes]]}
              (or {"error": message}), then each region's bytes, back to back.

A region is a box of the array (``start`` and ``stop`` per axis): an executor of a slice that
spans hosts sends only the shards it holds. This module only encodes and decodes frames.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from typing import Any

LENGTH = struct.Struct("!I")
MAX_HEADER_BYTES = 1 << 20
# Made once: ``json.dumps`` with options builds an encoder per call, and ``json.loads`` of
# bytes detects their encoding first (a few µs each, on every transfer's critical path).
_encode = json.JSONEncoder(separators=(",", ":")).encode
_decode = json.JSONDecoder().decode


@dataclass(frozen=True)
class RegionHeader:
    start: tuple[int, ...]
    stop: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Reply:
    dtype: str
    shape: tuple[int, ...]
    regions: tuple[RegionHeader, ...]


def frame(payload: dict) -> bytes:
    """A length-prefixed JSON frame."""
    data = _encode(payload).encode()
    return LENGTH.pack(len(data)) + data


def request(buffer_id: str, timeout: float, appear_within: float | None = None) -> bytes:
    """A pull of ``buffer_id``, waiting up to ``timeout`` s for its value and, if given, up to
    ``appear_within`` s for it to be announced (else the holder's default)."""
    payload: dict[str, Any] = {"buffer": buffer_id, "timeout": timeout}
    if appear_within is not None:
        payload["appear"] = appear_within
    return frame(payload)


def reply(dtype: str, shape: tuple[int, ...], regions: list[RegionHeader]) -> bytes:
    return frame(
        {
            "dtype": dtype,
            "shape": list(shape),
            "regions": [[list(r.start), list(r.stop), r.nbytes] for r in regions],
        }
    )


def error(message: str) -> bytes:
    return frame({"error": message})


def header_length(prefix: bytes) -> int:
    """The JSON length announced by a 4-byte prefix; refuses absurd sizes."""
    (length,) = LENGTH.unpack(prefix)
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"a data-plane header of {length} bytes is too large")
    return length


def parse_request(data: bytes) -> tuple[str, float, float | None]:
    """A request's buffer id, timeout and, if it gave one, time to wait for the buffer to be
    announced."""
    payload = _decode(data.decode())
    appear = payload.get("appear")
    return (
        str(payload["buffer"]),
        float(payload.get("timeout", 60.0)),
        None if appear is None else float(appear),
    )


@functools.lru_cache(maxsize=1024)
def parse_reply(data: bytes) -> Reply:
    """The reply's header; raises ``LookupError`` with the sender's message on an error.
    Headers repeat (one per array layout), so the last ones parsed are remembered."""
    payload = _decode(data.decode())
    if "error" in payload:
        raise LookupError(payload["error"])
    return Reply(
        dtype=payload["dtype"],
        shape=tuple(payload["shape"]),
        regions=tuple(
            RegionHeader(tuple(start), tuple(stop), int(nbytes))
            for start, stop, nbytes in payload["regions"]
        ),
    )
