"""Registered programs in the island dispatcher, driven with no network: what a registration
is checked for, a call as one item in the island order (one command per executor, one
completion), the sources of what crosses executors, per-node trace records, the intermediates
freed once the call is done, and calls refused with what is wrong."""

from __future__ import annotations

import pytest
from test_dispatcher import ARTIFACT, FUNCTION, client_events, island, remote, to_executors

from pathways_core.scheduling import ExecutorSpec, IslandDispatcher
from pathways_core.scheduling.island import TraceRecord
from pathways_core.scheduling.programs import MAX_PROGRAM_NODES, check_program, program_digest
from pathways_core.scheduling.trace import in_order
from pathways_core.wire import pb

Event = pb.ClientEvent


def node(name: str, devices, inputs, outputs) -> pb.Computation:
    return pb.Computation(
        id=name, function_id=FUNCTION, devices=list(devices), inputs=list(inputs), outputs=outputs
    )


def chain(devices, name: str = "chain") -> pb.ProgramRegistration:
    """x -> y0 -> y1 -> ... with node k on devices[k]; the last output is the result."""
    nodes, previous = [], "x"
    for k, device in enumerate(devices):
        nodes.append(node(f"s{k}", [device], [previous], [f"y{k}"]))
        previous = f"y{k}"
    return sealed(
        pb.ProgramRegistration(name=name, nodes=nodes, arguments=["x"], results=[previous])
    )


def sealed(registration: pb.ProgramRegistration) -> pb.ProgramRegistration:
    registration.program_id = program_digest(registration)
    return registration


def registered(dispatcher: IslandDispatcher, registration: pb.ProgramRegistration) -> str:
    (event,) = client_events(dispatcher.register_program("a", registration))
    assert event.kind == Event.REGISTERED, event.message
    assert event.program_id == registration.program_id
    return registration.program_id


def call(program_id: str, n: int, arguments=("a/x",), results=None) -> pb.ProgramCall:
    results = [f"a/r{n}"] if results is None else results
    return pb.ProgramCall(
        id=f"a/p{n}", program_id=program_id, arguments=list(arguments), results=list(results)
    )


def test_a_call_is_one_command_per_executor_after_its_registrations() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 1, 2, 3]))
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    assert [(e, c.WhichOneof("kind")) for e, c in sent] == [
        (0, "register"),
        (0, "program"),
        (0, "call"),
    ]
    assert not sent[1][1].program.sources  # nothing crosses executors
    again = to_executors(dispatcher.call("a", call(program, 2, arguments=["a/r1"])))
    assert [c.WhichOneof("kind") for _, c in again] == ["call"]
    assert again[0][1].call.arguments == ["a/r1"]  # the first call's result, a future


def test_a_call_completes_once_with_a_trace_record_per_node() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 1]))
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    seq = sent[-1][1].seq
    event = pb.ExecutorEvent(seq=seq, computation_id="a/p1", executor=0, ok=True)
    event.node_indices.extend([0, 1])
    event.node_starts_ns.extend([10, 20])
    event.node_ends_ns.extend([20, 30])
    (done,) = client_events(dispatcher.executor_event(event))
    assert (done.kind, done.computation_id) == (Event.COMPLETED, "a/p1")
    assert [(r.computation_id, r.devices, r.start_ns, r.end_ns) for r in dispatcher.trace] == [
        ("a/p1/s0", (0,), 10, 20),
        ("a/p1/s1", (1,), 20, 30),
    ]
    assert all(r.seq == seq and r.client == "a" for r in dispatcher.trace)


def test_a_failed_calls_nodes_that_ran_are_traced_ok() -> None:
    """Every node of a call failing in one was traced as failed, those that ran too."""
    dispatcher = island()
    program = registered(dispatcher, chain([0, 0, 0]))
    seq = to_executors(dispatcher.call("a", call(program, 1)))[-1][1].seq
    event = pb.ExecutorEvent(seq=seq, computation_id="a/p1", executor=0, ok=False, message="no")
    event.node_indices.extend([0, 1, 2])
    event.node_starts_ns.extend([10, 20, 30])
    event.node_ends_ns.extend([20, 30, 40])
    event.node_failed.extend([1, 2])
    (done,) = client_events(dispatcher.executor_event(event))
    assert done.kind == Event.FAILED
    assert [(r.computation_id, r.ok) for r in dispatcher.trace] == [
        ("a/p1/s0", True),
        ("a/p1/s1", False),
        ("a/p1/s2", False),
    ]


