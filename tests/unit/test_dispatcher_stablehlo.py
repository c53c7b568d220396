"""STABLEHLO registrations and describe computations (the IFRT proxy's) pass through the island
dispatcher unchanged: hashed and bounded like every artifact, sent whole to the executors."""

from __future__ import annotations

import hashlib

from pathways_core.scheduling import ExecutorSpec, IslandDispatcher, ToClient, ToExecutor
from pathways_core.wire import pb

Event = pb.ClientEvent
STABLEHLO = pb.FunctionRegistration.STABLEHLO


def _island(**limits: int) -> IslandDispatcher:
    dispatcher = IslandDispatcher(
        [ExecutorSpec(0, "h:1", (0, 1, 2, 3)), ExecutorSpec(1, "h:2", (4, 5, 6, 7))], **limits
    )
    dispatcher.connect("p")
    return dispatcher


def _registration(module: bytes) -> pb.FunctionRegistration:
    artifact = pb.StableHloProgram(module=module, compile_options=b"\x08\x01").SerializeToString()
    return pb.FunctionRegistration(
        function_id=hashlib.sha256(artifact).hexdigest(),
        artifact=artifact,
        name="proxy-f",
        kind=STABLEHLO,
    )


def test_a_stablehlo_function_reaches_every_executor_of_a_describe_computation() -> None:
    dispatcher = _island()
    registration = _registration(b"module bytes")
    (accepted,) = [i.event for i in dispatcher.register("p", registration)]
    assert accepted.kind == Event.REGISTERED
    describe = pb.Computation(
        id="p/c1",
        client="p",
        function_id=registration.function_id,
        devices=[2, 3, 4, 5],
        outputs=["p/b1"],
        name="compile",
        describe=True,
    )
    commands = [
        (i.executor, i.command)
        for i in dispatcher.submit("p", describe)
        if isinstance(i, ToExecutor)
    ]
    registers = [(e, c.register) for e, c in commands if c.HasField("register")]
    runs = [(e, c.run) for e, c in commands if c.HasField("run")]
    assert sorted(e for e, _ in registers) == [0, 1]
    assert all(r == registration for _, r in registers)  # kind and artifact unchanged
    assert sorted(e for e, _ in runs) == [0, 1]
    assert all(r.describe and r.name == "compile" for _, r in runs)


def test_stablehlo_artifacts_are_hashed_and_bounded_like_every_artifact() -> None:
    dispatcher = _island(max_artifact_bytes=64)
    large = _registration(b"x" * 100)
    (refused,) = [i.event for i in dispatcher.register("p", large) if isinstance(i, ToClient)]
    assert refused.kind == Event.REJECTED and "proxy-f" in refused.message
    wrong = _registration(b"small")
    wrong.function_id = "0" * 64
    (refused,) = [i.event for i in dispatcher.register("p", wrong)]
    assert refused.kind == Event.REJECTED and "does not match its id" in refused.message
