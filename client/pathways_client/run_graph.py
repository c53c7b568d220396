"""``python -m pathways_client.run_graph --spec FILE``: run a graph PathwaysProgram.

This is what a graph program's pod runs: it reads the program (the whole resource or its
spec, JSON or YAML), connects with the settings the operator injects (or ``PATHWAYS_ISLANDS``),
loads and checks every function artifact, and runs the graph ``spec.steps`` times, each step
dispatched all at once. It prints one JSON line per completed step and a final summary, and
exits 1 with the reason on stderr when anything fails.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import ValidationError

from pathways_client.cluster import Cluster, connect
from pathways_client.errors import PathwaysError
from pathways_client.futures import Specialized, describe
from pathways_client.programs import dispatch
from pathways_client.slices import Slice
from pathways_core.control.programs import ARTIFACTS_MOUNT
from pathways_core.dataflow import Dataflow
from pathways_core.resources import PathwaysProgram
from pathways_core.resources.program import (
    FunctionArtifact,
    PathwaysProgramSpec,
    ProgramGraph,
    ProgramSlice,
)
from pathways_core.topology import parse_shape

ARTIFACTS_DIR = ARTIFACTS_MOUNT


def load_spec(path: Path) -> PathwaysProgramSpec:
    """A program's spec from a file holding the resource or the spec alone."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PathwaysError(f"cannot read the program {path}: {error}") from None
    if not isinstance(document, dict):
        raise PathwaysError(f"{path}: expected a PathwaysProgram or its spec, as a mapping")
    try:
        if document.get("kind") == "PathwaysProgram":
            spec = PathwaysProgram.model_validate(document).spec
        else:
            spec = PathwaysProgramSpec.model_validate(document)
    except ValidationError as error:
        raise PathwaysError(f"{path}: not a valid program: {error}") from None
    if spec.graph is None:
        raise PathwaysError(f"{path}: the program has a driver, not a graph")
    return spec


def load_artifact(function: FunctionArtifact, artifacts_dir: Path) -> bytes:
    """The serialized artifact of ``function``, checked against its sha256."""
    if function.inline is not None:
        artifact = base64.b64decode(function.inline)
    elif function.uri is not None and function.uri.startswith("file://"):
        artifact = _read(function.name, Path(function.uri.removeprefix("file://")))
    elif function.config_map_key_ref is not None:
        ref = function.config_map_key_ref
        path = artifacts_dir / ref.name / ref.key
        if not path.is_file():
            raise PathwaysError(
                f"function {function.name!r}: its artifact, key {ref.key!r} of ConfigMap "
                f"{ref.name!r}, is not at {path}: the ConfigMap must exist in the program's "
                "namespace and hold that key (binaryData: the serialized jax.export bytes); "
                "the embedded mode keeps no ConfigMaps, use inline or file:// artifacts there"
            )
        artifact = _read(function.name, path)
    else:
        raise PathwaysError(
            f"function {function.name!r}: fetching {function.uri} is not supported here; "
            "use inline, file:// or configMapKeyRef artifacts"
        )
    if function.sha256 is not None and hashlib.sha256(artifact).hexdigest() != function.sha256:
        raise PathwaysError(f"function {function.name!r}: the artifact does not match its sha256")
    return artifact