def test_a_failure_passed_on_to_another_executor_is_said_once() -> None:
    """A call failing on executor 0 and, reading its output, on executor 1: the second
    failure names the first as its cause, so the call's message was the first one twice."""
    dispatcher = island()
    program = registered(dispatcher, chain([0, 4]))
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    seq = sent[-1][1].seq
    first = "computation 's0' of call 'a/p1' failed on executor 0: too big"
    passed_on = f"computation 's1' of call 'a/p1' failed on executor 1: input failed: {first}"
    for executor, message in [(1, passed_on), (0, first)]:
        event = pb.ExecutorEvent(seq=seq, executor=executor, ok=False, message=message)
        done = client_events(dispatcher.executor_event(event))
    (failed,) = done
    assert (failed.kind, failed.message) == (Event.FAILED, passed_on)


def test_the_trace_keeps_the_latest_reports_in_order_and_calls_cost_no_records_until_read() -> None:
    """Calls and computations interleaved, far past the trace's limit: the trace holds the
    latest records (the oldest tenth goes at the limit) in the order they were reported, and
    a call's node records are made only when the trace is read (made as reported, 20,000
    calls' worth at a time held the island for 3.5 s)."""
    from test_dispatcher import ARTIFACT, computation, finish

    dispatcher = IslandDispatcher(
        [ExecutorSpec(0, "h:1", (0, 1, 2, 3))], policy="fifo", max_in_flight=16, trace_limit=100
    )
    dispatcher.connect("a")
    dispatcher.register("a", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/x", executor=0))
    program = registered(dispatcher, chain([0, 1, 2, 3]))
    expected = []
    for n in range(60):
        sent = to_executors(dispatcher.call("a", call(program, n)))
        event = pb.ExecutorEvent(seq=sent[-1][1].seq, computation_id=f"a/p{n}", ok=True)
        event.node_indices.extend(range(4))
        event.node_starts_ns.extend(range(4))
        event.node_ends_ns.extend(range(1, 5))
        dispatcher.executor_event(event)
        expected += [f"a/p{n}/s{k}" for k in range(4)]
        (run,) = [c for _, c in to_executors(dispatcher.submit("a", computation("a", n)))]
        finish(dispatcher, run.seq, 0)
        expected.append(run.run.id)
        dispatcher.delete("a", [f"a/r{n}", *run.run.outputs])
    held = [
        entry
        for entry in in_order(dispatcher.trace_entries())
        if not isinstance(entry, TraceRecord)
    ]
    assert held, "the calls' node records were made before the trace was read"
    records = [r.computation_id for r in dispatcher.trace]
    assert 90 <= len(records) <= 100
    assert records == expected[-len(records) :]
    assert dispatcher.trace == dispatcher.trace  # read twice, made once: the same records


def test_what_crosses_executors_is_pulled_from_its_maker_and_freed_after_the_call() -> None:
    dispatcher = island()
    # y0 and y1 on executor 0; y2 on executor 1 reads y1; y3 back on executor 0 reads y2.
    program = registered(dispatcher, chain([0, 1, 4, 2]))
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    by_kind = {(e, c.WhichOneof("kind")): c for e, c in sent}
    assert [(s.buffer_id, list(s.executors)) for s in by_kind[(1, "program")].program.sources] == [
        ("y1", ["h:1"])
    ]
    assert [(s.buffer_id, list(s.executors)) for s in by_kind[(0, "program")].program.sources] == [
        ("y2", ["h:2"])
    ]
    seq = by_kind[(0, "call")].seq
    assert by_kind[(1, "call")].seq == seq  # one place in the island order on both
    assert (
        client_events(dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=0, ok=True)))
        == []
    )
    finished = dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=1, ok=True))
    deletes = {e: sorted(c.delete.ids) for e, c in to_executors(finished)}
    # Each executor frees the intermediates it held for the other or pulled from it.
    assert deletes == {0: ["a/p1/y1", "a/p1/y2"], 1: ["a/p1/y1", "a/p1/y2"]}
    assert [e.kind for e in client_events(finished)] == [Event.COMPLETED]


