"""Registered programs: what a program is checked for once, and what the island dispatcher
keeps of it to dispatch each call as one item.

A program is a list of computations (its nodes) whose buffer ids are names local to it: its
arguments and its nodes' outputs. A call binds the arguments and results to buffer ids; each
intermediate of a call is ``<call id>/<name>``. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from pathways_core.wire import pb

# A program's nodes are checked and planned at registration, and each call is one queue item:
# bounded so that one registration cannot hold the dispatcher for long.
MAX_PROGRAM_NODES = 4096
# What a client is told of a function or program the island does not hold.
REGISTER_IN_SESSION = (
    "register it in this session (an island keeps a function or program only while a session "
    "using it is open)"
)


def program_digest(registration: pb.ProgramRegistration) -> str:
    """The id of a program: the sha256 of its registration without the scheduler's sources,
    serialized deterministically."""
    content = pb.ProgramRegistration()
    content.CopyFrom(registration)
    content.ClearField("program_id")
    content.ClearField("sources")
    return hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()


def intermediate_id(call_id: str, name: str) -> str:
    """The buffer id of a call's node output ``name`` that is not one of its results."""
    return f"{call_id}/{name}"


@dataclass(frozen=True)
class Program:
    """A checked program and its plan on the island's executors."""

    registration: pb.ProgramRegistration
    owners: tuple[frozenset[int], ...]  # per node: the executors holding its devices
    # Every executor running a node, in the order the nodes first use them: a call's command
    # reaches the first node's executor first.
    executors: tuple[int, ...]
    devices: int  # device count summed over the nodes (a call's cost, before it was timed)
    # Node output name -> the node that makes it (results and intermediates alike).
    producer: Mapping[str, int]
    # Per argument: the executors whose nodes read it, and per such executor the executors
    # every one of its reading nodes spans (an argument held on more than those is held there
    # in part: the executor assembles it whole).
    argument_readers: tuple[frozenset[int], ...]
    argument_spans: tuple[Mapping[int, frozenset[int]], ...]
    # Per executor: the intermediates it pulls from others (name -> producing executors).
    pulls: Mapping[int, Mapping[str, frozenset[int]]]
    # Per executor: the intermediates it holds as buffers because they cross executors (made
    # for another, or pulled from another); deleted once the call has finished everywhere.
    shared: Mapping[int, tuple[str, ...]]
    # Per executor: outputs of nodes spanning more executors than a node here reading them,
    # which it holds in part and assembles whole from their makers (name -> makers).
    wholes: Mapping[int, Mapping[str, frozenset[int]]]
    # Results pulled by executors that do not make them: those copies go with the result.
    result_copies: Mapping[str, frozenset[int]]
    # Results read within the call by an executor that does not make them (pulled, or
    # assembled whole): deleting one waits for the call to end.
    results_read_across: frozenset[str]
    # Per executor: the function ids of the nodes it runs, each once, in node order.
    functions: Mapping[int, tuple[str, ...]]

    @property
    def name(self) -> str:
        return self.registration.name or self.registration.program_id[:12]

    def result_owners(self) -> list[frozenset[int]]:
        """The executors holding each result, in the program's result order."""
        return [self.owners[self.producer[name]] for name in self.registration.results]

    @cached_property
    def device_set(self) -> frozenset[int]:
        """Every island device its nodes name."""
        return frozenset(d for node in self.registration.nodes for d in node.devices)

    @cached_property
    def function_ids(self) -> tuple[str, ...]:
        """Every function its nodes run, each once."""
        return tuple(dict.fromkeys(node.function_id for node in self.registration.nodes))

    def functions_on(self, executor: int) -> tuple[str, ...]:
        """The function ids of the nodes ``executor`` runs, each once, in node order."""
        return self.functions.get(executor, ())


def slice_problem(label: str, devices: list[int], device_owner: Mapping[int, int]) -> str | None:
    """What is wrong with the devices a computation or program node names, if anything."""
    if not devices:
        return f"{label} names no devices"
    unknown = sorted({d for d in devices if d not in device_owner})
    if unknown:
        return (
            f"{label} names devices {unknown} the island does not have "
            f"(it has 0..{len(device_owner) - 1})"
        )
    if len(set(devices)) != len(devices):
        return f"{label} names a device twice"
    return None


