"""The CRDs: generated from the models, structural, committed, and accepting the examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from pathways_core.crds import all_crds
from pathways_core.resources import KINDS

# Keys the Kubernetes API server accepts in a structural schema (apiextensions.k8s.io/v1).
ALLOWED_KEYS = {
    "type", "description", "properties", "required", "items", "additionalProperties",
    "enum", "default", "pattern", "format", "minimum", "maximum", "minLength", "maxLength",
    "minItems", "maxItems", "nullable", "x-kubernetes-validations",
    "x-kubernetes-int-or-string", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}  # fmt: skip


def walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from walk(schema[key], f"{path}[{key}]")


@pytest.mark.parametrize("info", KINDS.values(), ids=list(KINDS))
def test_schema_is_structural(info) -> None:
    crd = all_crds()[f"{info.plural}.pathways.dev.yaml"]
    version = crd["spec"]["versions"][0]
    for path, node in walk(version["schema"]["openAPIV3Schema"]):
        assert set(node) <= ALLOWED_KEYS, (path, set(node) - ALLOWED_KEYS)
        int_or_string = node.get("x-kubernetes-int-or-string")
        assert "type" in node or int_or_string, f"{path} has no type"
        if node.get("type") == "object" and path not in (".metadata",):
            assert "properties" in node or "additionalProperties" in node, path
        if path.count(".") >= 2 and node.get("type") not in (None, "object", "array"):
            assert node.get("description") or path.endswith("]"), f"{path} has no description"
        for key in node.get("x-kubernetes-list-map-keys", []):
            assert key in node["items"]["required"], (path, key)


@pytest.mark.parametrize("info", KINDS.values(), ids=list(KINDS))
def test_crd_names_columns_and_status(info) -> None:
    crd = all_crds()[f"{info.plural}.pathways.dev.yaml"]
    spec = crd["spec"]
    assert spec["names"]["categories"] == ["pathways"]
    assert spec["names"]["shortNames"]
    assert spec["scope"] == ("Namespaced" if info.namespaced else "Cluster")
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {column["name"] for column in version["additionalPrinterColumns"]}
    assert {"Phase", "Age"} <= columns


def test_committed_crds_match_the_models(pathways, root: Path) -> None:
    result = pathways("crds", "--check", "--out", str(root / "crds"),
                      "--out", str(root / "charts/pathways/crds"))  # fmt: skip
    assert result.exit_code == 0, result.stderr


def test_check_reports_drift_and_write_fixes_it(pathways, tmp_path: Path) -> None:
    assert pathways("crds", "--out", str(tmp_path)).exit_code == 0
    (tmp_path / "islands.pathways.dev.yaml").write_text("# edited by hand\n")
    (tmp_path / "old.pathways.dev.yaml").write_text("stale\n")
    (tmp_path / "virtualslices.pathways.dev.yaml").unlink()
    result = pathways("crds", "--check", "--out", str(tmp_path))
    assert result.exit_code == 1
    assert "islands.pathways.dev.yaml: differs" in result.stderr
    assert "virtualslices.pathways.dev.yaml: missing" in result.stderr
    assert "old.pathways.dev.yaml: stale" in result.stderr
    assert pathways("crds", "--out", str(tmp_path)).exit_code == 0
    assert pathways("crds", "--check", "--out", str(tmp_path)).exit_code == 0


def example_documents(root: Path):
    for path in sorted((root / "examples").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path.name, document


def test_examples_validate_against_the_crd_schemas(root: Path) -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in all_crds().values()}
    count = 0
    for _file, document in example_documents(root):
        schema = crds[document["kind"]]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.validate(document, schema)  # raises with the path on failure
        count += 1
    assert count >= 5


def test_crd_schema_rejects_what_the_models_reject() -> None:
    schema = all_crds()["islands.pathways.dev.yaml"]["spec"]["versions"][0]["schema"]
    bad = {"apiVersion": "pathways.dev/v1alpha1", "kind": "Island", "metadata": {},
           "spec": {"acceleratorKind": "tpu-v9", "topology": "4by4", "hosts": 0}}  # fmt: skip
    errors = list(jsonschema.Draft7Validator(schema["openAPIV3Schema"]).iter_errors(bad))
    fields = {tuple(error.absolute_path) for error in errors}
    assert fields == {("spec", "acceleratorKind"), ("spec", "topology"), ("spec", "hosts")}
