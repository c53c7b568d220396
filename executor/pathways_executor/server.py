"""The executor's servers, a thin shell around the runner: gRPC for arrays and information,
the control stream for the scheduler's commands, the bulk data plane for peers."""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any

import grpc
import jax
import numpy as np

from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.arrays import Assembly, Chunk, numeric_dtype, region_chunks
from pathways_core.wire.streams import CONTROL_TOKEN_ENV
from pathways_executor.arrays import local_regions, received_upload
from pathways_executor.buffers import BufferError, not_ready
from pathways_executor.control import ControlServer
from pathways_executor.data_plane import DataPlaneServer, Puller
from pathways_executor.health import publish_metrics, publish_readiness
from pathways_executor.metrics import PULLED, SENT, Tally, renderer
from pathways_executor.rpc import MESSAGE_OPTIONS, generic_handler
from pathways_executor.runner import INPUT_TIMEOUT_SECONDS, Runner
from pathways_executor.tls import Tls, TlsConfigError, load

# How long a requested buffer may take to be announced by the island's command stream.
APPEAR_WITHIN_SECONDS = 30.0
# gRPC worker threads, and how many of them GetArray calls may hold while they wait for a
# buffer: the rest stay free for Info, PutArray and ready buffers, whoever asks for what.
GRPC_WORKERS = 64
MAX_WAITING_GETS = 48
# A waiting GetArray looks this often whether its caller is still there (a cancelled call or
# one past its deadline frees its thread).
POLL_SECONDS = 0.5
MAX_BUFFER_ID = 4096


# The exit code of an executor its scheduler retired (lost, then answering again as the same
# process): it is to be restarted, and taken back as a new one (EX_TEMPFAIL).
RETIRED_EXIT_CODE = 75


