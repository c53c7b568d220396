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

The server runs on one asyncio loop (``grpc.aio``): a call waiting for its client (an upload
whose next chunk is slow to come, a client stopped in a debugger) holds no thread, so one
client cannot keep the others waiting; each session's requests run on a thread of its own.

The messages come from the installed jaxlib (:mod:`pathways_client.proxy.protocol`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
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
        # Open sessions by id (None: admitted, still opening).
        self._sessions: dict[int, Session | None] = {}
        # Blocking work of sessions (waiting for their last replies, closing them), off the loop.
        self.closing = ThreadPoolExecutor(
            max_workers=SESSION_END_WORKERS, thread_name_prefix="proxy-session-end"
        )
        self.stopping = False  # the proxy stops: its sessions end with it

    # -- helpers -------------------------------------------------------------------------------

    def sessions(self) -> list[Session]:
        """The sessions open now."""
        with self._lock:
            return [session for session in self._sessions.values() if session is not None]

    async def _buffers(self, session_id: int, context: grpc.aio.ServicerContext) -> HostBuffers:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            # Never echo the id: it is a credential, and a guess must learn nothing.
            await context.abort(grpc.StatusCode.NOT_FOUND, "no open session has this session_id")
        return session.host_buffers

    async def _metadata(
        self,
        context: grpc.aio.ServicerContext,
        key: str,
        message: str,
        method: str,
        missing: grpc.StatusCode,
        malformed: grpc.StatusCode,
    ) -> Any:
        """The protocol ``message`` the client sends as binary metadata ``key`` of ``method``;
        the call is aborted with ``missing`` without it, with ``malformed`` if it does not
        parse (the codes the stock server answers)."""
        raw = next((v for k, v in context.invocation_metadata() or () if k == key), None)
        if raw is None:
            await context.abort(missing, f"missing metadata {key} for {method}")
        parsed = getattr(self.protocol, message)()
        try:
            parsed.ParseFromString(raw if isinstance(raw, bytes) else raw.encode())
        except Exception:
            await context.abort(malformed, f"unable to parse {message}")
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

    async def get_version(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """``GetVersion``: the highest protocol version both sides speak."""
        chosen = self.choose_version(request)
        if isinstance(chosen, str):
            log.warning("refused a client: %s", chosen)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, chosen)
        response = self.protocol.GrpcGetVersionResponse()
        response.version.protocol_version, response.version.ifrt_serdes_version_number = chosen
        return response

    async def ifrt_session(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """``IfrtSession``: one client's ordered requests and their replies."""
        metadata = await self._metadata(
            context,
            SESSION_METADATA_KEY,
            "GrpcIfrtSessionMetadata",
            "GrpcIfrtService.IfrtSession",
            missing=grpc.StatusCode.INVALID_ARGUMENT,
            malformed=grpc.StatusCode.INVALID_ARGUMENT,
        )
        version = metadata.version.protocol_version
        if not self.config.protocol_min <= version <= self.config.protocol_max:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {version} in the session metadata is outside the versions "
                f"[{self.config.protocol_min}, {self.config.protocol_max}] of the Pathways proxy",
            )
        limit = self.config.max_sessions
        with self._lock:
            if len(self._sessions) >= limit:
                session_id = 0
            else:
                session_id = _unguessable_id(self._sessions)
                self._sessions[session_id] = None
        if not session_id:
            log.warning("refused a session from %s: %d are open", context.peer(), limit)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the Pathways proxy serves at most {limit} sessions at once and {limit} are "
                "open: end one, or start the proxy with a larger --max-sessions",
            )
        number = next(self._ids)
        loop = asyncio.get_running_loop()
        replies: asyncio.Queue[Any] = asyncio.Queue()
        try:
            session = Session(
                session_id=session_id,
                protocol=self.protocol,
                version=metadata.version,
                backend=self.config.backend,
                # Replies come from the session's threads.
                reply=lambda item: loop.call_soon_threadsafe(replies.put_nowait, item),
                peer=context.peer(),
                lookup_timeout=self.config.lookup_timeout,
                number=number,
            )
        except BaseException:
            with self._lock:
                del self._sessions[session_id]
            raise
        with self._lock:
            self._sessions[session_id] = session
        log.info("session %d opened by %s (protocol %d)", number, context.peer(), version)

        async def read() -> None:
            try:
                async for request in requests:
                    session.submit(request)
            except Exception as exc:
                log.warning("session %d: stream broken: %r", number, exc)
                session.abandon()
            # Its stream ended: the replies still to come, then the end of the replies.
            await loop.run_in_executor(self.closing, session.drain)
            replies.put_nowait(_END)

        reader = asyncio.create_task(read())
        answered = False
        try:
            while (item := await replies.get()) is not _END:
                yield item
            answered = True
        except asyncio.CancelledError:  # the client cancelled its stream: how stock clients end
            if self.stopping:
                log.info("session %d: ended by the proxy stopping", number)
            else:
                log.info("session %d: its client ended the stream", number)
            raise
        finally:
            if not answered:
                # Cancelled, or closed at a ``yield`` (GeneratorExit: the client died while a
                # reply was written), which skipped the branch above: the session's worker
                # ran every request left queued against its freed state (43,000 failures).
                session.abandon()
            reader.cancel()
            with self._lock:
                self._sessions.pop(session_id, None)
            # Its slice and arrays are freed off the loop (the island may be slow to answer).
            self.closing.submit(self._close, session)

    @staticmethod
    def _close(session: Session) -> None:
        session.close()
        log.info("session %d closed", session.number)

    async def host_buffer_store(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> Any:
        """``HostBufferStore``: bytes of one host buffer, streamed in chunks."""
        metadata = await self._metadata(
            context,
            STORE_METADATA_KEY,
            "GrpcHostBufferStoreMetadata",
            "HostBufferStore",
            missing=grpc.StatusCode.INTERNAL,
            malformed=grpc.StatusCode.DATA_LOSS,
        )
        buffers = await self._buffers(metadata.session_id, context)
        size = metadata.buffer_size
        if size < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"host buffer {metadata.handle}: buffer_size {size} is negative",
            )
        try:
            data = empty_for_devices(size, np.uint8)
        except MemoryError:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"host buffer {metadata.handle}: buffer_size {size} bytes does not fit in the "
                "proxy's memory",
            )
        filled = 0
        async for chunk in requests:  # each a view of the chunk's bytes (_chunk_data)
            end = filled + len(chunk)
            if end > size:
                await context.abort(
                    grpc.StatusCode.DATA_LOSS,
                    f"host buffer {metadata.handle}: expected buffer_size {size} bytes but got "
                    f"more ({end} so far)",
                )
            data[filled:end] = np.frombuffer(chunk, np.uint8)
            filled = end
        if filled != size:
            await context.abort(
                grpc.StatusCode.DATA_LOSS,
                f"host buffer {metadata.handle}: expected buffer_size {size} bytes but got "
                f"{filled}",
            )
        error = buffers.store(metadata.handle, data)
        if error:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, error)
        return self.protocol.GrpcHostBufferStoreResponse()

    async def host_buffer_lookup(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """``HostBufferLookup``: a stored buffer in 1 MiB chunks (one empty chunk if empty),
        each a view of the buffer serialized by ``_chunk_message``."""
        buffers = await self._buffers(request.session_id, context)
        data = await buffers.lookup_async(request.handle, self.config.lookup_timeout)
        if isinstance(data, str):
            await context.abort(grpc.StatusCode.NOT_FOUND, data)
        view = memoryview(data)
        if not len(view):
            yield view
            return
        for offset in range(0, len(view), LOOKUP_CHUNK):
            yield view[offset : offset + LOOKUP_CHUNK]

    async def host_buffer_delete(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """``HostBufferDelete``: forget a host buffer."""
        buffers = await self._buffers(request.session_id, context)
        error = buffers.delete(request.handle)
        if error:
            await context.abort(grpc.StatusCode.NOT_FOUND, error)
        return self.protocol.GrpcHostBufferDeleteResponse()

    async def host_buffer_read_from_disk(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        """``HostBufferReadFromDisk``: not offered (the client uses it only when told a shared
        directory exists, which this server never advertises)."""
        await context.abort(
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


SESSION_END_WORKERS = 16
"""Threads that wait for sessions' last replies and close them (off the server's loop)."""


MAX_PENDING_CALLS = 1 << 20
"""Calls gRPC holds for their handler before it refuses more: as many as a client may start at
once (every leaf of a pytree of arrays is one host buffer call)."""


class RunningProxy:
    """A proxy server serving on an event loop of its own thread."""

    def __init__(self, servicer: ProxyServer) -> None:
        self.servicer = servicer
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="proxy-server", daemon=True
        )
        self._thread.start()
        self.server: grpc.aio.Server | None = None

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self, grace: float) -> None:
        """Stop serving: calls in flight get ``grace`` seconds, then every session ends (its
        slice and arrays freed) before this returns."""
        self.servicer.stopping = True
        if self.server is not None:
            self.run(self.server.stop(grace))
        self.servicer.closing.shutdown(wait=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def serve(
    config: ProxyConfig,
    address: str = "127.0.0.1:0",
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[RunningProxy, int, ProxyServer]:
    """Start a proxy server on ``address``; returns the running server, its port and
    servicer."""
    servicer = ProxyServer(config)
    running = RunningProxy(servicer)

    async def start() -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                # A port another process listens on is refused, not shared (gRPC's default
                # SO_REUSEPORT split clients at random between two proxies on one port).
                ("grpc.so_reuseport", 0),
                # A stock client sends every host buffer of a pytree at once, each its own
                # call: beyond gRPC's default 1,000 calls awaiting their handler (3,000 at
                # most), it cancelled the later ones and the client dropped its whole session.
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
        if port:
            await server.start()
            running.server = server
        return port

    port = running.run(start())
    if port == 0:
        running.stop(0)
        raise OSError(
            f"cannot listen on {address}: another process listens on that port, or the host "
            "is not an address of this machine"
        )
    return running, port, servicer


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