def _read(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise PathwaysError(f"function {name!r}: cannot read its artifact: {error}") from None


def load_function(index: int, artifact: FunctionArtifact, artifacts_dir: Path) -> Specialized:
    """The function ``spec.graph.functions[index]``, loaded and checked; ``PathwaysError``
    naming that field when it cannot run on an island."""
    where = f"spec.graph.functions[{index}]"
    try:
        function = Specialized.from_artifact(artifact.name, load_artifact(artifact, artifacts_dir))
    except PathwaysError as error:
        raise PathwaysError(f"{where}: {error}") from None
    except Exception as error:
        raise PathwaysError(
            f"{where}: function {artifact.name!r}: not a jax.export artifact: {error}"
        ) from None
    symbolic = symbolic_dimension(function)
    if symbolic is not None:
        raise PathwaysError(
            f"{where}: function {artifact.name!r} has a symbolic dimension ({symbolic}): an "
            "island compiles each function once for fixed shapes; export it with concrete ones"
        )
    return function


def check_outputs(graph: ProgramGraph, functions: Mapping[str, Specialized]) -> None:
    """Every output a node input or the graph's outputs name exists, as only the artifacts
    tell: ``PathwaysError`` naming the field (``spec.graph.nodes[i].inputs[j].output``)."""
    produced = {node.name: len(functions[node.function].out_avals) for node in graph.nodes}
    edges = [
        (f"spec.graph.nodes[{i}].inputs[{j}]", edge)
        for i, node in enumerate(graph.nodes)
        for j, edge in enumerate(node.inputs)
    ]
    edges += [(f"spec.graph.outputs[{k}]", edge) for k, edge in enumerate(graph.outputs)]
    for where, edge in edges:
        if edge.output >= produced[edge.node]:
            raise PathwaysError(
                f"{where}.output: node {edge.node!r} has {produced[edge.node]} output(s), "
                f"numbered from 0; {edge.output} is not one of them"
            )


def bind(cluster: Cluster, item: ProgramSlice) -> Slice:
    """The slice for one of the program's slices: bound for the pod, or requested here."""
    if item.devices is None and item.shape is None:
        return cluster.slice(item.name)
    try:
        return cluster.slice(item.name)
    except PathwaysError:
        shape = parse_shape(item.shape) if item.shape is not None else None
        return cluster.slice(item.name, devices=item.devices, shape=shape, island=item.island)


def check_inputs(flow: Dataflow, functions: Mapping[str, Specialized]) -> None:
    """Each node's inputs against its function's parameters, as only the artifacts tell:
    their number, and the shape and dtype of each.
    Raises ``PathwaysError`` naming the field (``spec.graph.nodes[i].inputs[j]``)."""
    producers = {node.name: node for node in flow.nodes}
    for index, node in enumerate(flow.nodes):
        function = functions[node.function]
        where = f"spec.graph.nodes[{index}].inputs"
        if len(node.inputs) != len(function.in_avals):
            raise PathwaysError(
                f"{where}: node {node.name!r} gives {len(node.inputs)} input(s); function "
                f"{node.function!r} takes {len(function.in_avals)}"
            )
        for position, (ref, wanted) in enumerate(zip(node.inputs, function.in_avals, strict=True)):
            given = functions[producers[ref.node].function].out_avals[ref.index]
            if np.dtype(given.dtype) != np.dtype(wanted.dtype) or tuple(given.shape) != tuple(
                wanted.shape
            ):
                raise PathwaysError(
                    f"{where}[{position}]: output {ref.index} of node {ref.node!r} is "
                    f"{describe(given)}; function {node.function!r} takes {describe(wanted)} "
                    "there"
                )


def check_devices(
    spec: PathwaysProgramSpec, flow: Dataflow, functions: Mapping[str, Specialized]
) -> None:
    """Each node's function against its slice's size, where the spec gives it (a named
    VirtualSlice's is known once bound): ``PathwaysError`` naming the node's field."""
    sizes = {
        item.name: item.devices or (math.prod(parse_shape(item.shape)) if item.shape else None)
        for item in spec.slices
    }
    for index, node in enumerate(flow.nodes):
        wanted, size = functions[node.function].nr_devices, sizes.get(node.slice)
        if size is not None and wanted != size:
            raise PathwaysError(
                f"spec.graph.nodes[{index}].slice: function {node.function!r} of node "
                f"{node.name!r} was exported for {wanted} device(s); slice {node.slice!r} has "
                f"{size}"
            )


def symbolic_dimension(function: Specialized) -> str | None:
    """Where ``function`` has a symbolic dimension ("input 0 is float32[b,4]"), or None."""
    for side, avals in (("input", function.in_avals), ("output", function.out_avals)):
        for position, aval in enumerate(avals):
            if not all(isinstance(size, int) for size in aval.shape):
                return f"{side} {position} is {describe(aval)}"
    return None


def run(
    spec: PathwaysProgramSpec,
    cluster: Cluster,
    artifacts_dir: Path = Path(ARTIFACTS_DIR),
    on_step: Callable[[int], None] = lambda step: None,
) -> list[np.ndarray]:
    """Run the graph ``spec.steps`` times; return the last step's outputs on the host."""
    assert spec.graph is not None
    functions = {
        artifact.name: load_function(index, artifact, artifacts_dir)
        for index, artifact in enumerate(spec.graph.functions)
    }
    check_outputs(spec.graph, functions)  # what only the artifacts tell: how many there are
    outputs = {name: len(function.out_avals) for name, function in functions.items()}
    flow = Dataflow.from_graph(spec.graph, outputs)
    check_inputs(flow, functions)  # before any slice is bound: no devices held for a bad graph
    check_devices(spec, flow, functions)
    slices = {item.name: bind(cluster, item) for item in spec.slices}
    # dispatch places a node by its function's key: one key per function and slice, so nodes
    # calling one function on several slices each run on their own.
    placed: dict[str, tuple[Slice, Specialized]] = {}
    for position, node in enumerate(flow.nodes):
        key = node.function
        if key in placed and placed[key][0] is not slices[node.slice]:
            key = f"{node.function}@{node.slice}"
        placed.setdefault(key, (slices[node.slice], functions[node.function]))
        flow.nodes[position] = dataclasses.replace(node, function=key)
    results: list[np.ndarray] = []
    for step in range(spec.steps):
        outputs = dispatch(flow, placed)
        for output in outputs:
            output.wait()
        if step == spec.steps - 1:
            results = [output.result() for output in outputs]
        on_step(step + 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pathways_client.run_graph", description=__doc__)
    parser.add_argument("--spec", type=Path, required=True, help="the program, JSON or YAML")
    parser.add_argument("--results", type=Path, help="write the outputs to this .npz file")
    parser.add_argument(
        "--artifacts-dir",
        type=Path,
        default=Path(os.environ.get("PATHWAYS_ARTIFACTS_DIR", ARTIFACTS_DIR)),
        help="where configMapKeyRef artifacts are mounted (<configmap>/<key>)",
    )
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        with connect() as cluster:
            results = run(
                spec,
                cluster,
                args.artifacts_dir,
                on_step=lambda step: _say(event="step", completedSteps=step, steps=spec.steps),
            )
    except PathwaysError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.results:
        np.savez(args.results, *results)
    _say(
        event="succeeded",
        outputs=[{"shape": list(r.shape), "dtype": r.dtype.name, "sum": _sum(r)} for r in results],
    )
    return 0


def _sum(result: np.ndarray) -> float | list[float]:
    """A result's sum for the summary, taken in double precision (in a bfloat16 or float16
    output's own precision it was off, or inf); a complex one's as [real, imaginary]."""
    if np.iscomplexobj(result):
        total = complex(result.astype(np.complex128).sum())
        return [total.real, total.imag]
    return float(result.astype(np.float64).sum())


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


if __name__ == "__main__":
    sys.exit(main())
