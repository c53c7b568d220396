"""`pathways validate`: good manifests pass; bad ones get one line per problem with its path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_yaml import HOSTILE_MANIFESTS

ISLAND = """\
apiVersion: pathways.dev/v1alpha1
kind: Island
metadata: {name: isl}
spec:
"""
SLICE = """\
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata: {name: vs, namespace: team}
spec:
"""
PROGRAM = """\
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata: {name: prog, namespace: team}
spec:
"""
GRAPH = """\
  slices: [{name: s, devices: 2}]
  graph:
    functions: [{name: f, uri: "gs://bucket/f.jaxexport"}]
"""


LABELLED = """\
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata:
  name: vs
  labels: LABELS
spec: {devices: 1}
"""

BAD = [
    # As the API server checks a custom resource's types (the model would coerce these).
    pytest.param(
        SLICE + "  devices: true\n",
        "spec.devices: expected an integer (got True)",
        id="bool-as-integer",
    ),
    pytest.param(
        SLICE + "  devices: 2\n  timeShared: 'yes'\n  priority: '7'\n",
        "spec.timeShared: expected true or false (got 'yes')",
        id="string-as-boolean",
    ),
    pytest.param(
        SLICE + "  devices: '2'\n",
        "spec.devices: expected an integer (got '2')",
        id="string-as-integer",
    ),
    pytest.param(
        LABELLED.replace("LABELS", "{team: 模型}"),
        "metadata.labels.team: expected a Kubernetes label value (empty, or at most 63",
        id="label-value",
    ),
    pytest.param(
        LABELLED.replace("LABELS", "{'bad key!': x}"),
        "metadata.labels.bad key! (the key): expected a Kubernetes label key",
        id="label-key",
    ),
    pytest.param(
        LABELLED.replace("LABELS", "{team: " + "v" * 64 + "}"),
        "metadata.labels.team: expected at most 63 characters",
        id="label-value-length",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 2x4\n  hostz: 2\n",
        "spec.hostz: unknown field; did you mean 'hosts'?",
        id="unknown-field",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 2x4\n  hosts: two\n",
        "spec.hosts: expected an integer (got 'two')",
        id="wrong-type",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 2x4\n  hosts: 0\n",
        "spec.hosts: expected a number >= 1 (got 0)",
        id="zero-hosts",
    ),
    pytest.param(
        SLICE + "  devices: -2\n",
        "spec.devices: expected a number >= 1 (got -2)",
        id="negative-count",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 4x4\n  hosts: 2\n  devicesPerHost: 4\n",
        "spec.devicesPerHost: topology '4x4' has 16 devices but hosts x devicesPerHost is "
        "2 x 4 = 8",
        id="topology-mismatch",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 3x3\n  hosts: 2\n",
        "spec.hosts: topology '3x3' has 9 devices, which 2 hosts cannot share evenly",
        id="topology-uneven",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: tpu-v5p\n  topology: 4x4\n  hosts: 4\n",
        "spec.topology: topology '4x4' has 2 axes, but tpu-v5p meshes are 3-D",
        id="topology-rank",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: tpu-v9\n  topology: 2x2\n",
        "spec.acceleratorKind: expected one of 'tpu-v4', 'tpu-v5e'",
        id="unknown-accelerator",
    ),
    pytest.param(
        ISLAND + "  acceleratorKind: cpu-fake\n  topology: 4by4\n",
        "spec.topology: expected a mesh shape of 1 to 3 positive integers joined by 'x'",
        id="bad-topology",
    ),
    pytest.param(
        ISLAND + "  topology: 2x2\n",
        "spec.acceleratorKind: required field is missing",
        id="missing-field",
    ),
    pytest.param(
        SLICE + "  priority: 5\n",
        "spec.devices: set devices (a count) or shape (a mesh such as 2x4)",
        id="slice-without-size",
    ),
    pytest.param(
        SLICE + "  devices: 4\n  shape: 2x4\n",
        "spec.shape: devices is 4 but shape '2x4' has 8 devices",
        id="slice-size-conflict",
    ),
    pytest.param(
        PROGRAM + GRAPH + "    nodes: [{name: a, function: g, slice: s}]\n",
        "spec.graph.nodes[0].function: node 'a' calls function 'g', which is not in "
        "graph.functions (f)",
        id="unknown-function",
    ),
    pytest.param(
        PROGRAM
        + GRAPH
        + "    nodes:\n"
        + "      - {name: a, function: f, slice: s, inputs: [{node: b}]}\n"
        + "      - {name: b, function: f, slice: s, inputs: [{node: a}]}\n",
        "spec.graph.nodes[0]: the graph has a cycle of 2 nodes: a -> b -> a",
        id="cycle",
    ),
    pytest.param(
        PROGRAM + GRAPH + "    nodes: [{name: a, function: f, slice: t}]\n",
        "spec.graph.nodes[0].slice: node 'a' runs on slice 't', which is not in spec.slices (s)",
        id="unknown-slice",
    ),
    pytest.param(
        PROGRAM + "  slices: [{name: s, devices: 2}]\n",
        "spec.graph: set exactly one of graph or driver",
        id="no-graph-no-driver",
    ),
    pytest.param(
        PROGRAM + "  slices: [{name: s, devices: 2}, {name: s, shape: 2x2}]\n"
        "  driver: {command: [python, train.py]}\n",
        "spec.slices[1].name: name 's' is used twice",
        id="duplicate-slice",
    ),
    pytest.param(
        "apiVersion: pathways.dev/v1alpha1\nkind: Isle\nmetadata: {name: x}\nspec: {}\n",
        "kind: expected one of Island, VirtualSlice, PathwaysProgram (got 'Isle')",
        id="unknown-kind",
    ),
    pytest.param(
        "apiVersion: pathways.dev/v1\nkind: Island\nmetadata: {name: x}\nspec: {}\n",
        "apiVersion: expected pathways.dev/v1alpha1 (got 'pathways.dev/v1')",
        id="wrong-version",
    ),
    # A kind of ours in a misspelt group was skipped as another group's, exit 0.
    pytest.param(
        SLICE.replace("pathways.dev", "pathway.dev") + "  devices: 1\n",
        "apiVersion: expected pathways.dev/v1alpha1 (got 'pathway.dev/v1alpha1')",
        id="misspelt-group",
    ),
    pytest.param(
        ISLAND.replace("pathways.dev", "Pathways.dev") + "  acceleratorKind: cpu-fake\n",
        "apiVersion: expected pathways.dev/v1alpha1 (got 'Pathways.dev/v1alpha1')",
        id="capitalised-group",
    ),
    # It said "(got None)".
    pytest.param(
        "apiVersion: pathways.dev/v1alpha1\nmetadata: {name: x}\nspec: {}\n",
        "kind: required field is missing (expected one of Island, VirtualSlice, PathwaysProgram)",
        id="missing-kind",
    ),
    pytest.param(
        SLICE.replace("name: vs", "name: Not_A_Name") + "  devices: 1\n",
        "metadata.name: expected a lowercase RFC 1123 name",
        id="bad-name",
    ),
    pytest.param(
        PROGRAM + "  slices: [{name: s, devices: 2}]\n  driver: {source: x}\n"
        "  steps: 9223372036854775808\n",
        "spec.steps: expected a number <= 9223372036854775807",
        id="steps-past-int64",
    ),
    # What the REST API refuses of a manifest, validate says too (it said valid).
    pytest.param(
        SLICE.replace("namespace: team", "namespace: team, labelz: {a: b}") + "  devices: 1\n",
        "metadata.labelz: unknown field; did you mean 'labels'?",
        id="unknown-metadata",
    ),
    pytest.param(
        LABELLED.replace("LABELS", "{pathways.dev/program: other}"),
        "metadata.labels.pathways.dev/program: pathways.dev/ keys are set by the system",
        id="system-label",
    ),
    pytest.param(
        SLICE.replace("name: vs", "generateName: Team_") + "  devices: 1\n",
        "metadata.generateName: expected a lowercase RFC 1123 prefix",
        id="bad-generate-name",
    ),
    pytest.param(
        "kind: [unclosed\n",
        "invalid YAML at line 2, column 1",
        id="yaml-syntax",
    ),
    *(pytest.param(text, expected, id=name) for name, text, expected in HOSTILE_MANIFESTS),
]


@pytest.mark.parametrize(("manifest", "expected"), BAD)
def test_bad_manifest_is_rejected_with_its_field_path(
    pathways, tmp_path: Path, manifest: str, expected: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(manifest)
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith(str(path))]
    assert any(expected in line for line in lines), result.stderr
    assert "document 1" in lines[0]


def test_examples_are_valid(pathways, root: Path) -> None:
    result = pathways("validate", str(root / "examples"))
    assert result.exit_code == 0, result.stderr
    assert "0 problem(s)" in result.stdout


def test_every_problem_of_every_document_is_reported(pathways, tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(
        SLICE
        + "  devices: 0\n  priority: high\n---\n"
        + "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\n---\n"
        + SLICE
        + "  devices: 1\n"
    )
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}: document 1 (VirtualSlice vs): spec.devices" in result.stderr
    assert f"{path}: document 1 (VirtualSlice vs): spec.priority" in result.stderr
    assert "1 valid, 2 problem(s), 1 skipped" in result.stderr


def test_an_object_defined_twice_is_a_problem_of_the_second(pathways, tmp_path: Path) -> None:
    """Both were called valid, and `place` bound one island's slices on the other's mesh."""
    island = "apiVersion: pathways.dev/v1alpha1\nkind: Island\nmetadata: {name: isl}\n"
    path = tmp_path / "twice.yaml"
    path.write_text(
        island
        + "spec: {acceleratorKind: cpu-fake, topology: 2x4, hosts: 2}\n---\n"
        + island
        + "spec: {acceleratorKind: cpu-fake, topology: 2x2, hosts: 1}\n---\n"
        + SLICE
        + "  devices: 1\n"
    )
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert (
        f"{path}: document 2 (Island isl): metadata.name: defined already, by {path}: "
        "document 1 (Island isl)" in " ".join(result.stderr.split())
    )
    assert "2 valid, 1 problem(s)" in result.stderr
    placed = pathways("place", str(path))
    assert placed.exit_code == 1 and "Traceback" not in placed.output + placed.stderr


def test_the_objects_of_a_list_are_validated_each(pathways, tmp_path: Path) -> None:
    """A `get -o json` dump of a list is a kubectl List: it was one skipped document."""
    import json

    import yaml

    good = yaml.safe_load(SLICE + "  devices: 1\n")
    bad = yaml.safe_load(SLICE.replace("name: vs", "name: other") + "  devices: 0\n")
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [good, bad]}))
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}: document 1: items[1] (VirtualSlice other): spec.devices" in result.stderr
    assert "1 valid, 1 problem(s)" in result.stderr


def test_folder_without_manifests_is_an_error(pathways, tmp_path: Path) -> None:
    result = pathways("validate", str(tmp_path))
    assert result.exit_code == 1
    assert "no manifest files" in result.stderr


def test_paths_and_fields_are_printed_as_written(pathways, tmp_path: Path) -> None:
    """Brackets in a file's name or a field's are text, not the console's markup: rich took
    ``[x]`` for a style (and dropped it) and ``[/x]`` for a closing tag (a traceback)."""
    path = tmp_path / "bad[x].yaml"
    path.write_text(SLICE + '  devices: 2\n  "[/x]": 1\n')
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}: document 1 (VirtualSlice vs): spec[/x]: unknown field" in result.stderr
    empty = tmp_path / "nothing[x]"
    empty.mkdir()
    nothing = pathways("validate", str(empty))
    assert nothing.exit_code == 1 and f"in {empty}" in nothing.stderr


def test_a_dump_is_valid_as_submit_sends_it_and_an_island_may_name_its_scheduler(
    pathways, tmp_path: Path
) -> None:
    """What the system sets (status, uid, resourceVersion, ...) `pathways submit` drops, so
    validate takes it; an administrator's Island may carry the system's annotations."""
    dump = tmp_path / "dump.yaml"
    dump.write_text(
        SLICE.replace(
            "namespace: team",
            "namespace: team, uid: 0f3c-1234, resourceVersion: '7', creationTimestamp: "
            "'2026-11-29T10:00:00Z', managedFields: []",
        )
        + "  devices: 1\nstatus: {phase: Bound}\n---\n"
        + ISLAND.replace(
            "name: isl", "name: isl, annotations: {pathways.dev/scheduler-endpoint: 'h:1'}"
        )
        + "  topology: '4'\n  acceleratorKind: cpu-fake\n"
    )
    result = pathways("validate", str(dump))
    assert result.exit_code == 0, result.stderr
    assert "2 valid, 0 problem(s)" in result.stdout


def test_a_key_given_twice_is_refused_where_it_is_given_again(pathways, tmp_path: Path) -> None:
    """PyYAML kept the last silently: `devices: 2` then `devices: 4` was valid, and submitted
    4. Refused as the API server's strict decoding refuses it; a merge's keys may still be
    given again."""
    path = tmp_path / "twice.yaml"
    path.write_text(SLICE + "  devices: 2\n  priority: 1\n  devices: 4\n")
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert (
        f"{path}: document 1: invalid YAML at line 7, column 3: the key 'devices' is given "
        "twice (first at line 5)" in result.stderr
    )
    sent = pathways("submit", str(path), "--api", "http://127.0.0.1:9", "--token", "t")
    assert sent.exit_code == 1 and "the key 'devices' is given twice" in sent.output
    assert "Unreachable" not in sent.output  # refused before sending
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        SLICE.replace(
            "name: vs,", "name: vs, annotations: &base {a: x, b: y}, labels: {<<: *base, a: z},"
        )
        + "  devices: 1\n"
    )
    overridden = pathways("validate", str(merged))
    assert overridden.exit_code == 0, overridden.stderr


def test_a_file_named_twice_is_read_once(pathways, root: Path, tmp_path: Path) -> None:
    """A file named again (by a folder holding it, or as ``./f.yaml`` after ``f.yaml``) was
    read twice, and each of its documents reported as defined already by itself."""
    result = pathways(
        "validate", str(root / "examples"), str(root / "examples" / "islands" / "cpu-fake.yaml")
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == pathways("validate", str(root / "examples")).stdout
    path = tmp_path / "f.yaml"
    path.write_text(SLICE + "  devices: 1\n")
    same = f"{tmp_path}/./f.yaml"
    again = pathways("validate", str(path), same, str(tmp_path))
    assert again.exit_code == 0, again.stderr
    assert "1 valid, 0 problem(s)" in again.stdout
    sent = pathways("submit", str(path), same, "--api", "http://127.0.0.1:9", "--token", "t")
    assert "defined already" not in sent.output and "Unreachable" in sent.output


def test_objects_without_names_are_not_duplicates(pathways, tmp_path: Path) -> None:
    """Two documents of a ``generateName`` each make an object of their own: the second was
    reported as defined already by the first."""
    path = tmp_path / "generated.yaml"
    path.write_text(2 * (SLICE.replace("name: vs", "generateName: vs-") + "  devices: 1\n---\n"))
    result = pathways("validate", str(path))
    assert result.exit_code == 0, result.stderr
    assert "2 valid, 0 problem(s)" in result.stdout


def test_standard_input_is_read_for_a_dash(tmp_path: Path) -> None:
    """`pathways validate -` said "Path '-' does not exist", where `submit -` reads it."""
    from click.testing import CliRunner

    from pathways_client.cli import main

    good = CliRunner().invoke(main, ["validate", "-"], input=SLICE + "  devices: 1\n")
    assert good.exit_code == 0, good.output
    assert "1 valid, 0 problem(s)" in good.stdout
    bad = CliRunner().invoke(main, ["validate", "-"], input=SLICE + "  devices: 0\n")
    assert bad.exit_code == 1
    assert "standard input: document 1 (VirtualSlice vs): spec.devices" in bad.stderr


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n---\n"])
def test_a_file_of_no_document_is_a_problem(pathways, tmp_path: Path, text: str) -> None:
    """It was "0 valid" and exit 0, while `pathways submit` refuses it ("no documents")."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    result = pathways("validate", str(path))
    assert result.exit_code == 1
    assert f"{path}: no documents (the file is empty, or only comments)" in result.stderr
    assert "0 valid, 1 problem(s)" in result.stderr
