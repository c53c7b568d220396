"""The repository's shape: import rules, the standard library's `operator`, lint, packaging."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMPONENTS = {
    "core": "pathways_core",
    "operator": "pathways_operator",
    "scheduler": "pathways_scheduler",
    "executor": "pathways_executor",
    "api": "pathways_api",
    "client": "pathways_client",
}


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(arg) for arg in args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_import_rules_hold() -> None:
    result = run(BIN / "lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_standard_library_operator_is_not_shadowed_from_the_root() -> None:
    result = run(sys.executable, "-c", "import operator; operator.eq; print(operator.__file__)")
    assert result.returncode == 0, result.stderr
    assert "pathways" not in result.stdout.split("/")[-2]


def test_ruff_is_clean() -> None:
    result = run(BIN / "ruff", "check", ".")
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(("folder", "package"), COMPONENTS.items())
def test_each_component_folder_holds_one_uniquely_named_package(folder: str, package: str) -> None:
    entries = {p.name for p in (ROOT / folder).iterdir() if not p.name.startswith((".", "__"))}
    assert entries == {package}
    assert not (ROOT / folder / "__init__.py").exists()
    assert (ROOT / folder / package / "__init__.py").exists()


def test_one_distribution_packages_all_six_and_the_cli() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert sorted(packages) == sorted(f"{f}/{p}" for f, p in COMPONENTS.items())
    assert project["project"]["scripts"]["pathways"] == "pathways_client.cli:main"
    assert project["project"]["requires-python"] == ">=3.11"
    assert "dev" in project["project"]["optional-dependencies"]


def test_console_script_runs() -> None:
    result = run(BIN / "pathways", "--help")
    assert result.returncode == 0, result.stderr
    for command in ("crds", "validate", "place"):
        assert command in result.stdout


def test_the_cli_and_the_managers_helpers_import_no_jax() -> None:
    """Importing the SDK's package imported JAX: a second and a half more for every CLI
    command, and for the trace the embedded manager collects before a run is Succeeded."""
    checked = "pathways_client.cli", "pathways_client.trace_dump", "pathways_api.run_job"
    result = run(
        sys.executable,
        "-c",
        f"import importlib, sys; [importlib.import_module(m) for m in {checked}]; "
        "import pathways_client as pw; assert pw.PathwaysError; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
