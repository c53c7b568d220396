"""Functions and programs are kept while an open session uses them, and forgotten (in the
scheduler and on each executor that was sent them, after every command using them) once the
last such session ends; driven with no network."""

from __future__ import annotations

import hashlib

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
from test_program_dispatch import chain, registered

from pathways_core.scheduling import island as island_module
from pathways_core.wire import pb

Event = pb.ClientEvent


def forgotten(instructions) -> list[tuple[int, list[str], list[str]]]:
    return [
        (executor, list(command.forget.function_ids), list(command.forget.program_ids))
        for executor, command in to_executors(instructions)
        if command.WhichOneof("kind") == "forget"
    ]


def test_a_function_is_forgotten_once_the_last_session_using_it_ends() -> None:
    dispatcher = island()  # clients a, b and c registered the function
    sent = to_executors(dispatcher.submit("a", computation("a", 1, devices=(2, 3, 4, 5))))
    finish(dispatcher, sent[-1][1].seq, 0)
    finish(dispatcher, sent[-1][1].seq, 1)
    assert forgotten(dispatcher.disconnect("a")) == []
    assert forgotten(dispatcher.disconnect("b")) == []
    assert dispatcher.functions_held == 1
    # Both executors were sent it; each is told to forget it.
    assert forgotten(dispatcher.disconnect("c")) == [(0, [FUNCTION], []), (1, [FUNCTION], [])]
    assert dispatcher.functions_held == 0

    dispatcher.connect("d")
    (refused,) = client_events(dispatcher.submit("d", computation("d", 1)))
    assert refused.kind == Event.REJECTED and "is not registered: register it" in refused.message
    dispatcher.register("d", pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    again = to_executors(dispatcher.submit("d", computation("d", 2)))
    assert [(e, c.WhichOneof("kind")) for e, c in again] == [(0, "register"), (0, "run")]


def test_the_forget_comes_after_the_work_in_flight_that_uses_it() -> None:
    dispatcher = island()
    for client in ("b", "c"):
        dispatcher.disconnect(client)
    (run,) = [c for _, c in to_executors(dispatcher.submit("a", computation("a", 1)))][1:]
    instructions = dispatcher.disconnect("a")
    (forget,) = [c for _, c in to_executors(instructions) if c.WhichOneof("kind") == "forget"]
    assert forget.seq > run.seq
    # The work still in flight completes as ever.
    assert [e.kind for e in client_events(finish(dispatcher, run.seq, 0))] == [Event.COMPLETED]


def test_a_program_and_its_functions_stay_while_a_session_calling_it_is_open() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 1]))  # registered by a
    dispatcher.placed("b", pb.PlacedBuffer(buffer_id="b/in", executor=0))
    by_b = pb.ProgramCall(id="b/p1", program_id=program, arguments=["b/in"], results=["b/r1"])
    sent = to_executors(dispatcher.call("b", by_b))
    assert [c.WhichOneof("kind") for _, c in sent] == ["register", "program", "call"]
    finish(dispatcher, sent[-1][1].seq, 0)
    dispatcher.disconnect("c")
    assert forgotten(dispatcher.disconnect("a")) == []  # b calls it
    assert dispatcher.programs_held == 1
    by_b.id, by_b.results[0] = "b/p2", "b/r2"
    assert [c.WhichOneof("kind") for _, c in to_executors(dispatcher.call("b", by_b))] == ["call"]
    assert forgotten(dispatcher.disconnect("b")) == [(0, [FUNCTION], [program])]
    assert (dispatcher.functions_held, dispatcher.programs_held) == (0, 0)


def test_a_program_registered_by_a_session_alone_goes_with_it() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0]))
    # Never called: the executors were never sent it, the scheduler drops it.
    assert forgotten(dispatcher.disconnect("a")) == []
    assert dispatcher.programs_held == 0
    dispatcher.connect("a")
    (refused,) = client_events(
        dispatcher.call("a", pb.ProgramCall(id="a/p", program_id=program, arguments=["a/x"]))
    )
    assert refused.kind == Event.REJECTED and program[:12] in refused.message


def test_many_forgotten_functions_go_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(island_module, "FORGET_PIECE", 2)
    dispatcher = island()
    for client in ("b", "c"):
        dispatcher.disconnect(client)
    ids = []
    for n in range(3):
        artifact = f"artifact {n}".encode()
        ids.append(hashlib.sha256(artifact).hexdigest())
        dispatcher.register("a", pb.FunctionRegistration(function_id=ids[-1], artifact=artifact))
        submitted = computation("a", n)
        submitted.function_id = ids[-1]
        dispatcher.submit("a", submitted)
    pieces = forgotten(dispatcher.disconnect("a"))
    assert [executor for executor, _, _ in pieces] == [0, 0]
    # FUNCTION (registered by a, never run) was never sent to an executor.
    assert sorted(i for _, functions, _ in pieces for i in functions) == sorted(ids)
    assert all(len(functions) <= 2 for _, functions, _ in pieces)
