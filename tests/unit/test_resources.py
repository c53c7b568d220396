"""Resource models: wire format, defaults, validators, selectors and the graph order."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pathways_core.graph import CycleError, topological_order
from pathways_core.manifests import check_document
from pathways_core.resources import (
    Island,
    LabelSelector,
    PathwaysProgram,
    SchedulingPolicy,
    VirtualSlice,
)
from pathways_core.topology import coordinates, device_id, format_shape, parse_shape


def island(**spec) -> dict:
    return {"apiVersion": "pathways.dev/v1alpha1", "kind": "Island",
            "metadata": {"name": "isl"}, "spec": spec}  # fmt: skip


def test_island_defaults_and_derived_devices_per_host() -> None:
    model = Island.model_validate(island(acceleratorKind="tpu-v5e", topology="4x4", hosts=4))
    assert model.spec.host_devices == 4
    assert model.spec.device_total == 16
    assert model.spec.scheduler.policy is SchedulingPolicy.PROPORTIONAL_SHARE
    assert model.status.conditions == []


def test_wire_format_is_camel_case_and_round_trips() -> None:
    placement = {"nodeSelector": {"a": "b"}, "resources": {"requests": {"cpu": 1, "memory": "1Gi"}}}
    document = island(
        acceleratorKind="cpu-fake", topology="2x4", hosts=2, devicesPerHost=4, placement=placement
    )
    model = Island.model_validate(document)
    wire = model.to_wire()
    assert wire["spec"]["devicesPerHost"] == 4
    assert wire["spec"]["placement"]["nodeSelector"] == {"a": "b"}
    # Quantities written as numbers in YAML are kept as Kubernetes quantities (strings).
    assert wire["spec"]["placement"]["resources"]["requests"]["cpu"] == "1"
    assert "status" in wire and "phase" not in wire["status"]
    assert Island.model_validate(wire) == model


@pytest.mark.parametrize(
    ("kind", "topology", "hosts", "ok"),
    [
        ("tpu-v5e", "2x4", 1, True),
        ("tpu-v5p", "2x2x2", 2, True),
        ("tpu-v4", "2x2x4", 4, True),
        ("tpu-v5p", "4x4", 4, False),  # v5p meshes are 3-D
        ("tpu-v6e", "16", 4, False),  # v6e meshes are 2-D
        ("tpu-v5e", "4x4", 1, False),  # 16 chips on one host exceed 8 per host
        ("gpu-h100", "8", 1, True),
        ("gpu-h100", "2x8", 2, True),
        ("cpu-fake", "2x2x2", 1, True),
    ],
)
def test_topology_rules_per_accelerator(kind: str, topology: str, hosts: int, ok: bool) -> None:
    checked = check_document(island(acceleratorKind=kind, topology=topology, hosts=hosts))
    assert (not checked.problems) == ok, checked.problems


def test_slice_needs_a_size_and_program_slices_resolve() -> None:
    with pytest.raises(ValidationError):
        VirtualSlice.model_validate({"spec": {"priority": 1}})
    program = PathwaysProgram.model_validate({
        "metadata": {"name": "p"},
        "spec": {
            "slices": [{"name": "a", "shape": "2x2"}, {"name": "b", "virtualSliceName": "mine"}],
            "driver": {"source": "print('hi')"},
        },
    })  # fmt: skip
    assert [s.name for s in program.spec.slices] == ["a", "b"]
    with pytest.raises(ValidationError, match="virtualSliceName alone"):
        PathwaysProgram.model_validate({
            "spec": {"slices": [{"name": "b", "virtualSliceName": "mine", "devices": 2}],
                     "driver": {"source": "x"}},
        })  # fmt: skip


def test_function_artifact_needs_exactly_one_source() -> None:
    base = {"slices": [{"name": "s", "devices": 1}],
            "graph": {"nodes": [{"name": "n", "function": "f", "slice": "s"}]}}  # fmt: skip
    for sources in ({}, {"uri": "gs://b/f", "inline": "AAAA"}):
        spec = {**base, "graph": {**base["graph"], "functions": [{"name": "f", **sources}]}}
        checked = check_document({"apiVersion": "pathways.dev/v1alpha1",
                                  "kind": "PathwaysProgram", "metadata": {"name": "p"},
                                  "spec": spec})  # fmt: skip
        assert [str(p) for p in checked.problems] == [
            "spec.graph.functions[0].uri: set exactly one of configMapKeyRef, uri or inline"
        ]


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({"matchLabels": {"pool": "a"}}, {"pool": "a"}, True),
        ({"matchLabels": {"pool": "a"}}, {"pool": "b"}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a", "b"]}]},
         {"pool": "b"}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]},
         {}, True),
        ({"matchExpressions": [{"key": "pool", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}, {}, True),
        ({}, {"anything": "x"}, True),
    ],
)  # fmt: skip
def test_label_selector(selector: dict, labels: dict, expected: bool) -> None:
    assert LabelSelector.model_validate(selector).matches(labels) is expected


def test_topological_order_and_cycles() -> None:
    assert topological_order({"c": ["b"], "b": ["a"], "a": []}) == ["a", "b", "c"]
    assert topological_order({"x": [], "y": []}) == ["x", "y"]
    with pytest.raises(CycleError) as caught:
        topological_order({"a": ["b"], "b": ["c"], "c": ["a"]})
    assert caught.value.cycle == ["a", "b", "c"]
    # A long cycle is named by its ends (4,000 nodes made a message of 35 KB).
    long = {f"n{i}": [f"n{(i + 1) % 4000}"] for i in range(4000)}
    with pytest.raises(CycleError) as caught:
        topological_order(long)
    assert len(caught.value.cycle) == 4000
    assert str(caught.value) == (
        "the graph has a cycle of 4000 nodes: n0 -> n1 -> n2 -> n3 -> n4 -> n5 -> n6 -> "
        "... 3992 more ... -> n3999 -> n0"
    )


@pytest.mark.parametrize("shape", [(8,), (4, 4), (2, 3, 4)])
def test_device_ids_and_coordinates_are_inverse(shape: tuple[int, ...]) -> None:
    assert parse_shape(format_shape(shape)) == shape
    for device in range(8):
        assert device_id(coordinates(device, shape), shape) == device


@pytest.mark.parametrize("text", ["", "0x4", "4x", "x4", "1x2x3x4", "4 x 4", "-1"])
def test_bad_shapes_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="mesh shape"):
        parse_shape(text)


@pytest.mark.parametrize(
    ("quantity", "ok"),
    [
        *((good, True) for good in ("2", 4, "1.5", 1.5, "500m", "16Gi", "0.5Gi", "1e3", "+1")),
        *((bad, False) for bad in ("lots", "nan", float("nan"), "Infinity", "-1", -1, "1 Gi", "")),
    ],
)
def test_resources_are_kubernetes_quantities(quantity, ok: bool) -> None:
    """Anything went (cpu: lots, memory: -1): the API server then refused the program's Job,
    and the program waited for good, saying only that it was creating its slices."""
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "p"},
        "spec": {
            "slices": [{"name": "main", "devices": 2}],
            "driver": {"source": "print(1)", "resources": {"requests": {"cpu": quantity}}},
        },
    }
    problems = check_document(document).problems
    if ok:
        assert not problems
    else:
        (problem,) = problems
        assert problem.path == "spec.driver.resources.requests.cpu"
        assert "expected a Kubernetes quantity, not negative" in problem.message