def test_a_node_on_fewer_hosts_than_its_input_s_maker_assembles_it_from_them() -> None:
    dispatcher = island()
    spanning = sealed(
        pb.ProgramRegistration(
            name="back",
            nodes=[node("a", [1, 4], ["x"], ["p"]), node("b", [2], ["p"], ["q"])],
            arguments=["x"],
            results=["q"],
        )
    )
    program = registered(dispatcher, spanning)
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    registration = next(c.program for e, c in sent if e == 0 and c.WhichOneof("kind") == "program")
    (source,) = registration.sources
    assert (source.buffer_id, source.partial, list(source.executors)) == ("p", True, ["h:1", "h:2"])
    seq = next(c.seq for _, c in sent if c.WhichOneof("kind") == "call")
    dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=0, ok=True))
    finished = dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=1, ok=True))
    # p is freed on both makers once the call is done (with it, executor 0's whole).
    assert {e: list(c.delete.ids) for e, c in to_executors(finished)} == {
        0: ["a/p1/p"],
        1: ["a/p1/p"],
    }


def test_a_call_reaches_its_first_nodes_executor_first() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([4, 0, 5]))  # starts on executor 1
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    assert [e for e, c in sent if c.WhichOneof("kind") == "call"] == [1, 0]


def test_an_argument_held_elsewhere_comes_with_its_source() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([4, 5]))  # "a/x" is on executor 0
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    (command,) = [c for _, c in sent if c.WhichOneof("kind") == "call"]
    assert [(s.buffer_id, list(s.executors)) for s in command.sources] == [("a/x", ["h:1"])]


def test_a_failed_node_fails_the_call_with_its_message() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0]))
    seq = to_executors(dispatcher.call("a", call(program, 1)))[-1][1].seq
    failed = pb.ExecutorEvent(seq=seq, executor=0, ok=False, message="node s0 broke")
    (event,) = client_events(dispatcher.executor_event(failed))
    assert (event.kind, event.computation_id, event.message) == (
        Event.FAILED,
        "a/p1",
        "node s0 broke",
    )


def test_calls_take_their_share_by_their_nodes_devices() -> None:
    dispatcher = island(max_in_flight=1, policy="proportional-share")
    program = registered(dispatcher, chain([0, 1, 2, 3]))  # cost 4
    dispatcher.submit(
        "b",
        pb.Computation(id="b/c0", function_id=FUNCTION, devices=[0], inputs=[], outputs=["b/o0"]),
    )
    for n in range(1, 4):
        dispatcher.call("a", call(program, n))
    for n in range(1, 5):
        dispatcher.submit(
            "b",
            pb.Computation(
                id=f"b/c{n}", function_id=FUNCTION, devices=[0], inputs=[], outputs=[f"b/o{n}"]
            ),
        )
    order = []
    while dispatcher._in_flight:
        (seq,) = dispatcher._in_flight
        flight = dispatcher._in_flight[seq]
        order.append(flight.id)
        dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=0, ok=True))
    # One call of four one-device nodes costs as much as four computations of one device:
    # after a's first call, b runs until its pass catches up (ties go to the older item).
    assert order == ["b/c0", "a/p1", "b/c1", "b/c2", "b/c3", "a/p2", "b/c4", "a/p3"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda r: r.ClearField("nodes"), "has no nodes"),
        (lambda r: r.nodes[1].inputs.__setitem__(0, "nowhere"), "reads 'nowhere'"),
        (lambda r: r.nodes[1].inputs.__setitem__(0, "y2"), "reads 'y2'"),  # defined later
        (lambda r: r.nodes[0].outputs.__setitem__(0, "x"), "output 'x' must be a new name"),
        (lambda r: setattr(r.nodes[1], "id", "s0"), "its id must be set and unique"),
        (lambda r: r.nodes[0].devices.append(99), "names devices [99]"),
        (lambda r: r.nodes[0].devices.append(0), "names a device twice"),
        (lambda r: setattr(r.nodes[0], "function_id", "0" * 64), "is not registered"),
        (lambda r: r.results.append("x"), "result 'x' is not an output"),
        (lambda r: setattr(r.nodes[0], "describe", True), "cannot describe"),
    ],
)
def test_a_bad_program_is_refused_naming_what_is_wrong(change, expected) -> None:
    dispatcher = island()
    registration = chain([0, 1, 2])
    change(registration)
    sealed(registration)
    (event,) = client_events(dispatcher.register_program("a", registration))
    assert event.kind == Event.REJECTED
    assert expected in event.message
    assert "program 'chain'" in event.message
    assert event.program_id == registration.program_id


