"""The kind scripts, the demo program they run, and the tool fetcher, checked statically."""

from __future__ import annotations

import shutil
import subprocess
import sys

import jsonschema
import pytest
import yaml
from chart_helpers import ROOT, TOOLS_BIN, helm_path, render

from pathways_core.crds import all_crds
from pathways_core.manifests import check_document

SCRIPTS = ["kind-up.sh", "kind-down.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_parse_and_are_executable(script: str) -> None:
    path = ROOT / "scripts" / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "set -euo pipefail" in path.read_text()


def test_kind_up_uses_the_files_it_names() -> None:
    text = (ROOT / "scripts" / "kind-up.sh").read_text()
    for relative in ("kind-config.yaml", "charts/pathways/values-kind.yaml",
                     "scripts/kind/demo-program.yaml"):  # fmt: skip
        assert f"${{ROOT}}/{relative}" in text, relative
        assert (ROOT / relative).exists(), relative


def test_demo_program_is_valid() -> None:
    documents = [
        doc
        for doc in yaml.safe_load_all((ROOT / "scripts/kind/demo-program.yaml").read_text())
        if doc
    ]
    programs = [doc for doc in documents if doc["kind"] == "PathwaysProgram"]
    assert len(programs) == 1
    namespaces = {doc["metadata"]["name"] for doc in documents if doc["kind"] == "Namespace"}
    assert programs[0]["metadata"]["namespace"] in namespaces
    crd = all_crds()["pathwaysprograms.pathways.dev.yaml"]
    jsonschema.validate(programs[0], crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    checked = check_document(programs[0])
    assert not checked.problems, checked.problems
    # Its slices fit the kind islands: 2x2 of fake CPU devices each.
    for item in programs[0]["spec"]["slices"]:
        assert item["acceleratorKind"] == "cpu-fake"
    source = programs[0]["spec"]["driver"]["source"]
    compile(source, "demo-program.yaml:driver.source", "exec")


def test_demo_program_binds_on_the_kind_islands(pathways, tmp_path) -> None:
    """The allocator binds the demo's slices on the islands values-kind.yaml declares."""
    islands = render("values-kind.yaml").of_kind("Island")
    (tmp_path / "islands.yaml").write_text(yaml.safe_dump_all(islands))
    shutil.copy(ROOT / "scripts/kind/demo-program.yaml", tmp_path / "demo.yaml")
    result = pathways("place", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "2 of 2 slices bound on 2 islands" in result.output
    rows = [line for line in result.output.splitlines() if "pathways-demo/demo-" in line]
    assert len(rows) == 2 and "fake-a" in rows[0] and "fake-b" in rows[1], rows


def test_fetch_tools_is_idempotent() -> None:
    helm = helm_path()
    if not helm.startswith(str(TOOLS_BIN)):
        pytest.skip(f"using helm from PATH ({helm}), not one installed by fetch_tools")
    before = (TOOLS_BIN / "helm").stat().st_mtime_ns
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fetch_tools.py")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(TOOLS_BIN / "helm")
    assert (TOOLS_BIN / "helm").stat().st_mtime_ns == before  # nothing downloaded again
    version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True)
    assert version.stdout.startswith("v4.3.1")
    assert shutil.which("kubectl", path=str(TOOLS_BIN))