def check_program(
    registration: pb.ProgramRegistration,
    functions: Mapping[str, object],
    device_owner: Mapping[int, int],
) -> Program | str:
    """The program planned on the island's executors, or what is wrong with it (naming the
    node and field)."""
    label = registration.name or registration.program_id[:12]
    if program_digest(registration) != registration.program_id:
        return f"program {label!r}: its id is not the sha256 of its registration"
    nodes = registration.nodes
    if not nodes:
        return f"program {label!r} has no nodes"
    if len(nodes) > MAX_PROGRAM_NODES:
        return f"program {label!r} has {len(nodes)} nodes; at most {MAX_PROGRAM_NODES}"
    arguments = list(registration.arguments)
    if len(set(arguments)) != len(arguments):
        return f"program {label!r} names an argument twice"
    defined = set(arguments)
    producer: dict[str, int] = {}
    seen_nodes: set[str] = set()
    owners: list[frozenset[int]] = []
    for index, node in enumerate(nodes):
        where = f"program {label!r} node {index} ({node.name or node.id or 'unnamed'!r})"
        if not node.id or node.id in seen_nodes:
            return f"{where}: its id must be set and unique in the program"
        seen_nodes.add(node.id)
        if node.describe:
            return f"{where}: a program node cannot describe its function"
        if node.function_id not in functions:
            return (
                f"{where} calls function {node.function_id[:12]!r}, which is not registered: "
                f"{REGISTER_IN_SESSION}"
            )
        problem = slice_problem(where, list(node.devices), device_owner)
        if problem:
            return problem
        for name in node.inputs:
            if name not in defined:
                return (
                    f"{where} reads {name!r}, which is neither an argument nor an output of a "
                    "node before it"
                )
        for name in node.outputs:
            if not name or "/" in name or name in defined:
                return (
                    f"{where}: output {name!r} must be a new name without '/' (arguments and "
                    "outputs share one namespace)"
                )
            defined.add(name)
            producer[name] = index
        owners.append(frozenset(device_owner[d] for d in node.devices))
    results = list(registration.results)
    if len(set(results)) != len(results):
        return f"program {label!r} names a result twice"
    for name in results:
        if name not in producer:
            return f"program {label!r}: result {name!r} is not an output of any node"
    pulls: dict[int, dict[str, frozenset[int]]] = {}
    wholes: dict[int, dict[str, frozenset[int]]] = {}
    shared: dict[int, dict[str, None]] = {}
    copies: dict[str, set[int]] = {}
    readers: dict[str, set[int]] = {name: set() for name in arguments}
    spans: dict[str, dict[int, frozenset[int]]] = {name: {} for name in arguments}
    kept = set(results)
    for index, node in enumerate(nodes):
        for name in node.inputs:
            made_by = producer.get(name)
            if made_by is None:  # an argument: the scheduler says where each call's comes from
                readers[name].update(owners[index])
                for executor in owners[index]:
                    spans[name][executor] = spans[name].get(executor, owners[index]) & owners[index]
                continue
            for executor in owners[index] - owners[made_by]:
                pulls.setdefault(executor, {})[name] = owners[made_by]
                if name in kept:
                    copies.setdefault(name, set()).add(executor)
                    continue
                for holder in (*owners[made_by], executor):
                    shared.setdefault(holder, {})[name] = None
            if len(owners[made_by]) > 1 and not owners[made_by] <= owners[index]:
                # Read on fewer of its makers' hosts: those readers hold it in part only.
                for executor in owners[index] & owners[made_by]:
                    wholes.setdefault(executor, {})[name] = owners[made_by]
                if name not in kept:
                    for holder in owners[made_by]:
                        shared.setdefault(holder, {})[name] = None
    return Program(
        registration=registration,
        owners=tuple(owners),
        executors=tuple(dict.fromkeys(e for node_owners in owners for e in sorted(node_owners))),
        devices=sum(len(node.devices) for node in nodes),
        producer=producer,
        argument_readers=tuple(frozenset(readers[name]) for name in arguments),
        argument_spans=tuple(spans[name] for name in arguments),
        pulls=pulls,
        wholes=wholes,
        shared={executor: tuple(names) for executor, names in shared.items()},
        result_copies={name: frozenset(executors) for name, executors in copies.items()},
        results_read_across=frozenset(
            name for name in kept if name in copies or any(name in w for w in wholes.values())
        ),
        functions={
            executor: tuple(
                dict.fromkeys(
                    node.function_id
                    for node, held in zip(nodes, owners, strict=True)
                    if executor in held
                )
            )
            for executor in set().union(*owners)
        },
    )
