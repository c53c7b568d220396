"""The graph runner's artifacts: a configMapKeyRef one is read where the program's Job mounts
its ConfigMap, and one that is not there is named with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_client.errors import PathwaysError
from pathways_client.run_graph import load_artifact
from pathways_core.resources.program import FunctionArtifact


def test_configmap_artifacts_are_read_where_the_job_mounts_them(tmp_path: Path) -> None:
    function = FunctionArtifact.model_validate(
        {"name": "g", "configMapKeyRef": {"name": "weights", "key": "g.jaxexport"}}
    )
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "g.jaxexport").write_bytes(b"\x00artifact")
    assert load_artifact(function, tmp_path) == b"\x00artifact"
    with pytest.raises(PathwaysError, match=r"key 'g.jaxexport' of ConfigMap 'weights', is not"):
        load_artifact(function, tmp_path / "elsewhere")


def test_node_inputs_are_checked_against_the_artifacts_before_any_slice_is_bound() -> None:
    """Found only when the node ran, after the slices were bound, and run again on every
    restart, naming no field."""
    import jax
    import jax.numpy as jnp
    from jax import export

    from pathways_client.futures import Specialized
    from pathways_client.run_graph import check_inputs
    from pathways_core.dataflow import Dataflow
    from pathways_core.resources.program import ProgramGraph

    def specialized(name: str, function, *shapes: tuple[int, ...]) -> Specialized:
        avals = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
        artifact = export.export(jax.jit(function))(*avals).serialize()
        return Specialized.from_artifact(name, bytes(artifact))

    functions = {
        "make4": specialized("make4", lambda: jnp.zeros(4)),
        "inc4": specialized("inc4", lambda x: x + 1, (4,)),
        "inc5": specialized("inc5", lambda x: x + 1, (5,)),
        "add": specialized("add", lambda x, y: x + y, (4,), (4,)),
    }

    def flow(*nodes: dict) -> Dataflow:
        graph = ProgramGraph.model_validate(
            {
                "functions": [{"name": n, "inline": "AAAA"} for n in functions],
                "nodes": [{"name": "src", "function": "make4", "slice": "s"}, *nodes],
                "outputs": [{"node": "src"}],
            }
        )
        return Dataflow.from_graph(graph, {n: len(f.out_avals) for n, f in functions.items()})

    def node(name: str, function: str, *inputs: str) -> dict:
        return {
            "name": name,
            "function": function,
            "slice": "s",
            "inputs": [{"node": i} for i in inputs],
        }

    check_inputs(flow(node("a", "inc4", "src"), node("b", "add", "a", "src")), functions)
    with pytest.raises(
        PathwaysError,
        match=r"spec.graph.nodes\[1\].inputs\[0\]: output 0 of node 'src' is float32\[4\]; "
        r"function 'inc5' takes float32\[5\]",
    ):
        check_inputs(flow(node("a", "inc5", "src")), functions)
    with pytest.raises(
        PathwaysError,
        match=r"spec.graph.nodes\[1\].inputs: node 'b' gives 1 input\(s\); function 'add' takes 2",
    ):
        check_inputs(flow(node("b", "add", "src")), functions)


def test_a_function_of_symbolic_shapes_is_refused_before_any_slice_is_bound(
    tmp_path: Path,
) -> None:
    """It passed the graph's checks, then failed in the executor when first called."""
    import jax
    import jax.numpy as jnp

    from pathways_client.run_graph import run
    from pathways_core.resources.program import PathwaysProgramSpec

    (batch,) = jax.export.symbolic_shape("b")
    artifact = jax.export.export(jax.jit(lambda x: x * 2))(
        jax.ShapeDtypeStruct((batch,), jnp.float32)
    )
    (tmp_path / "double").write_bytes(bytes(artifact.serialize()))
    spec = PathwaysProgramSpec.model_validate(
        {
            "slices": [{"name": "s", "devices": 1}],
            "graph": {
                "functions": [{"name": "double", "uri": f"file://{tmp_path / 'double'}"}],
                "nodes": [{"name": "d", "function": "double", "slice": "s"}],
                "outputs": [{"node": "d"}],
            },
        }
    )
    with pytest.raises(
        PathwaysError, match=r"'double' has a symbolic dimension \(input 0 is float32\[b\]\)"
    ):
        run(spec, cluster=None)  # type: ignore[arg-type]  # refused before the cluster is used


