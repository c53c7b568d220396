"""The executor's servers, a thin shell around the runner: gRPC for arrays and information,
the control stream for the scheduler's commands, the bulk data plane for peers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from concurrent import futures

import grpc
import jax
import numpy as np

from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.arrays import Assembly, from_chunks, region_chunks
from pathways_executor.arrays import local_regions
from pathways_executor.buffers import BufferError
from pathways_executor.control import ControlServer
from pathways_executor.data_plane import DataPlaneServer, Puller
from pathways_executor.rpc import MESSAGE_OPTIONS, generic_handler
from pathways_executor.runner import INPUT_TIMEOUT_SECONDS, Runner

# How long a requested buffer may take to be announced by the island's command stream.
APPEAR_WITHIN_SECONDS = 30.0


class ExecutorService:
    """Implements ``pathways.v1.Executor``."""

    def __init__(
        self, index: int, first_device: int, endpoint: str = "", host: str = "127.0.0.1"
    ) -> None:
        self.index = index
        self.endpoint = endpoint
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
        self._puller = Puller()
        self.runner = Runner(index, self.island_devices, self._fetch, self._emit)
        self.control = ControlServer(self.runner.submit, host)
        self.data_plane = DataPlaneServer(
            lambda buffer_id, timeout: self.runner.buffers.get(
                buffer_id, timeout, APPEAR_WITHIN_SECONDS
            ),
            host,
        )

    def _emit(self, events: list[pb.ExecutorEvent]) -> None:
        self.control.emit(events)

    # -- arrays ------------------------------------------------------------------------------

    def PutArray(self, chunks, context):
        try:
            buffer_id, array = from_chunks(chunks)
        except ValueError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad array upload: {error}")
        self.runner.put_array(buffer_id, array)
        return pb.Ack(message=f"stored {buffer_id}")

    def GetArray(self, request, context):
        timeout = request.timeout_seconds or None
        try:
            value = self.runner.buffers.get(request.buffer_id, timeout, APPEAR_WITHIN_SECONDS)
            regions = local_regions(value)
        except BufferError as error:
            code = (
                grpc.StatusCode.NOT_FOUND
                if "unknown" in str(error)
                else grpc.StatusCode.FAILED_PRECONDITION
            )
            context.abort(code, str(error))
        except Exception as error:  # the computation failed on the devices
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{type(error).__name__}: {error}")
        yield from region_chunks(request.buffer_id, value.dtype, value.shape, regions)

    def Info(self, request, context):
        return pb.ExecutorInfo(
            index=self.index,
            endpoint=self.endpoint,
            devices=sorted(self.local_devices),
            data_endpoint=self.data_plane.endpoint,
            control_endpoint=self.control.endpoint,
            platform=jax.default_backend(),
        )

    # -- data plane --------------------------------------------------------------------------

    def _fetch(self, source: pb.InputSource) -> np.ndarray:
        """Pull a buffer from the executors holding it over the bulk data plane: each sends the
        regions it holds, until the whole array is assembled."""
        errors = []
        assembly = Assembly()
        for endpoint in source.data_endpoints:
            try:
                self._puller.pull(endpoint, source.buffer_id, INPUT_TIMEOUT_SECONDS, assembly)
            except (OSError, ValueError, LookupError) as error:
                errors.append(f"{endpoint}: {error}")
            if assembly.complete:
                assert assembly.array is not None
                return assembly.array
        problem = "; ".join(errors) or "the holders sent only part of it"
        raise BufferError(f"cannot fetch buffer {source.buffer_id!r}: {problem}")


def serve(index: int, first_device: int, host: str, port: int) -> tuple[grpc.Server, int]:
    """Start the executor's server; returns it and the port it listens on."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=MESSAGE_OPTIONS)
    service = ExecutorService(index, first_device, host=host)
    server.add_generic_rpc_handlers([generic_handler(EXECUTOR, service)])
    bound = server.add_insecure_port(f"{host}:{port}")
    service.endpoint = f"{host}:{bound}"
    server.start()
    return server, bound


def main(args: argparse.Namespace) -> None:
    server, port = serve(args.index, args.first_device, args.host, args.port)
    # The launcher reads this line to learn the port.
    print(
        json.dumps({"ready": True, "port": port, "devices": len(jax.local_devices())}), flush=True
    )

    def stop(signum: int, frame: object) -> None:
        # Exit at once: a distributed group's orderly shutdown would wait for the other hosts.
        server.stop(grace=0)
        os._exit(0)

    # Installed after JAX's own handlers (its preemption notifier also listens for SIGTERM).
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait_for_termination()
    sys.exit(0)
