"""The island scheduler's servers: a thin shell around ``IslandDispatcher``.

Clients hold sessions on the session endpoint and the scheduler holds one command stream per
executor on its control endpoint, both framed protobuf over raw TCP (``pathways_core.wire.
streams``); gRPC serves the island's information and trace. A thread per stream reads
frames and feeds the dispatcher under one lock; the instructions that come out are queued per
peer in dispatch order under that lock and written, after it is released, by the same thread:
no hand-off to sender threads, and whatever several threads queued meanwhile goes out in one
frame.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc

from pathways_core.scheduling import (
    ExecutorSpec,
    Instruction,
    IslandDispatcher,
    Policy,
    ToClient,
    ToExecutor,
)
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.streams import FrameError, frame, messages
from pathways_scheduler.rpc import MESSAGE_OPTIONS, generic_handler, stub

# A peer that takes no bytes for this long is considered gone (its stream is closed), so one
# stuck client cannot stall the island.
SEND_TIMEOUT_SECONDS = 60


class Peer:
    """The sending side of one control stream. Messages are queued under the dispatcher's lock,
    so they are in dispatch order, and written by whichever thread flushes first."""

    def __init__(self, connection: socket.socket, wrap: Callable[[list[Any]], Any]) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_SECONDS, 0)
        )
        self.connection = connection
        self._wrap = wrap
        self._pending: list[Any] = []
        self._pending_lock = threading.Lock()
        self._send_lock = threading.Lock()

    def queue(self, message: Any) -> None:
        with self._pending_lock:
            self._pending.append(message)

    def flush(self) -> None:
        """Write what is queued. Taking and writing under one lock keeps the order."""
        with self._send_lock:
            with self._pending_lock:
                items, self._pending = self._pending, []
            if not items:
                return
            try:
                self.connection.sendall(frame(self._wrap(items)))
            except OSError:
                self.close()  # its reader sees the stream end and reports the peer gone

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class SchedulerService:
    """Implements ``pathways.v1.Scheduler``, serves client sessions and drives the island's
    executors."""

    def __init__(
        self,
        island: str,
        executor_endpoints: list[str],
        policy: str,
        max_in_flight: int,
        max_queued: int,
        host: str = "127.0.0.1",
        session_port: int = 0,
    ) -> None:
        self.island = island
        self._lock = threading.Lock()
        self._clients: dict[str, Peer] = {}
        self._executors: dict[int, Peer] = {}
        specs = []
        controls = []
        self._channels = []
        for index, endpoint in enumerate(executor_endpoints):
            channel = grpc.insecure_channel(endpoint, options=MESSAGE_OPTIONS)
            self._channels.append(channel)
            info = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=60, wait_for_ready=True)
            if info.index != index:
                raise SystemExit(
                    f"executor {endpoint} says it is host {info.index}, but it is listed as "
                    f"host {index}: pass --executor once per host, in host order"
                )
            specs.append(ExecutorSpec(index, endpoint, tuple(info.devices), info.data_endpoint))
            host, port = info.control_endpoint.rsplit(":", 1)
            if host in ("", "0.0.0.0", "::", "[::]"):  # listening everywhere: reach it where
                host = endpoint.rsplit(":", 1)[0]  # its gRPC server was reached
            controls.append((host.strip("[]"), int(port)))
        self.dispatcher = IslandDispatcher(specs, Policy(policy), max_queued, max_in_flight)
        for spec, control in zip(specs, controls, strict=True):
            self._open_executor_stream(spec, control)
        self._listener = socket.create_server((host, session_port), backlog=64)
        self.session_endpoint = f"{host}:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="sessions", daemon=True).start()

    # -- executors ---------------------------------------------------------------------------

    def _open_executor_stream(self, spec: ExecutorSpec, control: tuple[str, int]) -> None:
        connection = socket.create_connection(control, timeout=60)
        connection.settimeout(None)
        self._executors[spec.index] = Peer(
            connection, lambda commands: pb.CommandBatch(commands=commands)
        )

        def incoming() -> None:
            reason = "its command stream ended"
            try:
                for batch in messages(connection.recv, pb.EventBatch.FromString):
                    self._handle(
                        lambda d, b=batch: [i for e in b.events for i in d.executor_event(e)]
                    )
            except (OSError, FrameError) as error:
                reason = f"{type(error).__name__}: {error}"
            self._handle(lambda d: d.executor_lost(spec.index, reason))

        threading.Thread(target=incoming, name=f"executor-{spec.index}", daemon=True).start()

    def _handle(self, stimulus: Callable[[IslandDispatcher], list[Instruction]]) -> None:
        touched: dict[int, Peer] = {}
        with self._lock:
            instructions = stimulus(self.dispatcher)
            for instruction in instructions:
                if isinstance(instruction, ToExecutor):
                    peer = self._executors[instruction.executor]
                    peer.queue(instruction.command)
                elif isinstance(instruction, ToClient):
                    peer = self._clients.get(instruction.client)
                    if peer is None:
                        continue
                    peer.queue(instruction.event)
                touched[id(peer)] = peer
        for peer in touched.values():
            peer.flush()

    # -- clients -----------------------------------------------------------------------------

    def _apply_batch(self, client: str, batch: Sequence[pb.ClientMessage]) -> None:
        """A client's messages in order, in chunks of 1, 2, 4, ...: the first computations of a
        long batch reach their executors while the rest are being dispatched, and the later
        ones still travel together."""
        start, size = 0, 1
        while start < len(batch):
            chunk = batch[start : start + size]
            self._handle(lambda d, c=chunk: _apply(d, client, c))
            start, size = start + size, size * 2

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._session, args=(connection,), name="session", daemon=True
            ).start()

    def _session(self, connection: socket.socket) -> None:
        """One client's session: a hello naming the client, then its requests; events back."""
        peer = Peer(connection, lambda events: pb.ClientEventBatch(events=events))
        incoming = messages(connection.recv, pb.ClientBatch.FromString)
        client = ""
        try:
            first = next(incoming, None)
            batch = list(first.messages) if first is not None else []
            problem = None
            if not batch or batch[0].WhichOneof("kind") != "hello" or not batch[0].hello.client:
                problem = "a session starts with hello naming the client"
            else:
                hello = batch.pop(0).hello
                with self._lock:
                    if hello.client in self._clients:
                        problem = f"client {hello.client!r} already has a session on this island"
                    else:
                        client = hello.client
                        self._clients[client] = peer
            if problem is not None:
                peer.queue(pb.ClientEvent(kind=pb.ClientEvent.REJECTED, message=problem))
                peer.flush()
                return
            self._handle(lambda d: d.connect(client, hello.weight, hello.priority))
            self._apply_batch(client, batch)
            for batch_in in incoming:
                self._apply_batch(client, batch_in.messages)
        except FrameError as error:  # bytes that are not our frames: say why, then hang up
            with contextlib.suppress(OSError):
                peer.queue(pb.ClientEvent(kind=pb.ClientEvent.REJECTED, message=str(error)))
                peer.flush()
        except OSError:
            pass
        finally:
            if client:
                with self._lock:
                    self._clients.pop(client, None)
                self._handle(lambda d: d.disconnect(client))
            peer.close()
            connection.close()

    def Info(self, request, context):
        dispatcher = self.dispatcher
        return pb.IslandInfo(
            island=self.island,
            policy=dispatcher.queue.policy.value,
            session_endpoint=self.session_endpoint,
            executors=[
                pb.ExecutorInfo(
                    index=s.index,
                    endpoint=s.endpoint,
                    devices=s.devices,
                    data_endpoint=s.data_endpoint,
                )
                for s in dispatcher.executors.values()
            ],
        )

    def GetTrace(self, request, context):
        with self._lock:
            records = list(self.dispatcher.trace)
        return pb.Trace(
            records=[
                pb.TraceRecord(
                    seq=r.seq,
                    computation_id=r.computation_id,
                    client=r.client,
                    name=r.name,
                    devices=r.devices,
                    executor=r.executor,
                    start_ns=r.start_ns,
                    end_ns=r.end_ns,
                    ok=r.ok,
                )
                for r in records
            ]
        )


