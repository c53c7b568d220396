"""Dispatch and data-plane benchmarks of one island, each against a baseline from the same run.

1. The paper's dispatch benchmark: a trivial gang-scheduled all-reduce over 8 fake devices on 2
   executors, in modes -O (one call per step, waiting for it), -C (chains of 128 steps per call:
   a program of 128 nodes registered once, one message per call) and -F (128 steps fused into
   one function), against multi-controller JAX on the same layout
   (2 processes x 4 fake devices); swept over the computation size, with the smallest size at
   which -C reaches 95% of JAX. The same modes on one executor of 4 devices, against
   single-process JAX on 4 devices, separate the control plane's cost from the cross-host
   collectives'. (Single-process JAX on 8 fake devices deadlocks in this all-reduce on 2 cores.)
2. Parallel versus sequential asynchronous dispatch of chains of 2 to 16 stages, on one host
   and across two: each stage submitted once its predecessor completed, against the chain
   registered once as a program and dispatched in one call (the target), and against its
   computations submitted together in one batch; and the same chain in plain JAX with no
   control plane, as a JAX user writes it (``jax_stage_chain.py``).
3. Pulling 1 KiB to 256 MiB from an executor over the bulk data plane (the code executors pull
   inputs with, over a kept connection) against raw loopback TCP between two processes over a
   kept connection; and a call's 64 MiB host input sharded over two executors, sent to each in
   its parts, against the same sent whole to the first executor (the second pulling it).

    python benchmarks/dispatch.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)  # to export functions for up to 8 devices
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from jax_chain import all_reduce_step  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from pathways_client.island_client import IslandClient  # noqa: E402
from pathways_client.launcher import LocalIsland  # noqa: E402
from pathways_core.flags import at_least  # noqa: E402
from pathways_core.wire import pb  # noqa: E402

CHAIN = 128
# The paper's claim, as issue 8 states it: -C within 95% of JAX for computations of 1 ms or
# more, -F for 0.5 ms or more.
CLAIM_FLOOR_MS = {"-C": 1.0, "-F": 0.5}
console = Console(width=120)


def rate(run: Callable[[], int]) -> float:
    """Steps per second of one run."""
    start = time.perf_counter()
    steps = run()
    return steps / (time.perf_counter() - start)


def interleaved_best(
    runs: dict[str, Callable[[], float]], rounds: int, back_to_back: int = 1
) -> dict[str, float]:
    """The best rate of each run over ``rounds`` rounds that take every run once in turn (or
    ``back_to_back`` times in a row), so a burst of load on this shared machine hits a
    baseline and the runs compared with it alike."""
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            for _ in range(back_to_back):
                best[name] = max(best[name], run())
    return best


def fused_steps(x):
    return jax.lax.fori_loop(0, CHAIN, lambda _, y: all_reduce_step(y), x)


def exported(function, shape, sharding) -> bytes:
    spec = jax.ShapeDtypeStruct(shape, jnp.float32)
    jitted = jax.jit(function, in_shardings=sharding, out_shardings=sharding)
    return bytes(jax.export.export(jitted)(spec).serialize())


class JaxProcesses:
    """Plain JAX in processes of its own, kept running so its rounds interleave with the
    island's: single-process JAX on 4 fake devices (``single_process.py``), or
    multi-controller JAX on 2 processes x 4 (``multi_controller.py``, gloo collectives); with
    ``stage_chain``, the chain suite's chain over 1 or 2 such processes
    (``jax_stage_chain.py``)."""

    def __init__(self, hosts: int, stage_chain: bool = False) -> None:
        from pathways_client.launcher import free_port

        if stage_chain:
            script, port = Path(__file__).with_name("jax_stage_chain.py"), free_port()
            commands = [[str(script), str(i), str(hosts), str(port)] for i in range(hosts)]
        elif hosts == 1:
            commands = [[str(Path(__file__).with_name("single_process.py"))]]
        else:
            script, coordinator = Path(__file__).with_name("multi_controller.py"), free_port()
            commands = [[str(script), str(i), f"127.0.0.1:{coordinator}"] for i in range(2)]
        self._processes = [
            subprocess.Popen(
                [sys.executable, *command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for command in commands
        ]

    def _ask(self, command: str) -> str:
        """Every process runs ``command`` (the processes of a JAX group take part in each
        step); the first one's answer."""
        for process in self._processes:
            assert process.stdin is not None
            process.stdin.write(command + "\n")
            process.stdin.flush()
        answers = []
        for process in self._processes:
            assert process.stdout is not None
            answers.append(process.stdout.readline().strip())
        if not all(answers):
            raise RuntimeError(f"a baseline JAX process exited answering {command!r}")
        return answers[0]

    def prepare(self, size: int) -> Callable[[], float]:
        """A run of the step on ``size`` floats per device, chained ``CHAIN`` times (steps/s)."""
        self._ask(f"SIZE {size}")
        return lambda: float(self._ask(f"RUN {CHAIN}"))

    def chain(self, stages: int) -> float:
        """Chains per second of one run of the chain suite's chain of ``stages`` stages."""
        return float(self._ask(f"CHAIN {stages}"))

    def close(self) -> None:
        for process in self._processes:
            process.kill()
            process.wait()


