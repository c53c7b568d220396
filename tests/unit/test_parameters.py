"""Which arguments ``pw.function`` and ``pw.program`` take as static: every form ``jax.jit``
accepts (``None``, one position or name, a numpy integer, several), and a clear refusal,
naming the option and the function, of anything else."""

from __future__ import annotations

import numpy as np
import pytest

from pathways_client.parameters import Parameters


def scale(x, n, k=1):
    return x * n * k


@pytest.mark.parametrize(
    ("numbers", "names", "positions", "named"),
    [
        (None, None, [], []),
        ((), (), [], []),
        (np.int64(1), (), [1], ["n"]),
        (1, "k", [1, 2], ["k", "n"]),
        ([1], ["k"], [1, 2], ["k", "n"]),
        (None, "k", [2], ["k"]),
        (-1, None, [2], ["k"]),
    ],
)
def test_the_forms_jax_jit_takes(numbers, names, positions, named) -> None:
    parameters = Parameters(scale, "function 'scale'", numbers, names)
    assert sorted(parameters.static_positions) == positions
    assert sorted(parameters.static_names) == named


@pytest.mark.parametrize(
    ("numbers", "names", "message"),
    [
        (True, (), r"static_argnums: expected a position or positions of arguments \(got True\)"),
        ("1", (), r"static_argnums: expected a position .* \(got '1'\)"),
        (1.5, (), r"static_argnums: expected a position .* \(got 1\.5\)"),
        ((1, None), (), r"static_argnums: expected a position .* \(got \(1, None\)\)"),
        ((), 1, r"static_argnames: expected a name or names of arguments \(got 1\)"),
        ((), [1], r"static_argnames: expected a name .* \(got \[1\]\)"),
    ],
)
def test_anything_else_is_refused_naming_the_option_and_the_function(
    numbers, names, message
) -> None:
    with pytest.raises(TypeError, match=f"^function 'scale': {message}$"):
        Parameters(scale, "function 'scale'", numbers, names)