def test_a_program_whose_id_is_not_its_digest_is_refused() -> None:
    registration = chain([0])
    registration.program_id = "0" * 64
    problem = check_program(registration, {FUNCTION: None}, {0: 0})
    assert isinstance(problem, str) and "not the sha256" in problem


@pytest.mark.parametrize(
    ("bad_call", "expected"),
    [
        (lambda p: call("0" * 64, 1), "is not registered: register it"),
        (lambda p: call(p, 1, arguments=[]), "passes 0 argument(s); the program takes 1"),
        (lambda p: call(p, 1, results=[]), "names 0 result(s); the program has 1"),
        (lambda p: call(p, 1, arguments=["a/missing"]), "reads unknown buffer 'a/missing'"),
        (lambda p: call(p, 1, results=["b/r"]), "must start with the client name"),
        (lambda p: call(p, 1, results=["a/x"]), "writes buffer 'a/x', which exists already"),
        (lambda p: pb.ProgramCall(id="b/p1", program_id=p, arguments=["a/x"]), "must start"),
    ],
)
def test_a_bad_call_is_refused_and_nothing_of_it_kept(bad_call, expected) -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 1]))
    request = bad_call(program)
    (event,) = client_events(dispatcher.call("a", request))
    assert event.kind == Event.REJECTED
    assert expected in event.message
    assert event.computation_id == request.id
    assert not dispatcher._in_flight and dispatcher.queue.queued == 0
    # The island keeps serving: a good call goes.
    assert to_executors(dispatcher.call("a", call(program, 7)))


def test_a_call_id_is_not_taken_twice_nor_over_a_buffer_its_intermediates_would_be() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 4, 1]))  # y0 and y1 cross executors
    first = to_executors(dispatcher.call("a", call(program, 1)))
    (again,) = client_events(dispatcher.call("a", call(program, 1, results=["a/other"])))
    assert again.kind == Event.REJECTED
    assert "id 'a/p1' is taken by work not yet finished" in again.message
    # A buffer where a call would keep an intermediate that crosses executors.
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/p2/y0", executor=0))
    (clash,) = client_events(dispatcher.call("a", call(program, 2)))
    assert clash.kind == Event.REJECTED
    assert "intermediate 'y0' as buffer 'a/p2/y0', which exists already" in clash.message
    # Once the first call is done, its id may be used again.
    seq = first[-1][1].seq
    for executor in (0, 1):
        dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=executor, ok=True))
    dispatcher.delete("a", ["a/r1"])
    assert to_executors(dispatcher.call("a", call(program, 1)))


def test_a_call_queued_when_its_executor_is_lost_fails_naming_it() -> None:
    dispatcher = island(max_in_flight=1)
    program = registered(dispatcher, chain([4]))
    dispatcher.submit(
        "b",
        pb.Computation(id="b/c0", function_id=FUNCTION, devices=[0], inputs=[], outputs=["b/o"]),
    )
    dispatcher.call("a", call(program, 1))  # waits behind b's computation
    dispatcher.executor_lost(1, "killed")
    (seq,) = dispatcher._in_flight
    events = client_events(
        dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=0, ok=True))
    )
    failed = [e for e in events if e.computation_id == "a/p1"]
    assert failed and failed[0].kind == Event.FAILED
    assert "executor 1" in failed[0].message and "killed" in failed[0].message


def test_a_program_over_the_node_limit_is_refused() -> None:
    dispatcher = island()
    registration = chain([0] * (MAX_PROGRAM_NODES + 1), name="huge")
    (event,) = client_events(dispatcher.register_program("a", registration))
    assert event.kind == Event.REJECTED
    assert f"has {MAX_PROGRAM_NODES + 1} nodes; at most {MAX_PROGRAM_NODES}" in event.message