def _apply(dispatcher: IslandDispatcher, client: str, batch: Any) -> list[Instruction]:
    """A client's batch of messages, in order."""
    instructions: list[Instruction] = []
    for message in batch:
        kind = message.WhichOneof("kind")
        if kind == "computation":
            instructions += dispatcher.submit(client, message.computation)
        elif kind == "function":
            instructions += dispatcher.register(client, message.function)
        elif kind == "placed":
            instructions += dispatcher.placed(client, message.placed)
        elif kind == "delete":
            instructions += dispatcher.delete(client, message.delete.ids)
    return instructions


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="pathways_scheduler", description="The gang scheduler of one island."
    )
    parser.add_argument("--island", default="local")
    parser.add_argument(
        "--executor",
        action="append",
        required=True,
        help="executor endpoint host:port, in host order (repeatable)",
    )
    parser.add_argument("--policy", default=Policy.FIFO.value, choices=[p.value for p in Policy])
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument("--max-queued", type=int, default=4096)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="gRPC port (0 picks a free one)")
    parser.add_argument(
        "--session-port", type=int, default=0, help="client sessions' port (0 picks a free one)"
    )
    args = parser.parse_args()
    service = SchedulerService(
        args.island,
        args.executor,
        args.policy,
        args.max_in_flight,
        args.max_queued,
        args.host,
        args.session_port,
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=MESSAGE_OPTIONS)
    server.add_generic_rpc_handlers([generic_handler(SCHEDULER, service)])
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    server.start()
    print(json.dumps({"ready": True, "port": port}), flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=1)
    sys.exit(0)
