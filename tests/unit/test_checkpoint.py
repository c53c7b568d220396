"""Checkpoints keep what they are given: dtypes NumPy's files store as raw bytes, and
namedtuples (optax's states) come back as they were saved."""

from __future__ import annotations

import collections
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pathways_client import checkpoint

Moments = collections.namedtuple("Moments", "mean variance")


def test_narrow_dtypes_come_back_as_themselves(tmp_path: Path) -> None:
    """They came back as raw void arrays ('|V2'), silently."""
    state = {
        "bf16": jnp.arange(3, dtype=jnp.bfloat16),
        "fp8": np.array([1.0, 0.5], ml_dtypes.float8_e4m3fn),
        "int4": np.array([1, -2, 7], ml_dtypes.int4),
        "f32": np.ones(2, np.float32),
    }
    checkpoint.save(3, state, tmp_path)
    step, back = checkpoint.restore(tmp_path)
    assert step == 3
    for name, value in state.items():
        assert back[name].dtype == np.asarray(value).dtype, name
        np.testing.assert_array_equal(back[name], np.asarray(value), err_msg=name)


def test_namedtuples_come_back_as_their_type(tmp_path: Path) -> None:
    """They came back as plain tuples (an optimizer's state lost its type)."""
    state = {"opt": (Moments(np.zeros(2), np.ones(2)), [Moments(np.ones(1), np.zeros(1))])}
    checkpoint.save(1, state, tmp_path)
    _, back = checkpoint.restore(tmp_path)
    first, rest = back["opt"]
    assert type(first) is Moments and type(rest[0]) is Moments
    np.testing.assert_array_equal(first.variance, np.ones(2))


def test_a_namedtuple_that_cannot_be_imported_is_named(tmp_path: Path) -> None:
    local = collections.namedtuple("Local", "x")
    local.__module__ = "nowhere_to_be_found"
    checkpoint.save(1, local(np.zeros(1)), tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=r"nowhere_to_be_found:Local .* cannot be"):
        checkpoint.restore(tmp_path)


def test_a_step_may_be_any_integer_scalar_and_nothing_else(tmp_path: Path) -> None:
    for given in (np.int64(5), jnp.int32(6), 7):
        checkpoint.save(given, {}, tmp_path)
        step, _ = checkpoint.restore(tmp_path)
        assert step == int(given) and type(step) is int
    for bad in (-1, 2.0, True, "3", np.float32(1)):
        with pytest.raises(checkpoint.CheckpointError, match="step must be an integer >= 0"):
            checkpoint.save(bad, {}, tmp_path)
