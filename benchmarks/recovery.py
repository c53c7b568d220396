"""Recovery in the embedded mode: from an executor's death to its program running again,
against starting the same program fresh on a ready cluster (the floor).

An embedded cluster (``pathways up``: two islands of 1 host x 4 fake devices, the resource
manager, the API) runs a checkpointing driver (``restartPolicy: OnFailure``) that logs the wall
time of every completed step. Measured, interleaved, ``--repeats`` times each:

- **fresh**: from the submission to the first completed step (the driver's start, connection,
  compilation from the warm cache, one step): the floor any restart pays;
- **same island**: the driver's slice is pinned to ``island-0``; one of its executor processes
  is SIGKILLed mid-run, and the clock runs until the next run completes its first step: the
  supervisor notices the death, restarts the island, the manager sees it Degraded then Ready,
  binds the slice again and starts run 2, which restores its checkpoint;
- **remapped**: the slice may go anywhere; the executor of the island it runs on is killed and
  the slice is bound again on the other, healthy island (no wait for the restart).

Each kill hits an island that has run for the supervisor's ``STABLE_AFTER`` seconds, so it is
restarted at once (an island that dies again soon after a restart is restarted after a
back-off, as a crash loop).

Each figure is the median, in seconds, against the fresh start (ratio = recovery / fresh;
lower is better). ``--json FILE`` writes the records.

    python benchmarks/recovery.py [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from pathways_client.api_client import ApiCallError, ApiClient
from pathways_client.bench import machine
from pathways_client.embedded import STABLE_AFTER, IslandSpec, down, read_info, tokens, up
from pathways_core.flags import at_least

TENANT = "bench"
DRIVER = textwrap.dedent(
    """
    import time
    import numpy as np
    import pathways_client as pw
    from pathways_client import checkpoint

    run = checkpoint.run_number()
    restored = checkpoint.restore()
    step, state = restored if restored else (0, {"x": np.zeros(4, np.float32)})
    print(f"START run={run} step={step} t={time.time():.4f}", flush=True)
    with pw.connect() as cluster:
        inc = pw.function(lambda x: x + 1, slice=cluster.slice("main"), name="inc")
        x = state["x"]
        while True:  # until cancelled
            x = inc(x).result()
            step += 1
            checkpoint.save(step, {"x": x})
            print(f"STEP run={run} step={step} t={time.time():.4f}", flush=True)
            time.sleep(0.05)
    """
)
LINE = re.compile(r"^(START|STEP) run=(\d+) step=(\d+) t=([\d.]+)")


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except ApiCallError:
            value = None
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Bench:
    """One embedded cluster and the tenant's client."""

    def __init__(self, state: Path) -> None:
        self.state = state
        info = up(state, [IslandSpec("island-0", 1, 4), IslandSpec("island-1", 1, 4)], [TENANT])
        self.client = ApiClient(info.api, tokens(state)[TENANT])
        self.count = 0

    def close(self) -> None:
        self.client.close()
        down(self.state)

    def lines(self, name: str, run: int) -> list[tuple[str, int, float]]:
        log = self.state / "logs" / TENANT / f"{name}-run-{run}.log"
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return []
        found = []
        for line in text.splitlines():
            match = LINE.match(line)
            if match:
                found.append((match[1], int(match[3]), float(match[4])))
        return found

    def first_step(self, name: str, run: int, after: int = 0) -> float | None:
        """When run ``run`` completed its first step past ``after``."""
        return next(
            (t for kind, step, t in self.lines(name, run) if kind == "STEP" and step > after),
            None,
        )

    def submit(self, island: str | None) -> tuple[str, float]:
        self.count += 1
        name = f"p{self.count}"
        main: dict[str, Any] = {"name": "main", "devices": 4}
        if island:
            main["island"] = island
        document = {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "PathwaysProgram",
            "metadata": {"name": name},
            "spec": {
                "slices": [main],
                "restartPolicy": "OnFailure",
                "maxRestarts": 5,
                "driver": {"source": DRIVER},
            },
        }
        started = time.time()
        self.client.submit(document)
        return name, started

    def finish(self, name: str) -> None:
        """Cancel the program; return once every island is Ready with all devices free."""
        self.client.cancel(name)

        def settled() -> bool:
            islands = self.client.list("islands")
            return all(
                i["status"].get("phase") == "Ready"
                and i["status"].get("devicesFree") == i["status"].get("devicesTotal")
                for i in islands
            )

        wait_for(settled, 120, "every device free")

    def fresh(self) -> float:
        name, submitted = self.submit("island-0")
        first = wait_for(lambda: self.first_step(name, 1), 180, "the first step")
        self.finish(name)
        return first - submitted

    def recovery(self, island: str | None) -> dict[str, float]:
        name, _ = self.submit(island)
        wait_for(lambda: self.first_step(name, 1, after=2), 180, "three steps")
        placed = self.client.get("programs", name)["status"]["slices"][0]["island"]
        info = read_info(self.state)
        assert info is not None
        # An island killed again soon after its restart is in a crash loop, restarted after a
        # back-off: measure the restart of a healthy island.
        stable = info.islands[placed].get("startedAt", 0) + STABLE_AFTER + 0.5
        time.sleep(max(0.0, stable - time.time()))
        killed = time.time()
        os.kill(info.islands[placed]["executors"][0], signal.SIGKILL)

        def running_again() -> tuple[int, float] | None:
            runs = int(self.client.get("programs", name)["status"].get("runs") or 0)
            for run in range(2, runs + 1):
                moment = self.first_step(name, run)
                if moment is not None:
                    return run, moment
            return None

        run, moment = wait_for(running_again, 300, "the program to run again")
        started = self.lines(name, run)[0]
        assert started[0] == "START" and started[1] > 0, "the new run did not resume"
        now = self.client.get("programs", name)["status"]["slices"][0]["island"]
        self.finish(name)
        return {
            "seconds": moment - killed,
            "driver_started": started[2] - killed,
            "resumed_from_step": started[1],
            "moved": float(now != placed),
        }


