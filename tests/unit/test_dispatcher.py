"""The island dispatcher, driven with no network: validation, one island order, registrations
before use, cross-executor sources, deletions in order, the in-flight window, lost executors."""

from __future__ import annotations

import hashlib

import pytest

from pathways_core.scheduling import ExecutorSpec, IslandDispatcher, ToClient, ToExecutor
from pathways_core.scheduling.island import HOLD_WHILE_PENDING, MAX_HELD_COMPLETIONS
from pathways_core.wire import pb

Event = pb.ClientEvent
ARTIFACT = b"not a real artifact, the dispatcher only hashes it"
FUNCTION = hashlib.sha256(ARTIFACT).hexdigest()


def island(max_in_flight: int = 16, policy: str = "fifo", **limits) -> IslandDispatcher:
    dispatcher = IslandDispatcher(
        [ExecutorSpec(0, "h:1", (0, 1, 2, 3)), ExecutorSpec(1, "h:2", (4, 5, 6, 7))],
        policy=policy,
        max_in_flight=max_in_flight,
        **limits,
    )
    for client in ("a", "b", "c"):
        dispatcher.connect(client)
        dispatcher.register(
            client, pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT, name="f")
        )
        dispatcher.placed(client, pb.PlacedBuffer(buffer_id=f"{client}/x", executor=0))
    return dispatcher


def computation(client: str, n: int, devices=(0,), inputs=(), outputs=None) -> pb.Computation:
    outputs = [f"{client}/out{n}"] if outputs is None else outputs
    return pb.Computation(
        id=f"{client}/c{n}",
        client=client,
        function_id=FUNCTION,
        devices=list(devices),
        inputs=list(inputs),
        outputs=outputs,
        name=f"n{n}",
    )


def to_executors(instructions) -> list[tuple[int, pb.ExecutorCommand]]:
    return [(i.executor, i.command) for i in instructions if isinstance(i, ToExecutor)]


def client_events(instructions) -> list[pb.ClientEvent]:
    return [i.event for i in instructions if isinstance(i, ToClient)]


def finish(dispatcher: IslandDispatcher, seq: int, executor: int, ok: bool = True, message=""):
    return dispatcher.executor_event(
        pb.ExecutorEvent(seq=seq, executor=executor, ok=ok, message=message, start_ns=1, end_ns=2)
    )


def test_registration_precedes_first_use_and_runs_go_to_every_owner() -> None:
    dispatcher = island()
    sent = to_executors(dispatcher.submit("a", computation("a", 1, devices=(2, 3, 4, 5))))
    kinds = [(executor, command.WhichOneof("kind")) for executor, command in sent]
    assert kinds == [(0, "register"), (1, "register"), (0, "run"), (1, "run")]
    assert sent[2][1].seq == sent[3][1].seq  # one place in the island order
    again = to_executors(dispatcher.submit("a", computation("a", 2, devices=(4,))))
    assert [command.WhichOneof("kind") for _, command in again] == ["run"]


def test_inputs_on_other_executors_come_with_their_sources() -> None:
    dispatcher = island()
    dispatcher.submit("a", computation("a", 1, devices=(0,), inputs=["a/x"]))
    sent = to_executors(
        dispatcher.submit("a", computation("a", 2, devices=(5,), inputs=["a/out1"]))
    )
    run = sent[-1][1]
    assert sent[-1][0] == 1
    assert [(s.buffer_id, list(s.executors)) for s in run.sources] == [("a/out1", ["h:1"])]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (computation("a", 1, devices=()), "names no devices"),
        (computation("a", 1, devices=(9,)), "devices [9] the island does not have"),
        (computation("a", 1, devices=(1, 1)), "names a device twice"),
        (computation("a", 1, inputs=["a/nothing"]), "reads unknown buffer 'a/nothing'"),
        (computation("a", 1, outputs=["b/y"]), "must start with the client name 'a/'"),
        (computation("a", 1, outputs=["a/x"]), "writes buffer 'a/x', which exists already"),
        (computation("a", 1, outputs=["a/y", "a/y"]), "names an output twice"),
        (pb.Computation(id="a/c", function_id="0" * 64, devices=[0]), "is not registered"),
    ],
)
def test_bad_computations_are_rejected_with_a_reason(bad: pb.Computation, message: str) -> None:
    dispatcher = island()
    events = client_events(dispatcher.submit("a", bad))
    assert [e.kind for e in events] == [Event.REJECTED]
    assert message in events[0].message
    # Nothing was queued, and the island keeps serving.
    assert dispatcher.queue.queued == 0
    assert to_executors(dispatcher.submit("a", computation("a", 7)))


