"""Shared fixtures: the repository root, a runner for the ``pathways`` CLI and an embedded
cluster."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import settings

from pathways_client.cli import main

ROOT = Path(__file__).resolve().parent.parent

# No per-example time limit: on a shared 2-core host an example's wall time says nothing of the
# code (one took 200 ms+ while other suites ran); speed is measured by the benchmarks.
settings.register_profile("shared-host", deadline=None)
settings.load_profile("shared-host")

# Tests press Ctrl-C (SIGINT) on commands they start. Run in the background of a shell without
# job control (``make test &``), the suite ignores SIGINT, and so did those commands (Python
# keeps an ignored SIGINT ignored): three tests waited in vain. Handled here, a command's SIGINT
# is its own again (exec resets a handler, not an ignored signal).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def pathways():
    """Run the CLI in-process: ``pathways("validate", "examples")`` returns click's Result."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


@pytest.fixture(scope="module")
def embedded_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The state folder of an embedded cluster (``pathways up``: one island of 1 host x 4 fake
    CPU devices, a token for tenant ``team-a``), shared by a module's tests."""
    folder = tmp_path_factory.mktemp("embedded") / "state"
    runner = CliRunner()
    arguments = ["--state", str(folder)]
    started = runner.invoke(
        main, ["up", *arguments, "--hosts", "1", "--devices", "4", "--tenant", "team-a"]
    )
    assert started.exit_code == 0, started.output
    yield folder
    runner.invoke(main, ["down", *arguments])