def record(
    name: str, values: list[float], floor: list[float], parameters: dict[str, Any]
) -> dict[str, Any]:
    value, baseline = statistics.median(values), statistics.median(floor)
    return {
        "name": name,
        "value": value,
        "baseline": baseline,
        "ratio": value / baseline,
        "unit": "s",
        "target": None,
        "parameters": parameters,
        "machine": machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--quick", action="store_true", help="One repetition.")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    repeats = 1 if arguments.quick else arguments.repeats
    with tempfile.TemporaryDirectory(prefix="pathways-recovery-") as scratch:
        bench = Bench(Path(scratch) / "state")
        try:
            bench.fresh()  # warm-up: the compilation cache, the drivers' imports
            fresh: list[float] = []
            same: list[dict[str, float]] = []
            moved: list[dict[str, float]] = []
            for _ in range(repeats):
                fresh.append(bench.fresh())
                same.append(bench.recovery("island-0"))
                moved.append(bench.recovery(None))
                print(
                    f"fresh {fresh[-1]:.2f} s, same island {same[-1]['seconds']:.2f} s, "
                    f"remapped {moved[-1]['seconds']:.2f} s",
                    flush=True,
                )
        finally:
            bench.close()
    common = {"islands": "2 x (1 host x 4 fake CPU devices)", "slice": 4, "repeats": repeats}

    def against_fresh(name: str, runs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        seconds = [r["seconds"] for r in runs]
        driver_started = [r["driver_started"] for r in runs]
        return record(
            f"executor killed -> program running again, {name}, vs fresh start",
            seconds,
            fresh,
            {**common, "runs": seconds, "fresh": fresh, "driver_started": driver_started, **extra},
        )

    records = [
        against_fresh("same island restarted", same),
        against_fresh(
            "remapped to the healthy island", moved, moved=[bool(r["moved"]) for r in moved]
        ),
    ]
    for item in records:
        print(
            f"{item['name']}: {item['value']:.2f} s vs {item['baseline']:.2f} s = "
            f"{item['ratio']:.2f}x",
            flush=True,
        )
    if arguments.json:
        arguments.json.write_text(json.dumps(records, indent=2, default=str))


if __name__ == "__main__":
    main()
