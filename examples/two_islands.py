"""Data parallel across two islands: each island computes gradients on half of every batch,
and the gradients cross the data-centre network (DCN) to be averaged on both sides.

The result equals the same training on one island with whole batches (and plain JAX).

    python examples/two_islands.py               # starts two local islands of 4 fake devices
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_client as pw
from pathways_client.launcher import LocalIsland


@dataclass(frozen=True)
class Config:
    width: int = 64
    batch: int = 64  # samples per step, over all islands
    steps: int = 6
    learning_rate: float = 0.5
    devices: int = 4  # per island
    seed: int = 1


def loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"])
    return jnp.mean((hidden @ params["w2"] - y) ** 2)


def init(config: Config):
    rng = np.random.default_rng(config.seed)
    scale = 1.0 / np.sqrt(config.width)
    params = {
        "w1": rng.normal(0, scale, (config.width, config.width)).astype(np.float32),
        "w2": rng.normal(0, scale, (config.width, 1)).astype(np.float32),
    }
    x = rng.normal(0, 1, (config.steps, config.batch, config.width)).astype(np.float32)
    y = np.sin(x.sum(axis=-1, keepdims=True)).astype(np.float32)
    return params, x, y


def _functions(devices: pw.Slice, config: Config, parts: int):
    """Gradient and update functions on one slice; ``parts`` gradients are averaged."""
    batch, replicated = P("x"), P()
    grad = pw.function(
        jax.value_and_grad(loss),
        slice=devices,
        in_shardings=(replicated, batch, batch),
        out_shardings=replicated,
        name="grad",
    )

    def apply(params, *grads):
        mean = jax.tree.map(lambda *g: sum(g) / len(g), *grads)
        return jax.tree.map(lambda p, g: p - config.learning_rate * g, params, mean)

    update = pw.function(
        apply,
        slice=devices,
        in_shardings=replicated,
        out_shardings=replicated,
        name=f"update-{parts}",
    )
    return grad, update


class DataParallel:
    """One model replica per slice (one slice per island); every step each replica computes
    gradients on its share of the batch and averages them with the others' (moved to it)."""

    def __init__(self, islands: list[pw.Slice], config: Config) -> None:
        self.config = config
        self.functions = [_functions(devices, config, len(islands)) for devices in islands]

    def train(self, params, x, y) -> tuple[list[float], dict]:
        """Train on ``len(x)`` batches; returns the mean loss per step and the final
        parameters of the first replica."""
        parts = len(self.functions)
        replicas = [params] * parts
        losses = []
        for inputs, targets in zip(x, y, strict=True):
            rows = np.split(np.arange(len(inputs)), parts)
            outcomes = [
                grad(replica, inputs[mine], targets[mine])
                for (grad, _), replica, mine in zip(self.functions, replicas, rows, strict=True)
            ]
            grads = [g for _, g in outcomes]
            replicas = [
                update(replica, grads[i], *(g for j, g in enumerate(grads) if j != i))
                for i, ((_, update), replica) in enumerate(
                    zip(self.functions, replicas, strict=True)
                )
            ]
            losses.append(outcomes)
        mean_losses = [float(np.mean([value.result() for value, _ in step])) for step in losses]
        # Every replica's last update is waited for: training is done once all are.
        finals = [jax.tree.map(lambda leaf: leaf.result(), replica) for replica in replicas]
        return mean_losses, finals[0]


def run(islands: list[pw.Slice], config: Config = Config()) -> tuple[list[float], dict]:
    """Train data parallel over the given slices (one per island)."""
    return DataParallel(islands, config).train(*init(config))


def reference(config: Config = Config()) -> tuple[list[float], dict]:
    """Whole batches on one device, in plain JAX."""
    params, x, y = init(config)
    step_fn = jax.jit(jax.value_and_grad(loss))
    losses = []
    for step in range(config.steps):
        value, grads = step_fn(params, x[step], y[step])
        losses.append(float(value))
        params = jax.tree.map(lambda p, g: p - config.learning_rate * g, params, grads)
    return losses, jax.tree.map(np.asarray, params)


def main() -> None:
    config = Config()
    with (
        LocalIsland(hosts=1, devices_per_host=config.devices, name="island-a") as a,
        LocalIsland(hosts=1, devices_per_host=config.devices, name="island-b") as b,
        pw.connect([a, b]) as cluster,
    ):
        two = [cluster.slice(devices=config.devices, island=name) for name in (a.name, b.name)]
        losses, _ = run(two, config)
        for item in two:
            item.release()
        one, _ = run([cluster.slice(devices=config.devices, island=a.name)], config)
    for step, (split, single, plain) in enumerate(
        zip(losses, one, reference(config)[0], strict=True)
    ):
        print(
            f"step {step}: two islands {split:.5f}  one island {single:.5f}  plain JAX {plain:.5f}"
        )


if __name__ == "__main__":
    main()
