"""A client of one island: registers compiled functions, places arrays, submits computations
and fetches results over gRPC. The SDK's programs are built on it."""

from __future__ import annotations

import hashlib
import itertools
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import grpc
import numpy as np

from pathways_client.rpc import MESSAGE_OPTIONS, batches, stub
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.arrays import Assembly, to_chunks

Event = pb.ClientEvent


class IslandError(RuntimeError):
    """The island refused or failed a request; the message says why."""


@dataclass(frozen=True)
class Submitted:
    """A computation accepted for dispatch: its id, output buffer ids and completion future."""

    id: str
    outputs: tuple[str, ...]
    done: Future[None]

    def wait(self, timeout: float | None = 120.0) -> None:
        """Block until the computation completed; raise ``IslandError`` if it failed."""
        self.done.result(timeout)


class IslandClient:
    """One client session with an island's scheduler."""

    def __init__(self, endpoint: str, client: str, weight: int = 1, priority: int = 0) -> None:
        self.client = client
        self._channel = grpc.insecure_channel(endpoint, options=MESSAGE_OPTIONS)
        self.info: pb.IslandInfo = stub(self._channel, SCHEDULER, "Info")(
            pb.Empty(), timeout=60, wait_for_ready=True
        )
        self.device_owner = {d: e.index for e in self.info.executors for d in e.devices}
        self._executors = {
            e.index: grpc.insecure_channel(e.endpoint, options=MESSAGE_OPTIONS)
            for e in self.info.executors
        }
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[str, Future[None]] = {}
        self._functions: dict[str, Future[None]] = {}
        self._locations: dict[str, tuple[int, ...]] = {}  # buffer id -> executors holding it
        self._outgoing: queue.Queue[pb.ClientMessage | None] = queue.Queue()
        self._outgoing.put(
            pb.ClientMessage(hello=pb.Hello(client=client, weight=weight, priority=priority))
        )
        outgoing = batches(self._outgoing, lambda items: pb.ClientBatch(messages=items))
        responses = stub(self._channel, SCHEDULER, "Session")(outgoing)
        self._reader = threading.Thread(target=self._read, args=(responses,), daemon=True)
        self._reader.start()

    # -- requests ----------------------------------------------------------------------------

    def register(self, artifact: bytes, name: str = "", timeout: float = 60.0) -> str:
        """Register a serialized ``jax.export`` artifact; returns its function id."""
        artifact = bytes(artifact)
        function_id = hashlib.sha256(artifact).hexdigest()
        with self._lock:
            future = self._functions.get(function_id)
            if future is None:
                future = self._functions[function_id] = Future()
                self._send(
                    pb.ClientMessage(
                        function=pb.FunctionRegistration(
                            function_id=function_id, artifact=artifact, name=name
                        )
                    )
                )
        future.result(timeout)
        return function_id

    def put(self, array: np.ndarray, device: int) -> str:
        """Upload a host array to the executor owning ``device``; returns its buffer id."""
        buffer_id = self._new_id("put")
        executor = self.device_owner[device]
        stub(self._executors[executor], EXECUTOR, "PutArray")(
            to_chunks(buffer_id, np.asarray(array)), timeout=120
        )
        self._locations[buffer_id] = (executor,)
        self._send(pb.ClientMessage(placed=pb.PlacedBuffer(buffer_id=buffer_id, executor=executor)))
        return buffer_id

    def submit(
        self,
        function_id: str,
        devices: Sequence[int],
        inputs: Sequence[str],
        outputs: int,
        name: str = "",
    ) -> Submitted:
        """Queue a computation; returns at once with its future outputs."""
        computation_id = self._new_id("c")
        output_ids = tuple(self._new_id("b") for _ in range(outputs))
        done: Future[None] = Future()
        with self._lock:
            self._pending[computation_id] = done
        holders = tuple(sorted({self.device_owner[d] for d in devices if d in self.device_owner}))
        for buffer_id in output_ids:
            self._locations[buffer_id] = holders
        self._send(
            pb.ClientMessage(
                computation=pb.Computation(
                    id=computation_id,
                    client=self.client,
                    function_id=function_id,
                    devices=list(devices),
                    inputs=list(inputs),
                    outputs=list(output_ids),
                    name=name,
                )
            )
        )
        return Submitted(computation_id, output_ids, done)

    def get(self, buffer_id: str, timeout: float = 120.0) -> np.ndarray:
        """Fetch a buffer's value to the host, waiting for it to be computed."""
        holders = self._locations.get(buffer_id)
        if not holders:
            raise IslandError(f"unknown buffer {buffer_id!r}")
        request = pb.ArrayRequest(buffer_id=buffer_id, timeout_seconds=timeout)
        # Each executor of the buffer's slice sends the shards it holds.
        assembly = Assembly()
        for executor in holders:
            get_array = stub(self._executors[executor], EXECUTOR, "GetArray")
            try:
                assembly.add(get_array(request, timeout=timeout + 5))
            except grpc.RpcError as error:
                raise IslandError(error.details()) from None
            if assembly.complete:
                assert assembly.array is not None
                return assembly.array
        raise IslandError(f"the executors of buffer {buffer_id!r} sent only part of it")

    def delete(self, buffer_ids: Sequence[str]) -> None:
        """Free buffers once the computations queued before this call have used them."""
        for buffer_id in buffer_ids:
            self._locations.pop(buffer_id, None)
        self._send(pb.ClientMessage(delete=pb.DeleteBuffers(ids=list(buffer_ids))))

    def trace(self) -> list[pb.TraceRecord]:
        """The island's trace: which computation of which client ran where and when."""
        return list(stub(self._channel, SCHEDULER, "GetTrace")(pb.Empty(), timeout=60).records)

    def close(self) -> None:
        self._outgoing.put(None)
        self._reader.join(timeout=10)
        for channel in [self._channel, *self._executors.values()]:
            channel.close()

    def __enter__(self) -> IslandClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- session -----------------------------------------------------------------------------

    def _new_id(self, kind: str) -> str:
        return f"{self.client}/{kind}{next(self._ids)}"

    def _send(self, message: pb.ClientMessage) -> None:
        self._outgoing.put(message)

    def _read(self, responses) -> None:
        try:
            for batch in responses:
                for event in batch.events:
                    self._on_event(event)
            reason = "the scheduler closed the session"
        except grpc.RpcError as error:
            reason = f"the scheduler is unreachable: {error.details()}"
        with self._lock:
            waiting = [*self._pending.values(), *self._functions.values()]
            self._pending.clear()
        for future in waiting:
            if not future.done():
                future.set_exception(IslandError(reason))

    def _on_event(self, event: pb.ClientEvent) -> None:
        with self._lock:
            if event.kind in (Event.REGISTERED, Event.REJECTED) and event.function_id:
                future = self._functions.get(event.function_id)
                if event.kind == Event.REJECTED:
                    self._functions.pop(event.function_id, None)
            else:
                future = self._pending.pop(event.computation_id, None)
        if future is None or future.done():
            return
        if event.kind in (Event.COMPLETED, Event.REGISTERED):
            future.set_result(None)
        else:
            future.set_exception(IslandError(event.message))
