"""The CRDs' CEL validation rules (x-kubernetes-validations): they compile, accept every
example, and reject what the models reject, so the API server and `pathways validate` agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from pathways_core.crds import all_crds
from pathways_core.manifests import check_document

SCHEMAS = {
    crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for crd in all_crds().values()
}
ENVIRONMENT = celpy.Environment()


def rules(schema: dict[str, Any]):
    yield from schema.get("x-kubernetes-validations", [])
    for child in schema.get("properties", {}).values():
        yield from rules(child)
    if isinstance(schema.get("items"), dict):
        yield from rules(schema["items"])


def failed_rules(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Evaluate every rule of ``schema`` on ``value`` as the API server would (``self`` is the
    object the rule sits on); return ``path: message`` of each rule that is false."""
    failures = []
    if isinstance(value, dict):
        for rule in schema.get("x-kubernetes-validations", []):
            program = ENVIRONMENT.program(ENVIRONMENT.compile(rule["rule"]))
            if not program.evaluate({"self": celpy.json_to_cel(value)}):
                failures.append(f"{path}: {rule['message']}")
        for name, child in schema.get("properties", {}).items():
            if name in value:
                failures += failed_rules(child, value[name], f"{path}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            failures += failed_rules(schema["items"], item, f"{path}[{index}]")
    return failures


def test_rules_compile() -> None:
    found = [rule for schema in SCHEMAS.values() for rule in rules(schema)]
    assert len(found) >= 5
    for rule in found:
        ENVIRONMENT.compile(rule["rule"])
        assert rule["message"]


def test_examples_pass_every_rule(root: Path) -> None:
    for path in sorted((root / "examples").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                assert failed_rules(SCHEMAS[document["kind"]], document) == [], path


PROGRAM = {"apiVersion": "pathways.dev/v1alpha1", "kind": "PathwaysProgram",
           "metadata": {"name": "p"}}  # fmt: skip
SLICE = {"apiVersion": "pathways.dev/v1alpha1", "kind": "VirtualSlice", "metadata": {"name": "s"}}
GRAPH = {"functions": [{"name": "f", "uri": "gs://b/f"}],
         "nodes": [{"name": "n", "function": "f", "slice": "a"}]}  # fmt: skip


@pytest.mark.parametrize(
    ("document", "failure"),
    [
        ({**SLICE, "spec": {"priority": 1}}, ".spec: set devices or shape"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}]}},
         ".spec: set exactly one of graph or driver"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}], "graph": GRAPH,
                              "driver": {"source": "x"}}},
         ".spec: set exactly one of graph or driver"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a"}], "driver": {"source": "x"}}},
         ".spec.slices[0]: set virtualSliceName, or devices or shape, but not both"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "virtualSliceName": "v", "devices": 2}],
                              "driver": {"source": "x"}}},
         ".spec.slices[0]: set virtualSliceName, or devices or shape, but not both"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}],
                              "driver": {"source": "x", "command": ["python"]}}},
         ".spec.driver: set exactly one of command or source"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}], "graph": {
            **GRAPH, "functions": [{"name": "f", "uri": "gs://b/f", "inline": "AAAA"}]}}},
         ".spec.graph.functions[0]: set exactly one of configMapKeyRef, uri or inline"),
    ],
)  # fmt: skip
def test_rules_reject_what_the_models_reject(document: dict, failure: str) -> None:
    assert check_document(document).problems, "the model must reject it too"
    assert failure in failed_rules(SCHEMAS[document["kind"]], document)
