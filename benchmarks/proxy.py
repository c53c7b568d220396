"""Step time of a small jitted training loop through the IFRT proxy, against plain local JAX;
and with ``--transfers``, arrays moved between the program and the devices through it.

    .venv/bin/python benchmarks/proxy.py [--steps 200] [--rounds 3] [--devices 4]
    .venv/bin/python benchmarks/proxy.py --transfers [--sizes-mib 1 16 64] [--rounds 3]

All sides run the same unmodified JAX program on the same number of fake CPU devices: as plain
JAX, and with ``jax_platforms='proxy'`` against two ``pathways proxy`` processes on loopback: one
running the work on its own devices (``--backend local``), one whose sessions are clients of an
island it starts (``--backend island``: 2 executors x 4 fake CPU devices, the session's slice on
one executor; compiles and steps go through the island scheduler and the executors). Each round
runs them in turn, in fresh processes; the medians and their ratios to plain JAX are printed.
Two step modes: ``pipelined`` (steps dispatched back to back, at most four in flight: JAX's usual
asynchronous dispatch) and ``synchronous`` (the loss fetched to the host every step: one round
trip per step).

``--transfers``: ``jax.device_put`` of a host array of each size onto one device (until ready)
and ``np.asarray`` of a device array just made (JAX keeps an array's host copy, so each is
fresh), as plain JAX and through the two proxies; the baseline is raw loopback TCP between two
processes, measured in the same run (``benchmarks/dispatch.py``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from pathways_core.flags import at_least

HERE = os.path.dirname(os.path.abspath(__file__))
WINDOW = 4


def client(mode: str, where: str, steps: int) -> None:
    """One measured run (in its own process): prints a JSON line of seconds per step."""
    jax = _connect(mode, where)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows = 64 * len(jax.devices())

    def loss_fn(params, xs, ys):
        w1, w2 = params
        return jnp.mean((jnp.tanh(xs @ w1) @ w2 - ys) ** 2)

    @jax.jit
    def step(params, xs, ys):
        loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    rng = np.random.default_rng(0)
    xs = jax.device_put(rng.normal(size=(rows, 32)).astype(np.float32), NamedSharding(mesh, P("x")))
    ys = jax.device_put(rng.normal(size=(rows, 1)).astype(np.float32), NamedSharding(mesh, P("x")))
    params = (
        jnp.asarray(rng.normal(size=(32, 64)).astype(np.float32) * 0.1),
        jnp.asarray(rng.normal(size=(64, 1)).astype(np.float32) * 0.1),
    )
    for _ in range(5):  # compile and warm up
        params, loss = step(params, xs, ys)
    jax.block_until_ready(loss)
    # At most WINDOW steps in flight: plain JAX on fake CPU devices deadlocks in its collectives
    # (and aborts) with hundreds of multi-device steps queued on 2 cores.
    start = time.perf_counter()
    losses = []
    for i in range(steps):
        params, loss = step(params, xs, ys)
        losses.append(loss)
        if i >= WINDOW:
            losses[i - WINDOW].block_until_ready()
    jax.block_until_ready((params, loss))
    pipelined = (time.perf_counter() - start) / steps
    start = time.perf_counter()
    for _ in range(steps):
        params, loss = step(params, xs, ys)
        float(loss)
    synchronous = (time.perf_counter() - start) / steps
    print(json.dumps({"pipelined": pipelined, "synchronous": synchronous, "loss": float(loss)}))


def transfers(mode: str, where: str, sizes_mib: str) -> None:
    """One measured run of transfers (in its own process): prints a JSON line of the median
    seconds up and down per size."""
    jax = _connect(mode, where)
    import numpy as np

    device = jax.devices()[0]
    out = {}
    for mib in map(int, sizes_mib.split(",")):
        host = np.random.default_rng(mib).random(mib << 18, dtype=np.float32)
        ups, downs = [], []
        for _ in range(6):  # the first round warms up, and is left out
            start = time.perf_counter()
            array = jax.device_put(host, device).block_until_ready()
            ups.append(time.perf_counter() - start)
            start = time.perf_counter()
            back = np.asarray(array)
            downs.append(time.perf_counter() - start)
            assert np.array_equal(back, host)
            del array, back
        out[mib] = {"up": statistics.median(ups[1:]), "down": statistics.median(downs[1:])}
    print(json.dumps(out))


def _connect(mode: str, where: str) -> Any:
    """JAX, set up as plain JAX on ``where`` fake CPU devices (``mode`` "local") or as a client
    of the proxy at ``where`` (``mode`` "proxy")."""
    if mode == "proxy":
        os.environ["IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"] = "true"
        import jax
        from jax.extend import backend

        options = backend.ifrt_proxy.ClientConnectionOptions()
        options.connection_timeout_in_seconds = 30
        backend.register_backend_factory(
            "proxy", lambda: backend.ifrt_proxy.get_client(f"grpc://{where}", options), priority=-1
        )
        jax.config.update("jax_platforms", "proxy")
    else:
        import jax

        jax.config.update("jax_num_cpu_devices", int(where))
        jax.config.update("jax_platforms", "cpu")
    return jax


def _run(args: list[str], timeout: float = 600) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    run = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if run.returncode != 0:
        raise RuntimeError(f"client {args} failed ({run.returncode}):\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=at_least(1), default=200)
    parser.add_argument("--rounds", type=at_least(1), default=3)
    parser.add_argument("--devices", type=at_least(1), default=4)
    parser.add_argument("--transfers", action="store_true", help="measure transfers instead")
    parser.add_argument("--sizes-mib", type=at_least(1), nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    n = str(args.devices)
    # name -> the proxy's arguments (None: plain JAX, no proxy).
    setups: dict[str, list[str] | None] = {
        "plain JAX": None,
        "proxy, local backend": ["--backend", "local", "--devices", n],
        # One executor: XLA's in-process collectives, as in plain JAX.
        "proxy, island 1 x 4": ["--backend", "island", "--devices", n, "--hosts", "1"],
        # The standard island: its executors form one JAX group, collectives go through gloo.
        "proxy, island 2 x 4": ["--backend", "island", "--devices", n, "--hosts", "2"],
    }
    if args.transfers:
        del setups["proxy, island 2 x 4"]  # one device's transfers: the same as on 1 x 4
        sizes = ",".join(map(str, args.sizes_mib))
        measured = _measure(setups, args.rounds, n, lambda where: ["transfers", *where, sizes])
        _transfer_table(measured, args.sizes_mib, args.rounds)
        return
    measured = _measure(setups, args.rounds, n, lambda where: ["client", *where, str(args.steps)])
    print(f"{args.devices} fake CPU devices, {args.steps} steps x {args.rounds} rounds (medians)")
    print("| setup | pipelined ms/step | / plain | synchronous ms/step | / plain |")
    print("|---|---:|---:|---:|---:|")
    plain = {
        mode: statistics.median(r[mode] for r in measured["plain JAX"]) * 1e3
        for mode in ("pipelined", "synchronous")
    }
    for name in setups:
        cells = []
        for mode in ("pipelined", "synchronous"):
            value = statistics.median(r[mode] for r in measured[name]) * 1e3
            cells += [f"{value:.3f}", f"{value / plain[mode]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    same = {round(r["loss"], 5) for runs in measured.values() for r in runs}
    print(f"final losses identical across all runs: {len(same) == 1}")


def _measure(
    setups: dict[str, list[str] | None],
    rounds: int,
    devices: str,
    command: Callable[[list[str]], list[str]],
) -> dict[str, list[Any]]:
    """Start the setups' proxies, run ``command(where)`` in a fresh process for each setup in
    turn, ``rounds`` times; every setup's results, by name."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "proxy"))
    from proxy_harness import start_proxy, stop_proxy  # the tests' launcher

    proxies = {}
    measured: dict[str, list[Any]] = {name: [] for name in setups}
    try:
        for name, proxy_args in setups.items():
            if proxy_args is not None:
                proxies[name] = start_proxy(*proxy_args, timeout=180)
        for _ in range(rounds):
            for name in setups:
                proxy = proxies.get(name)
                where = ["proxy", proxy.address] if proxy else ["local", devices]
                measured[name].append(_run(command(where)))
    finally:
        for running in proxies.values():
            stop_proxy(running)
    return measured


def _transfer_table(measured: dict[str, list[Any]], sizes_mib: list[int], rounds: int) -> None:
    sys.path.insert(0, HERE)
    from dispatch import raw_tcp_rate

    raw = {mib: raw_tcp_rate(mib << 20, 5) / 1e6 for mib in sizes_mib}
    print(
        f"MB/s (10^6 bytes), medians of 5 transfers x {rounds} rounds; raw loopback TCP best of 5"
    )
    print("| setup | size | host to device | / raw TCP | device to host | / raw TCP |")
    print("|---|---:|---:|---:|---:|---:|")
    for mib in sizes_mib:
        print(f"| raw loopback TCP | {mib} MiB | {raw[mib]:.0f} | 1.00 | {raw[mib]:.0f} | 1.00 |")
    for name, runs in measured.items():
        for mib in sizes_mib:
            cells = []
            for way in ("up", "down"):
                rate = (mib << 20) / statistics.median(r[str(mib)][way] for r in runs) / 1e6
                cells += [f"{rate:.0f}", f"{rate / raw[mib]:.2f}"]
            print(f"| {name} | {mib} MiB | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "transfers":
        transfers(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
