"""Allocator throughput and placement quality under a realistic churn of requests.

64 islands of 256 TPU v5e devices (16x16 meshes); tenants request slices of mixed sizes (mesh
shapes from 1x1 to 16x16 and plain device counts, mostly small, with a few high-priority ones)
and release them, keeping the fleet busy. Every allocate and release is one decision.

Baseline, measured in the same run on the same request stream: a first-fit allocator over the
same placement tables (islands in name order, first free block wins, no snug-fit scoring, no
preemption, no caching). Reported: decisions/s, p50/p99 latency of one decision, the share of
requests bound, and the fleet's mean utilisation. The same stream is also run with every tenant
limited to an eighth of the fleet (``set_quota``): tenants then often wait at their quota, and
their high-priority requests make room in it by preempting their own slices.

    python benchmarks/allocator.py [--decisions 40000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import Allocator, Bound, IslandInventory, Request
from pathways_core.allocator.placement import bits, orientations, placement_table
from pathways_core.flags import at_least

MESH = (16, 16)
SHAPES = [(1,), (2,), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)]
SHAPE_WEIGHTS = [10, 10, 14, 14, 12, 8, 5, 2, 1]
COUNTS = [1, 4, 8, 16, 32]
TARGET_UTILISATION = 0.95
TENANTS = 8


class FirstFit:
    """The baseline: first free block in island-name order; the same interface as Allocator."""

    def __init__(self) -> None:
        self.islands: dict[str, tuple[IslandInventory, list[int]]] = {}
        self.bound: dict[str, tuple[str, int]] = {}

    def add_island(self, inventory: IslandInventory) -> None:
        self.islands[inventory.name] = (inventory, [0])

    def allocate(self, request: Request, preempt: bool = False) -> Bound | None:
        for name in sorted(self.islands):
            inventory, occupied = self.islands[name]
            if request.shape is not None:
                blocks = [o.block for o in orientations(request.shape, inventory.shape)]
                for block in blocks:
                    for mask in placement_table(inventory.shape, block).masks:
                        if not mask & occupied[0]:
                            return self._take(request, name, occupied, mask)
            else:
                free = bits(((1 << inventory.size) - 1) & ~occupied[0])
                if len(free) >= request.size:
                    mask = sum(1 << d for d in free[: request.size])
                    return self._take(request, name, occupied, mask)
        return None

    def _take(self, request: Request, name: str, occupied: list[int], mask: int) -> Bound:
        occupied[0] |= mask
        self.bound[request.key] = (name, mask)
        return Bound(None)  # type: ignore[arg-type]

    def release(self, key: str) -> None:
        name, mask = self.bound.pop(key)
        self.islands[name][1][0] &= ~mask


@dataclass
class Outcome:
    name: str
    latencies_ns: list[int] = field(default_factory=list)
    requests: int = 0
    bound: int = 0
    utilisation: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(self.latencies_ns) / 1e9

    @property
    def decisions_per_second(self) -> float:
        return len(self.latencies_ns) / self.seconds

    def percentile_us(self, q: float) -> float:
        ordered = sorted(self.latencies_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e3


def make_request(rng: random.Random, serial: int) -> Request:
    tenant = f"tenant-{rng.randrange(TENANTS)}"
    priority = 100 if rng.random() < 0.05 else 0
    key = f"{tenant}/slice-{serial}"
    if rng.random() < 0.25:
        return Request(key, tenant, count=rng.choice(COUNTS), priority=priority)
    shape = rng.choices(SHAPES, SHAPE_WEIGHTS)[0]
    return Request(key, tenant, shape=shape, kind=AcceleratorKind.TPU_V5E, priority=priority)


def run(
    allocator,
    islands: int,
    decisions: int,
    seed: int,
    name: str,
    preempt: bool = True,
    quota: int | None = None,
) -> Outcome:
    """Drive one allocator with the seeded request stream; ``decisions`` allocates + releases.
    ``quota``: the devices each tenant may hold (``Allocator`` only)."""
    rng = random.Random(seed)
    for index in range(islands):
        allocator.add_island(
            IslandInventory(f"island-{index:03d}", AcceleratorKind.TPU_V5E, MESH, 4)
        )
    capacity = islands * MESH[0] * MESH[1]
    if quota is not None:
        for tenant in range(TENANTS):
            allocator.set_quota(f"tenant-{tenant}", AcceleratorKind.TPU_V5E, quota)
    outcome = Outcome(name)
    live: list[tuple[str, int]] = []  # key, devices
    used = 0
    serial = 0
    clock = time.perf_counter_ns
    while len(outcome.latencies_ns) < decisions:
        # Release more often as the fleet fills, so it runs close to full and fragments.
        if live and rng.random() < 0.5 + (used / capacity - TARGET_UTILISATION) * 10:
            key, size = live.pop(rng.randrange(len(live)))
            start = clock()
            allocator.release(key)
            outcome.latencies_ns.append(clock() - start)
            used -= size
        else:
            serial += 1
            request = make_request(rng, serial)
            start = clock()
            decision = allocator.allocate(request, preempt=preempt)
            outcome.latencies_ns.append(clock() - start)
            outcome.requests += 1
            if isinstance(decision, Bound):
                outcome.bound += 1
                live.append((request.key, request.size))
                used += request.size
                for victim in decision.preempted or ():
                    live.remove((victim.key, victim.request.size))
                    used -= victim.request.size
        outcome.utilisation.append(used / capacity)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--islands", type=at_least(1), default=64)
    parser.add_argument("--decisions", type=at_least(1), default=40_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    ours = run(Allocator(), args.islands, args.decisions, args.seed, "allocator")
    # Placement quality is compared without preemption, which the baseline does not do.
    quality = run(
        Allocator(), args.islands, args.decisions, args.seed, "allocator, no preemption", False
    )
    baseline = run(FirstFit(), args.islands, args.decisions, args.seed, "first-fit baseline")
    capacity = args.islands * MESH[0] * MESH[1]
    quotas = run(
        Allocator(),
        args.islands,
        args.decisions,
        args.seed,
        "allocator, tenants at quotas",
        quota=capacity // TENANTS,
    )

    table = Table(title=f"{args.islands} islands x 256 devices, {args.decisions} decisions")
    for column in ("", "decisions/s", "p50 µs", "p99 µs", "requests bound", "mean utilisation"):
        table.add_column(column, justify="right")
    for outcome in (ours, quality, baseline, quotas):
        table.add_row(
            outcome.name,
            f"{outcome.decisions_per_second:,.0f}",
            f"{outcome.percentile_us(0.5):.1f}",
            f"{outcome.percentile_us(0.99):.1f}",
            f"{outcome.bound / outcome.requests:.1%}",
            f"{statistics.fmean(outcome.utilisation):.1%}",
        )
    console = Console()
    console.print(table)
    ratio = ours.decisions_per_second / baseline.decisions_per_second
    bound_ratio = (quality.bound / quality.requests) / (baseline.bound / baseline.requests)
    console.print(
        f"throughput {ratio:.2f}x the baseline; requests bound without preemption "
        f"{bound_ratio:.3f}x the baseline's; "
        f"target >= 10,000 decisions/s: {'met' if ours.decisions_per_second >= 1e4 else 'MISSED'}"
    )
    if args.json:
        record = {
            "name": "allocator",
            "value": ours.decisions_per_second,
            "baseline": baseline.decisions_per_second,
            "ratio": ratio,
            "unit": "decisions/s",
            "target": 10_000,
            "p50_us": ours.percentile_us(0.5),
            "p99_us": ours.percentile_us(0.99),
            "bound_share_no_preemption": quality.bound / quality.requests,
            "baseline_bound_share": baseline.bound / baseline.requests,
            "quotas_decisions_per_second": quotas.decisions_per_second,
            "quotas_p99_us": quotas.percentile_us(0.99),
            "parameters": {k: v for k, v in vars(args).items() if k != "json"},
            "machine": {"python": platform.python_version(), "processor": platform.machine()},
        }
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=2)


if __name__ == "__main__":
    main()
