"""Pipelines and islands against SPMD and one island, measured side by side in one run.

1. The 4-stage GPipe model of ``examples/pipeline_mlp.py`` on 4 slices of 2 devices against the
   same model and step run SPMD (data parallel) on one slice of the same 8 devices.
2. Data parallel across two islands of 4 devices (gradients over DCN) of
   ``examples/two_islands.py`` against the same training on one island of 8 devices (2 hosts).

Throughput in samples per second after warm-up (compilation excluded), several repetitions
interleaved so both sides see the same machine load. ``--json FILE`` writes the figures.

    python benchmarks/pipeline.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pathways_client as pw
from pathways_client.examples import load_example
from pathways_client.launcher import LocalIsland

# Big enough that a stage's computation takes milliseconds, as on real accelerators.
WIDTH, BATCH = 1024, 64


def samples_per_second(train: Callable[[], Any], samples: int) -> float:
    start = time.perf_counter()
    train()
    return samples / (time.perf_counter() - start)


def interleaved(
    runs: dict[str, Callable[[], Any]], samples: int, repeats: int
) -> dict[str, list[float]]:
    """Each run once to warm up, then ``repeats`` rounds alternating between them."""
    for train in runs.values():
        train()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, train in runs.items():
            rates[name].append(samples_per_second(train, samples))
    return rates


def pipeline_vs_spmd(quick: bool, cache: Path) -> list[dict[str, Any]]:
    """The paper's Table 2 shape: S stages x M microbatches against SPMD, on 8 devices."""
    pipeline = load_example("pipeline_mlp")
    shapes = [(2, 4), (4, 8)] if quick else [(s, m) for s in (2, 4) for m in (4, 8, 16)]
    records = []
    with (
        LocalIsland(hosts=2, devices_per_host=4, compilation_cache=cache) as island,
        pw.connect(island) as cluster,
        # The SPMD baseline's own session, which binds the same 8 devices as the stages:
        # a session never uses a slice it gave back, and the two models run in turn.
        pw.connect(island) as baseline,
    ):
        for stages, microbatches in shapes:
            config = pipeline.Config(
                stages=stages,
                microbatches=microbatches,
                devices_per_stage=8 // stages,
                width=WIDTH,
                batch=BATCH,
                steps=2 if quick else 3,
            )
            slices = [cluster.slice(devices=8 // stages, name=f"stage-{s}") for s in range(stages)]
            model = pipeline.Pipeline(slices, config)
            params, inputs, targets = pipeline.init(config)
            whole = baseline.slice(devices=8, name="spmd")
            spmd = pipeline.Spmd(whole, config)
            samples = config.steps * config.microbatches * config.batch
            rates = interleaved(
                {
                    "pipeline": lambda m=model, p=params, i=inputs, t=targets: m.train(p, i, t),
                    "spmd": lambda m=spmd, p=params, i=inputs, t=targets: m.train(p, i, t),
                },
                samples,
                repeats=2 if quick else 3,
            )
            for item in [*slices, whole]:
                item.release()
            record = _record(
                f"pipeline (S={stages}, M={microbatches}) vs SPMD",
                rates,
                "pipeline",
                "spmd",
                0.9 if (stages, microbatches) == (4, 16) else None,
                config.__dict__,
            )
            records.append(record)
            _say(record)
    return records


def two_islands_vs_one(quick: bool, cache: Path) -> list[dict[str, Any]]:
    islands = load_example("two_islands")
    config = islands.Config(width=WIDTH, batch=8 * BATCH, steps=3 if quick else 6)
    samples = config.steps * config.batch
    with (
        LocalIsland(hosts=1, devices_per_host=4, name="a", compilation_cache=cache) as a,
        LocalIsland(hosts=1, devices_per_host=4, name="b", compilation_cache=cache) as b,
        LocalIsland(hosts=2, devices_per_host=4, name="one", compilation_cache=cache) as one,
        pw.connect([a, b, one]) as cluster,
    ):
        split = islands.DataParallel(
            [cluster.slice(devices=4, island="a"), cluster.slice(devices=4, island="b")], config
        )
        single = islands.DataParallel([cluster.slice(devices=8, island="one")], config)
        data = islands.init(config)
        rates = interleaved(
            {"two islands": lambda: split.train(*data), "one island": lambda: single.train(*data)},
            samples,
            repeats=2 if quick else 3,
        )
    return [
        _record(
            "two islands (2 x 4 devices) vs one island (8 devices)",
            rates,
            "two islands",
            "one island",
            0.9,
            config.__dict__,
        )
    ]


def _record(
    name: str,
    rates: dict[str, list[float]],
    ours: str,
    baseline: str,
    target: float | None,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    value, base = statistics.median(rates[ours]), statistics.median(rates[baseline])
    return {
        "name": name,
        "value": value,
        "baseline": base,
        "ratio": value / base,
        "unit": "samples/s",
        "target": target,
        "runs": rates,
        "parameters": parameters,
    }


def _say(record: dict[str, Any]) -> None:
    target = f" (target {record['target']}x)" if record["target"] else ""
    print(
        f"{record['name']}: {record['value']:.0f} vs {record['baseline']:.0f} "
        f"{record['unit']} = {record['ratio']:.2f}x{target}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["pipeline", "islands"], action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cache = Path.home() / ".cache" / "pathways" / "bench-xla"
    suites = {"pipeline": pipeline_vs_spmd, "islands": two_islands_vs_one}
    records = []
    for name, suite in suites.items():
        if args.only and name not in args.only:
            continue
        for record in suite(args.quick, cache):
            records.append(record)
            if name != "pipeline":
                _say(record)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2, default=str))


if __name__ == "__main__":
    main()
