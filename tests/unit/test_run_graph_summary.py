"""The graph runner's summary of its results: sums in double precision, complex ones too."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pathways_client.run_graph import _sum


def test_a_result_is_summed_in_double_precision_whatever_its_dtype() -> None:
    values = [2.59375, 3.515625, 3.296875, 3.15625]  # exact in bfloat16
    assert _sum(np.array(values, ml_dtypes.bfloat16)) == sum(values)  # 12.625 in bfloat16
    assert _sum(np.full(4, 60000, np.float16)) == 240000.0  # inf in float16
    assert _sum(np.array([1 + 2j, 3 - 1j], np.complex64)) == [4.0, 1.0]
    assert _sum(np.array([True, True])) == 2.0
