"""How much plain JAX's step slows when another process takes part of a core: the cost, on
fake CPU devices, of CPU spent anywhere else on the machine (the island's control plane, for
one). The dispatch benchmark's -C mode pays that cost; on accelerators it does not, because
the devices are not the host's cores.

Single-process JAX runs the dispatch benchmark's step (the 4-device all-reduce, chained as the
-C baseline is) alone and beside a process that spins for a share of each 0.2 ms and sleeps
the rest, at nice 0 (as the island's processes run) and at nice 19. Each loaded run is paired
with a run alone right before it; a ratio is loaded against that run.

    python benchmarks/load_sensitivity.py [--sizes N ...] [--loads F ...] [--repeats R]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import time
from typing import Any

from dispatch import CHAIN, JaxProcesses, interleaved_best
from rich.console import Console
from rich.table import Table

from pathways_core.flags import at_least, fraction

QUANTUM_SECONDS = 0.0002


def spin(share: float, niceness: int, started: Any) -> None:
    """Use ``share`` of one core, in slices of ``QUANTUM_SECONDS``, until killed."""
    os.nice(niceness)
    started.set()
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < QUANTUM_SECONDS * share:
            pass
        time.sleep(QUANTUM_SECONDS * (1 - share))


def loaded_rate(run, share: float, niceness: int) -> float:
    """The steps/s of ``run`` while a process uses ``share`` of a core at ``niceness``."""
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    load = context.Process(target=spin, args=(share, niceness, started), daemon=True)
    load.start()
    started.wait(60)  # past its imports: from now on it only spins
    try:
        return run()
    finally:
        load.kill()
        load.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=at_least(1), nargs="*", default=[16, 524_288])
    parser.add_argument("--loads", type=fraction, nargs="*", default=[0.1, 0.2, 0.3])
    parser.add_argument("--repeats", type=at_least(1), default=3, help="best of this many runs")
    args = parser.parse_args()
    console = Console(width=120)
    table = Table(title=f"single-process JAX, 4 devices, all-reduce chained {CHAIN} steps")
    columns = ("floats/device", "load", "nice", "alone ms/step", "loaded ms/step", "ratio")
    for column in (*columns, "µs of step per µs of load"):
        table.add_column(column, justify="right")
    with contextlib.closing(JaxProcesses(hosts=1)) as jax_process:
        for size in args.sizes:
            run = jax_process.prepare(size)
            for share in args.loads:
                for niceness in (0, 19):
                    rates = interleaved_best(
                        {
                            "alone": run,
                            "loaded": lambda r=run, s=share, n=niceness: loaded_rate(r, s, n),
                        },
                        args.repeats,
                    )
                    alone_ms, loaded_ms = 1e3 / rates["alone"], 1e3 / rates["loaded"]
                    load_ms = share * loaded_ms  # the load's CPU per step
                    table.add_row(
                        f"{size:,}",
                        f"{share:.0%} of a core",
                        str(niceness),
                        f"{alone_ms:.3f}",
                        f"{loaded_ms:.3f}",
                        f"{rates['loaded'] / rates['alone']:.2f}",
                        f"{(loaded_ms - alone_ms) / load_ms:.1f}",
                    )
    console.print(table)


if __name__ == "__main__":
    main()
