"""A registered program as this executor runs it: its own nodes in program order, where each
of their inputs comes from, and which outputs become buffers (the rest live only during a
call, so a node may take its input's buffer over at the input's last use)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pathways_core.scheduling.programs import intermediate_id
from pathways_core.wire import pb


class Source(Enum):
    ARGUMENT = 1  # the call's argument at a position (a buffer)
    LOCAL = 2  # an output of an earlier node here, held only during the call
    BUFFER = 3  # an intermediate held as a buffer: made here for others, or pulled
    WHOLE = 4  # an output held here in part (made on more hosts), assembled whole beside it


@dataclass(frozen=True)
class Step:
    """One node this executor runs."""

    index: int  # in the program's nodes
    node: pb.Computation
    # Per input: where it comes from, the argument's or result's position (-1: neither), and
    # the output's name.
    inputs: tuple[tuple[Source, int, str], ...]
    # Per output: its name, and the position of the result it is (-1: an intermediate).
    outputs: tuple[tuple[str, int], ...]
    stored: tuple[bool, ...]  # per output: kept as a buffer (a result, or read elsewhere)
    # Input positions holding a local output at its last read here: their buffer may be
    # taken over.
    last_reads: frozenset[int]
    # Whether every input is a local output (whose shape the node before it fixed).
    local_only: bool
    # Local-only steps: per input, its name and whether this is its last read (then it is
    # dropped as it is read).
    local_reads: tuple[tuple[str, bool], ...]


@dataclass(eq=False)
class Plan:
    program_id: str
    name: str
    steps: tuple[Step, ...]
    # Outputs other executors make that nodes here read: pulled per call.
    pulled: tuple[pb.InputSource, ...]
    results: dict[str, int]  # result name -> position
    stored: tuple[tuple[str, int], ...]  # outputs made here as buffers: name, result position
    # Filled by the runner: per step position, its function resolved for its devices and the
    # inputs it may take over; and whether a call ran every step (local inputs' shapes are
    # then known to fit).
    bound: dict[int, Any] = field(default_factory=dict)
    checked: bool = False
    # Filled by the runner once checked: its runs of chain links by first position.
    links: dict[int, Any] | None = None

    def stored_ids(self, call: pb.ProgramCall) -> list[str]:
        """The buffer ids this executor's nodes make as buffers in ``call``."""
        return [output_id(call, name, result) for name, result in self.stored]

    def pulls(self, call: pb.ProgramCall) -> list[pb.InputSource]:
        """Where this executor pulls ``call``'s intermediates made elsewhere from."""
        sources = []
        for template in self.pulled:
            source = pb.InputSource()
            source.CopyFrom(template)
            name = template.buffer_id
            source.buffer_id = output_id(call, name, self.results.get(name, -1))
            sources.append(source)
        return sources


def output_id(call: pb.ProgramCall, name: str, result: int) -> str:
    """The buffer id of a node output in a call: its result's id, or the intermediate's."""
    return call.results[result] if result >= 0 else intermediate_id(call.id, name)


def plan(
    registration: pb.ProgramRegistration,
    hosts: Callable[[pb.Computation], frozenset[Hashable]],
    me: Hashable,
) -> Plan:
    """The nodes of ``registration`` this executor (``me``) runs and their data; ``hosts``
    says which executors a node's devices are on."""
    nodes = registration.nodes
    on = [hosts(node) for node in nodes]
    here = [me in node_hosts for node_hosts in on]
    arguments = {name: position for position, name in enumerate(registration.arguments)}
    results = {name: position for position, name in enumerate(registration.results)}
    made_here = {
        name for node, mine in zip(nodes, here, strict=True) if mine for name in node.outputs
    }
    # Outputs a node on other executors than their maker's reads (also one spanning this one
    # and another), or one on fewer of a spanning maker's: pulled from a buffer, as the
    # scheduler plans them.
    maker = {name: on[index] for index, node in enumerate(nodes) for name in node.outputs}
    read_elsewhere = {
        name
        for index, node in enumerate(nodes)
        for name in node.inputs
        if name in maker
        and (
            not on[index] <= maker[name] or (len(maker[name]) > 1 and not maker[name] <= on[index])
        )
    }
    in_part = {source.buffer_id for source in registration.sources if source.partial}
    # The last node here reading each local output.
    last_reader: dict[str, int] = {}
    for index, node in enumerate(nodes):
        if here[index]:
            for name in node.inputs:
                last_reader[name] = index
    steps = []
    for index, node in enumerate(nodes):
        if not here[index]:
            continue
        inputs: list[tuple[Source, int, str]] = []
        last_reads = set()
        for position, name in enumerate(node.inputs):
            if name in arguments:
                inputs.append((Source.ARGUMENT, arguments[name], name))
            elif name in in_part:
                inputs.append((Source.WHOLE, results.get(name, -1), name))
            elif name in made_here and name not in results and name not in read_elsewhere:
                inputs.append((Source.LOCAL, -1, name))
                if last_reader[name] == index and list(node.inputs).count(name) == 1:
                    last_reads.add(position)
            else:  # a result, or an intermediate crossing executors: a buffer
                inputs.append((Source.BUFFER, results.get(name, -1), name))
        outputs = tuple((name, results.get(name, -1)) for name in node.outputs)
        stored = tuple(name in results or name in read_elsewhere for name in node.outputs)
        local_only = all(source is Source.LOCAL for source, _, _ in inputs)
        local_reads = (
            tuple((name, slot in last_reads) for slot, (_, _, name) in enumerate(inputs))
            if local_only
            else ()
        )
        steps.append(
            Step(
                index,
                node,
                tuple(inputs),
                outputs,
                stored,
                frozenset(last_reads),
                local_only,
                local_reads,
            )
        )
    # Pulled in the order this executor reads them: the transfer threads are few, and one
    # waiting for an intermediate made late (after work here that waits on an earlier pull)
    # while that earlier pull queued behind it deadlocked the island (a 1F1B pipeline did).
    first_read: dict[str, int] = {}
    for step in steps:
        for _, _, name in step.inputs:
            first_read.setdefault(name, step.index)
    pulled = sorted(
        registration.sources, key=lambda source: first_read.get(source.buffer_id, len(nodes))
    )
    return Plan(
        program_id=registration.program_id,
        name=registration.name or registration.program_id[:12],
        steps=tuple(steps),
        pulled=tuple(pulled),
        results=results,
        stored=tuple(
            output
            for step in steps
            for output, stored in zip(step.outputs, step.stored, strict=True)
            if stored
        ),
    )
