"""The array codec: whole arrays and shard regions as chunk streams, and their checks."""

from __future__ import annotations

import re
import sys

import ml_dtypes
import numpy as np
import pytest

from pathways_core.wire import arrays, pb
from pathways_core.wire.arrays import (
    Assembly,
    explicit_region,
    from_chunks,
    region_chunks,
    to_chunks,
)
from pathways_core.wire.fields import append_bytes_field, split_bytes_field


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.zeros((0, 3), np.int8),
        np.array(7.5),
        np.arange(10, dtype=np.int64),
    ],
)
def test_whole_arrays_round_trip(array: np.ndarray) -> None:
    buffer_id, back = from_chunks(to_chunks("c/b", array))
    assert buffer_id == "c/b"
    np.testing.assert_array_equal(back, array)
    assert back.dtype == array.dtype


def test_large_arrays_are_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "CHUNK_BYTES", 10)
    array = np.arange(100, dtype=np.float32)
    chunks = list(to_chunks("c/b", array))
    assert len(chunks) == 40 and chunks[0].begin and not chunks[1].begin
    np.testing.assert_array_equal(from_chunks(chunks)[1], array)


def test_regions_from_several_holders_assemble_the_array() -> None:
    array = np.arange(16, dtype=np.float32).reshape(4, 4)
    top, bottom = (slice(0, 2), slice(0, 4)), (slice(2, 4), slice(0, 4))
    assembly = Assembly()
    assembly.add(region_chunks("c/b", array.dtype, array.shape, [(top, array[top])]))
    assert not assembly.complete
    assembly.add(region_chunks("c/b", array.dtype, array.shape, [(bottom, array[bottom])]))
    assert assembly.complete
    np.testing.assert_array_equal(assembly.array, array)


def test_truncated_or_inconsistent_streams_are_refused() -> None:
    chunks = list(to_chunks("c/b", np.arange(8, dtype=np.float32)))
    chunks[0].header.total_bytes += 4
    with pytest.raises(ValueError, match="ended after 32 of 36 bytes"):
        from_chunks(chunks)
    bad = list(to_chunks("c/b", np.arange(8, dtype=np.float32)))
    bad[0].header.dtype = "float99"
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        from_chunks(bad)
    with pytest.raises(ValueError, match="does not cover the whole array"):
        from_chunks([])


def test_arrays_go_in_this_machines_byte_order() -> None:
    swapped = np.arange(4, dtype=np.float32).astype(np.dtype(np.float32).newbyteorder())
    native = arrays.native_order(swapped)
    assert native.dtype == np.float32 and native.dtype.byteorder in "=|"
    np.testing.assert_array_equal(native, [0, 1, 2, 3])
    plain = np.arange(3)
    assert arrays.native_order(plain) is plain


def test_only_dtypes_devices_hold_are_numeric() -> None:
    for spelled in ("float32", "int8", "bool", "complex64", np.dtype(ml_dtypes.bfloat16)):
        assert arrays.numeric_dtype(spelled) == np.dtype(spelled)
    for spelled, why in (
        ("object", "is not a numeric dtype"),
        (np.dtype(object), "is not a numeric dtype"),
        ("U4", "is not a numeric dtype"),
        ("i4,i4", "is not a numeric dtype"),
        ("(3,)f4", "is not a numeric dtype"),
        ("V0", "is not a numeric dtype"),
        ("V8", "is not a numeric dtype"),  # raw bytes, not one of the ml_dtypes types
        (">f4" if sys.byteorder == "little" else "<f4", "not in this machine's byte order"),
        ("nonsense", "is not a dtype"),
    ):
        with pytest.raises(ValueError, match=why):
            arrays.numeric_dtype(spelled)


