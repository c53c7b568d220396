"""A gRPC server speaking the IFRT proxy protocol (``xla.ifrt.proxy.GrpcIfrtService``).

A stock JAX program with the ``proxy`` backend registered (see ``docs/proxy.md``) connects here:

- ``GetVersion`` negotiates the protocol version (the highest both sides support) and the IFRT
  serdes version; a client whose range does not meet ours gets ``FAILED_PRECONDITION`` with both
  ranges in the message (the stock client then gives up with that message; it never sees a
  version it cannot handle, which would abort it).
- ``IfrtSession`` is one bidirectional stream per client: requests are handled in order by a
  :class:`~pathways_client.proxy.session.Session`; replies go back as they complete.
- ``HostBufferStore`` / ``HostBufferLookup`` / ``HostBufferDelete`` move array bytes in and out of
  a session's host buffer store, in 1 MiB chunks (read and written without the protobuf
  classes' copies, and held in memory JAX's CPU devices can take as it is).

The messages come from the installed jaxlib (:mod:`pathways_client.proxy.protocol`).
"""

from __future__ import annotations

import itertools
import logging
import queue
import secrets
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from pathways_client.proxy import protocol
from pathways_client.proxy.backend import Backend
from pathways_client.proxy.session import HostBuffers, Session
from pathways_core.wire.arrays import empty_for_devices
from pathways_core.wire.fields import append_bytes_field, split_bytes_field

log = logging.getLogger(__name__)

#: Protocol versions this server implements (see docs/proxy.md for what each one changed).
#: 16 added Executable::devices(); 21 moved execution results to FetchExecuteResult; 22 added
#: Device::PlatformName(); 23 a layout on MakeArrayFromHostBuffer. Both sides of each change
#: are handled here.
PROTOCOL_MIN = 16
PROTOCOL_MAX = 25
#: IFRT serdes versions we read: the payloads we parse carry their own version numbers.
SERDES_MIN = 0
SERDES_MAX = 1 << 20

SESSION_METADATA_KEY = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA_KEY = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
LOOKUP_CHUNK = 1 << 20
MAX_MESSAGE = 1 << 30
_END = object()


@dataclass
class ProxyConfig:
    """What a proxy server offers: its backend and the protocol range it accepts."""

    backend: Backend
    protocol_min: int = PROTOCOL_MIN
    protocol_max: int = PROTOCOL_MAX
    # How long a host buffer lookup waits for a store still in flight.
    lookup_timeout: float = 120.0
    # Sessions served at once; one more is refused (RESOURCE_EXHAUSTED), not left waiting.
    max_sessions: int = 64
    extra: dict[str, Any] = field(default_factory=dict)