def test_corrupt_artifact_is_rejected_at_registration() -> None:
    dispatcher = island()
    events = client_events(
        dispatcher.register(
            "a", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT + b"!", name="f")
        )
    )
    assert events[0].kind == Event.REJECTED
    assert "does not match its id" in events[0].message


def test_window_bounds_work_in_flight_and_completion_releases_the_next() -> None:
    dispatcher = island(max_in_flight=2)
    runs = []
    for n in range(4):
        runs += [
            c
            for _, c in to_executors(dispatcher.submit("a", computation("a", n)))
            if c.HasField("run")
        ]
    assert [c.run.id for c in runs] == ["a/c0", "a/c1"]
    instructions = finish(dispatcher, runs[0].seq, 0)
    assert [e.kind for e in client_events(instructions)] == [Event.COMPLETED]
    assert [c.run.id for _, c in to_executors(instructions)] == ["a/c2"]


def test_a_window_of_no_computations_is_refused() -> None:
    """It would queue every computation and dispatch none."""
    with pytest.raises(ValueError, match=r"max_in_flight must be >= 1 \(got 0\)"):
        island(max_in_flight=0)


def test_a_computation_completes_only_when_every_executor_reports() -> None:
    dispatcher = island()
    sent = to_executors(dispatcher.submit("a", computation("a", 1, devices=(3, 4))))
    seq = sent[-1][1].seq
    assert client_events(finish(dispatcher, seq, 0)) == []
    events = client_events(finish(dispatcher, seq, 1, ok=False, message="boom on 1"))
    assert [(e.kind, e.message) for e in events] == [(Event.FAILED, "boom on 1")]
    assert {r.executor for r in dispatcher.trace} == {0, 1}


def test_deletes_wait_for_the_computations_queued_before_them() -> None:
    dispatcher = island(max_in_flight=1)
    first = to_executors(dispatcher.submit("a", computation("a", 1, inputs=["a/x"])))
    dispatcher.submit("a", computation("a", 2, inputs=["a/x"]))
    assert to_executors(dispatcher.delete("a", ["a/x", "b/x"])) == []  # a/c2 still queued
    instructions = finish(dispatcher, first[-1][1].seq, 0)
    # The deletion goes right behind the computation reading a/x last, in the same batch (at
    # the bound on work in flight too: it is free), so that computation may take a/x over.
    sent = [(e, c.WhichOneof("kind"), list(c.delete.ids)) for e, c in to_executors(instructions)]
    assert sent == [(0, "run", []), (0, "delete", ["a/x"])]
    second = next(c for _, c in to_executors(instructions))
    assert to_executors(finish(dispatcher, second.seq, 0)) == []


def test_a_buffer_pulled_by_another_executor_is_deleted_after_the_pull() -> None:
    dispatcher = island()
    sent = to_executors(dispatcher.submit("a", computation("a", 1, devices=(5,), inputs=["a/x"])))
    seq = sent[-1][1].seq
    # The client drops a/x at once: executor 0 must keep it until executor 1 has pulled it.
    assert to_executors(dispatcher.delete("a", ["a/x"])) == []
    assert dispatcher.submit("a", computation("a", 2, inputs=["a/x"])) == [
        ToClient(
            "a",
            Event(
                kind=Event.REJECTED,
                computation_id="a/c2",
                message="computation 'n2' reads unknown buffer 'a/x'",
            ),
        )
    ]
    # Nor is a/x written again until then: the deletion sent later would take the new one.
    (refused,) = client_events(dispatcher.submit("a", computation("a", 3, outputs=["a/x"])))
    assert refused.kind == Event.REJECTED
    assert "writes buffer 'a/x', which is still being deleted" in refused.message
    released = finish(dispatcher, seq, executor=1)
    deletes = [(e, list(c.delete.ids)) for e, c in to_executors(released)]
    assert deletes == [(0, ["a/x"]), (1, ["a/x"])]  # the holder's and the pulled copy
    assert [e.kind for e in client_events(released)] == [Event.COMPLETED]