class ExecutorService:
    """Implements ``pathways.v1.Executor``."""

    def __init__(
        self,
        index: int,
        first_device: int,
        endpoint: str = "",
        host: str = "127.0.0.1",
        tls: Tls | None = None,
    ) -> None:
        self.index = index
        self.endpoint = endpoint
        # New at every start: the scheduler tells a restarted executor from a lost one that
        # answers again (whose state it no longer trusts).
        self.incarnation = secrets.token_hex(8)
        if jax.process_count() > 1:
            # One JAX distributed group per island: every device of the island, in island order.
            self.island_devices = dict(enumerate(jax.devices()))
        else:
            local = jax.local_devices()
            self.island_devices = {first_device + i: device for i, device in enumerate(local)}
        self.local_devices = {
            i
            for i, device in self.island_devices.items()
            if device.process_index == jax.process_index()
        }
        self._puller = Puller(tls)
        self.tally = Tally()
        self.runner = Runner(index, self.island_devices, self._fetch, self._emit)
        self.control = ControlServer(
            self._submit,
            host,
            tls,
            token=os.environ.get(CONTROL_TOKEN_ENV, ""),
            replaced=self.runner.replaced,
        )
        self._waiting = threading.BoundedSemaphore(MAX_WAITING_GETS)
        self.data_plane = DataPlaneServer(
            lambda buffer_id, timeout, appear: self.runner.buffers.get(
                buffer_id, timeout, APPEAR_WITHIN_SECONDS if appear is None else appear
            ),
            host,
            tls,
            sent=lambda size: self.tally.add(SENT, size),
        )

    def _emit(self, events: list[pb.ExecutorEvent]) -> None:
        self.control.emit(events)

    def _submit(self, commands: Sequence[pb.ExecutorCommand]) -> None:
        """The scheduler's commands: a lost peer, or one taken back, is acted on at once (its
        reads fail now, or may go again), and so is being retired; the rest go to the runner
        in island order."""
        ordered = []
        for command in commands:
            kind = command.WhichOneof("kind")
            if kind == "retire":
                print(
                    f"pathways_executor: retired by its scheduler: {command.retire.reason}",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(RETIRED_EXIT_CODE)  # nothing here is the island's to keep any more
            if kind == "peer_down":
                self._puller.down(command.peer_down.data_endpoint, command.peer_down.reason)
            elif kind == "remote_failed":
                # The commands before it first: a pull they start must be there to fail.
                self.runner.submit(ordered)
                ordered = []
                self.runner.remote_failed(command.remote_failed)
            elif kind == "peer_up":
                self._puller.up(command.peer_up.data_endpoint)
            elif kind == "prefetch":  # inputs of work held in the queue: pulled from now on
                self.runner.prefetch(command.prefetch.sources)
            else:
                ordered.append(command)
        self.runner.submit(ordered)

    # -- arrays ------------------------------------------------------------------------------

    def PutArray(self, chunks, context):
        try:
            buffer_id, array = received_upload(_checked_upload(chunks))
            if buffer_id in self.runner.buffers:
                context.abort(
                    grpc.StatusCode.ALREADY_EXISTS, f"buffer {buffer_id!r} exists already"
                )
        except (ValueError, TypeError, OverflowError, MemoryError) as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad array upload: {error}")
        if not self.runner.put_array(buffer_id, array):
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"buffer {buffer_id!r} was deleted before its upload arrived (its session "
                "ended, or the client deleted it): nothing was kept",
            )
        return pb.Ack(message=f"stored {buffer_id}")

    def GetArray(self, request, context):
        try:
            value = self._wait_for(request, context)
            regions = local_regions(value)
        except _Gone:
            return
        except _Refused as refused:
            context.abort(refused.code, refused.message)
        except BufferError as error:
            code = (
                grpc.StatusCode.NOT_FOUND
                if "unknown" in str(error)
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            context.abort(code, str(error))
        except Exception as error:  # the computation failed on the devices
            failure = self.runner.failure_of(request.buffer_id)
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, failure or f"{type(error).__name__}: {error}"
            )
        yield from region_chunks(request.buffer_id, value.dtype, value.shape, regions)

    def _wait_for(self, request: pb.ArrayRequest, context: grpc.ServicerContext) -> Any:
        """A buffer's value, waiting at most ``timeout_seconds`` (0: no limit) and the call's
        deadline, and only while the caller is there; raises ``BufferError`` naming why not."""
        buffer_id, timeout = request.buffer_id, request.timeout_seconds
        if not buffer_id or len(buffer_id) > MAX_BUFFER_ID:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"buffer_id must hold 1 to {MAX_BUFFER_ID} characters, not {len(buffer_id)}",
            )
        if not math.isfinite(timeout) or timeout < 0:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"timeout_seconds must be a finite number >= 0 (0: no limit), not {timeout}",
            )
        store = self.runner.buffers
        try:  # a ready buffer needs no waiting, hence no waiting slot
            return store.get(buffer_id, 0.0, 0.0)
        except BufferError as error:
            if not _not_yet(error, buffer_id):
                raise
        if not self._waiting.acquire(blocking=False):
            raise _Refused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_WAITING_GETS} GetArray calls already wait for buffers on executor "
                f"{self.index}; retry later",
            )
        try:
            start = time.monotonic()
            remaining = context.time_remaining()  # 0 once past the deadline
            limits = [timeout or math.inf, math.inf if remaining is None else remaining]
            # A buffer not announced yet may be one whose producer is queued behind long work:
            # a caller that asked to wait longer than the default waits for it that long.
            end, appear_end = start + min(limits), start + max(APPEAR_WITHIN_SECONDS, timeout)
            while True:
                now = time.monotonic()
                step = max(0.0, min(POLL_SECONDS, end - now))
                try:
                    return store.get(buffer_id, step, max(0.0, min(step, appear_end - now)))
                except BufferError as error:
                    if not _not_yet(error, buffer_id):
                        raise
                now = time.monotonic()
                known = buffer_id in store
                if not known and now >= min(end, appear_end):
                    raise BufferError(
                        f"unknown buffer {buffer_id!r} (not announced within {now - start:.1f} s)"
                    )
                if now >= end:
                    raise BufferError(f"{not_ready(buffer_id)} {now - start:.1f} s")
                if not context.is_active():
                    raise _Gone
        finally:
            self._waiting.release()

    def Info(self, request, context):
        buffers, buffer_bytes = self.runner.buffers.usage()
        return pb.ExecutorInfo(
            index=self.index,
            endpoint=self.endpoint,
            devices=sorted(self.local_devices),
            data_endpoint=self.data_plane.endpoint,
            control_endpoint=self.control.endpoint,
            platform=jax.default_backend(),
            buffers=buffers,
            buffer_bytes=buffer_bytes,
            inputs_taken_over=self.runner.inputs_taken_over,
            functions=self.runner.functions.loaded,
            executables=self.runner.executables,
            programs=self.runner.programs,
            incarnation=self.incarnation,
        )

    # -- data plane --------------------------------------------------------------------------

    def _fetch(self, source: pb.InputSource) -> np.ndarray:
        """Pull a buffer from the executors holding it over the bulk data plane: each sends the
        regions it holds, until the whole array is assembled."""
        errors = []
        assembly = Assembly()
        for endpoint in source.data_endpoints:
            try:
                # An upload is at its holders already: they answer at once (a buffer named
                # but never uploaded fails now instead of holding this executor up).
                appear = 0.0 if source.uploaded else None
                self._puller.pull(
                    endpoint,
                    source.buffer_id,
                    INPUT_TIMEOUT_SECONDS,
                    assembly,
                    appear,
                    until_ready=True,
                )
            except (OSError, ValueError, LookupError) as error:
                errors.append(f"{endpoint}: {error}")
            if assembly.complete:
                assert assembly.array is not None
                self.tally.add(PULLED, assembly.array.nbytes)
                return assembly.array
        problem = "; ".join(errors) or "the holders sent only part of it"
        raise BufferError(f"cannot fetch buffer {source.buffer_id!r}: {problem}")


