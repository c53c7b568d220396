"""Elastic training: a data-parallel loop loses a slice to a dead executor (SIGKILL) and
continues on the rest from its last checkpoint, ending where uninterrupted training ends."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pathways_client as pw
from pathways_client.launcher import LocalIsland

STEPS, BATCH, WIDTH, RATE = 6, 8, 4, 0.1


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(STEPS, BATCH, WIDTH)).astype(np.float32)
    y = (x @ np.arange(1, WIDTH + 1, dtype=np.float32)).astype(np.float32)
    return x, y


def reference() -> np.ndarray:
    x, y = data()
    w = jnp.zeros(WIDTH, jnp.float32)
    for step in range(STEPS):
        w = w - RATE * jax.grad(loss)(w, x[step], y[step])
    return np.asarray(w)


def test_training_survives_the_loss_of_a_slice(compilation_cache: Path) -> None:
    x, y = data()
    # Two executors that are not one distributed group: losing one leaves the other running.
    with (
        LocalIsland(
            hosts=2, devices_per_host=2, distributed=False, compilation_cache=compilation_cache
        ) as island,
        pw.connect(island) as cluster,
    ):
        slices = [cluster.slice(devices=2, name=name) for name in ("a", "b")]
        owners = cluster.session(island.name).device_owner
        assert [{owners[d] for d in s.devices} for s in slices] == [{0}, {1}]
        grads = {s.name: pw.function(jax.grad(loss), slice=s) for s in slices}
        manager = pw.elastic.Manager(cluster, slices)
        checkpoint = {"step": 0, "w": np.zeros(WIDTH, np.float32)}
        events = []

        @manager.elastic_retry(max_retries=2, on_elastic_event=lambda *e: events.append(e))
        def train() -> np.ndarray:
            while checkpoint["step"] < STEPS:
                step, w = checkpoint["step"], checkpoint["w"]
                if step == 3 and island.executors[1].popen.poll() is None:
                    island.kill_executor(1)
                replicas = manager.available
                shards = np.split(np.arange(BATCH), len(replicas))
                futures = [
                    grads[s.name](w, x[step][rows], y[step][rows])
                    for s, rows in zip(replicas, shards, strict=True)
                ]
                mean = np.mean([f.result(timeout=60) for f in futures], axis=0)
                checkpoint.update(step=step + 1, w=w - RATE * mean)
            return checkpoint["w"]

        final = train()
        # The dead executor's devices are never bound again, in this connection or a new one
        # (the scheduler's Info says it lost them).
        cluster.release(slices[1])
        with pytest.raises(pw.SliceError, match="cannot be bound"):
            cluster.slice(devices=2, name="again")
        with pw.connect(island) as fresh:
            lost = fresh.session(island.name).lost_executors
            assert list(lost) == [1] and "unreachable" in lost[1]
            healthy = fresh.slice(devices=2)
            assert {owners[d] for d in healthy.devices} == {0}
            with pytest.raises(pw.SliceError, match="cannot be bound"):
                fresh.slice(devices=2)
    np.testing.assert_allclose(final, reference(), rtol=1e-5)
    assert [s.name for s in manager.lost] == ["b"]
    assert [s.name for s in manager.available] == ["a"]
    assert len(events) == 1 and events[0][0] == 1


def test_a_failure_that_is_not_a_loss_is_raised_at_once(island: LocalIsland) -> None:
    with pw.connect(island) as cluster, cluster.slice(devices=1) as one:
        manager = pw.elastic.Manager(cluster, [one])
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")
        specialized = increment.specialize(jax.ShapeDtypeStruct((4,), jnp.float32))
        calls = []

        @manager.elastic_retry(max_retries=3)
        def broken() -> None:
            calls.append(1)
            (bad,) = pw.futures.call(cluster, one, specialized, [np.zeros(2, np.float32)], "bad")
            bad.result(timeout=60)

        with pytest.raises(pw.NodeFailed, match="node 'bad'"):
            broken()
        assert len(calls) == 1 and manager.lost == []
