"""`benchmarks/multitenancy.py`'s tenants: processes started once per island and kept for every
run, each run exactly the computations asked of the tenants asked."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from pathways_client.island_client import IslandClient
from pathways_client.launcher import LocalIsland

sys.path.append(str(Path(__file__).parents[2] / "benchmarks"))  # after the rest: shadows nothing
from multitenancy import Tenants, median_round_figure


def test_a_figure_is_the_round_whose_ratio_is_the_median_of_the_rounds() -> None:
    # Round 3's one client was lucky: taken apart, the best of each would make 0.93.
    rates = {
        (1, 1): [416.0, 428.0, 481.0, 432.0, 445.0],
        (8, 1): [424.0, 442.0, 423.0, 412.0, 447.0],
    }
    figure = median_round_figure("x", rates, (8, 1), (1, 1), 0.95, {"clients": 8})
    # The rounds' ratios: 1.019, 1.033, 0.879, 0.954, 1.004: the median is round 5's.
    assert (figure["value"], figure["baseline"]) == (447.0, 445.0)
    assert figure["ratio"] == pytest.approx(447 / 445)
    assert figure["target"] == 0.95
    assert figure["parameters"] == {"clients": 8, "best_of_each": round(447 / 481, 3)}


@pytest.mark.slow
def test_tenants_are_kept_across_runs_and_run_what_each_run_asks() -> None:
    with (
        LocalIsland(hosts=1, devices_per_host=4, policy="proportional-share") as island,
        Tenants(island.scheduler_endpoint, [1, 2]) as tenants,
    ):
        pids = [process.pid for process in tenants.processes]
        assert tenants.run(64, 12, clients=1) > 0
        assert tenants.run(64, 10) > 0
        assert tenants.run(128, 8, clients=1, chains=3) > 0
        assert [process.pid for process in tenants.processes] == pids
        assert all(process.is_alive() for process in tenants.processes)
        with IslandClient(island.scheduler_endpoint, "observer") as observer:
            ran = Counter(record.client for record in observer.trace() if record.ok)
    # Each tenant warms up once per width it is asked for (uploaded and compiled before its
    # clock starts), then runs what it was asked: tenant 0 both widths, tenant 1 one.
    assert ran == {"tenant-0-w1": 1 + 12 + 10 + 1 + 8, "tenant-1-w2": 1 + 10}


@pytest.mark.slow
def test_a_tenant_that_died_fails_the_run_naming_it() -> None:
    with (
        LocalIsland(hosts=1, devices_per_host=4) as island,
        Tenants(island.scheduler_endpoint, [1, 1]) as tenants,
    ):
        tenants.processes[1].kill()
        tenants.processes[1].join()
        with pytest.raises(RuntimeError, match="tenant-1-w1 exited with code -9"):
            tenants.run(64, 5)
