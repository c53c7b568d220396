"""Facts read from HLO text: which parameters a run consumes."""

from __future__ import annotations

import pytest

from pathways_core.hlo import donated_parameters

LAYOUT = "entry_computation_layout={(f32[3]{0}, f32[3]{0})->(f32[3]{0}, f32[3]{0})}"


@pytest.mark.parametrize(
    ("header", "donated"),
    [
        (f"HloModule m, is_scheduled=true, {LAYOUT}", []),
        (f"HloModule m, input_output_alias={{ {{0}}: (0, {{}}, may-alias) }}, {LAYOUT}", [0]),
        (
            "HloModule m, input_output_alias={ {0}: (2, {}, may-alias), {1,0}: (0, {1}, "
            f"must-alias) }}, {LAYOUT}",
            [0, 2],
        ),
        (f"HloModule m, buffer_donor={{ (1, {{}}), (3, {{}}) }}, {LAYOUT}", [1, 3]),
        # Only the header counts: the body's text is not read.
        (f"HloModule m, {LAYOUT}\n  ROOT t = (0, {{}}, may-alias)", []),
    ],
)
def test_donated_parameters_are_read_from_the_header(header: str, donated: list[int]) -> None:
    assert donated_parameters(header) == donated
