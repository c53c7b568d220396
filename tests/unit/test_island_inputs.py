"""What work may read in the island dispatcher, driven with no network: only its own session's
buffers (the queue keeps order within a client alone), not outputs of work that failed at
dispatch (they will never be made), and not a previous session's work of the same name."""

from __future__ import annotations

import pytest
from test_dispatcher import (
    ARTIFACT,
    FUNCTION,
    client_events,
    computation,
    finish,
    island,
    to_executors,
)
from test_program_dispatch import call, chain, registered

from pathways_core.scheduling import IslandDispatcher
from pathways_core.wire import pb

Event = pb.ClientEvent
WHY = "it will never be here: on island 'far', its computation failed: boom"


def runs(instructions) -> list[str]:
    return [c.run.id or c.call.id for _, c in to_executors(instructions) if c.run.id or c.call.id]


def with_far_buffer(dispatcher: IslandDispatcher) -> int:
    """``a/far``, held on another island; returns the seq of a computation of ``b`` that holds
    the only place in flight (the dispatcher must have ``max_in_flight=1``)."""
    remote = pb.InputSource(buffer_id="a/far", executors=["other:1"], data_endpoints=["other:2"])
    assert dispatcher.placed("a", pb.PlacedBuffer(buffer_id="a/far", remote=remote)) == []
    sent = to_executors(dispatcher.submit("b", computation("b", 0)))
    (seq,) = [c.seq for _, c in sent if c.run.id]
    return seq


# -- 1. only the session's own buffers ------------------------------------------------------


@pytest.mark.parametrize("read", ["a/x", "a/out1"])
def test_a_computation_reading_another_clients_buffer_is_refused_naming_it_and_its_owner(
    read: str,
) -> None:
    """Uploaded or a future: ``b``'s reader could go before ``a``'s producer (or after its
    deletion), as the queue keeps order within a client only."""
    dispatcher = island(max_in_flight=1)
    dispatcher.submit("a", computation("a", 1))
    (refused,) = client_events(dispatcher.submit("b", computation("b", 1, inputs=[read])))
    assert (refused.kind, refused.computation_id) == (Event.REJECTED, "b/c1")
    assert refused.message == (
        f"computation 'n1' reads buffer {read!r}, which belongs to client 'a': a computation "
        "reads only its own session's buffers (ids starting with 'b/'); get the value and put "
        "it in this session to use it here"
    )
    assert "b/out1" not in dispatcher._buffers and "b/c1" not in dispatcher._unfinished
    assert dispatcher.usage["b"].refused == 1


def test_an_input_id_of_no_client_is_refused() -> None:
    dispatcher = island()
    (refused,) = client_events(dispatcher.submit("b", computation("b", 1, inputs=["b/x", "x"])))
    assert refused.kind == Event.REJECTED
    assert "reads buffer 'x', which is no client's: a computation reads only" in refused.message


def test_a_program_call_reading_another_clients_buffer_is_refused() -> None:
    dispatcher = island()
    program = chain([0])
    (registered_b,) = client_events(dispatcher.register_program("b", program))
    assert registered_b.kind == Event.REGISTERED
    bad = pb.ProgramCall(
        id="b/p1", program_id=program.program_id, arguments=["a/x"], results=["b/r1"]
    )
    (refused,) = client_events(dispatcher.call("b", bad))
    assert (refused.kind, refused.computation_id) == (Event.REJECTED, "b/p1")
    assert refused.message.startswith(
        "call 'b/p1' of program 'chain' reads buffer 'a/x', which belongs to client 'a': a "
        "program call reads only its own session's buffers (ids starting with 'b/')"
    )
    assert "b/r1" not in dispatcher._buffers


def test_deleting_another_clients_buffer_is_refused_and_the_rest_goes_ahead() -> None:
    dispatcher = island()
    instructions = dispatcher.delete("b", ["a/x", "b/x", "c/x"])
    (refused,) = client_events(instructions)
    assert refused.kind == Event.REJECTED
    assert refused.message == (
        "deleting buffer 'a/x' (and 1 more not this session's) refused: it belongs to client "
        "'a'; a session deletes only its own buffers (ids starting with 'b/'): delete it in "
        "the session that made it"
    )
    assert [(e, list(c.delete.ids)) for e, c in to_executors(instructions)] == [(0, ["b/x"])]
    assert "a/x" in dispatcher._buffers and "c/x" in dispatcher._buffers
    assert client_events(dispatcher.delete("b", ["b/x"])) == []  # its own, gone: nothing said


# -- 2. outputs of work failed at dispatch ----------------------------------------------------


