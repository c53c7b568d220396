"""How an executor plans its part of a program: which nodes it runs, where each input comes
from, which outputs become buffers, and which inputs a node may take over."""

from __future__ import annotations

from pathways_core.wire import pb
from pathways_executor.programs import Source, plan


def node(name: str, devices, inputs, outputs) -> pb.Computation:
    return pb.Computation(
        id=name, function_id="f", devices=list(devices), inputs=list(inputs), outputs=outputs
    )


# x -> a (device 0) -> p; p -> b (device 4, another executor) -> q; q, p -> c (device 1) -> r;
# y -> d (device 2) -> s, s -> e (device 3) -> t. Results: r and s.
REGISTRATION = pb.ProgramRegistration(
    program_id="id",
    nodes=[
        node("a", [0], ["x"], ["p"]),
        node("b", [4], ["p"], ["q"]),
        node("c", [1], ["q", "p"], ["r"]),
        node("d", [2], ["y"], ["s"]),
        node("e", [3], ["s"], ["t"]),
    ],
    arguments=["x", "y"],
    results=["r", "s"],
    sources=[pb.InputSource(buffer_id="q", executors=["other:1"])],
)
CALL = pb.ProgramCall(id="c/p7", program_id="id", arguments=["c/x", "c/y"], results=["c/r", "c/s"])


def hosts(node: pb.Computation) -> frozenset[int]:
    """Devices 0-3 are this executor's (0), 4-7 another's (1)."""
    return frozenset(device // 4 for device in node.devices)


def test_an_executor_runs_its_own_nodes_with_each_input_from_where_it_is() -> None:
    planned = plan(REGISTRATION, hosts, 0)
    steps = {step.node.id: step for step in planned.steps}
    assert list(steps) == ["a", "c", "d", "e"]  # b runs on the other executor
    assert steps["a"].inputs == ((Source.ARGUMENT, 0, "x"),)
    # q is pulled from the other executor; p is read by it too, so p is a buffer here.
    assert steps["c"].inputs == ((Source.BUFFER, -1, "q"), (Source.BUFFER, -1, "p"))
    assert steps["e"].inputs == ((Source.BUFFER, 1, "s"),)  # a result: the call's buffer
    assert [source.buffer_id for source in planned.pulls(CALL)] == ["c/p7/q"]


def test_outputs_read_elsewhere_or_kept_are_buffers_the_rest_live_in_the_call() -> None:
    planned = plan(REGISTRATION, hosts, 0)
    assert planned.stored_ids(CALL) == ["c/p7/p", "c/r", "c/s"]
    steps = {step.node.id: step for step in planned.steps}
    assert steps["e"].stored == (False,)  # t is read by no one and not kept


def test_a_local_output_at_its_last_read_may_be_taken_over() -> None:
    chain = pb.ProgramRegistration(
        program_id="chain",
        nodes=[
            node("a", [0], ["x"], ["p"]),
            node("b", [1], ["p"], ["q"]),
            node("c", [2], ["q", "p"], ["r"]),
        ],
        arguments=["x"],
        results=["r"],
    )
    steps = {step.node.id: step for step in plan(chain, hosts, 0).steps}
    assert steps["a"].last_reads == frozenset()  # an argument: the caller keeps it
    assert steps["b"].last_reads == frozenset()  # p is read again by c
    assert steps["c"].last_reads == frozenset({0, 1})
    assert steps["c"].local_only and not steps["a"].local_only


def test_an_output_read_by_a_node_spanning_executors_is_a_buffer_its_other_hosts_pull() -> None:
    spanning = pb.ProgramRegistration(
        program_id="span",
        nodes=[
            node("a", [0], ["x"], ["p"]),  # here alone
            node("b", [1, 4], ["p"], ["q"]),  # here and on the other executor: it pulls p
            node("c", [2, 5], ["q"], ["r"]),  # on both, like b: q's shards are on each
        ],
        arguments=["x"],
        results=["r"],
    )
    mine = {step.node.id: step for step in plan(spanning, hosts, 0).steps}
    assert mine["a"].stored == (True,) and mine["b"].inputs == ((Source.BUFFER, -1, "p"),)
    assert mine["c"].inputs == ((Source.LOCAL, -1, "q"),)
    theirs = {step.node.id: step for step in plan(spanning, hosts, 1).steps}
    assert list(theirs) == ["b", "c"]
    assert theirs["b"].inputs == ((Source.BUFFER, -1, "p"),)


def test_an_output_of_a_node_spanning_executors_read_here_alone_is_assembled_whole() -> None:
    back = pb.ProgramRegistration(
        program_id="back",
        nodes=[
            node("a", [1, 4], ["x"], ["p"]),  # on both executors
            node("b", [2], ["p"], ["q"]),  # here alone: this executor holds p in part
        ],
        arguments=["x"],
        results=["q"],
        sources=[pb.InputSource(buffer_id="p", executors=["h:1", "h:2"], partial=True)],
    )
    mine = {step.node.id: step for step in plan(back, hosts, 0).steps}
    assert mine["a"].stored == (True,)  # served to the assembly, here and there
    assert mine["b"].inputs == ((Source.WHOLE, -1, "p"),)
    assert [s.buffer_id for s in plan(back, hosts, 0).pulls(CALL)] == ["c/p7/p"]
