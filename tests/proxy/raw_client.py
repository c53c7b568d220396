"""A bare IFRT proxy client built from the protocol's messages: sends exactly what a test
says (including what the stock client never would) and returns the server's replies."""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

import grpc

from pathways_client.proxy import protocol
from pathways_client.proxy.server import SESSION_METADATA_KEY, STORE_METADATA_KEY

P = protocol.load()
_END = object()


def method(channel: grpc.Channel, name: str, kind: str, request: str, response: str) -> Any:
    return getattr(channel, kind)(
        f"/{protocol.SERVICE_NAME}/{name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=P.message(f"xla.ifrt.proxy.{response}").FromString,
    )


def get_version(channel: grpc.Channel, low: int, high: int, serdes: int = 3) -> Any:
    request = P.GrpcGetVersionRequest()
    request.min_version.protocol_version = low
    request.max_version.protocol_version = high
    request.max_version.ifrt_serdes_version_number = serdes
    call = method(channel, "GetVersion", "unary_unary", "", "GrpcGetVersionResponse")
    return call(request, timeout=30)


class RawSession:
    """One ``IfrtSession`` stream; :meth:`call` sends a request and waits for its reply."""

    def __init__(self, channel: grpc.Channel, version: int = 25, metadata: bool = True) -> None:
        self.channel = channel
        self._ops = itertools.count(1)
        self._requests: queue.Queue[Any] = queue.Queue()
        self._replies: dict[int, Any] = {}
        self._cond = threading.Condition()
        md = P.GrpcIfrtSessionMetadata()
        md.version.protocol_version = version
        md.version.ifrt_serdes_version_number = 3
        stream = method(channel, "IfrtSession", "stream_stream", "", "IfrtResponse")
        self._call = stream(
            iter(self._requests.get, _END),
            metadata=[(SESSION_METADATA_KEY, md.SerializeToString())] if metadata else None,
        )
        self.error: grpc.RpcError | None = None
        threading.Thread(target=self._read, daemon=True).start()
        self.session_id = 0

    def _read(self) -> None:
        try:
            for reply in self._call:
                with self._cond:
                    self._replies[reply.response_metadata.op_id] = reply
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def call(self, kind: str, message: Any | None = None, timeout: float = 60.0) -> Any:
        """Send ``IfrtRequest.<kind>`` and return the whole ``IfrtResponse``."""
        request = P.IfrtRequest()
        op_id = next(self._ops)
        request.request_metadata.op_id = op_id
        field = getattr(request, kind)
        if message is not None:
            field.CopyFrom(message)
        else:
            field.SetInParent()
        self._requests.put(request)
        with self._cond:
            self._cond.wait_for(lambda: op_id in self._replies or self.error, timeout)
            if op_id in self._replies:
                return self._replies.pop(op_id)
        raise AssertionError(f"no reply to {kind}: {self.error}")

    def init(self) -> Any:
        reply = self.call("init_request")
        self.session_id = reply.init_response.session_id
        return reply.init_response

    def store(self, handle: int, data: bytes, size: int | None = None, chunk: int = 1 << 20) -> Any:
        md = P.GrpcHostBufferStoreMetadata()
        md.session_id, md.handle = self.session_id, handle
        md.buffer_size = len(data) if size is None else size
        call = method(
            self.channel, "HostBufferStore", "stream_unary", "", "GrpcHostBufferStoreResponse"
        )
        chunks = [
            P.GrpcHostBufferStoreRequest(data=data[i : i + chunk])
            for i in range(0, len(data), chunk)
        ]
        return call(
            iter(chunks), metadata=[(STORE_METADATA_KEY, md.SerializeToString())], timeout=30
        )

    def lookup(self, handle: int) -> list[bytes]:
        call = method(
            self.channel, "HostBufferLookup", "unary_stream", "", "GrpcHostBufferLookupResponse"
        )
        request = P.GrpcHostBufferLookupRequest(session_id=self.session_id, handle=handle)
        return [r.data for r in call(request, timeout=30)]

    def delete(self, handle: int) -> Any:
        call = method(
            self.channel, "HostBufferDelete", "unary_unary", "", "GrpcHostBufferDeleteResponse"
        )
        return call(
            P.GrpcHostBufferDeleteRequest(session_id=self.session_id, handle=handle), timeout=30
        )

    def close(self) -> None:
        self._requests.put(_END)


def unparsable_compile() -> Any:
    """A ``CompileRequest`` of an XLA program that is not StableHLO."""
    request = P.CompileRequest()
    request.program.type_name = "xla::ifrt::XlaProgram"
    request.program.data = b"this is not StableHLO"
    request.compile_options.type_name = "xla::ifrt::XlaCompileOptions"
    return request


def single_device_sharding(device_id: int) -> Any:
    sharding = P.ShardingProto()
    sharding.serialized_sharding.type_name = "xla::ifrt::SingleDeviceSharding"
    sharding.serialized_sharding.data = P.SingleDeviceShardingProto(
        device_id=device_id
    ).SerializeToString()
    return sharding
