"""What an island keeps of sessions that ended: sessions one after another each register a
function of their own, run it once and close; the scheduler's and the executor's resident
memory, and what they say they hold, after the last one against after the tenth (the
baseline: the processes warm).

    python benchmarks/session_memory.py [--sessions N]
"""

from __future__ import annotations

import argparse
import time

import grpc
import jax
import jax.numpy as jnp
import numpy as np
from rich.progress import track

from pathways_client.island_client import IslandClient
from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.flags import at_least
from pathways_core.wire import EXECUTOR, pb

WARM = 10  # sessions before the baseline


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"process {pid} has no VmRSS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=at_least(1), default=200)
    args = parser.parse_args()
    if args.sessions <= WARM:
        parser.error(f"--sessions must be more than {WARM}")
    shape = jax.ShapeDtypeStruct((4096,), jnp.float32)
    with LocalIsland(hosts=1, devices_per_host=4) as island:
        processes = {"scheduler": island.scheduler, "executor": island.executors[0]}
        baseline: dict[str, float] = {}
        for k in track(range(args.sessions), description="sessions"):
            step = jax.jit(lambda x, k=k: jnp.tanh(x * (k + 1)) + k)
            artifact = jax.export.export(step)(shape).serialize()
            with IslandClient(island.scheduler_endpoint, f"session-{k}") as client:
                function = client.register(artifact, f"step-{k}")
                x = client.put(np.ones(4096, np.float32), device=0)
                client.submit(function, [0], [x], 1).wait(60)
            if k + 1 == WARM:
                time.sleep(1)  # the last session's end reaches the executor
                baseline = {n: resident_mib(p.popen.pid) for n, p in processes.items()}
        time.sleep(1)
        grown = {n: resident_mib(p.popen.pid) - baseline[n] for n, p in processes.items()}
        with IslandClient(island.scheduler_endpoint, "observer") as observer:
            scheduler = observer.info
        with grpc.insecure_channel(island.executors[0].endpoint) as channel:
            executor = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30)
    print(
        f"after {args.sessions} sessions, resident memory grew since session {WARM}: "
        + ", ".join(f"{name} {mib:+.1f} MiB" for name, mib in grown.items())
        + f"; the scheduler holds {scheduler.functions} functions and {scheduler.programs} "
        f"programs, the executor {executor.functions} functions, {executor.executables} "
        f"executables and {executor.programs} programs"
    )


if __name__ == "__main__":
    main()