def test_a_program_spanning_a_restarted_executor_is_registered_again_everywhere() -> None:
    """The others' plans pull its intermediates from its data endpoint, which changed."""
    specs = [
        ExecutorSpec(0, "h:1", (0, 1, 2, 3), "d:1"),
        ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:2"),
    ]
    dispatcher = IslandDispatcher(specs, policy="fifo")
    dispatcher.connect("a")
    dispatcher.register("a", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/x", executor=0))
    program = registered(dispatcher, chain([4, 0]))
    first = to_executors(dispatcher.call("a", call(program, 1)))
    pulls = [c.program for _, c in first if c.HasField("program") and c.program.sources]
    assert [list(p.sources[0].data_endpoints) for p in pulls] == [["d:2"]]
    seq = first[-1][1].seq
    for executor in (0, 1):
        dispatcher.executor_event(pb.ExecutorEvent(seq=seq, executor=executor, ok=True))
    dispatcher.executor_lost(1, "killed")
    dispatcher.executor_rejoined(ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:9"))
    again = to_executors(dispatcher.call("a", call(program, 2)))
    assert sorted((e, c.WhichOneof("kind")) for e, c in again) == [
        (0, "call"),
        (0, "program"),
        (1, "call"),
        (1, "program"),
        (1, "register"),
    ]
    pulls = [c.program for _, c in again if c.HasField("program") and c.program.sources]
    assert [list(p.sources[0].data_endpoints) for p in pulls] == [["d:9"]]


def test_calls_refused_before_any_node_ran_leave_the_traces_count_true() -> None:
    """Each such call counted one record its report never made: read between them, the count
    drifted up one a call, the trace kept ever fewer records, and at its limit the trim popped
    an empty trace, killing the executor's event thread (the island hung)."""
    dispatcher = IslandDispatcher(
        [ExecutorSpec(0, "h:1", (0, 1, 2, 3))], policy="fifo", max_in_flight=16, trace_limit=20
    )
    dispatcher.connect("a")
    dispatcher.register("a", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/x", executor=0))
    program = registered(dispatcher, chain([0, 1]))
    for n in range(60):
        sent = to_executors(dispatcher.call("a", call(program, n)))
        refused = pb.ExecutorEvent(seq=sent[-1][1].seq, ok=False, message="wrong argument")
        (failed,) = client_events(dispatcher.executor_event(refused))
        assert failed.kind == Event.FAILED
        dispatcher.delete("a", [f"a/r{n}"])
        if n == 30:  # one that ran, among them
            ran = to_executors(dispatcher.call("a", call(program, 100)))
            event = pb.ExecutorEvent(seq=ran[-1][1].seq, ok=True)
            event.node_indices.extend([0, 1])
            event.node_starts_ns.extend([1, 2])
            event.node_ends_ns.extend([2, 3])
            dispatcher.executor_event(event)
        assert dispatcher._trace.size == len(dispatcher.trace)
    assert [r.computation_id for r in dispatcher.trace] == ["a/p100/s0", "a/p100/s1"]


def test_a_session_ended_before_its_work_keeps_nothing_in_the_dispatcher() -> None:
    """Its completions, reported after it ended, counted the client's deferred completions
    again: one entry kept for every such session, for good."""
    dispatcher = island()
    program = registered(dispatcher, chain([0, 1]))
    seqs = [to_executors(dispatcher.call("a", call(program, n)))[-1][1].seq for n in range(3)]
    dispatcher.disconnect("a")
    for seq in seqs:
        dispatcher.executor_event(pb.ExecutorEvent(seq=seq, ok=True))
    assert "a" not in dispatcher._held


def test_a_call_reading_another_islands_pending_buffer_is_held_while_its_readers_pull_it() -> None:
    """Held in the queue until the buffer is made over there, as a computation is; the
    executors whose nodes read it pull it meanwhile (a call's wait for it was the whole
    transfer, after the work before it)."""
    dispatcher = island()
    both = sealed(
        pb.ProgramRegistration(
            name="both",
            nodes=[node("s0", [0], ["x"], ["y0"]), node("s1", [4], ["x"], ["y1"])],
            arguments=["x"],
            results=["y0", "y1"],
        )
    )
    program = registered(dispatcher, both)
    dispatcher.placed("a", remote("a", "far"))
    held = to_executors(
        dispatcher.call("a", call(program, 1, arguments=["a/far"], results=["a/r", "a/s"]))
    )
    assert [(e, c.WhichOneof("kind")) for e, c in held] == [(0, "prefetch"), (1, "prefetch")]
    assert all([s.buffer_id for s in c.prefetch.sources] == ["a/far"] for _, c in held)
    ready = to_executors(dispatcher.remote_ready("a", pb.RemoteReady(buffer_ids=["a/far"])))
    assert [(e, c.WhichOneof("kind")) for e, c in ready][-2:] == [(0, "call"), (1, "call")]