def test_readers_of_outputs_of_work_failed_at_dispatch_fail_naming_the_root_cause() -> None:
    """Queued readers fail at dispatch (none reaches an executor, which never heard of the
    outputs); later ones are refused. Down the chain the cause stays the first failure's."""
    dispatcher = island(max_in_flight=1)
    blocking = with_far_buffer(dispatcher)
    for n, inputs in ((1, ["a/far"]), (2, ["a/out1"]), (3, ["a/out2"])):
        assert dispatcher.submit("a", computation("a", n, devices=(4,), inputs=inputs)) == []
    dispatcher.remote_failed("a", pb.RemoteFailed(buffer_ids=["a/far"], reason=WHY))
    instructions = finish(dispatcher, blocking, 0)
    assert runs(instructions) == []
    failed = {e.computation_id: e.message for e in client_events(instructions)}
    root = f"computation 'n1' failed: its input 'a/far' was lost: {WHY}"
    assert failed == {
        "b/c0": "",
        "a/c1": f"computation 'n1': its input 'a/far' was lost: {WHY}",
        "a/c2": f"computation 'n2': its input 'a/out1' will never be made: {root}",
        "a/c3": f"computation 'n3': its input 'a/out2' will never be made: {root}",
    }
    (refused,) = client_events(dispatcher.submit("a", computation("a", 4, inputs=["a/out2"])))
    assert refused.kind == Event.REJECTED
    assert refused.message == (
        f"computation 'n4' reads buffer 'a/out2', which will never be made: {root}"
    )
    # Deleted, nothing of them stays behind.
    dispatcher.delete("a", ["a/out1", "a/out2", "a/out3"])
    assert not dispatcher._gone.keys() & {"a/out1", "a/out2", "a/out3"}
    assert not dispatcher._unmade


def test_results_of_a_call_failed_at_dispatch_will_never_be_made() -> None:
    dispatcher = island(max_in_flight=1)
    program = registered(dispatcher, chain([0]))
    blocking = with_far_buffer(dispatcher)
    assert dispatcher.call("a", call(program, 1, arguments=["a/far"])) == []
    dispatcher.remote_failed("a", pb.RemoteFailed(buffer_ids=["a/far"], reason=WHY))
    (_, failed) = client_events(finish(dispatcher, blocking, 0))
    assert (failed.kind, failed.computation_id) == (Event.FAILED, "a/p1")
    (refused,) = client_events(dispatcher.submit("a", computation("a", 2, inputs=["a/r1"])))
    assert refused.message == (
        "computation 'n2' reads buffer 'a/r1', which will never be made: call 'a/p1' of program "
        f"'chain' failed: its input 'a/far' was lost: {WHY}"
    )


# -- 3. a new session of the same name ---------------------------------------------------------


def test_a_new_session_of_the_same_name_is_not_given_the_old_sessions_work() -> None:
    """The old session's work still running keeps its ids taken, and its outcome is not
    reported to the new session (which did not submit it); its usage still counts."""
    dispatcher = island()
    seqs = [
        c.seq
        for n in range(2)
        for _, c in to_executors(dispatcher.submit("a", computation("a", n)))
        if c.run.id
    ]
    dispatcher.disconnect("a")
    dispatcher.connect("a")
    dispatcher.register("a", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    (refused,) = client_events(dispatcher.submit("a", computation("a", 0)))
    assert refused.kind == Event.REJECTED
    assert "id 'a/c0' is taken by work not yet finished" in refused.message
    new = [c.seq for _, c in to_executors(dispatcher.submit("a", computation("a", 5))) if c.run.id]
    assert client_events(finish(dispatcher, seqs[0], 0)) == []
    assert client_events(finish(dispatcher, seqs[1], 0, ok=False, message="boom")) == []
    (done,) = client_events(finish(dispatcher, new[0], 0))
    assert (done.kind, done.computation_id) == (Event.COMPLETED, "a/c5")
    usage = dispatcher.usage["a"]
    assert (usage.completed, usage.failed) == (2, 1)
    # Finished, the old work's ids may be used again.
    (again,) = [c for _, c in to_executors(dispatcher.submit("a", computation("a", 0))) if c.run.id]
    (done,) = client_events(finish(dispatcher, again.seq, 0))
    assert (done.kind, done.computation_id) == (Event.COMPLETED, "a/c0")


def test_a_hello_again_within_a_session_keeps_its_work_reported() -> None:
    dispatcher = island()
    (run,) = [c for _, c in to_executors(dispatcher.submit("a", computation("a", 1))) if c.run.id]
    dispatcher.connect("a", weight=3)  # a new weight, the same session
    (done,) = client_events(finish(dispatcher, run.seq, 0))
    assert (done.kind, done.computation_id) == (Event.COMPLETED, "a/c1")
