"""Fixtures of the operator tests: an emulated cluster on loopback and the operator, run by
kopf's ``KopfRunner`` in a thread exactly as ``kopf run -m pathways_operator`` runs it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kopf.testing import KopfRunner
from kube_cluster import Cluster, running_operator
from rbac import refused


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """A fresh emulated API server; KUBECONFIG points at it."""
    emulated = Cluster()
    monkeypatch.setenv("KUBECONFIG", str(emulated.write_kubeconfig(tmp_path / "kubeconfig")))
    yield emulated
    emulated.close()
    # Every call the operator made, the chart's RBAC allows (the emulator checks none).
    assert not refused(emulated.emulator), (
        f"the chart's roles lack (caller, group, resource, verb) {refused(emulated.emulator)}"
    )


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[KopfRunner]:
    """The operator running against ``cluster``."""
    with running_operator() as runner:
        yield runner
