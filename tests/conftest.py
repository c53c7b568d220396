"""Shared fixtures: the repository root and a runner for the ``pathways`` CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pathways_client.cli import main

ROOT = Path(__file__).resolve().parent.parent


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
