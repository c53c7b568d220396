"""The step of the dispatch benchmark and how plain JAX runs it: shared by the in-process
baseline (dispatch.py) and the multi-controller one (multi_controller.py)."""

from __future__ import annotations

import time

import jax.numpy as jnp

# On these 2-core machines more collectives queued than this deadlock XLA's CPU rendezvous and
# gloo alike; executors bound their outstanding work the same way.
OUTSTANDING = 8


def all_reduce_step(x):
    """A trivial all-reduce: every row becomes the mean of all rows."""
    return jnp.sum(x, axis=0, keepdims=True) * jnp.ones_like(x) * (1.0 / x.shape[0])


def chain_rate(step, x, chain: int, repeats: int) -> float:
    """Steps/s of the fastest of ``repeats`` runs of ``step`` chained ``chain`` times."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        y = x
        for count in range(1, chain + 1):
            y = step(y)
            if count % OUTSTANDING == 0:
                y.block_until_ready()
        y.block_until_ready()
        best = max(best, chain / (time.perf_counter() - start))
    return best