class _Gone(Exception):
    """The caller of a waiting call went away (cancelled, or past its deadline)."""


class _Refused(Exception):
    """A call refused with a status code (raised where ``context.abort`` would be caught)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _not_yet(error: BufferError, buffer_id: str) -> bool:
    """Whether ``error`` only says the buffer is not there or not ready yet (rather than that
    it failed): the store's own words for those two."""
    message = str(error)
    return message.startswith((f"unknown buffer {buffer_id!r}", not_ready(buffer_id)))


def _checked_upload(chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """An upload's chunks, refused (``ValueError`` naming the field) as soon as they describe
    something other than an array (whole, or distinct regions inside its shape: the shards of
    an input sharded over several executors) whose bytes match their dtype and bounds, so that
    no memory is set aside for sizes the bytes sent do not back."""
    first: Chunk | None = None
    expected = received = announced = 0
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for chunk in chunks:
        if chunk.begin:
            if received != expected:
                raise ValueError(f"a region ended after {received} of {expected} bytes")
            if first is None:
                first = chunk
                if not chunk.buffer_id or len(chunk.buffer_id) > MAX_BUFFER_ID:
                    raise ValueError(
                        f"buffer_id must hold 1 to {MAX_BUFFER_ID} characters, "
                        f"not {len(chunk.buffer_id)}"
                    )
                dtype = numeric_dtype(chunk.dtype)
                shape = list(chunk.shape)
                if len(shape) > 64 or any(n < 0 for n in shape):
                    raise ValueError(f"shape {shape[:8]} must be at most 64 sizes, each >= 0")
            elif (chunk.buffer_id, chunk.dtype, list(chunk.shape)) != (
                first.buffer_id,
                first.dtype,
                shape,
            ):
                raise ValueError(
                    "the regions of an upload must share its buffer_id, dtype and shape"
                )
            starts = list(chunk.region_start) or [0] * len(shape)
            stops = list(chunk.region_stop) or shape
            if not len(starts) == len(stops) == len(shape) or not all(
                0 <= a <= b <= n for a, b, n in zip(starts, stops, shape, strict=True)
            ):
                raise ValueError(
                    f"region_start {starts[:8]} and region_stop {stops[:8]} must bound a region "
                    f"of shape {shape[:8]}"
                )
            bounds = (tuple(starts), tuple(stops))
            if bounds in seen:
                raise ValueError(f"the region {starts[:8]}-{stops[:8]} was sent twice")
            seen.add(bounds)
            expected = math.prod(b - a for a, b in zip(starts, stops, strict=True)) * dtype.itemsize
            if chunk.total_bytes != expected:
                raise ValueError(
                    f"total_bytes {chunk.total_bytes} does not match dtype {dtype.name} and "
                    f"region {starts[:8]}-{stops[:8]} ({expected} bytes)"
                )
            announced += expected
            if announced > math.prod(shape) * dtype.itemsize:
                raise ValueError(f"the regions hold more bytes than an array of shape {shape[:8]}")
            received = 0
        elif first is None:
            raise ValueError("array data arrived before its header")
        received += len(chunk.data)
        if received > expected:
            raise ValueError(f"more than the {expected} bytes announced in total_bytes arrived")
        yield chunk


def serve(
    index: int, first_device: int, host: str, port: int, tls: Tls | None = None
) -> tuple[grpc.Server, int]:
    """Start the executor's server (mutual TLS on every endpoint with ``tls``); returns it
    and the port it listens on."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS),
        # A port another process listens on is refused, not shared (gRPC's SO_REUSEPORT).
        options=[*MESSAGE_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    service = ExecutorService(index, first_device, host=host, tls=tls)
    server.add_generic_rpc_handlers([generic_handler(EXECUTOR, service)])
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, tls.server_credentials())
    service.endpoint = f"{host}:{bound}"
    server.start()
    publish_metrics(renderer(service))
    # Ready once its island's scheduler holds its command stream (took it, or took it back
    # after a restart): a pod that only listens would count as a usable host too early.
    publish_readiness(
        lambda: "" if service.control.connected else "no island scheduler holds its command stream"
    )
    return server, bound


def main(args: argparse.Namespace) -> None:
    try:
        tls = load()
    except TlsConfigError as error:
        raise SystemExit(f"pathways_executor: {error}") from None
    server, port = serve(args.index, args.first_device, args.host, args.port, tls)
    # The launcher reads this line to learn the port.
    ready = {"ready": True, "port": port, "devices": len(jax.local_devices())}
    if args.health_port is not None:
        ready["health"] = args.health_port
    print(json.dumps(ready), flush=True)

    def stop(signum: int, frame: object) -> None:
        # Exit at once: a distributed group's orderly shutdown would wait for the other hosts.
        server.stop(grace=0)
        os._exit(0)

    # Installed after JAX's own handlers (its preemption notifier also listens for SIGTERM).
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()  # (--exit-with-launcher: watched since the start)
    sys.exit(0)