def test_a_buffer_of_another_island_is_pulled_from_its_holders() -> None:
    dispatcher = island()
    remote = pb.InputSource(buffer_id="a/far", executors=["other:1"], data_endpoints=["other:2"])
    assert dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/far", remote=remote)) == []
    sent = to_executors(
        dispatcher.submit("a", computation("a", 1, devices=(0, 5), inputs=["a/far"]))
    )
    runs = [c for _, c in sent if c.WhichOneof("kind") == "run"]
    assert [list(s.data_endpoints) for c in runs for s in c.sources] == [["other:2"]] * 2
    # Deleting it frees the copies the executors pulled, after they pulled them.
    assert to_executors(dispatcher.delete("a", ["a/far"])) == []
    finish(dispatcher, runs[0].seq, executor=0)
    released = finish(dispatcher, runs[0].seq, executor=1)
    assert [(e, list(c.delete.ids)) for e, c in to_executors(released)] == [
        (0, ["a/far"]),
        (1, ["a/far"]),
    ]
    # A remote buffer needs somewhere to pull from, and ids stay unique.
    (refused,) = client_events(
        dispatcher.placed(
            "a", pb.PlacedBuffer(buffer_id="a/near", remote=pb.InputSource(buffer_id="a/near"))
        )
    )
    assert refused.kind == Event.REJECTED and "no data endpoint" in refused.message
    (twice,) = client_events(dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/x", executor=1)))
    assert "exists already" in twice.message


def test_a_buffer_of_another_island_that_will_never_be_fails_its_readers() -> None:
    """Relayed by the client from the producer's island: executors pulling it stop now, and
    work queued on it fails at dispatch naming why; another client's ids are not touched."""
    dispatcher = island(max_in_flight=1)
    remote = pb.InputSource(buffer_id="a/far", executors=["other:1"], data_endpoints=["other:2"])
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/far", remote=remote))
    first = to_executors(dispatcher.submit("a", computation("a", 1, devices=(0,))))
    (running,) = [c for _, c in first if c.WhichOneof("kind") == "run"]  # the one place in flight
    dispatcher.submit("a", computation("a", 2, devices=(4,), inputs=["a/far"]))
    why = "it will never be here: on island 'far', the session ended"
    assert dispatcher.remote_failed("b", pb.RemoteFailed(buffer_ids=["a/far"], reason=why)) == []
    sent = to_executors(
        dispatcher.remote_failed("a", pb.RemoteFailed(buffer_ids=["a/far", "a/x"], reason=why))
    )
    assert [(e, list(c.remote_failed.buffer_ids), c.seq) for e, c in sent] == [
        (0, ["a/far"], 0),
        (1, ["a/far"], 0),
    ]
    events = client_events(finish(dispatcher, running.seq, executor=0))
    (failed,) = [e for e in events if e.kind == Event.FAILED]
    assert failed.computation_id == "a/c2"
    assert f"its input 'a/far' was lost: {why}" in failed.message


def test_a_lost_executor_fails_its_work_and_the_rest_keeps_serving() -> None:
    dispatcher = island()
    on_1 = to_executors(dispatcher.submit("a", computation("a", 1, devices=(4,))))
    events = client_events(dispatcher.executor_lost(1, "UNAVAILABLE: connection reset"))
    # Every client is told (their uploads to it and reads from it end), and its work fails.
    assert [e.kind for e in events] == [Event.EXECUTOR_LOST] * 3 + [Event.FAILED]
    assert [e.executor for e in events[:3]] == [1, 1, 1]
    # A session opened later is told too.
    (told,) = client_events(dispatcher.connect("d"))
    assert told.kind == Event.EXECUTOR_LOST and "executor 1 (h:2) is unreachable" in told.message
    assert "executor 1 (h:2) is unreachable: UNAVAILABLE" in events[0].message
    assert on_1
    rejected = client_events(dispatcher.submit("a", computation("a", 2, devices=(5,))))
    assert rejected[0].kind == Event.REJECTED and "unreachable" in rejected[0].message
    assert to_executors(dispatcher.submit("a", computation("a", 3, devices=(0,))))


def test_work_spanning_a_lost_executor_fails_at_once() -> None:
    """It waited for the healthy executor's report, which its collective never gave until JAX
    gave up on the group, ~100 s later."""
    dispatcher = island()
    (run,) = [
        c
        for e, c in to_executors(dispatcher.submit("a", computation("a", 1, devices=(0, 4))))
        if c.HasField("run") and e == 0
    ]
    (failed,) = [
        e
        for e in client_events(dispatcher.executor_lost(1, "it sent nothing for 31 s"))
        if e.kind == Event.FAILED
    ]
    assert failed.kind == Event.FAILED and "executor 1 (h:2) is unreachable" in failed.message
    assert finish(dispatcher, run.seq, executor=0) == []  # its late report changes nothing


def test_an_id_in_use_by_unfinished_work_is_refused_until_it_finishes() -> None:
    """Two computations of one id were accepted: their events could not be told apart."""
    dispatcher = island()
    (run,) = [
        c for _, c in to_executors(dispatcher.submit("a", computation("a", 1))) if c.HasField("run")
    ]
    (again,) = client_events(dispatcher.submit("a", computation("a", 1, outputs=["a/other"])))
    assert again.kind == Event.REJECTED
    assert "id 'a/c1' is taken by work not yet finished" in again.message
    finish(dispatcher, run.seq, executor=0)
    reused = dispatcher.submit("a", computation("a", 1, outputs=["a/third"]))
    assert [c.run.id for _, c in to_executors(reused) if c.HasField("run")] == ["a/c1"]


def test_a_lost_executor_is_announced_to_the_others_once() -> None:
    """They stop reading its buffers at once (a read from a silent holder waited minutes)."""
    specs = [ExecutorSpec(i, f"h:{i}", (i,), f"d:{i}") for i in range(3)]
    dispatcher = IslandDispatcher(specs, policy="fifo", max_in_flight=4)
    told = to_executors(dispatcher.executor_lost(1, "it sent nothing for 31 s"))
    assert [(e, c.peer_down.executor, c.peer_down.data_endpoint) for e, c in told] == [
        (0, 1, "d:1"),
        (2, 1, "d:1"),
    ]
    assert "executor 1 (h:1) is unreachable: it sent nothing" in told[0][1].peer_down.reason
    assert dispatcher.executor_lost(1, "its command stream ended") == []
    # A second loss is not announced to the first.
    assert [e for e, _ in to_executors(dispatcher.executor_lost(2, "gone"))] == [0]


def test_every_executor_sees_one_order_for_two_clients() -> None:
    dispatcher = island(max_in_flight=64)
    sent = []
    for n in range(10):
        sent += to_executors(dispatcher.submit("a", computation("a", n, devices=(0, 4))))
        sent += to_executors(dispatcher.submit("b", computation("b", n, devices=(3, 7))))
    orders = {
        executor: [c.run.id for e, c in sent if e == executor and c.HasField("run")]
        for executor in (0, 1)
    }
    assert orders[0] == orders[1]
    seqs = [c.seq for _, c in sent]
    assert seqs == sorted(seqs)


def test_disconnect_deletes_the_clients_buffers() -> None:
    dispatcher = island()
    dispatcher.submit("a", computation("a", 1, devices=(4,)))
    deleted = to_executors(dispatcher.disconnect("a"))
    assert sorted((e, sorted(c.delete.ids)) for e, c in deleted) == [(0, ["a/x"]), (1, ["a/out1"])]


def submitted(dispatcher: IslandDispatcher, client: str, numbers) -> dict[int, pb.ClientEvent]:
    """Submit computations; the rejections by number."""
    rejected = {}
    for n in numbers:
        for event in client_events(dispatcher.submit(client, computation(client, n))):
            if event.kind == Event.REJECTED:
                rejected[n] = event
    return rejected


def test_a_flooding_client_is_told_busy_at_its_own_bound_and_others_still_get_in() -> None:
    dispatcher = island(max_in_flight=1, island="isl-a", max_queued=8, max_queued_per_client=3)
    # One computation in flight, three queued: the fifth and later are refused.
    rejected = submitted(dispatcher, "a", range(10))
    assert sorted(rejected) == [4, 5, 6, 7, 8, 9]
    message = rejected[4].message
    assert rejected[4].computation_id == "a/c4"
    assert message.startswith("island busy:") and message.endswith("retry later")
    assert "client 'a'" in message and "island 'isl-a'" in message
    assert "max-queued-per-client 3" in message
    # Nothing of a refused computation is kept: its outputs do not exist.
    events = client_events(dispatcher.submit("a", computation("a", 20, inputs=["a/out5"])))
    assert "unknown buffer 'a/out5'" in events[0].message
    # Another client still gets in: the island's queue has room.
    assert submitted(dispatcher, "b", range(3)) == {}


def test_the_island_bound_holds_over_all_clients() -> None:
    dispatcher = island(max_in_flight=1, island="isl-a", max_queued=4, max_queued_per_client=2)
    assert submitted(dispatcher, "a", range(3)) == {}  # one in flight, two queued
    assert submitted(dispatcher, "b", range(2)) == {}
    rejected = submitted(dispatcher, "c", [0])
    assert "island 'isl-a' already queues 4 computations" in rejected[0].message
    assert "max-queued 4" in rejected[0].message and "retry later" in rejected[0].message


def test_busy_clients_get_in_again_once_work_completes() -> None:
    dispatcher = island(max_in_flight=1, max_queued=8, max_queued_per_client=1)
    first = to_executors(dispatcher.submit("a", computation("a", 0)))
    assert submitted(dispatcher, "a", [1]) == {}
    assert 2 in submitted(dispatcher, "a", [2])
    instructions = finish(dispatcher, first[-1][1].seq, 0)  # a/c1 goes in flight
    assert [c.run.id for _, c in to_executors(instructions)] == ["a/c1"]
    assert submitted(dispatcher, "a", [3]) == {}


def test_the_per_client_bound_defaults_to_a_quarter_of_the_queue() -> None:
    dispatcher = island(max_queued=100)
    assert dispatcher.queue.max_queued_per_client == 25
    assert island(max_queued=2).queue.max_queued_per_client == 1


def test_deletions_are_never_refused_and_merge_while_they_wait() -> None:
    dispatcher = island(max_in_flight=1, max_queued=4, max_queued_per_client=2)
    first = to_executors(dispatcher.submit("a", computation("a", 0, inputs=["a/x"])))
    dispatcher.submit("a", computation("a", 1))
    dispatcher.submit("a", computation("a", 2))
    assert 3 in submitted(dispatcher, "a", [3])  # the client is at its bound
    queued = dispatcher.queue.queued
    for _ in range(50):  # a deletion storm, repeated ids included, queues one deletion
        assert dispatcher.delete("a", ["a/x", "a/out1", "a/out1"]) == []
    dispatcher.delete("a", ["a/out2"])
    assert dispatcher.queue.queued == queued + 1
    # Once the computations before them ran, every buffer is deleted, once.
    deleted = []
    instructions = finish(dispatcher, first[-1][1].seq, 0)
    for _ in range(2):
        run = next(c for _, c in to_executors(instructions) if c.HasField("run"))
        instructions = finish(dispatcher, run.seq, 0)
        deleted += [i for _, c in to_executors(instructions) for i in c.delete.ids]
    assert sorted(deleted) == ["a/out1", "a/out2", "a/x"]
    assert dispatcher.queue.queued == 0


def test_an_artifact_over_the_limit_is_refused_naming_the_limit() -> None:
    dispatcher = island(island="isl-a", max_artifact_bytes=len(ARTIFACT))  # the fixture's fits
    big = ARTIFACT + b"more"
    events = client_events(
        dispatcher.register(
            "a",
            pb.FunctionRegistration(
                function_id=hashlib.sha256(big).hexdigest(), artifact=big, name="big"
            ),
        )
    )
    assert events[0].kind == Event.REJECTED
    assert events[0].message == (
        f"function 'big': its artifact is {len(big)} bytes, larger than island 'isl-a' accepts "
        f"({len(ARTIFACT)} bytes, max-artifact-bytes / PATHWAYS_MAX_ARTIFACT_BYTES)"
    )
    # Not stored: computations calling it are refused, and the island keeps serving.
    call = computation("a", 1)
    call.function_id = hashlib.sha256(big).hexdigest()
    assert "is not registered" in client_events(dispatcher.submit("a", call))[0].message
    assert to_executors(dispatcher.submit("a", computation("a", 2)))


def outcomes(instructions) -> list[tuple[str, int, bool]]:
    """The completions and failures among ``instructions``: client, kind, deferrable."""
    return [
        (i.client, i.event.kind, i.deferrable)
        for i in instructions
        if isinstance(i, ToClient) and i.event.kind in (Event.COMPLETED, Event.FAILED)
    ]


def test_a_completion_waits_for_the_clients_next_event_only_while_it_has_more_outstanding() -> None:
    """A client with two or more other computations queued or running may get a completion
    with its next event; with one or none it gets it at once, and a failure always at once.
    Other clients' work does not count."""
    assert HOLD_WHILE_PENDING == 2
    dispatcher = island(max_in_flight=3)
    for n in range(1, 6):  # c1-c3 run, c4 and c5 wait: queued work counts too
        dispatcher.submit("a", computation("a", n))
    for n in range(1, 5):
        dispatcher.submit("b", computation("b", n, devices=(4,)))

    def report(item_id: str, ok: bool = True) -> list[tuple[str, int, bool]]:
        (seq,) = [seq for seq, flight in dispatcher._in_flight.items() if flight.id == item_id]
        return outcomes(finish(dispatcher, seq, 0 if item_id.startswith("a") else 1, ok, "boom"))

    assert report("a/c1") == [("a", Event.COMPLETED, True)]  # c2, c3 run; c4, c5 wait
    assert report("a/c2") == [("a", Event.COMPLETED, True)]
    assert report("a/c3", ok=False) == [("a", Event.FAILED, False)]  # failures: at once
    dispatcher.submit("a", computation("a", 6))  # behind b's work
    assert report("a/c4") == [("a", Event.COMPLETED, True)]  # c5 runs, c6 waits
    # One other outstanding (c6), then none: at once, whatever b still has.
    assert report("a/c5") == [("a", Event.COMPLETED, False)]
    for n in range(1, 5):
        assert report(f"b/c{n}")[0][2] == (n <= 2)
    assert report("a/c6") == [("a", Event.COMPLETED, False)]


def test_at_most_a_bounded_number_of_completions_wait_in_a_row() -> None:
    """A client keeping its pipeline full still hears every ``MAX_HELD_COMPLETIONS``-th
    completion at once, with those held before it: a caller waiting for room in its window
    resumes long before the pipeline drains."""
    count = 2 * MAX_HELD_COMPLETIONS + 10
    dispatcher = island(max_in_flight=count)
    for n in range(count):
        dispatcher.submit("a", computation("a", n))
    seqs = sorted(dispatcher._in_flight)
    deferrable = [outcomes(finish(dispatcher, seq, 0))[0][2] for seq in seqs]
    at_once = [position for position, held in enumerate(deferrable) if not held]
    assert at_once == [
        MAX_HELD_COMPLETIONS,
        2 * MAX_HELD_COMPLETIONS + 1,
        count - HOLD_WHILE_PENDING,
        count - 1,
    ]


# -- a lost executor restarted and taken back -----------------------------------------------


def with_data_endpoints() -> IslandDispatcher:
    specs = [
        ExecutorSpec(0, "h:1", (0, 1, 2, 3), "d:1"),
        ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:2"),
    ]
    dispatcher = IslandDispatcher(specs, policy="fifo", max_in_flight=1)
    for client in ("a", "b"):
        dispatcher.connect(client)
        dispatcher.register(
            client, pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT, name="f")
        )
        dispatcher.placed(client, pb.PlacedBuffer(buffer_id=f"{client}/x", executor=0))
    return dispatcher