def test_a_function_for_another_number_of_devices_is_refused_before_binding(
    tmp_path: Path,
) -> None:
    """The executor found it when the node ran, after the slices were bound."""
    import jax
    import jax.numpy as jnp

    from pathways_client.run_graph import run
    from pathways_core.resources.program import PathwaysProgramSpec

    artifact = jax.export.export(jax.jit(lambda: jnp.zeros(4)))()
    (tmp_path / "zeros").write_bytes(bytes(artifact.serialize()))
    spec = PathwaysProgramSpec.model_validate(
        {
            "slices": [{"name": "s", "shape": "1x2"}],
            "graph": {
                "functions": [{"name": "zeros", "uri": f"file://{tmp_path / 'zeros'}"}],
                "nodes": [{"name": "d", "function": "zeros", "slice": "s"}],
                "outputs": [{"node": "d"}],
            },
        }
    )
    with pytest.raises(
        PathwaysError,
        match=r"spec.graph.nodes\[0\].slice: function 'zeros' of node 'd' was exported for 1 "
        r"device\(s\); slice 's' has 2",
    ):
        run(spec, cluster=None)  # type: ignore[arg-type]  # refused before the cluster is used


def test_an_unreadable_artifact_and_an_output_not_there_name_their_fields(
    tmp_path: Path,
) -> None:
    """They said "function 'f': cannot read its artifact" and "graph: node 'b' uses output 1
    of 'a', which has 1", naming no field of the program."""
    import jax
    import jax.numpy as jnp

    from pathways_client.run_graph import run
    from pathways_core.resources.program import PathwaysProgramSpec

    artifact = jax.export.export(jax.jit(lambda: jnp.zeros(4)))()
    (tmp_path / "zeros").write_bytes(bytes(artifact.serialize()))
    (tmp_path / "garbage").write_bytes(b"not an artifact")

    def spec(uri: str, inputs: list[dict], outputs: list[dict]) -> PathwaysProgramSpec:
        return PathwaysProgramSpec.model_validate(
            {
                "slices": [{"name": "s", "devices": 1}],
                "graph": {
                    "functions": [
                        {"name": "zeros", "uri": f"file://{tmp_path / 'zeros'}"},
                        {"name": "other", "uri": uri},
                    ],
                    "nodes": [
                        {"name": "a", "function": "zeros", "slice": "s"},
                        {"name": "b", "function": "zeros", "slice": "s", "inputs": inputs},
                    ],
                    "outputs": outputs,
                },
            }
        )

    zeros = f"file://{tmp_path / 'zeros'}"
    cases = [
        (
            spec(f"file://{tmp_path / 'missing'}", [], [{"node": "a"}]),
            r"spec.graph.functions\[1\]: function 'other': cannot read its artifact: .*missing",
        ),
        (
            spec(f"file://{tmp_path / 'garbage'}", [], [{"node": "a"}]),
            r"spec.graph.functions\[1\]: function 'other': not a jax.export artifact",
        ),
        (
            spec(zeros, [{"node": "a", "output": 1}], [{"node": "b"}]),
            r"spec.graph.nodes\[1\].inputs\[0\].output: node 'a' has 1 output\(s\), numbered "
            r"from 0; 1 is not one of them",
        ),
        (
            spec(zeros, [], [{"node": "a"}, {"node": "b", "output": 3}]),
            r"spec.graph.outputs\[1\].output: node 'b' has 1 output\(s\)",
        ),
    ]
    for program, message in cases:
        with pytest.raises(PathwaysError, match=message):
            run(program, cluster=None)  # type: ignore[arg-type]  # refused before binding