def test_chunks_on_the_wire_are_arraychunk_messages_with_their_data_not_copied() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    (chunk,) = to_chunks("c/b", array)
    assert np.shares_memory(np.frombuffer(chunk.data, np.uint8), array)  # a view, not a copy
    wire = arrays.ChunkCodec.SerializeToString(chunk)
    # What the codec writes, protobuf reads as the whole message, and the other way round.
    message = pb.ArrayChunk.FromString(wire)
    assert message.data == array.tobytes() and message.begin and list(message.shape) == [3, 4]
    received = arrays.ChunkCodec.FromString(message.SerializeToString())
    assert received.header.data == b"" and received.buffer_id == "c/b"
    assert bytes(received.data) == array.tobytes()
    # Plain messages (what a hostile test sends) are serialized as protobuf does.
    plain = pb.ArrayChunk(buffer_id="x", data=b"abc")
    assert arrays.ChunkCodec.SerializeToString(plain) == plain.SerializeToString()
    large = np.arange(arrays.ALIGN_FROM_BYTES // 4, dtype=np.float32)
    _, back = from_chunks(
        arrays.ChunkCodec.FromString(arrays.ChunkCodec.SerializeToString(c))
        for c in to_chunks("c/b", large)
    )
    np.testing.assert_array_equal(back, large)
    assert back.ctypes.data % arrays.DEVICE_ALIGNMENT == 0  # JAX's CPU devices take it as is


@pytest.mark.parametrize("shape", [(), (0, 3), (5, 7), 9, (1024, 1024), (1 << 22,)])
def test_large_arrays_for_devices_are_aligned(shape: tuple[int, ...] | int) -> None:
    for dtype in (np.float32, np.bool_, np.complex64, np.int8, np.dtype(ml_dtypes.bfloat16)):
        array = arrays.empty_for_devices(shape, dtype)
        assert array.shape == (shape if isinstance(shape, tuple) else (shape,))
        assert array.dtype == dtype
        if array.nbytes >= arrays.ALIGN_FROM_BYTES:
            assert array.ctypes.data % arrays.DEVICE_ALIGNMENT == 0
        array[...] = 1


def test_bytes_fields_are_split_and_appended_as_protobuf_parses_them() -> None:
    message = pb.ArrayChunk(buffer_id="b", shape=[2, 3], total_bytes=6, data=b"xyz", begin=True)
    wire = message.SerializeToString()
    rest, data = split_bytes_field(wire, 5)
    assert bytes(data) == b"xyz"
    without = pb.ArrayChunk.FromString(rest)
    assert without.data == b"" and list(without.shape) == [2, 3] and without.begin
    assert pb.ArrayChunk.FromString(append_bytes_field(rest, 5, data)) == message
    # The last occurrence wins, as in protobuf; fields of every wire type are skipped.
    twice = append_bytes_field(wire, 5, b"second")
    assert pb.ArrayChunk.FromString(twice).data == b"second"
    rest, data = split_bytes_field(twice, 5)
    assert bytes(data) == b"second" and pb.ArrayChunk.FromString(rest).data == b""
    fixed = pb.ArrayRequest(buffer_id="b", timeout_seconds=2.5).SerializeToString()
    assert split_bytes_field(fixed, 5) == (fixed, memoryview(b""))
    assert append_bytes_field(b"", 1, b"") == b""
    for malformed in (b"\x0a\x05ab", b"\x0a", b"\xff", b"\x0b", b"\x2a\x80"):
        with pytest.raises(ValueError):
            split_bytes_field(malformed, 5)


def test_regions_are_made_explicit_and_bad_ones_named() -> None:
    """``slice(None)`` in a region reached the wire as a missing bound: the upload failed with
    gRPC's "Exception iterating requests!"."""
    assert explicit_region((slice(None), slice(1, -1)), (4, 6)) == (slice(0, 4), slice(1, 5))
    for region, problem in (
        ((slice(0, 2),), "has 1 slice(s); the array has 2 axes"),
        ((slice(0, 4, 2), slice(None)), "axis 0 is not a contiguous block"),
        ((slice(None), 3), "axis 1 is not a slice"),
    ):
        with pytest.raises(ValueError, match=re.escape(problem)):
            explicit_region(region, (4, 6))  # type: ignore[arg-type]
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    chunks = list(region_chunks("b", value.dtype, value.shape, [((slice(None),) * 2, value)]))
    assert list(chunks[0].header.region_start) == [0, 0]
    assert list(chunks[0].header.region_stop) == [4, 6]