def test_a_restarted_executor_is_taken_back_at_its_new_endpoints() -> None:
    dispatcher = with_data_endpoints()
    (run,) = [
        c for _, c in to_executors(dispatcher.submit("a", computation("a", 1, (4,)))) if c.run.id
    ]
    finish(dispatcher, run.seq, executor=1)
    dispatcher.executor_lost(1, "killed")
    restarted = ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:9")
    assert "is not a lost executor" in (
        dispatcher.rejoin_problem(ExecutorSpec(0, "h:1", (0, 1, 2, 3))) or ""
    )
    other_devices = ExecutorSpec(1, "h:2", (4, 5), "d:9")
    assert "now owns devices [4, 5], not [4, 5, 6, 7]" in (
        dispatcher.rejoin_problem(other_devices) or ""
    )
    with pytest.raises(ValueError, match="now owns devices"):
        dispatcher.executor_rejoined(other_devices)

    taken_back = dispatcher.executor_rejoined(restarted)
    # The other executors may read it again, at its new data endpoint; every client is told.
    assert [
        (e, c.peer_up.executor, c.peer_up.data_endpoint) for e, c in to_executors(taken_back)
    ] == [(0, 1, "d:9")]
    told = client_events(taken_back)
    assert [(e.kind, e.executor, e.rejoined.data_endpoint) for e in told] == [
        (Event.EXECUTOR_REJOINED, 1, "d:9")
    ] * 2
    assert dispatcher.executors_lost == 0 and dispatcher.executors_rejoined == 1
    assert client_events(dispatcher.connect("c")) == []  # a later session is told of no loss
    assert dispatcher.lost_reason(1) == ""
    # Work runs on it again: the function is sent to the new process before its first use.
    sent = to_executors(dispatcher.submit("a", computation("a", 2, (5,), inputs=["a/x"])))
    assert [(e, c.WhichOneof("kind")) for e, c in sent] == [(1, "register"), (1, "run")]
    assert list(sent[1][1].sources[0].data_endpoints) == ["d:1"]
    # What the lost process held is gone: reading it is refused, naming the loss.
    (refused,) = client_events(dispatcher.submit("a", computation("a", 3, (0,), inputs=["a/out1"])))
    assert refused.kind == Event.REJECTED
    assert "reads buffer 'a/out1', which was lost: executor 1 (h:2) is unreachable: killed" in (
        refused.message
    )
    # It may still be deleted, with nothing to free on the new process.
    dispatcher.delete("a", ["a/out1"])
    assert "a/out1" not in dispatcher._gone and "a/out1" not in dispatcher._buffers


