"""Pipelines and islands against SPMD and one island, measured side by side in one run.

1. The pipelined model of ``examples/pipeline_mlp.py`` (S stages on S slices of 8/S devices, M
   microbatches of a global batch of ``GLOBAL_BATCH`` samples a step, as the paper's Table 2
   splits its batch) against the same model and step run SPMD on one slice of the same 8
   devices, in the faster of its two layouts measured in the same run: data parallel (weights
   replicated, gradients all-reduced) and tensor parallel (weights split as the pipeline's
   stages split theirs). Both layouts and the pipeline compute the same losses (checked).
2. Data parallel across two islands of 1 host x 4 devices (gradients over DCN) of
   ``examples/two_islands.py`` against the same training on one island of 1 host x 8 devices
   (one process: its all-reduce stays on the island, as on an island's own interconnect),
   over global batch sizes: the exchange of gradients is a fixed cost per step, so the ratio
   grows with the step's compute. Also against one island of 2 hosts x 4 devices (its
   all-reduce crosses processes through gloo), for information.

Throughput in samples per second after warm-up (compilation excluded), rounds interleaved so
every side sees the same machine load; medians, and the spread of the rounds' ratios.
``--json FILE`` writes the figures.

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

import numpy as np

import pathways_client as pw
from pathways_client.examples import load_example
from pathways_client.launcher import LocalIsland

# Big enough that a stage's computation takes milliseconds, as on real accelerators.
WIDTH = 1024
# Samples per training step of the pipeline, split into its microbatches.
GLOBAL_BATCH = 1024
# Training steps of this long or longer (of the one-island baseline) carry the islands target:
# real ones are longer still, and the gradients' exchange is a fixed cost per step.
LONG_STEP_MS = 100.0


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
    shapes = [(2, 4), (4, 16)] if quick else [(s, m) for s in (2, 4) for m in (4, 8, 16)]
    records = []
    with (
        LocalIsland(hosts=2, devices_per_host=4, compilation_cache=cache) as island,
        pw.connect(island) as cluster,
        # The SPMD baselines' own session, which binds the same 8 devices as the stages:
        # a session never uses a slice it gave back, and the models run in turn.
        pw.connect(island) as baseline,
    ):
        for stages, microbatches in shapes:
            config = pipeline.Config(
                stages=stages,
                microbatches=microbatches,
                devices_per_stage=8 // stages,
                width=WIDTH,
                batch=GLOBAL_BATCH // microbatches,
                steps=2 if quick else 3,
            )
            slices = [cluster.slice(devices=8 // stages, name=f"stage-{s}") for s in range(stages)]
            whole = baseline.slice(devices=8, name="spmd")
            params, inputs, targets = pipeline.init(config)
            models = {
                "pipeline": pipeline.Pipeline(slices, config),
                **{
                    f"spmd ({layout})": pipeline.Spmd(whole, config, layout)
                    for layout in pipeline.Spmd.LAYOUTS
                },
            }
            _check_same_losses(
                {name: model.train(params, inputs, targets)[0] for name, model in models.items()}
            )
            samples = config.steps * GLOBAL_BATCH
            rates = interleaved(
                {
                    name: lambda m=model, p=params, i=inputs, t=targets: m.train(p, i, t)
                    for name, model in models.items()
                },
                samples,
                repeats=3 if quick else 5,
            )
            for item in [*slices, whole]:
                item.release()
            best = max(
                (name for name in rates if name.startswith("spmd")),
                key=lambda name: statistics.median(rates[name]),
            )
            record = _record(
                f"pipeline (S={stages}, M={microbatches}) vs SPMD",
                rates,
                "pipeline",
                best,
                0.9 if (stages, microbatches) == (4, 16) else None,
                {**config.__dict__, "global_batch": GLOBAL_BATCH, "baseline": best},
            )
            records.append(record)
            _say(record)
    return records


def _check_same_losses(losses: dict[str, list[float]]) -> None:
    """Every model's losses equal the first's (they compute one function: a benchmark of
    models that differ would compare nothing)."""
    first = next(iter(losses.values()))
    for name, values in losses.items():
        if not np.allclose(values, first, rtol=1e-4):
            raise AssertionError(f"{name} computes other losses than the first: {losses}")


def two_islands_vs_one(quick: bool, cache: Path) -> list[dict[str, Any]]:
    islands = load_example("two_islands")
    batches = [8192] if quick else [2048, 8192, 32768]
    records = []
    with (
        LocalIsland(hosts=1, devices_per_host=4, name="a", compilation_cache=cache) as a,
        LocalIsland(hosts=1, devices_per_host=4, name="b", compilation_cache=cache) as b,
        LocalIsland(hosts=1, devices_per_host=8, name="one", compilation_cache=cache) as one,
        LocalIsland(hosts=2, devices_per_host=4, name="hosts", compilation_cache=cache) as hosts,
        pw.connect([a, b, one, hosts]) as cluster,
    ):
        split_slices = [cluster.slice(devices=4, island="a"), cluster.slice(devices=4, island="b")]
        one_slice = cluster.slice(devices=8, island="one")
        hosts_slice = cluster.slice(devices=8, island="hosts")
        for batch in batches:
            config = islands.Config(width=WIDTH, batch=batch, steps=4 if quick else 6)
            split = islands.DataParallel(split_slices, config)
            single = islands.DataParallel([one_slice], config)
            gloo = islands.DataParallel([hosts_slice], config)
            data = islands.init(config)
            _check_same_losses(
                {"two islands": split.train(*data)[0], "one island": single.train(*data)[0]}
            )
            samples = config.steps * config.batch
            rates = interleaved(
                {
                    "two islands": lambda s=split, d=data: s.train(*d),
                    "one island": lambda s=single, d=data: s.train(*d),
                    "one island of 2 hosts": lambda s=gloo, d=data: s.train(*d),
                },
                samples,
                repeats=3 if quick else 5,
            )
            step_ms = 1000 * batch / statistics.median(rates["one island"])
            parameters = {**config.__dict__, "one_island_step_ms": round(step_ms, 1)}
            for baseline, name, target in (
                ("one island", "one island (1 host x 8 devices)", 0.9),
                ("one island of 2 hosts", "one island (2 hosts x 4 devices, gloo)", None),
            ):
                record = _record(
                    f"two islands (2 x 4 devices) vs {name}, batch {batch}",
                    {key: rates[key] for key in ("two islands", baseline)},
                    "two islands",
                    baseline,
                    target if step_ms >= LONG_STEP_MS else None,
                    parameters,
                )
                records.append(record)
                _say(record)
    return records


def _record(
    name: str,
    rates: dict[str, list[float]],
    ours: str,
    baseline: str,
    target: float | None,
    parameters: dict[str, Any],
) -> dict[str, Any]:
    value, base = statistics.median(rates[ours]), statistics.median(rates[baseline])
    # Each round ran both sides back to back: the spread of their ratios shows the noise.
    rounds = [mine / theirs for mine, theirs in zip(rates[ours], rates[baseline], strict=True)]
    return {
        "name": name,
        "value": value,
        "baseline": base,
        "ratio": value / base,
        "unit": "samples/s",
        "target": target,
        "runs": rates,
        "parameters": {
            **parameters,
            "round_ratios": f"{min(rounds):.2f}-{max(rounds):.2f}",
        },
    }


def _say(record: dict[str, Any]) -> None:
    target = f" (target {record['target']}x)" if record["target"] else ""
    spread = record["parameters"]["round_ratios"]
    print(
        f"{record['name']}: {record['value']:.0f} vs {record['baseline']:.0f} "
        f"{record['unit']} = {record['ratio']:.2f}x (rounds {spread}){target}",
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
        records += suite(args.quick, cache)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2, default=str))


if __name__ == "__main__":
    main()
