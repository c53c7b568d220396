"""Stream plumbing shared by every peer: gRPC message size limits, batching, and the framing of
the control streams.

The hot control streams (client sessions with the scheduler, the scheduler's command streams to
executors) are length-prefixed protobuf frames over raw TCP: measured on these machines, a
ping-pong over a Python gRPC stream costs ~430 µs and ~250 µs of CPU per side (grpc.aio: ~240 µs
and ~130 µs), over raw TCP ~50 µs and ~20 µs. This module only encodes and decodes frames; the
components own the sockets.
"""

from __future__ import annotations

import queue
import struct
from collections.abc import Callable, Iterator
from typing import Any

MAX_MESSAGE_BYTES = 64 << 20
MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
MAX_BATCH = 512
# A control frame: u32 length (network order), then a serialized protobuf message. Receivers
# refuse a frame announcing more than MAX_FRAME_BYTES (FrameError) before reading its body, so
# an absurd length prefix costs nothing; senders split bursts to stay within it (``frames``).
FRAME_LENGTH = struct.Struct("!I")
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES
# A control-stream peer must send its first frame (the hello) within this many seconds of
# connecting, else it is dropped: connections that send nothing hold no server thread for long.
HANDSHAKE_TIMEOUT_SECONDS = 10.0
# An executor takes a connection to its control endpoint as the scheduler's command stream only
# when its first frame is a ``ControlHello`` carrying this variable's value (the same in the
# island's scheduler and executors; empty when unset). Anything else is dropped without touching
# the current stream, so a stranger cannot cut the island off its executor.
CONTROL_TOKEN_ENV = "PATHWAYS_CONTROL_TOKEN"
# The most one read of a stream asks for. ``recv`` allocates that much and shrinks it to what
# arrived: 256 KiB, above glibc's 128 KiB threshold, was mapped, shrunk with mremap and
# unmapped at every read (~20 µs a small frame, against ~3.5 µs at 64 KiB from the heap); a
# buffer kept per stream would hold its size for every idle session.
RECEIVE_BYTES = 1 << 16


def batches(pending: queue.Queue, wrap: Callable[[list[Any]], Any]) -> Iterator[Any]:
    """Messages for a gRPC request stream fed from a queue: each waits for one item, then
    takes whatever else is queued (up to ``MAX_BATCH``) so a burst of work crosses the wire in
    one message. ``None`` ends the stream. (The control streams no longer use it; they are
    framed over raw TCP.)"""
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


def frame(message: Any) -> bytes:
    """A protobuf message as one control-stream frame."""
    data = message.SerializeToString()
    return FRAME_LENGTH.pack(len(data)) + data


def frames(
    items: list[Any], wrap: Callable[[list[Any]], Any], max_bytes: int = MAX_FRAME_BYTES
) -> bytes:
    """``items`` wrapped into as few frames as keep each within ``max_bytes`` (the receiver's
    cap), back to back: a burst of large messages (function artifacts, long error messages)
    never makes a frame its receiver must refuse, which would end the whole stream. An item
    larger than the cap on its own raises ``FrameError`` (senders bound their items)."""
    out: list[bytes] = []
    group: list[Any] = []
    size = 0
    for item in items:
        # A repeated field's element costs its size plus a tag and a length of at most 11 bytes.
        cost = item.ByteSize() + 11
        if cost > max_bytes:
            raise FrameError(f"a message of {cost} bytes exceeds the frame cap of {max_bytes}")
        if group and size + cost > max_bytes:
            out.append(frame(wrap(group)))
            group, size = [], 0
        group.append(item)
        size += cost
    if group or not out:
        out.append(frame(wrap(group)))
    return b"".join(out)


class FrameError(ValueError):
    """A control stream carried bytes that are not a frame."""


class FrameDecoder:
    """Splits the bytes of a control stream, in whatever pieces they arrive, into frames."""

    def __init__(self, parse: Callable[[bytes], Any], max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._parse = parse
        self._max = max_bytes
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages completed by ``data`` (possibly none); raises ``FrameError`` on a frame
        longer than allowed or one that does not parse."""
        pending = self._pending
        pending += data
        messages = []
        start, size = 0, len(pending)
        while size - start >= FRAME_LENGTH.size:
            (length,) = FRAME_LENGTH.unpack_from(pending, start)
            if length > self._max:
                raise FrameError(
                    f"a control frame of {length} bytes exceeds {self._max}, the cap on one frame"
                )
            end = start + FRAME_LENGTH.size + length
            if end > size:
                break
            try:
                messages.append(self._parse(bytes(pending[start + FRAME_LENGTH.size : end])))
            except Exception as error:  # protobuf's DecodeError and friends
                raise FrameError(f"a control frame does not parse: {error}") from error
            start = end
        del pending[:start]
        return messages

    @property
    def partial(self) -> bool:
        """Whether bytes of an unfinished frame are waiting for the rest."""
        return bool(self._pending)


def messages(receive: Callable[[int], bytes], parse: Callable[[bytes], Any]) -> Iterator[Any]:
    """The messages of a control stream read with ``receive`` (a socket's ``recv``) until the
    peer closes it; raises ``FrameError`` if it closes in the middle of a frame."""
    decoder = FrameDecoder(parse)
    while data := receive(RECEIVE_BYTES):
        yield from decoder.feed(data)
    if decoder.partial:
        raise FrameError("the control stream ended in the middle of a frame")