class ProxyServer:
    """The servicer: negotiates versions, runs sessions and their host buffer stores."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.protocol = protocol.load()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._opening = 0  # sessions admitted, not yet in _sessions

    # -- helpers -------------------------------------------------------------------------------

    def sessions(self) -> list[Session]:
        """The sessions open now."""
        with self._lock:
            return list(self._sessions.values())

    def _buffers(self, session_id: int, context: grpc.ServicerContext) -> HostBuffers:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            # Never echo the id: it is a credential, and a guess must learn nothing.
            context.abort(grpc.StatusCode.NOT_FOUND, "no open session has this session_id")
        return session.host_buffers

    def _metadata(
        self,
        context: grpc.ServicerContext,
        key: str,
        message: str,
        method: str,
        missing: grpc.StatusCode,
        malformed: grpc.StatusCode,
    ) -> Any:
        """The protocol ``message`` the client sends as binary metadata ``key`` of ``method``;
        the call is aborted with ``missing`` without it, with ``malformed`` if it does not
        parse (the codes the stock server answers)."""
        raw = next((v for k, v in context.invocation_metadata() if k == key), None)
        if raw is None:
            context.abort(missing, f"missing metadata {key} for {method}")
        parsed = getattr(self.protocol, message)()
        try:
            parsed.ParseFromString(raw if isinstance(raw, bytes) else raw.encode())
        except Exception:
            context.abort(malformed, f"unable to parse {message}")
        return parsed

    def choose_version(self, request: Any) -> tuple[int, int] | str:
        """The (protocol, serdes) versions to use with a client, or why there are none."""
        lo, hi = request.min_version, request.max_version
        cfg = self.config
        if hi.protocol_version < lo.protocol_version:
            return (
                f"min_version.protocol_version {lo.protocol_version} is above "
                f"max_version.protocol_version {hi.protocol_version}"
            )
        version = min(hi.protocol_version, cfg.protocol_max)
        if version < max(lo.protocol_version, cfg.protocol_min):
            return (
                f"IFRT proxy protocol versions [{lo.protocol_version}, {hi.protocol_version}] "
                f"asked by the client do not meet the versions [{cfg.protocol_min}, "
                f"{cfg.protocol_max}] that the Pathways proxy implements: use a jaxlib whose "
                f"IFRT proxy client speaks a version in that range"
            )
        serdes = min(hi.ifrt_serdes_version_number, SERDES_MAX)
        if serdes < max(lo.ifrt_serdes_version_number, SERDES_MIN):
            return (
                f"IFRT serdes versions [{lo.ifrt_serdes_version_number}, "
                f"{hi.ifrt_serdes_version_number}] asked by the client are not supported"
            )
        return version, serdes

    # -- RPCs ----------------------------------------------------------------------------------

    def get_version(self, request: Any, context: grpc.ServicerContext) -> Any:
        """``GetVersion``: the highest protocol version both sides speak."""
        chosen = self.choose_version(request)
        if isinstance(chosen, str):
            log.warning("refused a client: %s", chosen)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, chosen)
        response = self.protocol.GrpcGetVersionResponse()
        response.version.protocol_version, response.version.ifrt_serdes_version_number = chosen
        return response

    def ifrt_session(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        """``IfrtSession``: one client's ordered requests and their replies."""
        metadata = self._metadata(
            context,
            SESSION_METADATA_KEY,
            "GrpcIfrtSessionMetadata",
            "GrpcIfrtService.IfrtSession",
            missing=grpc.StatusCode.INVALID_ARGUMENT,
            malformed=grpc.StatusCode.INVALID_ARGUMENT,
        )
        version = metadata.version.protocol_version
        if not self.config.protocol_min <= version <= self.config.protocol_max:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {version} in the session metadata is outside the versions "
                f"[{self.config.protocol_min}, {self.config.protocol_max}] of the Pathways proxy",
            )
        limit = self.config.max_sessions
        with self._lock:
            admitted = len(self._sessions) + self._opening < limit
            if admitted:
                self._opening += 1
                session_id = _unguessable_id(self._sessions)
        if not admitted:
            log.warning("refused a session from %s: %d are open", context.peer(), limit)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the Pathways proxy serves at most {limit} sessions at once and {limit} are "
                "open: end one, or start the proxy with a larger --max-sessions",
            )
        number = next(self._ids)
        replies: queue.Queue[Any] = queue.Queue()
        try:
            session = Session(
                session_id=session_id,
                protocol=self.protocol,
                version=metadata.version,
                backend=self.config.backend,
                reply=replies.put,
                peer=context.peer(),
                lookup_timeout=self.config.lookup_timeout,
                number=number,
            )
        except BaseException:
            with self._lock:
                self._opening -= 1
            raise
        with self._lock:
            self._opening -= 1
            self._sessions[session_id] = session
        log.info("session %d opened by %s (protocol %d)", number, context.peer(), version)

        def read() -> None:
            try:
                for request in requests:
                    session.submit(request)
            except grpc.RpcError:  # the client cancelled its stream: how stock clients end
                log.info("session %d: its client ended the stream", number)
                session.abandon()
            except Exception as exc:
                log.warning("session %d: stream broken: %r", number, exc)
                session.abandon()
            finally:
                session.drain()
                replies.put(_END)

        reader = threading.Thread(target=read, name=f"proxy-session-{number}", daemon=True)
        reader.start()
        context.add_callback(lambda: replies.put(_END))
        try:
            while True:
                item = replies.get()
                if item is _END:
                    break
                yield item
        finally:
            session.close()
            with self._lock:
                self._sessions.pop(session_id, None)
            log.info("session %d closed", number)

    def host_buffer_store(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        """``HostBufferStore``: bytes of one host buffer, streamed in chunks."""
        metadata = self._metadata(
            context,
            STORE_METADATA_KEY,
            "GrpcHostBufferStoreMetadata",
            "HostBufferStore",
            missing=grpc.StatusCode.INTERNAL,
            malformed=grpc.StatusCode.DATA_LOSS,
        )
        buffers = self._buffers(metadata.session_id, context)
        size = metadata.buffer_size
        if size < 0:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"host buffer {metadata.handle}: buffer_size {size} is negative",
            )
        try:
            data = empty_for_devices(size, np.uint8)
        except MemoryError:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"host buffer {metadata.handle}: buffer_size {size} bytes does not fit in the "
                "proxy's memory",
            )
        filled = 0
        for chunk in requests:  # each a view of the chunk's bytes (_chunk_data)
            end = filled + len(chunk)
            if end > size:
                context.abort(
                    grpc.StatusCode.DATA_LOSS,
                    f"host buffer {metadata.handle}: expected buffer_size {size} bytes but got "
                    f"more ({end} so far)",
                )
            data[filled:end] = np.frombuffer(chunk, np.uint8)
            filled = end
        if filled != size:
            context.abort(
                grpc.StatusCode.DATA_LOSS,
                f"host buffer {metadata.handle}: expected buffer_size {size} bytes but got "
                f"{filled}",
            )
        error = buffers.store(metadata.handle, data)
        if error:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, error)
        return self.protocol.GrpcHostBufferStoreResponse()

    def host_buffer_lookup(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """``HostBufferLookup``: a stored buffer in 1 MiB chunks (one empty chunk if empty),
        each a view of the buffer serialized by ``_chunk_message``."""
        buffers = self._buffers(request.session_id, context)
        data = buffers.lookup(request.handle, self.config.lookup_timeout)
        if isinstance(data, str):
            context.abort(grpc.StatusCode.NOT_FOUND, data)
        view = memoryview(data)
        if not len(view):
            yield view
            return
        for offset in range(0, len(view), LOOKUP_CHUNK):
            yield view[offset : offset + LOOKUP_CHUNK]

    def host_buffer_delete(self, request: Any, context: grpc.ServicerContext) -> Any:
        """``HostBufferDelete``: forget a host buffer."""
        buffers = self._buffers(request.session_id, context)
        error = buffers.delete(request.handle)
        if error:
            context.abort(grpc.StatusCode.NOT_FOUND, error)
        return self.protocol.GrpcHostBufferDeleteResponse()

    def host_buffer_read_from_disk(self, request: Any, context: grpc.ServicerContext) -> Any:
        """``HostBufferReadFromDisk``: not offered (the client uses it only when told a shared
        directory exists, which this server never advertises)."""
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "HostBufferReadFromDisk is not supported by the Pathways proxy",
        )

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler registering every method of ``GrpcIfrtService``."""
        methods = {  # name: (cardinality, behaviour)
            "GetVersion": ("unary_unary", self.get_version),
            "IfrtSession": ("stream_stream", self.ifrt_session),
            "HostBufferStore": ("stream_unary", self.host_buffer_store),
            "HostBufferLookup": ("unary_stream", self.host_buffer_lookup),
            "HostBufferDelete": ("unary_unary", self.host_buffer_delete),
            "HostBufferReadFromDisk": ("unary_unary", self.host_buffer_read_from_disk),
        }
        handlers = {}
        for name, (cardinality, behaviour) in methods.items():
            # Each request message is Grpc<method>Request, but IfrtSession's is IfrtRequest.
            request = "IfrtRequest" if name == "IfrtSession" else f"Grpc{name}Request"
            deserialize = self.protocol.message(f"xla.ifrt.proxy.{request}").FromString
            serialize = _serialize
            if name == "HostBufferStore":
                deserialize = _chunk_data
            elif name == "HostBufferLookup":
                serialize = _chunk_message
            handlers[name] = getattr(grpc, f"{cardinality}_rpc_method_handler")(
                behaviour, request_deserializer=deserialize, response_serializer=serialize
            )
        return grpc.method_handlers_generic_handler(protocol.SERVICE_NAME, handlers)


UNARY_WORKERS = 16
"""Workers beyond one per session: for host buffer calls, and to refuse one session too many
at once (a call finding no worker would wait, not be refused)."""


MAX_PENDING_CALLS = 1 << 20
"""Calls gRPC holds for a worker before it refuses more: as many as a client may start at
once (every leaf of a pytree of arrays is one host buffer call)."""


def serve(
    config: ProxyConfig,
    address: str = "127.0.0.1:0",
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, int, ProxyServer]:
    """Start a proxy server on ``address``; returns the started server, its port and servicer.
    Every open session holds one worker thread for its reply stream: there are
    ``config.max_sessions`` of them, and ``UNARY_WORKERS`` more."""
    servicer = ProxyServer(config)
    workers = config.max_sessions + UNARY_WORKERS
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="proxy-rpc"),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
            # A port another process listens on is refused, not shared (gRPC's default
            # SO_REUSEPORT split clients at random between two proxies on one port).
            ("grpc.so_reuseport", 0),
            # A stock client sends every host buffer of a pytree at once, each its own call:
            # beyond gRPC's default 1,000 calls awaiting a worker (3,000 at most), it cancelled
            # the later ones and the client dropped its whole session.
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
        ],
    )
    server.add_generic_rpc_handlers((servicer.handler(),))
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError:  # gRPC's "Failed to bind to address"
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address} (is another process listening on it?)")
    server.start()
    return server, port, servicer


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


# GrpcHostBufferStoreRequest and GrpcHostBufferLookupResponse carry one field, ``bytes data =
# 1``: a chunk of a host buffer, read as a view of the received bytes and written in one copy
# (see pathways_core.wire.fields).
def _chunk_data(message: bytes) -> memoryview:
    return split_bytes_field(message, 1)[1]


def _chunk_message(data: memoryview) -> bytes:
    return append_bytes_field(b"", 1, data)


def _unguessable_id(taken: dict[int, Any]) -> int:
    """A new session id: the stock client's host buffer calls carry nothing but this id, so it
    must not be guessable (63 random bits; never 0, never one in use)."""
    while True:
        candidate = secrets.randbits(63)
        if candidate and candidate not in taken:
            return candidate