def island_modes(
    client: IslandClient, shape, sharding, devices: list[int]
) -> dict[str, Callable[[], float]]:
    """A run of each mode (steps/s)."""
    step = client.register(exported(all_reduce_step, shape, sharding), "all-reduce")
    fused = client.register(exported(fused_steps, shape, sharding), "all-reduce-x128")
    host = client.put(np.ones(shape, np.float32), device=0)
    first = client.submit(step, devices, [host], 1)  # compiles once
    client.submit(fused, devices, [host], 1).wait()
    first.wait()
    # Every mode starts from an array already on the devices, as the JAX loop does.
    x = first.outputs[0]
    client.delete([host])

    # Like the JAX loop, which drops each intermediate as soon as the next step is dispatched,
    # the client frees each intermediate once its consumer is queued: buffers held longer cost
    # memory traffic (and page faults) that have nothing to do with dispatch.
    def op_by_op() -> int:
        current = x
        for _ in range(CHAIN // 8):
            call = client.submit(step, devices, [current], 1)
            call.wait()
            if current != x:
                client.delete([current])
            current = call.outputs[0]
        client.delete([current])
        return CHAIN // 8

    # -C: the chain of 128 steps is a program, registered once and called with one message
    # per chain; its intermediates live only on the executors, as the JAX loop drops each one
    # as soon as the next step is dispatched.
    nodes = [
        pb.Computation(
            id=f"s{k}",
            function_id=step,
            devices=devices,
            inputs=["x" if k == 0 else f"y{k - 1}"],
            outputs=[f"y{k}"],
        )
        for k in range(CHAIN)
    ]
    chain = client.register_program(nodes, ["x"], [f"y{CHAIN - 1}"], name=f"all-reduce-x{CHAIN}")

    def chained() -> int:
        call = client.call(chain, [x])
        call.wait()
        client.delete(call.outputs)
        return CHAIN

    def fused_call() -> int:
        call = client.submit(fused, devices, [x], 1)
        call.wait()
        client.delete(list(call.outputs))
        return CHAIN

    return {
        "-O": lambda: rate(op_by_op),
        "-C": lambda: rate(chained),
        "-F": lambda: rate(fused_call),
    }


def dispatch_suite(sizes: dict[int, list[int]], repeats: int, records: list[dict]) -> None:
    """The dispatch benchmark on each layout in ``sizes`` (executors -> floats per device)."""
    # On these 2-core machines, single-process JAX deadlocks in an all-reduce over 8 fake
    # devices (XLA's CPU rendezvous times out with 5-7 of 8 participants), so the layouts are
    # 8 devices as 2 hosts x 4, against multi-controller JAX on the same layout, and 4 devices
    # on one host, against single-process JAX on 4 devices.
    layouts = [
        (2, "2 executors x 4 devices", "multi-controller JAX, 2 processes x 4 devices"),
        (1, "1 executor x 4 devices", "single-process JAX, 4 devices"),
    ]
    for hosts, layout, baseline_name in layouts:
        if hosts not in sizes:
            continue
        devices = 4 * hosts
        mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
        sharding = NamedSharding(mesh, PartitionSpec("x"))
        table = Table(title=f"dispatch: all-reduce, {layout} (steps/s); baseline {baseline_name}")
        columns = ("floats/device", "JAX ms/step", "JAX", "-O", "-C", "-F", "-C/JAX", "-F/JAX")
        for column in columns:
            table.add_column(column, justify="right")
        # The smallest size (and JAX's time per step there) at which each mode reaches 95%.
        first_match: dict[str, tuple[int, float]] = {}
        # Per mode, whether it reached 95% at each size at least as long as the claim's floor.
        above_floor: dict[str, list[bool]] = {mode: [] for mode in CLAIM_FLOOR_MS}
        with (
            LocalIsland(hosts=hosts, devices_per_host=4, max_in_flight=256) as island,
            contextlib.closing(JaxProcesses(hosts)) as plain_jax,
        ):
            client = IslandClient(island.scheduler_endpoint, f"bench-{hosts}")
            for size in sizes[hosts]:
                shape = (devices, size)
                runs = {
                    "JAX": plain_jax.prepare(size),
                    **island_modes(client, shape, sharding, list(range(devices))),
                }
                # Each run twice in a row: a run right after another mode's starts cold (-C
                # after -O's sparse steps ran ~10% slower than back to back), and JAX's own
                # loop, measured alike, would otherwise be the only one run warm.
                modes = interleaved_best(runs, repeats, back_to_back=2)
                baseline = modes.pop("JAX")
                table.add_row(
                    f"{size:,}",
                    f"{1e3 / baseline:.3f}",
                    f"{baseline:,.0f}",
                    *(f"{modes[m]:,.0f}" for m in modes),
                    f"{modes['-C'] / baseline:.2f}",
                    f"{modes['-F'] / baseline:.2f}",
                )
                for mode in CLAIM_FLOOR_MS:
                    if mode not in first_match and modes[mode] >= 0.95 * baseline:
                        first_match[mode] = (size, 1e3 / baseline)
                for mode, rate in modes.items():
                    floor_ms = CLAIM_FLOOR_MS.get(mode)
                    applies = floor_ms is not None and 1e3 / baseline >= floor_ms
                    if applies:
                        above_floor[mode].append(rate >= 0.95 * baseline)
                    records.append(
                        {
                            "name": f"dispatch{mode}",
                            "value": rate,
                            "baseline": baseline,
                            "ratio": rate / baseline,
                            "unit": "steps/s",
                            "target": 0.95 if applies else None,
                            "parameters": {
                                "floats_per_device": size,
                                "jax_ms_per_step": 1e3 / baseline,
                                "layout": layout,
                                "baseline": baseline_name,
                            },
                        }
                    )
            client.close()
        console.print(table)
        for mode, floor_ms in CLAIM_FLOOR_MS.items():
            if mode in first_match:
                size, step_ms = first_match[mode]
                reached = f"{size:,} floats per device ({step_ms:.2f} ms per step in JAX)"
            else:
                reached = f"not reached up to {sizes[hosts][-1]:,} floats per device"
            size, step_ms = first_match.get(mode, (None, None))
            records.append(
                {
                    "name": f"smallest computation at which {mode} reaches 95% of JAX",
                    "value": step_ms,
                    "baseline": None,
                    "ratio": None,
                    "unit": "ms per step",
                    "target": None,
                    "parameters": {"floats_per_device": size, "layout": layout},
                }
            )
            # The claim itself: within 95% of JAX at every size measured whose step takes
            # JAX at least the floor (on two hosts even the smallest takes ~3 ms).
            passed = above_floor[mode]
            if passed:
                records.append(
                    {
                        "name": f"sizes of {floor_ms:g} ms or more at which {mode} is within "
                        "95% of JAX",
                        "value": sum(passed),
                        "baseline": len(passed),
                        "ratio": sum(passed) / len(passed),
                        "unit": "sizes",
                        "target": 1.0,
                        "parameters": {"layout": layout},
                    }
                )
            console.print(
                f"smallest computation at which {mode} reaches 95% of JAX ({layout}): {reached}; "
                f"within 95% at {sum(passed)} of {len(passed)} sizes of {floor_ms:g} ms or more"
            )


def chain_suite(repeats: int, records: list[dict], lengths: tuple[int, ...]) -> None:
    with LocalIsland(hosts=2, devices_per_host=4, max_in_flight=64) as island:
        client = IslandClient(island.scheduler_endpoint, "chain")
        step = client.register(exported(lambda x: x * 1.0001 + 1, (1024,), None), "stage")
        host = client.put(np.ones(1024, np.float32), device=0)
        for device in range(8):  # compile on every device
            client.submit(step, [device], [host], 1).wait()
        # Chains start from an array already on the devices: they measure dispatch, not upload.
        first = client.submit(step, [0], [host], 1)
        first.wait()
        x = first.outputs[0]

        def run(devices: list[int], parallel: bool, stages: int) -> int:
            current, made = x, []
            # Batch: the whole chain is submitted in one pass (one message), before the first
            # stage has run. Sequential: each stage is submitted once its predecessor
            # completed.
            with client.batch() if parallel else contextlib.nullcontext():
                for stage in range(stages):
                    device = devices[stage % len(devices)]
                    call = client.submit(step, [device], [current], 1, name=f"stage-{stage}")
                    if not parallel:
                        call.wait()
                    current = call.outputs[0]
                    made.append(current)
            call.wait()
            client.delete(made)
            return 1

        def program(devices: list[int], stages: int) -> str:
            """The chain registered once as a program (see ``IslandClient.register_program``)."""
            nodes, previous = [], "x"
            for stage in range(stages):
                nodes.append(
                    pb.Computation(
                        id=f"s{stage}",
                        function_id=step,
                        devices=[devices[stage % len(devices)]],
                        inputs=[previous],
                        outputs=[f"y{stage}"],
                        name=f"stage-{stage}",
                    )
                )
                previous = f"y{stage}"
            return client.register_program(nodes, ["x"], [previous], name=f"chain-{stages}")

        def called(chain: str) -> int:
            call = client.call(chain, [x])
            call.wait()
            client.delete(call.outputs)
            return 1

        # Stage s runs on the s-th device of the layout, cycling: each stage is its own slice.
        layouts = {"one host (4 devices)": [0, 1, 2, 3], "two hosts (8 devices)": list(range(8))}
        for label, devices in layouts.items():
            hosts = len(devices) // 4
            with contextlib.closing(JaxProcesses(hosts, stage_chain=True)) as plain_jax:
                for stages in lengths:
                    chain = program(devices, stages)
                    rates = interleaved_best(
                        {
                            "sequential": lambda d=devices, n=stages: rate(
                                lambda: run(d, False, n)
                            ),
                            "batch": lambda d=devices, n=stages: rate(lambda: run(d, True, n)),
                            "program": lambda c=chain: rate(lambda: called(c)),
                            "plain JAX": lambda n=stages: plain_jax.chain(n),
                        },
                        repeats,
                    )
                    records.extend(chain_records(rates, stages, label))
        client.close()


def chain_records(rates: dict[str, float], stages: int, label: str) -> list[dict]:
    """The chain suite's figures for one chain (chains/s by mode), printed as they come."""
    sequential, jax_rate = rates["sequential"], rates["plain JAX"]
    console.print(
        f"{stages}-stage chain over {label}: sequential {1e3 / sequential:.2f} ms, "
        f"one program call {1e3 / rates['program']:.2f} ms "
        f"({rates['program'] / sequential:.1f}x), one batch of computations "
        f"{1e3 / rates['batch']:.2f} ms ({rates['batch'] / sequential:.1f}x), plain JAX "
        f"{1e3 / jax_rate:.2f} ms ({jax_rate / sequential:.1f}x)"
        + (" (target >= 8x)" if stages == 16 else "")
    )
    figures = [
        ("program", f"parallel-dispatch-{stages}", sequential, 8.0 if stages == 16 else None),
        ("batch", f"parallel-dispatch-{stages}, computations in one batch", sequential, None),
        # The same chain in plain JAX with no control plane, as a JAX user writes it.
        ("plain JAX", f"parallel-dispatch-{stages}, plain JAX", sequential, None),
    ]
    if stages == 16:  # how close one program call comes to it
        figures.append(("program", f"parallel-dispatch-{stages} against plain JAX", jax_rate, None))
    return [
        {
            "name": name,
            "value": rates[mode],
            "baseline": baseline,
            "ratio": rates[mode] / baseline,
            "unit": "chains/s",
            "target": target,
            "parameters": {"stages": stages, "layout": label, "dispatch": mode},
        }
        for mode, name, baseline, target in figures
    ]


def _tcp_sink(port: int, size: int, count: int, ready) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.set()
        connection, _ = server.accept()
        with connection:
            view = memoryview(bytearray(size))
            for _ in range(count):
                got = 0
                while got < size:
                    got += connection.recv_into(view[got:], size - got)
                connection.sendall(b"k")


def raw_tcp_rate(size: int, repeats: int) -> float:
    """Best of ``repeats`` transfers of ``size`` bytes between two processes over one warm
    loopback connection (the receiver reuses one buffer)."""
    payload = np.random.default_rng(0).bytes(size)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")  # never fork once JAX is imported
    ready = spawn.Event()
    sink = spawn.Process(target=_tcp_sink, args=(port, size, repeats + 1, ready))
    sink.start()
    ready.wait(30)
    rates = []
    with socket.create_connection(("127.0.0.1", port)) as connection:
        for _ in range(repeats + 1):
            start = time.perf_counter()
            connection.sendall(payload)
            connection.recv(1)
            rates.append(size / (time.perf_counter() - start))
    sink.join()
    return max(rates)


def transfer_suite(repeats: int, records: list[dict], sizes: tuple[int, ...]) -> None:
    from pathways_core.wire.arrays import Assembly
    from pathways_executor.data_plane import Puller

    with LocalIsland(hosts=2, devices_per_host=4) as island, contextlib.closing(Puller()) as puller:
        client = IslandClient(island.scheduler_endpoint, "transfer")
        source = client.info.executors[0].data_endpoint
        for size in sizes:
            buffer = client.put(np.ones(size // 4, np.float32), device=0)
            rates = []
            for _ in range(repeats + 1):
                # The very code an executor runs to pull an input from a peer, over a kept
                # connection as an executor's are (the first round opens it), as the raw TCP
                # baseline's is.
                start = time.perf_counter()
                assembly = Assembly()
                puller.pull(source, buffer, 120, assembly)
                assert assembly.complete
                rates.append(size / (time.perf_counter() - start))
            client.delete([buffer])
            ours, raw = max(rates), raw_tcp_rate(size, repeats)
            label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
            console.print(
                f"{label} pulled from an executor: {ours / 2**30:.3f} GiB/s; raw loopback TCP "
                f"{raw / 2**30:.3f} GiB/s: {ours / raw:.0%} of raw TCP"
                + (" (target >= 70%)" if size >= 64 << 20 else "")
            )
            records.append(
                {
                    "name": f"transfer-{label.replace(' ', '')}",
                    "value": ours,
                    "baseline": raw,
                    "ratio": ours / raw,
                    "unit": "bytes/s",
                    "target": 0.7 if size >= 64 << 20 else None,
                    "parameters": {"bytes": size},
                }
            )
        client.close()
        sharded_input_figure(island, repeats, records)


def sharded_input_figure(
    island: LocalIsland, repeats: int, records: list[dict], size: int = 64 << 20
) -> None:
    """A call's host input sharded over the island's two executors, uploaded to each in the
    parts its devices take, against the same call with the input uploaded whole to the first
    executor and pulled whole from there by the second (what calls did before)."""
    import pathways_client as pw
    from pathways_client import futures

    value = np.ones(size // 4, np.float32)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    with pw.connect(island) as cluster, cluster.slice(devices=8) as line:
        spec = PartitionSpec("x")
        step = pw.function(lambda x: x[::4096] + 1, slice=line, in_shardings=spec)
        step(value).wait()
        try:
            for _ in range(repeats + 1):
                for parts in (True, False):  # alternated: the host's noise falls on both
                    futures.UPLOAD_IN_PARTS = parts
                    start = time.perf_counter()
                    step(value).wait()
                    seconds[parts].append(time.perf_counter() - start)
        finally:
            futures.UPLOAD_IN_PARTS = True
    ours, whole = size / min(seconds[True]), size / min(seconds[False])
    console.print(
        f"{size >> 20} MiB host input of a call sharded over two executors: "
        f"{ours / 2**30:.3f} GiB/s sent in parts; {whole / 2**30:.3f} GiB/s sent whole to the "
        f"first executor: {ours / whole:.2f}x"
    )
    records.append(
        {
            "name": f"transfer-sharded-input-{size >> 20}MiB",
            "value": ours,
            "baseline": whole,
            "ratio": ours / whole,
            "unit": "bytes/s",
            "target": None,
            "parameters": {"bytes": size, "executors": 2},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    parser.add_argument("--only", nargs="*", choices=["dispatch", "chain", "transfer"])
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--sizes", type=at_least(1), nargs="*", help="floats per device to sweep")
    parser.add_argument(
        "--hosts",
        type=int,
        choices=[1, 2],
        nargs="*",
        default=[2, 1],
        help="dispatch layouts: executors",
    )
    args = parser.parse_args()
    full = [16, 1024, 16_384, 131_072, 262_144, 524_288, 1_048_576, 2_097_152]
    # Two hosts step at 3 ms or more from the smallest size (gloo), and their largest size
    # took ~50 s of a 5-minute quick run on a slow host: one host alone goes on past 1 ms.
    quick = {2: [16, 4096, 262_144], 1: [16, 4096, 262_144, 1_048_576]}
    sizes = {hosts: args.sizes or (quick[hosts] if args.quick else full) for hosts in args.hosts}
    records: list[dict] = []
    try:
        run_suites(args.only or ["dispatch", "chain", "transfer"], args.quick, sizes, records)
    finally:  # the figures measured are kept when a later one fails
        if args.json:
            machine = {"python": platform.python_version(), "processor": platform.machine()}
            with open(args.json, "w") as handle:
                json.dump([{**r, "machine": machine} for r in records], handle, indent=2)


def run_suites(
    suites: list[str], quick: bool, sizes: dict[int, list[int]], records: list[dict]
) -> None:
    """Measure ``suites`` in order, adding each figure to ``records`` as it is measured."""
    repeats = 3 if quick else 5
    if "dispatch" in suites:
        # Every run is taken twice in a row: two rounds make --quick's four runs per mode.
        dispatch_suite(sizes, 2 if quick else repeats, records)
    if "chain" in suites:
        # Chains take milliseconds: best of many.
        chain_suite(10 * repeats if not quick else 5 * repeats, records, (2, 4, 8, 16))
    if "transfer" in suites:
        kib, mib = 1 << 10, 1 << 20
        transfer_suite(
            repeats,
            records,
            (kib, mib, 64 * mib) if quick else (kib, 64 * kib, mib, 16 * mib, 64 * mib, 256 * mib),
        )


if __name__ == "__main__":
    main()
