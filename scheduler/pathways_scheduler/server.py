"""The island scheduler's gRPC server: a thin shell around ``IslandDispatcher``.

Threads only move messages: each client session and each executor stream has a reader that
feeds the dispatcher (under one lock) and queues that carry its instructions out.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
from concurrent import futures

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
from pathways_scheduler.rpc import MESSAGE_OPTIONS, batches, generic_handler, stub


class SchedulerService:
    """Implements ``pathways.v1.Scheduler`` and drives the island's executors."""

    def __init__(
        self,
        island: str,
        executor_endpoints: list[str],
        policy: str,
        max_in_flight: int,
        max_queued: int,
    ) -> None:
        self.island = island
        self._lock = threading.Lock()
        self._clients: dict[str, queue.Queue[pb.ClientEvent | None]] = {}
        self._executor_queues: dict[int, queue.Queue[pb.ExecutorCommand | None]] = {}
        specs = []
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
        self.dispatcher = IslandDispatcher(specs, Policy(policy), max_queued, max_in_flight)
        for spec, channel in zip(specs, self._channels, strict=True):
            self._open_executor_stream(spec, channel)

    # -- executors ---------------------------------------------------------------------------

    def _open_executor_stream(self, spec: ExecutorSpec, channel: grpc.Channel) -> None:
        commands: queue.Queue[pb.ExecutorCommand | None] = queue.Queue()
        self._executor_queues[spec.index] = commands

        def incoming() -> None:
            reason = "its command stream ended"
            outgoing = batches(commands, lambda items: pb.CommandBatch(commands=items))
            try:
                for batch in stub(channel, EXECUTOR, "Execute")(outgoing):
                    self._handle(
                        lambda d, b=batch: [i for e in b.events for i in d.executor_event(e)]
                    )
            except grpc.RpcError as error:
                reason = f"{error.code().name}: {error.details()}"
            self._handle(lambda d: d.executor_lost(spec.index, reason))

        threading.Thread(target=incoming, name=f"executor-{spec.index}", daemon=True).start()

    def _handle(self, stimulus) -> None:
        with self._lock:
            instructions: list[Instruction] = stimulus(self.dispatcher)
            for instruction in instructions:
                if isinstance(instruction, ToExecutor):
                    self._executor_queues[instruction.executor].put(instruction.command)
                elif isinstance(instruction, ToClient):
                    events = self._clients.get(instruction.client)
                    if events is not None:
                        events.put(instruction.event)

    # -- clients -----------------------------------------------------------------------------

    def Session(self, batches_in, context):
        first_batch = next(batches_in, None)
        messages = list(first_batch.messages) if first_batch is not None else []
        if (
            not messages
            or messages[0].WhichOneof("kind") != "hello"
            or not messages[0].hello.client
        ):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a session starts with hello naming the client"
            )
        hello = messages.pop(0).hello
        client = hello.client
        events: queue.Queue[pb.ClientEvent | None] = queue.Queue()
        with self._lock:
            if client in self._clients:
                context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"client {client!r} already has a session on this island",
                )
            self._clients[client] = events
        self._handle(lambda d: d.connect(client, hello.weight, hello.priority))

        def apply(dispatcher: IslandDispatcher, batch: list[pb.ClientMessage]) -> list:
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

        def read() -> None:
            self._handle(lambda d: apply(d, messages))
            try:
                for batch in batches_in:
                    self._handle(lambda d, b=batch: apply(d, list(b.messages)))
            except grpc.RpcError:
                pass
            with self._lock:
                self._clients.pop(client, None)
            self._handle(lambda d: d.disconnect(client))
            events.put(None)

        threading.Thread(target=read, name=f"client-{client}", daemon=True).start()
        yield from batches(events, lambda items: pb.ClientEventBatch(events=items))

    def Info(self, request, context):
        dispatcher = self.dispatcher
        return pb.IslandInfo(
            island=self.island,
            policy=dispatcher.queue.policy.value,
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
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    service = SchedulerService(
        args.island, args.executor, args.policy, args.max_in_flight, args.max_queued
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
