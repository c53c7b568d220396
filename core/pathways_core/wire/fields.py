"""Bulk bytes fields of protobuf messages, read and written without copying them.

Parsing a message with the protobuf classes copies each bytes field out of the received
buffer, reading the field copies it again, and serializing one copies the value into the
message and then into the output. For the array bytes moving between clients, executors and
the IFRT proxy that was most of a transfer's cost, so those messages carry their bytes field
out of band: the sender serializes the other fields with protobuf and appends the bytes field
itself (the protobuf wire format lets fields come in any order), and the receiver cuts the
field out as a view of the received bytes and parses the rest with protobuf.
"""

from __future__ import annotations

from typing import Any

#: Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit (3 and 4, groups,
#: are long deprecated and never written by proto3).
_FIXED = {1: 8, 5: 4}


def varint(data: Any, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` of ``data`` (anything indexable by byte) and the position after
    it; ``IndexError`` if it runs past the end, ``ValueError`` if longer than 64 bits."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos
        if shift > 63:
            raise ValueError("varint too long")


def encode_varint(value: int) -> bytes:
    """``value`` (not negative) as a protobuf varint."""
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def split_bytes_field(message: bytes, number: int) -> tuple[bytes, memoryview]:
    """``message`` (serialized) without its bytes field ``number``, and that field's value as a
    view into ``message`` (the last one, as protobuf parses a singular field; empty if absent).
    ``ValueError`` if the message is malformed."""
    view = memoryview(message)
    value = view[:0]
    spans: list[tuple[int, int]] = []
    pos, end = 0, len(view)
    try:
        while pos < end:
            start = pos
            tag, pos = varint(view, pos)
            wire = tag & 7
            if wire == 0:
                _, pos = varint(view, pos)
            elif wire == 2:
                length, pos = varint(view, pos)
                if tag >> 3 == number:
                    value = view[pos : pos + length]
                    spans.append((start, pos + length))
                pos += length
            elif wire in _FIXED:
                pos += _FIXED[wire]
            else:
                raise ValueError(f"field {tag >> 3} has wire type {wire}")
    except IndexError:
        raise ValueError("the message ends inside a field") from None
    if pos != end:
        raise ValueError("the message ends inside a field")
    if not spans:
        return (message if isinstance(message, bytes) else bytes(view)), value
    kept, last = [], 0
    for start, stop in spans:
        kept.append(view[last:start])
        last = stop
    kept.append(view[last:])
    return b"".join(kept), value


def append_bytes_field(message: bytes, number: int, value: Any) -> bytes:
    """``message`` (serialized) with bytes field ``number`` = ``value`` (bytes or a view)
    appended, in one copy of each; an empty value is not written, as protobuf writes none."""
    if not len(value):
        return message
    return b"".join((message, encode_varint(number << 3 | 2), encode_varint(len(value)), value))
