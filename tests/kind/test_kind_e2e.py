"""kind end to end: create the cluster, build and load the image, install the chart with
values-kind.yaml, run the demo program to completion, delete the cluster.

Runs only where a container engine and kind exist (`docker info` answers and `kind` is on PATH);
elsewhere, such as these development machines and CI, it skips and says why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def missing_engine() -> str | None:
    """Why the kind tests cannot run here, or None when they can."""
    if shutil.which("kind") is None:
        return "kind is not installed"
    if shutil.which("docker") is None:
        return "docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return "docker is installed but no container engine answers (docker info failed)"
    return None


REASON = missing_engine()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


@pytest.fixture(scope="module")
def cluster():
    """A kind cluster of its own, deleted afterwards whatever happened."""
    name = f"pathways-e2e-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "CLUSTER": name, "TIMEOUT": "600s"}
    up = subprocess.run(
        [str(ROOT / "scripts" / "kind-up.sh")], env=env, capture_output=True, text=True,
        check=False, timeout=3600,
    )  # fmt: skip
    try:
        yield name, up
    finally:
        subprocess.run([str(ROOT / "scripts" / "kind-down.sh")], env=env, check=False)


def kubectl(name: str, *args: str) -> str:
    tools = ROOT / ".tools" / "bin"
    binary = shutil.which("kubectl", path=f"{tools}:{os.environ.get('PATH', '')}") or "kubectl"
    result = subprocess.run(
        [binary, "--context", f"kind-{name}", *args], capture_output=True, text=True, check=True
    )
    return result.stdout


def test_chart_installs_and_the_demo_program_succeeds(cluster) -> None:
    name, up = cluster
    assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
    assert kubectl(name, "get", "islands", "-o", "jsonpath={.items[*].status.phase}").split() == [
        "Ready",
        "Ready",
    ]
    phase = kubectl(name, "-n", "pathways-demo", "get", "pwp", "demo", "-o",
                    "jsonpath={.status.phase}")  # fmt: skip
    assert phase == "Succeeded"


def test_operator_and_api_pods_run_locked_down(cluster) -> None:
    name, up = cluster
    assert up.returncode == 0
    users = kubectl(name, "-n", "pathways-system", "get", "pods", "-o",
                    "jsonpath={.items[*].spec.securityContext.runAsUser}")  # fmt: skip
    assert users.split() and set(users.split()) == {"65532"}
