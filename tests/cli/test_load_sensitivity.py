"""`benchmarks/load_sensitivity.py`: plain JAX alone and beside a process using part of a core."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "load_sensitivity.py"


@pytest.mark.slow
def test_each_load_is_measured_at_both_priorities_against_a_run_alone() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "16", "--loads", "0.2", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SCRIPT.parent,
    )
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if "20% of a core" in line]
    assert len(rows) == 2, run.stdout
    for row, niceness in zip(rows, ("0", "19"), strict=True):
        cells = [cell.strip() for cell in row.strip("│ ").split("│")]
        assert cells[0] == "16" and cells[2] == niceness
        alone, loaded, ratio = (float(cells[i]) for i in (3, 4, 5))
        assert alone > 0 and loaded > 0
        assert abs(ratio - alone / loaded) < 0.02  # ratio is loaded rate over alone
    assert re.search(r"all-reduce chained \d+ steps", run.stdout)
