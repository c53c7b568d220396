"""The program IR: a dataflow graph of compiled-function calls on named slices.

The SDK records one by tracing a Python function; the run-time dispatches it all at once; a
PathwaysProgram's ``spec.graph`` is its serialized form (``to_graph`` / ``from_graph``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pathways_core.graph import topological_order
from pathways_core.resources.program import FunctionArtifact, GraphNode, NodeInput, ProgramGraph


class Source(StrEnum):
    ARGUMENT = "argument"  # the program's n-th (flattened) argument
    CONSTANT = "constant"  # a value captured while tracing
    NODE = "node"  # an output of another node


@dataclass(frozen=True)
class Ref:
    """Where a value comes from: ``index`` is the argument, constant or output number."""

    source: Source
    index: int = 0
    node: str = ""

    def __str__(self) -> str:
        if self.source is Source.NODE:
            return f"{self.node}[{self.index}]"
        return f"{self.source.value} {self.index}"


@dataclass(frozen=True)
class Node:
    """One call of function ``function`` on slice ``slice``."""

    name: str
    function: str
    slice: str
    inputs: tuple[Ref, ...]
    outputs: int


@dataclass
class Dataflow:
    """A program: nodes, the values it takes, and the node outputs it returns."""

    arguments: int = 0
    constants: int = 0
    nodes: list[Node] = field(default_factory=list)
    outputs: tuple[Ref, ...] = ()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first dangling reference, duplicate or cycle."""
        nodes: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in nodes:
                raise ValueError(f"node name {node.name!r} is used twice")
            nodes[node.name] = node
        limits = {Source.ARGUMENT: self.arguments, Source.CONSTANT: self.constants}
        edges = [(f"node {n.name!r}", ref) for n in self.nodes for ref in n.inputs]
        edges += [("an output of the program", ref) for ref in self.outputs]
        for where, ref in edges:
            if ref.source is Source.NODE:
                producer = nodes.get(ref.node)
                if producer is None:
                    raise ValueError(f"{where} uses unknown node {ref.node!r}")
                if not 0 <= ref.index < producer.outputs:
                    raise ValueError(
                        f"{where} uses output {ref.index} of {ref.node!r}, which has "
                        f"{producer.outputs}"
                    )
            elif not 0 <= ref.index < limits[ref.source]:
                raise ValueError(f"{where} uses {ref}, but there are {limits[ref.source]}")
        self.order()

    def order(self) -> list[Node]:
        """The nodes, every one after the nodes it consumes (raises on a cycle)."""
        nodes = {node.name: node for node in self.nodes}
        dependencies = {
            node.name: [ref.node for ref in node.inputs if ref.source is Source.NODE]
            for node in self.nodes
        }
        return [nodes[name] for name in topological_order(dependencies)]

    def to_graph(self, functions: Mapping[str, FunctionArtifact]) -> ProgramGraph:
        """The serialized form. Arguments and constants must already be produced by nodes
        (a PathwaysProgram runs with no inputs from outside)."""
        loose = [ref for n in self.nodes for ref in n.inputs if ref.source is not Source.NODE]
        if loose:
            raise ValueError(f"{loose[0]} is not produced by a node; make it a source node first")
        used = sorted({node.function for node in self.nodes})
        missing = [name for name in used if name not in functions]
        if missing:
            raise ValueError(f"no artifact for function(s) {', '.join(missing)}")
        return ProgramGraph(
            functions=[functions[name] for name in used],
            nodes=[
                GraphNode(
                    name=node.name,
                    function=node.function,
                    slice=node.slice,
                    inputs=[NodeInput(node=ref.node, output=ref.index) for ref in node.inputs],
                )
                for node in self.nodes
            ],
            outputs=[NodeInput(node=ref.node, output=ref.index) for ref in self.outputs],
        )

    @classmethod
    def from_graph(cls, graph: ProgramGraph, outputs: Mapping[str, int]) -> Dataflow:
        """The IR of a serialized graph; ``outputs`` gives each function's output count."""
        flow = cls(
            nodes=[
                Node(
                    name=node.name,
                    function=node.function,
                    slice=node.slice,
                    inputs=tuple(Ref(Source.NODE, edge.output, edge.node) for edge in node.inputs),
                    outputs=outputs[node.function],
                )
                for node in graph.nodes
            ],
            outputs=tuple(Ref(Source.NODE, edge.output, edge.node) for edge in graph.outputs),
        )
        flow.validate()
        return flow
