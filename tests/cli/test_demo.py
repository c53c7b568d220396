"""`make demo` runs `pathways demo`: the README's first command, run whole as a user does (its
second part failed for days, its tenants' table looking trace records up by a client name
programs no longer had, with no test noticing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_both_parts_and_draws_its_trace(tmp_path: Path) -> None:
    out = tmp_path / "demo.png"
    done = subprocess.run(
        [sys.executable, "-m", "pathways_client", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},  # the tables' rows on one line each
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    shown = done.stdout
    assert "largest loss difference with plain" in shown and "demo finished" in shown
    rows = [line for line in shown.splitlines() if "tenant-w" in line and "│" in line]
    assert len(rows) == 4 and all(row.rstrip(" │").endswith("yes") for row in rows), rows
    assert out.read_bytes().startswith(b"\x89PNG")
