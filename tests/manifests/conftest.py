"""Fixtures of the chart tests: helm and cached renders of the chart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from chart_helpers import Run, helm_path, render, run_helm


@pytest.fixture(scope="session")
def helm() -> Callable[..., Run]:
    helm_path()
    return run_helm


@pytest.fixture(scope="session")
def rendered() -> Callable[..., Run]:
    """``rendered("values-kind.yaml", "api.ingress.enabled=true")``: a successful render."""
    helm_path()

    def get(values_file: str, *sets: str) -> Run:
        run = render(values_file, *sets)
        assert run.returncode == 0, run.stderr
        return run

    return get