def test_work_queued_before_a_loss_fails_even_once_its_executor_is_back() -> None:
    dispatcher = with_data_endpoints()  # one computation in flight at a time
    (blocking,) = [
        c for _, c in to_executors(dispatcher.submit("a", computation("a", 1))) if c.run.id
    ]
    assert to_executors(dispatcher.submit("b", computation("b", 1, (4,)))) == []
    assert to_executors(dispatcher.submit("b", computation("b", 2, (0,), ["b/out1"]))) == []
    dispatcher.executor_lost(1, "killed")
    dispatcher.executor_rejoined(ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:9"))
    failed = {
        e.computation_id: e.message for e in client_events(finish(dispatcher, blocking.seq, 0))
    }
    assert failed["b/c1"] == "computation 'n1': executor 1 (h:2) is unreachable: killed"
    assert failed["b/c2"] == (
        "computation 'n2': its input 'b/out1' was lost: executor 1 (h:2) is unreachable: killed"
    )


def test_a_restarted_executor_learns_of_the_others_still_lost() -> None:
    specs = [ExecutorSpec(i, f"h:{i}", (i,), f"d:{i}") for i in range(3)]
    dispatcher = IslandDispatcher(specs, policy="fifo", max_in_flight=4)
    dispatcher.executor_lost(1, "killed")
    dispatcher.executor_lost(2, "killed too")
    told = to_executors(dispatcher.executor_rejoined(ExecutorSpec(1, "h:1", (1,), "d:7")))
    assert [(e, c.WhichOneof("kind")) for e, c in told] == [(0, "peer_up"), (1, "peer_down")]
    assert told[1][1].peer_down.data_endpoint == "d:2"
    assert "killed too" in told[1][1].peer_down.reason


def test_an_upload_announced_after_its_executor_was_lost_is_lost() -> None:
    """The client's word of an upload may come after the loss (batched): the buffer looked
    healthy, and once a restarted executor was taken back it had no holder at all."""
    dispatcher = with_data_endpoints()
    dispatcher.executor_lost(1, "killed")
    dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/late", executor=1))
    dispatcher.executor_rejoined(ExecutorSpec(1, "h:2", (4, 5, 6, 7), "d:9"))
    (refused,) = client_events(dispatcher.submit("a", computation("a", 1, (4,), ["a/late"])))
    assert refused.kind == Event.REJECTED
    assert "reads buffer 'a/late', which was lost: executor 1 (h:2) is unreachable" in (
        refused.message
    )


def test_the_island_order_starts_past_first_seq() -> None:
    """A restarted scheduler numbers from past its predecessor's numbers: an executor's event
    of the old one's command 3 was taken for the new one's command 3."""
    dispatcher = island(first_seq=1_000_000)
    sent = to_executors(dispatcher.submit("a", computation("a", 1)))
    assert all(command.seq > 1_000_000 for _, command in sent)
    assert finish(dispatcher, 3, 0) == []  # the old scheduler's: no computation of this one


def remote(client: str, name: str, pending: bool = True) -> pb.PlacedBuffer:
    source = pb.InputSource(
        buffer_id=f"{client}/{name}",
        executors=["far:1"],
        data_endpoints=["far:2"],
        pending=pending,
    )
    return pb.PlacedBuffer(buffer_id=source.buffer_id, remote=source)


def runs(instructions) -> list[str]:
    return [c.run.id for _, c in to_executors(instructions) if c.WhichOneof("kind") == "run"]


def test_work_reading_another_islands_pending_buffer_waits_in_the_queue_not_on_executors() -> None:
    """Two islands whose tenants' priorities ordered their cross-island reads oppositely
    stopped for good: each island's executors waited, in island order, for work the other's
    held behind its own waiting reader. Held in the queue, such work takes no executor."""
    dispatcher = island(policy="proportional-share")
    dispatcher.connect("a", priority=10)
    dispatcher.placed("a", remote("a", "far"))
    # a's reader is held (its input is not made over there), and a's later work with it:
    # its order is kept. b, of lower priority, goes meanwhile. The executor that will run the
    # reader pulls its input from now on, outside the order, as it is made.
    held = to_executors(dispatcher.submit("a", computation("a", 1, inputs=["a/far"])))
    assert [(executor, c.WhichOneof("kind")) for executor, c in held] == [(0, "prefetch")]
    assert [s.buffer_id for s in held[0][1].prefetch.sources] == ["a/far"]
    assert runs(dispatcher.submit("a", computation("a", 2, inputs=["a/x"]))) == []
    assert runs(dispatcher.submit("b", computation("b", 1, inputs=["b/x"]))) == ["b/c1"]
    # Made over there: a's work goes, in its order, with the source to pull it from.
    ready = to_executors(dispatcher.remote_ready("a", pb.RemoteReady(buffer_ids=["a/far"])))
    assert [c.run.id for _, c in ready if c.WhichOneof("kind") == "run"] == ["a/c1", "a/c2"]
    assert [s.buffer_id for s in ready[0][1].sources] == ["a/far"]
    assert not ready[0][1].sources[0].pending
    # Another client cannot say a's buffer is made.
    dispatcher.placed("a", remote("a", "far2"))
    dispatcher.submit("a", computation("a", 3, inputs=["a/far2"]))
    assert runs(dispatcher.remote_ready("b", pb.RemoteReady(buffer_ids=["a/far2"]))) == []
    # Never to be: the held work goes, and fails at dispatch naming why.
    failed = dispatcher.remote_failed(
        "a", pb.RemoteFailed(buffer_ids=["a/far2"], reason="its producer failed")
    )
    (event,) = client_events(failed)
    assert event.kind == Event.FAILED and "its producer failed" in event.message and event.unmade


def test_a_remote_buffer_said_made_before_it_was_placed_holds_nothing() -> None:
    """The word that it is made and its placing come by different paths, in either order."""
    dispatcher = island()
    dispatcher.remote_ready("a", pb.RemoteReady(buffer_ids=["a/early"]))
    dispatcher.placed("a", remote("a", "early"))
    assert runs(dispatcher.submit("a", computation("a", 1, inputs=["a/early"]))) == ["a/c1"]
    # Placed as made (not pending), as before: nothing is held.
    dispatcher.placed("a", remote("a", "made", pending=False))
    assert runs(dispatcher.submit("a", computation("a", 2, inputs=["a/made"]))) == ["a/c2"]
