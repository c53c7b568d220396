"""Hostile input against every endpoint of a real island: the scheduler's client sessions, the
executors' control streams and data planes (framed bytes over raw TCP), and both gRPC services.

Random bytes, truncated frames, absurd length prefixes, well-formed messages full of nonsense,
raw gRPC calls with garbage bodies, connections that say nothing, many at once. After each
barrage every process is alive and a real computation (one executor pulling from the other
over the data plane) still gives the right result. Servers answer bad input with a clear error
(a REJECTED event, an error frame, INVALID_ARGUMENT), never a gRPC INTERNAL or UNKNOWN (the
"5xx" of gRPC), and never hang: every check waits a bounded time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_chain_runs, export, increment
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pathways_client.island_client as island_client_module
from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland, Process
from pathways_client.rpc import stub
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.arrays import to_chunks
from pathways_core.wire.streams import (
    CONTROL_TOKEN_ENV,
    HANDSHAKE_TIMEOUT_SECONDS,
    MAX_FRAME_BYTES,
    FrameDecoder,
    frame,
    messages,
)

TOKEN = "hostile-input-test-token"
# Every server answers or hangs up within this (handshake timeouts plus slack for a busy box).
BOUND = HANDSHAKE_TIMEOUT_SECONDS + 25
FUZZ = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
INCREMENT = increment()
INCREMENT_ID = hashlib.sha256(INCREMENT).hexdigest()
CRASHING_MODULE = (Path(__file__).parent / "data" / "crashing_stablehlo.bin").read_bytes()
_NAMES = itertools.count()


@dataclasses.dataclass
class Endpoints:
    """Where the island listens (host, port) on each of its raw TCP endpoints and gRPC ports."""

    session: tuple[str, int]
    controls: list[tuple[str, int]]
    data: list[tuple[str, int]]
    grpc_scheduler: str
    grpc_executors: list[str]

    def raw(self) -> list[tuple[str, tuple[str, int]]]:
        return [
            ("session", self.session),
            *((f"control-{i}", c) for i, c in enumerate(self.controls)),
            *((f"data-{i}", d) for i, d in enumerate(self.data)),
        ]


def _address(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


@pytest.fixture(scope="module")
def island(compilation_cache: Path) -> Iterator[LocalIsland]:
    """2 executors x 2 fake devices, started with a control token (in their environment)."""
    previous = os.environ.get(CONTROL_TOKEN_ENV)
    os.environ[CONTROL_TOKEN_ENV] = TOKEN
    try:
        with LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache) as isl:
            yield isl
    finally:
        if previous is None:
            os.environ.pop(CONTROL_TOKEN_ENV, None)
        else:
            os.environ[CONTROL_TOKEN_ENV] = previous


@pytest.fixture(scope="module")
def endpoints(island: LocalIsland) -> Endpoints:
    with grpc.insecure_channel(island.scheduler_endpoint) as channel:
        info = stub(channel, SCHEDULER, "Info")(pb.Empty(), timeout=30)
    controls, data = [], []
    for executor in info.executors:
        with grpc.insecure_channel(executor.endpoint) as channel:
            own = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30)
        controls.append(_address(own.control_endpoint))
        data.append(_address(own.data_endpoint))
    return Endpoints(
        _address(info.session_endpoint),
        controls,
        data,
        island.scheduler_endpoint,
        [e.endpoint for e in info.executors],
    )


def assert_alive(island: LocalIsland) -> None:
    assert island.scheduler is not None
    for process in [*island.executors, island.scheduler]:
        assert process.popen.poll() is None, f"{process.name} died:\n{process.tail(40)}"


def assert_serving(island: LocalIsland) -> None:
    """Every process is alive and a real chain runs right: executor 1 pulls executor 0's output
    over the data plane, and the result comes back over gRPC."""
    assert_alive(island)
    assert_chain_runs(island, f"check-{next(_NAMES)}")
    assert_alive(island)


def exchange(
    address: tuple[str, int], data: bytes, *, close_write: bool = True, wait: float = BOUND
) -> tuple[bytes, bool]:
    """Send ``data``, then read until the server hangs up: what it sent back, and whether it
    hung up within ``wait`` seconds."""
    with socket.create_connection(address, timeout=10) as connection:
        try:
            connection.sendall(data)
            if close_write:
                connection.shutdown(socket.SHUT_WR)
        except OSError:  # the server hung up while we were still sending
            return b"", True
        connection.settimeout(wait)
        received = bytearray()
        while True:
            try:
                chunk = connection.recv(1 << 16)
            except TimeoutError:
                return bytes(received), False
            except OSError:
                return bytes(received), True
            if not chunk:
                return bytes(received), True
            received += chunk


def client_events(data: bytes) -> list[pb.ClientEvent]:
    decoder = FrameDecoder(pb.ClientEventBatch.FromString)
    return [event for batch in decoder.feed(data) for event in batch.events]


def hello(name: str, *more: pb.ClientMessage) -> bytes:
    return frame(pb.ClientBatch(messages=[pb.ClientMessage(hello=pb.Hello(client=name)), *more]))


def assert_rejected(data: bytes, *needles: str) -> None:
    events = client_events(data)
    assert events, "the scheduler hung up without saying why"
    assert all(e.kind == pb.ClientEvent.REJECTED for e in events), events
    text = " ".join(e.message for e in events)
    for needle in needles:
        assert needle in text, text


# -- the scheduler's client sessions -----------------------------------------------------------


def test_sessions_refuse_random_bytes(island: LocalIsland, endpoints: Endpoints) -> None:
    @FUZZ
    @given(data=st.binary(max_size=4096))
    def garbage(data: bytes) -> None:
        reply, hung_up = exchange(endpoints.session, data)
        assert hung_up
        assert all(e.kind == pb.ClientEvent.REJECTED for e in client_events(reply))

    garbage()
    assert_serving(island)


def test_sessions_refuse_truncated_and_oversized_frames(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    valid = hello("truncated")
    for cut in range(1, len(valid)):
        reply, hung_up = exchange(endpoints.session, valid[:cut])
        assert hung_up
        assert_rejected(reply, "ended in the middle of a frame")
    for length in (MAX_FRAME_BYTES + 1, 1 << 31, (1 << 32) - 1):
        reply, hung_up = exchange(endpoints.session, struct.pack("!I", length) + b"x" * 64)
        assert hung_up
        assert_rejected(reply, f"a control frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    # 2**40 as 8 bytes: prefixes are 4 bytes, so this announces 256 bytes and stops short.
    reply, hung_up = exchange(endpoints.session, struct.pack("!Q", 1 << 40))
    assert hung_up
    assert_rejected(reply, "middle of a frame")
    # A frame of exactly the cap announced, then a hang-up: refused, nothing kept.
    reply, hung_up = exchange(endpoints.session, struct.pack("!I", MAX_FRAME_BYTES))
    assert hung_up
    assert_rejected(reply, "middle of a frame")
    assert_serving(island)


def test_sessions_refuse_bad_hellos(island: LocalIsland, endpoints: Endpoints) -> None:
    cases = {
        "a session starts with hello": frame(pb.ClientBatch()),
        "naming the client": hello(""),
        "must be printable and hold no '/'": hello("check-0/inner"),
        "at most 256": hello("x" * 300),
        "printable": hello("bell\x07"),
    }
    for needle, data in cases.items():
        reply, hung_up = exchange(endpoints.session, data)
        assert hung_up
        assert_rejected(reply, needle)
    not_hello = frame(pb.ClientBatch(messages=[pb.ClientMessage(delete=pb.DeleteBuffers())]))
    reply, _ = exchange(endpoints.session, not_hello)
    assert_rejected(reply, "a session starts with hello")
    # A second session under a name in use is refused; the first keeps its session.
    with IslandClient(island.scheduler_endpoint, "taken") as first:
        # Its session is open once a request of it was answered (the hello goes out on a
        # thread of its own: a loaded CI host once took the raw hello first, and accepted it).
        first.register(INCREMENT)
        reply, hung_up = exchange(endpoints.session, hello("taken"))
        assert hung_up
        assert_rejected(reply, "already has a session")
        first.register(INCREMENT)
    assert_serving(island)


def _ids(own: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=24),
        st.builds(lambda s: f"{own}/{s}", st.text(max_size=12)),
        st.sampled_from(["", "/", f"{own}/", "check-0/b1", "other/b", "x" * 300]),
    )


# Endpoints a fuzzed remote buffer may name: loopback only, and none that resolves a host name.
_JUNK_ENDPOINTS = ["", "x", "127.0.0.1", "127.0.0.1:1", "127.0.0.1:99999", "127.0.0.1:-5", ":"]
_JUNK_ARTIFACT = b"not an artifact, yet its id is its sha256"


def _client_messages(own: str, session_port: int) -> st.SearchStrategy[pb.ClientMessage]:
    ids = _ids(own)
    functions = st.one_of(
        st.builds(
            pb.FunctionRegistration,
            function_id=st.text(max_size=70),
            artifact=st.binary(max_size=128),
            name=st.text(max_size=24),
        ),
        st.binary(max_size=128).map(
            lambda b: pb.FunctionRegistration(function_id=hashlib.sha256(b).hexdigest(), artifact=b)
        ),
    )
    function_ids = st.one_of(
        st.text(max_size=70), st.just(hashlib.sha256(_JUNK_ARTIFACT).hexdigest())
    )
    computations = st.builds(
        pb.Computation,
        id=ids,
        client=st.text(max_size=12),
        function_id=function_ids,
        devices=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(-1, 4), max_size=6),
        inputs=st.lists(ids, max_size=4),
        outputs=st.lists(ids, max_size=4),
        name=st.text(max_size=24),
    )
    endpoints = st.sampled_from([*_JUNK_ENDPOINTS, f"127.0.0.1:{session_port}"])
    sources = st.builds(
        pb.InputSource,
        buffer_id=ids,
        executors=st.lists(st.text(max_size=12), max_size=3),
        data_endpoints=st.lists(endpoints, max_size=3),
    )
    placed = st.builds(
        pb.PlacedBuffer,
        buffer_id=ids,
        executor=st.integers(-(2**31), 2**31 - 1) | st.integers(-1, 3),
        remote=st.none() | sources,
    )
    deletes = st.builds(pb.DeleteBuffers, ids=st.lists(ids, max_size=8))
    return st.one_of(
        functions.map(lambda f: pb.ClientMessage(function=f)),
        computations.map(lambda c: pb.ClientMessage(computation=c)),
        placed.map(lambda p: pb.ClientMessage(placed=p)),
        deletes.map(lambda d: pb.ClientMessage(delete=d)),
        st.builds(pb.Hello, client=st.text(max_size=12), weight=st.integers(-5, 5)).map(
            lambda h: pb.ClientMessage(hello=h)
        ),
        st.just(pb.ClientMessage()),
    )


def _session(address: tuple[str, int], name: str) -> socket.socket:
    connection = socket.create_connection(address, timeout=BOUND)
    connection.sendall(hello(name))
    return connection


def _until_marker(connection: socket.socket, marker: str) -> list[pb.ClientEvent]:
    """Events of a session up to the refusal of the marker registration (the scheduler
    handles a session's messages in order, so everything before it was handled)."""
    seen: list[pb.ClientEvent] = []
    for batch in messages(connection.recv, pb.ClientEventBatch.FromString):
        seen += batch.events
        if any(e.function_id == marker for e in batch.events):
            return seen
    raise AssertionError(f"the session ended before the marker; events: {seen[-5:]}")


def test_sessions_answer_nonsense_requests_and_keep_serving(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    own = f"fuzz-{next(_NAMES)}"
    with _session(endpoints.session, own) as connection:
        # A registration whose artifact is junk but whose id is right: accepted here, refused
        # by the executors when a computation brings it to them.
        junk = pb.FunctionRegistration(
            function_id=hashlib.sha256(_JUNK_ARTIFACT).hexdigest(), artifact=_JUNK_ARTIFACT
        )
        connection.sendall(frame(pb.ClientBatch(messages=[pb.ClientMessage(function=junk)])))
        markers = itertools.count()

        @FUZZ
        @given(batch=st.lists(_client_messages(own, endpoints.session[1]), max_size=12))
        def nonsense(batch: list[pb.ClientMessage]) -> None:
            marker = f"marker-{next(markers)}"
            sync = pb.ClientMessage(function=pb.FunctionRegistration(function_id=marker))
            connection.sendall(frame(pb.ClientBatch(messages=[*batch, sync])))
            events = _until_marker(connection, marker)
            assert all(e.kind != pb.ClientEvent.COMPLETED for e in events), events

        nonsense()
    assert_serving(island)


def test_sessions_refuse_oversized_messages(island: LocalIsland, endpoints: Endpoints) -> None:
    own = f"big-{next(_NAMES)}"
    huge_name = pb.ClientMessage(
        computation=pb.Computation(
            id=f"{own}/c", function_id=INCREMENT_ID, devices=[0], name="n" * (2 << 20)
        )
    )
    many_inputs = pb.ClientMessage(
        computation=pb.Computation(
            id=f"{own}/d", function_id=INCREMENT_ID, devices=[0], inputs=[f"{own}/i"] * 200_000
        )
    )
    big_source = pb.ClientMessage(
        placed=pb.PlacedBuffer(
            buffer_id=f"{own}/r",
            remote=pb.InputSource(buffer_id=f"{own}/r", data_endpoints=["127.0.0.1:1"] * 200_000),
        )
    )
    huge_delete = pb.ClientMessage(
        delete=pb.DeleteBuffers(ids=[f"{own}/b{i}" for i in range(300_000)])
    )
    huge_program = pb.ClientMessage(
        program=pb.ProgramRegistration(program_id="p" * 64, name="n" * (2 << 20))
    )
    huge_call = pb.ClientMessage(
        call=pb.ProgramCall(id=f"{own}/p", program_id="p" * 64, arguments=["a" * 64] * 20_000)
    )
    marker = pb.ClientMessage(function=pb.FunctionRegistration(function_id="marker"))
    with _session(endpoints.session, own) as connection:
        for message in (
            huge_name,
            many_inputs,
            big_source,
            huge_delete,
            huge_program,
            huge_call,
            marker,
        ):
            connection.sendall(frame(pb.ClientBatch(messages=[message])))
        events = _until_marker(connection, "marker")
    refused = [e for e in events if "larger than the" in e.message]
    assert {e.computation_id for e in refused} >= {f"{own}/c", f"{own}/d", f"{own}/p"}, events
    assert [e.program_id for e in refused if e.program_id] == ["p" * 64], events
    assert len(refused) == 5, events
    assert_serving(island)


def test_a_burst_of_large_registrations_does_not_cut_an_executor_off(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    """Seven 20 MiB registrations dispatched together make commands far beyond one frame: they
    must reach the executor in several frames (one frame over its cap would end the
    scheduler's stream to it, and the executor would be lost to the island)."""
    own = f"burst-{next(_NAMES)}"
    artifacts = [bytes([n]) * (20 << 20) for n in range(7)]
    ids = [hashlib.sha256(a).hexdigest() for a in artifacts]
    with _session(endpoints.session, own) as connection:
        for artifact, function_id in zip(artifacts, ids, strict=True):
            registration = pb.FunctionRegistration(function_id=function_id, artifact=artifact)
            connection.sendall(
                frame(pb.ClientBatch(messages=[pb.ClientMessage(function=registration)]))
            )
        runs = [
            pb.ClientMessage(
                computation=pb.Computation(id=f"{own}/c{n}", function_id=i, devices=[0])
            )
            for n, i in enumerate(ids)
        ]
        connection.sendall(frame(pb.ClientBatch(messages=runs)))
        outcomes: dict[str, pb.ClientEvent] = {}
        for batch in messages(connection.recv, pb.ClientEventBatch.FromString):
            outcomes.update((e.computation_id, e) for e in batch.events if e.computation_id)
            if len(outcomes) == len(runs):
                break
    assert all(e.kind == pb.ClientEvent.FAILED for e in outcomes.values()), outcomes
    assert all("not a jax.export artifact" in e.message for e in outcomes.values()), outcomes
    assert_serving(island)


def _slow() -> jax.Array:
    # About a second of matrix products on one CPU device, from no input.
    start = jnp.full((256, 256), 0.001, jnp.float32)
    return jax.lax.fori_loop(0, 300, lambda _, y: jnp.tanh(y @ y), start)


def test_a_client_that_stops_reading_holds_up_no_one(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    """A client floods the scheduler with requests whose refusals it never reads, while its
    slow computations finish later: their events, sent from the threads that read the
    executors' streams, must not wait on its full socket (that would hold up every client's
    events). Past the backlog limit its session is dropped."""
    own = f"sleeper-{next(_NAMES)}"
    with IslandClient(island.scheduler_endpoint, f"setup-{next(_NAMES)}") as setup:
        slow_id = setup.register(export(_slow), "slow")  # the island knows the function
    connection = socket.socket()
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.settimeout(BOUND)
    connection.connect(endpoints.session)
    flood_done = threading.Event()

    def flood() -> None:
        with contextlib.suppress(OSError):
            connection.sendall(hello(own))
            # Computations that finish in a second or two (events from the executors) ...
            runs = [
                pb.ClientMessage(
                    computation=pb.Computation(
                        id=f"{own}/slow{n}",
                        function_id=slow_id,
                        devices=[n % 4],
                        outputs=[f"{own}/o{n}"],
                    )
                )
                for n in range(8)
            ]
            # ... and at once refusals of 100 KB each, 100 MB in all, never read.
            bad = [
                pb.ClientMessage(computation=pb.Computation(id=f"{own}/bad{n}", name="n" * 100_000))
                for n in range(1000)
            ]
            for start in range(0, len(bad), 250):
                connection.sendall(
                    frame(pb.ClientBatch(messages=[*runs, *bad[start : start + 250]]))
                )
                runs = []
        flood_done.set()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(1.0)
        # Meanwhile others are served, with computations completing on every executor.
        with ThreadPoolExecutor(2) as pool:
            for checked in [pool.submit(assert_serving, island) for _ in range(2)]:
                checked.result(timeout=BOUND)
        flood_done.wait(BOUND)
    finally:
        connection.close()
        flooder.join(BOUND)
    assert_serving(island)


# -- the executors' control streams ------------------------------------------------------------


def _control_frame(*commands: pb.ExecutorCommand) -> bytes:
    return frame(pb.CommandBatch(commands=list(commands)))


def test_control_streams_drop_strangers_without_touching_the_schedulers(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    with IslandClient(island.scheduler_endpoint, f"owner-{next(_NAMES)}") as owner:
        x = owner.put(np.full(4, 10, np.float32), device=0)
        y = owner.put(np.full(4, 20, np.float32), device=2)
        delete = pb.ExecutorCommand(seq=1, delete=pb.DeleteBuffers(ids=[x, y]))
        run = pb.ExecutorCommand(
            seq=2, run=pb.Computation(id="stranger/c", function_id=INCREMENT_ID, devices=[0])
        )
        strangers = {
            "nothing but a close": b"",
            "commands without hello": _control_frame(delete, run),
            "hello without the token": _control_frame(pb.ExecutorCommand(hello=pb.ControlHello())),
            "hello with a wrong token": _control_frame(
                pb.ExecutorCommand(hello=pb.ControlHello(island="local", token="guess"))
            )
            + _control_frame(delete),
            "hello with more in its frame": _control_frame(
                pb.ExecutorCommand(hello=pb.ControlHello(token=TOKEN[:-1])), delete
            ),
            "truncated hello": _control_frame(
                pb.ExecutorCommand(hello=pb.ControlHello(token=TOKEN))
            )[:-3],
            "absurd length": struct.pack("!I", (1 << 32) - 1) + b"\0" * 64,
            "2**40 as 8 bytes": struct.pack("!Q", 1 << 40),
        }
        for what, data in strangers.items():
            for control in endpoints.controls:
                reply, hung_up = exchange(control, data)
                assert hung_up, what
                assert reply == b"", what  # a stranger learns nothing

        @FUZZ
        @given(data=st.binary(max_size=2048))
        def garbage(data: bytes) -> None:
            for control in endpoints.controls:
                _, hung_up = exchange(control, data)
                assert hung_up

        garbage()
        # The scheduler's streams were never replaced: the buffers are there, work runs.
        increment = owner.register(INCREMENT)
        both = [owner.submit(increment, [0], [x], 1), owner.submit(increment, [2], [y], 1)]
        for done, expected in zip(both, (11, 21), strict=True):
            done.wait(60)
            np.testing.assert_array_equal(owner.get(done.outputs[0]), np.full(4, expected))
    assert_serving(island)


# -- the executors' data planes ----------------------------------------------------------------


def _data_reply(data: bytes) -> dict:
    (length,) = struct.unpack("!I", data[:4])
    return json.loads(data[4 : 4 + length])


def test_data_planes_refuse_garbage_with_error_replies(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    def request(payload: bytes) -> bytes:
        return struct.pack("!I", len(payload)) + payload

    cases = {
        "too large": struct.pack("!I", (1 << 32) - 1),
        "Expecting value": request(b"not json"),
        "expected {'buffer'": request(b"[]"),
        "'buffer'": request(b"{}"),
        "buffer must hold": request(b'{"buffer": ""}'),
        "timeout must be": request(b'{"buffer": "x", "timeout": NaN}'),
        "timeout must be ": request(b'{"buffer": "x", "timeout": -1}'),
        "could not convert": request(b'{"buffer": "x", "timeout": "soon"}'),
        "recursion": request(b"[" * 200_000),
    }
    for needle, data in cases.items():
        for address in endpoints.data:
            reply, hung_up = exchange(address, data)
            assert hung_up, needle
            error = _data_reply(reply)["error"]
            assert error.startswith("bad data-plane request"), error
            assert needle.lower() in error.lower(), (needle, error)

    @FUZZ
    @given(data=st.binary(max_size=2048))
    def garbage(data: bytes) -> None:
        for address in endpoints.data:
            reply, hung_up = exchange(address, data)
            assert hung_up
            if reply:
                assert "error" in _data_reply(reply)

    garbage()
    assert_serving(island)


# -- gRPC --------------------------------------------------------------------------------------


def _raw_call(target: str, service: str, method: str, body: bytes, streaming_request: bool):
    """A raw gRPC call with ``body`` as the request bytes; returns its status code and details."""
    with grpc.insecure_channel(target) as channel:
        path = f"/{service}/{method}"
        try:
            if streaming_request:
                channel.stream_unary(path)(iter([body, body[::-1]]), timeout=10)
            elif method == "GetArray":
                list(channel.unary_stream(path)(body, timeout=3))
            else:
                channel.unary_unary(path)(body, timeout=10)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def test_grpc_services_refuse_garbage_requests(island: LocalIsland, endpoints: Endpoints) -> None:
    methods = [
        (endpoints.grpc_scheduler, SCHEDULER.name, "Info", False),
        (endpoints.grpc_scheduler, SCHEDULER.name, "GetTrace", False),
        *(
            (target, EXECUTOR.name, method, method == "PutArray")
            for target in endpoints.grpc_executors
            for method in ("Info", "GetArray", "PutArray")
        ),
    ]
    code, details = _raw_call(endpoints.grpc_executors[0], EXECUTOR.name, "Info", b"\xff", False)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed pathways.v1.Empty request to Info" in details
    code, _ = _raw_call(endpoints.grpc_scheduler, SCHEDULER.name, "Nope", b"", False)
    assert code == grpc.StatusCode.UNIMPLEMENTED

    @FUZZ
    @given(data=st.binary(max_size=512))
    def garbage(data: bytes) -> None:
        for target, service, method, streaming in methods:
            code, details = _raw_call(target, service, method, data, streaming)
            assert code not in SERVER_ERRORS, (method, code, details)

    garbage()
    assert_serving(island)


def _put(target: str, chunks: list[pb.ArrayChunk]) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(target) as channel:
        try:
            stub(channel, EXECUTOR, "PutArray")(iter(chunks), timeout=30)
        except grpc.RpcError as error:
            return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def test_uploads_with_nonsense_fields_are_refused_naming_the_field(
    island: LocalIsland, endpoints: Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = endpoints.grpc_executors[0]

    def header(**fields) -> pb.ArrayChunk:
        base = dict(buffer_id="up/x", dtype="float32", shape=[4], total_bytes=16, begin=True)
        return pb.ArrayChunk(**{**base, **fields})

    cases = {
        "is not a dtype": [header(dtype="nonsense")],
        "not a numeric dtype": [header(dtype="object")],
        "not a numeric dtype ": [header(dtype="U4")],
        "not a numeric dtype  ": [header(dtype="i4,i4", total_bytes=32)],
        "not a numeric dtype   ": [header(dtype="(3,)f4", total_bytes=48)],
        "not a numeric dtype    ": [header(dtype="V8", total_bytes=32)],
        "not in this machine's byte order": [header(dtype=">f4")],
        "each >= 0": [header(shape=[-1], total_bytes=0)],
        "at most 64 sizes": [header(shape=[1] * 65, total_bytes=4)],
        "does not match dtype": [header(shape=[1 << 40, 1 << 40], total_bytes=16)],
        "does not match dtype ": [header(total_bytes=(1 << 62))],
        "more than the 16 bytes": [header(data=b"\0" * 17)],
        "ended after 8 of 16 bytes": [header(data=b"\0" * 8)],
        "before its header": [pb.ArrayChunk(data=b"\0" * 16)],
        "sent twice": [header(data=b"\0" * 16), header(data=b"\0" * 16)],
        "more bytes than an array": [
            header(region_start=[0], region_stop=[3], total_bytes=12, data=b"\0" * 12),
            header(region_start=[1], region_stop=[4], total_bytes=12, data=b"\0" * 12),
        ],
        "must share its buffer_id": [
            header(region_start=[0], region_stop=[2], total_bytes=8, data=b"\0" * 8),
            header(shape=[5], region_start=[2], region_stop=[4], total_bytes=8),
        ],
        "must bound a region": [header(region_start=[2], region_stop=[5], total_bytes=12)],
        "must bound a region ": [header(region_start=[3], region_stop=[1], total_bytes=0)],
        "must bound a region  ": [header(region_start=[0, 0], region_stop=[2, 2])],
        "ended after 4 of 8 bytes": [
            header(region_start=[0], region_stop=[2], total_bytes=8, data=b"\0" * 4),
            header(region_start=[2], region_stop=[4], total_bytes=8, data=b"\0" * 8),
        ],
        "buffer_id must hold": [header(buffer_id="", data=b"\0" * 16)],
        "holds no array": [],
    }
    for needle, chunks in cases.items():
        code, details = _put(target, chunks)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (needle, code, details)
        assert needle.strip() in details, (needle, details)
    # A buffer that exists cannot be overwritten (nor a pending output filled by a stranger).
    with IslandClient(island.scheduler_endpoint, f"owner-{next(_NAMES)}") as owner:
        x = owner.put(np.zeros(4, np.float32), device=0)
        code, details = _put(target, list(to_chunks(x, np.ones(4, np.float32))))
        assert code == grpc.StatusCode.ALREADY_EXISTS, details
        np.testing.assert_array_equal(owner.get(x), np.zeros(4))
        # Nor is a value uploaded ahead under an id a computation then writes served as its
        # output (ids are not guessed, their 64 random bits fixed here to play a stranger who
        # learned one): the computation fails saying so.
        monkeypatch.setattr(island_client_module, "_nonce", lambda: "0" * 16)
        function = owner.register(increment(), "increment")
        # (The id after the computation's: each id takes the next of one counter.)
        guessed = f"{owner.client}/b{next(island_client_module._IDS) + 2}-{'0' * 16}"
        code, _ = _put(target, list(to_chunks(guessed, np.full(4, 666, np.float32))))
        assert code == grpc.StatusCode.OK
        step = owner.submit(function, [0], [x], 1)
        assert step.outputs == (guessed,)
        with pytest.raises(IslandError, match=f"output '{guessed}' holds a value on executor 0"):
            step.wait(30)
        # So is a call's intermediate that crosses to another executor.
        nodes = [
            pb.Computation(id="n0", function_id=function, devices=[0], inputs=["a"], outputs=["h"]),
            pb.Computation(id="n1", function_id=function, devices=[2], inputs=["h"], outputs=["r"]),
        ]
        program = owner.register_program(nodes, ["a"], ["r"], name="across")
        crossing = f"{owner.client}/p{next(island_client_module._IDS) + 1}-{'0' * 16}/h"
        code, _ = _put(target, list(to_chunks(crossing, np.full(4, 666, np.float32))))
        assert code == grpc.StatusCode.OK
        with pytest.raises(IslandError, match=f"output '{crossing}' holds a value on executor 0"):
            owner.call(program, [x]).wait(30)

    def ask(request: pb.ArrayRequest, deadline: float = 10) -> tuple[grpc.StatusCode, str]:
        with grpc.insecure_channel(target) as channel:
            try:
                list(stub(channel, EXECUTOR, "GetArray")(request, timeout=deadline))
            except grpc.RpcError as error:
                return error.code(), error.details()
        return grpc.StatusCode.OK, ""

    for request, needle in [
        (pb.ArrayRequest(buffer_id=""), "buffer_id must hold"),
        (pb.ArrayRequest(buffer_id="x" * 5000), "buffer_id must hold"),
        (pb.ArrayRequest(buffer_id="x", timeout_seconds=float("nan")), "finite number"),
        (pb.ArrayRequest(buffer_id="x", timeout_seconds=float("inf")), "finite number"),
        (pb.ArrayRequest(buffer_id="x", timeout_seconds=-1), "finite number"),
    ]:
        code, details = ask(request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and needle in details, details
    code, details = ask(pb.ArrayRequest(buffer_id="never/seen", timeout_seconds=0.5))
    assert code == grpc.StatusCode.NOT_FOUND and "not announced within" in details, details
    assert_serving(island)


def test_waiting_downloads_never_starve_an_executor(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    """Hundreds of GetArray calls for buffers that never come: those past their deadline or
    cancelled free their threads, at most ``MAX_WAITING_GETS`` wait at once (the rest are told
    RESOURCE_EXHAUSTED), and Info, uploads and real work go on meanwhile."""
    target = endpoints.grpc_executors[0]
    with grpc.insecure_channel(target) as channel:
        get = stub(channel, EXECUTOR, "GetArray")
        forever = [get(pb.ArrayRequest(buffer_id=f"never/{n}")) for n in range(120)]
        short = [get(pb.ArrayRequest(buffer_id=f"never/s{n}"), timeout=1) for n in range(120)]
        time.sleep(2.0)
        info = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=BOUND)
        assert info.index == 0
        assert_serving(island)
        refused = 0
        for call in short:
            with pytest.raises(grpc.RpcError) as raised:
                list(call)
            # The executor stops waiting at the caller's deadline: its NOT_FOUND (the buffer
            # never came) and the client's DEADLINE_EXCEEDED race, both are right.
            assert raised.value.code() in (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )
        for call in forever:
            if not call.running() and call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                refused += 1
                assert "retry later" in call.details()
            call.cancel()
        assert refused > 0  # the waiting calls were bounded
    # Once the callers are gone their threads are free (each notices within a poll): a
    # download that has to wait works again.
    with IslandClient(island.scheduler_endpoint, f"after-{next(_NAMES)}") as client:
        increment = client.register(INCREMENT)
        x = client.put(np.zeros(4, np.float32), device=1)
        give_up = time.monotonic() + BOUND
        while True:
            done = client.submit(increment, [1], [x], 1)
            try:
                value = client.get(done.outputs[0], timeout=60)
                break
            except IslandError as error:
                assert "retry later" in str(error) and time.monotonic() < give_up, error
                time.sleep(0.5)
        np.testing.assert_array_equal(value, np.ones(4))


# -- silence and crowds --------------------------------------------------------------------------


def test_silent_connections_are_dropped_and_block_no_one(
    island: LocalIsland, endpoints: Endpoints
) -> None:
    """Connections that say nothing, or half a frame, to every endpoint, many at once: others
    are served meanwhile, and each raw TCP endpoint hangs up on them after its handshake
    timeout (the scheduler says why)."""
    opened: list[tuple[str, socket.socket]] = []

    def open_silent(n: int, name: str, address: tuple[str, int]) -> None:
        connection = socket.create_connection(address, timeout=10)
        opened.append((name, connection))
        if n % 3 == 1:
            connection.sendall(b"\x00\x00")  # half a length prefix
        elif n % 3 == 2:
            connection.sendall(struct.pack("!I", 1000) + b"\x0a")  # half a frame

    try:
        # 48 to each endpoint, opened a few at a time across them: a connection a listener's
        # full backlog dropped is retried by the kernel only 1 s later (opened one by one,
        # each such wait held up all the rest), and the others go on meanwhile.
        silent = [(n, *endpoint) for n in range(48) for endpoint in endpoints.raw()]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda item: open_silent(*item), silent))
        assert len(opened) == 48 * len(endpoints.raw())
        grpc_silent = [
            socket.create_connection(_address(target), timeout=10)
            for target in [endpoints.grpc_scheduler, *endpoints.grpc_executors]
            for _ in range(16)
        ]
        assert_serving(island)
        for name, connection in opened:
            connection.settimeout(BOUND)
            received = bytearray()
            with contextlib.suppress(ConnectionResetError):
                while chunk := connection.recv(1 << 16):
                    received += chunk
            if name == "session":
                assert_rejected(bytes(received), "no hello within")
            elif name.startswith("control"):
                assert received == b""
        for connection in grpc_silent:
            connection.close()
    finally:
        for _, connection in opened:
            connection.close()
    assert_serving(island)


def test_many_connections_at_once(island: LocalIsland, endpoints: Endpoints) -> None:
    """Hundreds of clients at once, each with a little garbage or a proper hello, on every
    endpoint; every one is answered or dropped, and the island keeps serving."""
    payloads = [
        b"",
        b"\xff" * 7,
        struct.pack("!I", (1 << 32) - 1),
        hello(""),
        frame(pb.CommandBatch(commands=[pb.ExecutorCommand(hello=pb.ControlHello())])),
    ]

    def visit(item: tuple[tuple[str, int], bytes]) -> bool:
        address, payload = item
        return exchange(address, payload)[1]

    work = [
        (address, payload)
        for _, address in endpoints.raw()
        for payload in payloads
        for _ in range(12)
    ]
    with ThreadPoolExecutor(64) as pool:
        hung_up = list(pool.map(visit, work, timeout=BOUND * 4))
    assert all(hung_up)
    assert_serving(island)


# -- a restarted scheduler, and the executor's own robustness ----------------------------------


def test_a_restarted_scheduler_takes_its_executors_back(island: LocalIsland) -> None:
    """The scheduler dies and a new one reconnects with the token: the island serves again
    (the hello check keeps the scheduler's reconnect working)."""
    assert island.scheduler is not None
    island.scheduler.popen.kill()
    island.scheduler.popen.wait()
    with grpc.insecure_channel(island.executors[0].endpoint) as channel:
        stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=BOUND)  # executors still serve
    assert island.workdir is not None
    log = island.workdir / "scheduler-restarted.log"
    arguments = [sys.executable, "-m", "pathways_scheduler", "--island", island.name]
    for executor in island.executors:
        arguments += ["--executor", executor.endpoint]
    with log.open("w") as stderr:
        popen = subprocess.Popen(
            arguments,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, CONTROL_TOKEN_ENV: TOKEN},
            start_new_session=True,
        )
    old = island.scheduler
    restarted = Process("scheduler", popen, log)
    island.scheduler = restarted  # the island stops it
    if old.popen.stdout is not None:
        old.popen.stdout.close()
    island._await_ready(restarted)  # bounded; names the log when it did not start
    assert_serving(island)


def _standalone_executor(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    environment = {**os.environ, CONTROL_TOKEN_ENV: TOKEN, "JAX_PLATFORMS": "cpu"}
    environment.pop("XLA_FLAGS", None)
    with (tmp / "executor.log").open("w") as log:
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pathways_executor",
                "--fake-devices",
                "2",
                "--compilation-cache",
                str(tmp / "cache"),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environment,
            start_new_session=True,
        )
    process = Process("executor", popen, tmp / "executor.log")
    LocalIsland()._await_ready(process)  # bounded; names the log when it did not start
    return popen, process.endpoint


class _Events:
    """A fake scheduler's view of an executor's events."""

    def __init__(self, connection: socket.socket) -> None:
        self._seen: list[pb.ExecutorEvent] = []
        self._changed = threading.Condition()
        self._connection = connection
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            for batch in messages(self._connection.recv, pb.EventBatch.FromString):
                with self._changed:
                    self._seen += batch.events
                    self._changed.notify_all()

    def of(self, computation_id: str, timeout: float = BOUND) -> pb.ExecutorEvent:
        def found() -> pb.ExecutorEvent | None:
            return next((e for e in self._seen if e.computation_id == computation_id), None)

        with self._changed:
            assert self._changed.wait_for(lambda: found() is not None, timeout), computation_id
            event = found()
        assert event is not None
        return event


def test_an_executor_survives_nonsense_commands_from_its_scheduler(tmp_path: Path) -> None:
    """What comes after a valid hello is the scheduler's to say, yet nonsense there fails only
    the computations it names: the executor keeps running, in order, and computes right."""
    popen, endpoint = _standalone_executor(tmp_path)
    try:
        with grpc.insecure_channel(endpoint) as channel:
            info = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=60, wait_for_ready=True)
            stub(channel, EXECUTOR, "PutArray")(to_chunks("me/x", np.zeros(4, np.float32)))
            stub(channel, EXECUTOR, "PutArray")(to_chunks("me/wrong", np.zeros(3, np.int32)))
        connection = socket.create_connection(_address(info.control_endpoint), timeout=30)
        connection.settimeout(None)
        hello_frame = _control_frame(pb.ExecutorCommand(hello=pb.ControlHello(token=TOKEN)))
        connection.sendall(hello_frame)
        events = _Events(connection)
        seq = itertools.count(1)

        def send(*commands: pb.ExecutorCommand) -> None:
            connection.sendall(_control_frame(*commands))

        crashing = dataclasses.replace(
            jax.export.deserialize(bytearray(INCREMENT)), mlir_module_serialized=CRASHING_MODULE
        ).serialize()
        crashing_id = hashlib.sha256(crashing).hexdigest()
        send(
            pb.ExecutorCommand(
                seq=next(seq),
                register=pb.FunctionRegistration(function_id=INCREMENT_ID, artifact=INCREMENT),
            ),
            pb.ExecutorCommand(
                seq=next(seq),
                register=pb.FunctionRegistration(
                    function_id=crashing_id, artifact=bytes(crashing), name="crashing"
                ),
            ),
            pb.ExecutorCommand(
                seq=next(seq),
                run=pb.Computation(id="crash", function_id=crashing_id, devices=[0]),
            ),
        )
        failed = events.of("crash", timeout=120)
        assert not failed.ok and "not a jax.export artifact" in failed.message, failed.message
        assert popen.poll() is None

        ids = st.sampled_from(["me/x", "me/wrong", "me/out", "", "nope", "me/x" * 50])
        function_ids = st.sampled_from([INCREMENT_ID, crashing_id, "", "f" * 64])
        sources = st.builds(
            pb.InputSource,
            buffer_id=ids,
            data_endpoints=st.lists(st.sampled_from(_JUNK_ENDPOINTS), max_size=2),
        )
        commands = st.one_of(
            st.builds(
                pb.ExecutorCommand,
                seq=st.integers(0, 2**64 - 1),
                run=st.builds(
                    pb.Computation,
                    id=st.text(max_size=12),
                    function_id=function_ids,
                    devices=st.lists(
                        st.integers(-3, 3) | st.integers(-(2**31), 2**31 - 1), max_size=3
                    ),
                    inputs=st.lists(ids, max_size=3),
                    outputs=st.lists(st.sampled_from(["me/o1", "me/o2", "me/x", ""]), max_size=2),
                    name=st.text(max_size=12),
                ),
                sources=st.lists(sources, max_size=2),
            ),
            st.builds(
                pb.ExecutorCommand,
                register=st.builds(
                    pb.FunctionRegistration,
                    function_id=function_ids | st.text(max_size=64),
                    artifact=st.binary(max_size=64) | st.just(bytes(INCREMENT[:100])),
                ),
            ),
            st.builds(
                pb.ExecutorCommand,
                delete=st.builds(pb.DeleteBuffers, ids=st.lists(ids.filter(lambda i: i != "me/x"))),
            ),
            st.builds(pb.ExecutorCommand, hello=st.builds(pb.ControlHello, token=st.text())),
            st.just(pb.ExecutorCommand()),
        )
        markers = itertools.count()

        @FUZZ
        @given(batch=st.lists(commands, max_size=8))
        def nonsense(batch: list[pb.ExecutorCommand]) -> None:
            marker = f"marker-{next(markers)}"
            send(*batch, pb.ExecutorCommand(seq=next(seq), run=pb.Computation(id=marker)))
            assert not events.of(marker).ok  # handled in order, after the batch
            assert popen.poll() is None

        nonsense()
        # Still computing right.
        send(
            pb.ExecutorCommand(
                seq=next(seq),
                run=pb.Computation(
                    id="final",
                    function_id=INCREMENT_ID,
                    devices=[1],
                    inputs=["me/x"],
                    outputs=["me/final"],
                ),
            )
        )
        final = events.of("final")
        assert final.ok, final.message
        with grpc.insecure_channel(endpoint) as channel:
            chunks = stub(channel, EXECUTOR, "GetArray")(
                pb.ArrayRequest(buffer_id="me/final"), timeout=30
            )
            value = np.frombuffer(b"".join(c.data for c in chunks), np.float32)
        np.testing.assert_array_equal(value, np.ones(4))
        connection.close()
    finally:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def test_a_buffer_named_but_never_uploaded_fails_at_once_and_holds_no_one_up(
    island: LocalIsland,
) -> None:
    n = next(_NAMES)
    with (
        IslandClient(island.scheduler_endpoint, f"liar-{n}") as liar,
        IslandClient(island.scheduler_endpoint, f"other-{n}") as other,
    ):
        ghost = f"{liar.client}/ghost"  # said to be on executor 1, never uploaded there
        liar._send(pb.ClientMessage(placed=pb.PlacedBuffer(buffer_id=ghost, executor=1)))
        increment_id = liar.register(increment(), "increment")
        began = time.monotonic()
        reading = liar.submit(increment_id, [0], [ghost], 1)
        function = other.register(increment(), "increment")
        behind = other.submit(function, [0], [other.put(np.zeros(4, np.float32), 0)], 1)
        with pytest.raises(IslandError, match=f"cannot fetch buffer '{ghost}'.*unknown buffer"):
            reading.wait(60)
        behind.wait(60)
        # Executor 0 waited for it to be announced at its holder: 30 s, the other tenant too.
        assert time.monotonic() - began < 10
    assert_serving(island)
