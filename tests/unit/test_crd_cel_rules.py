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
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}], "driver": {
            "source": "x", "env": [{"name": "A", "value": "1"}, {"name": "PATHWAYS_SLICES"}]}}},
         ".spec.driver: env: the PATHWAYS_* variables of every run are set by Pathways"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}], "driver": {
            "source": "x", "checkpointClaim": "c",
            "env": [{"name": "PATHWAYS_CHECKPOINT_DIR", "value": "/x"}]}}},
         ".spec.driver: env: PATHWAYS_CHECKPOINT_DIR is set from checkpointClaim"),
        ({**PROGRAM, "spec": {"slices": [{"name": "a", "devices": 1}], "graph": {
            **GRAPH, "functions": [{"name": "f", "uri": "gs://b/f", "inline": "AAAA"}]}}},
         ".spec.graph.functions[0]: set exactly one of configMapKeyRef, uri or inline"),
    ],
)  # fmt: skip
def test_rules_reject_what_the_models_reject(document: dict, failure: str) -> None:
    assert check_document(document).problems, "the model must reject it too"
    assert failure in failed_rules(SCHEMAS[document["kind"]], document)


ISLAND_SPEC = {"acceleratorKind": "cpu-fake", "topology": "4"}
DRIVER = {"slices": [{"name": "a", "devices": 1}], "driver": {"source": "x"}}


@pytest.mark.parametrize(
    ("kind", "spec", "name", "valid"),
    [
        ("PathwaysProgram", DRIVER, "p" * 54, True),
        ("PathwaysProgram", DRIVER, "p" * 55, False),  # its Job p...p-run-1001 has 64
        ("PathwaysProgram", DRIVER, "1st-run", True),
        ("PathwaysProgram", DRIVER, "a.b", False),  # a subdomain is no label value's form
        ("Island", ISLAND_SPEC, "i" * 43, True),
        ("Island", ISLAND_SPEC, "i" * 44, False),  # its StatefulSet i...i-executor has 53
        ("Island", ISLAND_SPEC, "0-island", False),  # a Service's name starts with a letter
    ],
)
def test_names_that_the_objects_made_for_them_cannot_carry_are_refused_by_both(
    kind: str, spec: dict, name: str, valid: bool
) -> None:
    """A program named with 253 characters used to be admitted and then wait forever: its
    VirtualSlices and Jobs could not be made."""
    document = {"apiVersion": "pathways.dev/v1alpha1", "kind": kind, "metadata": {"name": name}}
    document["spec"] = spec
    problems = [str(problem) for problem in check_document(document).problems]
    failures = [f for f in failed_rules(SCHEMAS[kind], document) if f.startswith(": metadata")]
    if valid:
        assert problems == [] and failures == []
    else:
        assert len(problems) == 1 and problems[0].startswith("metadata.name: expected a lowercase")
        assert failures == [": " + problems[0].split(" (got ")[0]]


def test_a_generated_name_is_checked_with_the_characters_the_server_appends() -> None:
    """The server appends five characters to a generateName, then checks the name (in a
    cluster, with the CRD's rule above): a prefix of 50 cannot make a program's name."""
    document = {**PROGRAM, "metadata": {"generateName": "g" * 49}, "spec": DRIVER}
    assert check_document(document).problems == ()
    document["metadata"] = {"generateName": "g" * 50}
    (problem,) = check_document(document).problems
    assert problem.path == "metadata.generateName" and "at most 54 characters" in problem.message
