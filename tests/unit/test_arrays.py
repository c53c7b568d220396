"""The array codec: whole arrays and shard regions as chunk streams, and their checks."""

from __future__ import annotations

import numpy as np
import pytest

from pathways_core.wire import arrays
from pathways_core.wire.arrays import Assembly, from_chunks, region_chunks, to_chunks


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
    chunks[0].total_bytes += 4
    with pytest.raises(ValueError, match="ended after 32 of 36 bytes"):
        from_chunks(chunks)
    bad = list(to_chunks("c/b", np.arange(8, dtype=np.float32)))
    bad[0].dtype = "float99"
    with pytest.raises(ValueError, match="unknown dtype 'float99'"):
        from_chunks(bad)
    with pytest.raises(ValueError, match="does not cover the whole array"):
        from_chunks([])


def test_only_dtypes_devices_hold_are_numeric() -> None:
    import ml_dtypes

    for spelled in ("float32", "int8", "bool", "complex64", np.dtype(ml_dtypes.bfloat16)):
        assert arrays.numeric_dtype(spelled) == np.dtype(spelled)
    for spelled, why in (
        ("object", "is not a numeric dtype"),
        (np.dtype(object), "is not a numeric dtype"),
        ("U4", "is not a numeric dtype"),
        ("i4,i4", "is not a numeric dtype"),
        ("(3,)f4", "is not a numeric dtype"),
        ("V0", "is not a numeric dtype"),
        ("nonsense", "is not a dtype"),
    ):
        with pytest.raises(ValueError, match=why):
            arrays.numeric_dtype(spelled)
