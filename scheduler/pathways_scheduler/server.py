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
import itertools
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any, TypeVar

import grpc

from pathways_core import flags
from pathways_core.scheduling import (
    ARTIFACT_LIMIT_ENV,
    DEFAULT_MAX_ARTIFACT_BYTES,
    DEFAULT_MAX_QUEUED,
    DEFAULT_RUN_LENGTH,
    DEFAULT_TRACE_LIMIT,
    ExecutorSpec,
    Instruction,
    IslandDispatcher,
    Policy,
    ToClient,
    ToExecutor,
    artifact_limit_from,
    check_artifact_limit,
)
from pathways_core.scheduling.limits import MAX_REQUEST_BYTES
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.credentials import (
    SESSION_KEY_ENV,
    CredentialError,
    SessionGrant,
    check_key,
    credential_needed,
    verify,
)
from pathways_core.wire.streams import (
    CONTROL_TOKEN_ENV,
    HANDSHAKE_TIMEOUT_SECONDS,
    MAX_FRAME_BYTES,
    FrameError,
    frame,
    frames,
    messages,
)
from pathways_scheduler.health import publish_metrics, serve_health
from pathways_scheduler.lifeline import stop_when_stdin_closes
from pathways_scheduler.metrics import renderer
from pathways_scheduler.rpc import MESSAGE_OPTIONS, generic_handler, stub
from pathways_scheduler.tls import Tls, TlsConfigError, channel, load

# A peer that takes no bytes for this long is considered gone (its stream is closed), so one
# stuck client cannot stall the island.
SEND_TIMEOUT_SECONDS = 60
# An executor heard from not even by its heartbeat (every second) for this long is lost: long
# enough for a busy host's interpreter (a large upload's copy holds it for a while).
DEFAULT_EXECUTOR_TIMEOUT_SECONDS = 30.0
# A lost executor's endpoint is asked this often whether a restarted one answers there.
REJOIN_POLL_SECONDS = 1.0
# A restarted executor that took the scheduler's hello sends its heartbeat (every second)
# within this long; one that refused it closes the stream.
HELLO_ANSWER_SECONDS = 5.0
# A completion held for a client's next event (see pathways_core.scheduling.island) goes out
# after this long at the latest: a 1 ms computation behind two 4 s ones was reported 4 s late.
MAX_HOLD_SECONDS = 0.005
# A client's events not yet taken by it: beyond this its session is ended (it stopped reading).
MAX_BACKLOG_BYTES = 64 << 20
# Writes of at most this many bytes to a TLS stream go out at once when its socket has room.
SMALL_WRITE_BYTES = 16 << 10
MAX_CLIENT_NAME = 256
# A trace answer's size at most, under the gRPC message limit (64 MiB).
MAX_TRACE_ANSWER_BYTES = 48 << 20
# A client's messages that run on devices (the rest ride along with them).
WORK = ("computation", "call")
# Deletions of many buffers are sent to executors in pieces of this many ids.
DELETE_PIECE = 4096

T = TypeVar("T")


class Peer:
    """The sending side of one control stream. Messages are queued under the dispatcher's lock,
    so they are in dispatch order, and written by whichever thread flushes first.

    A client's peer (``hand_off``) never makes the flushing thread wait on its socket: what the
    socket cannot take at once is handed to a writer thread of the peer's own, so a client that
    stops reading holds up no executor's events and no other client; past
    ``MAX_BACKLOG_BYTES`` it is dropped. An executor's peer writes in the caller (the executor
    is the island's own; waiting on it is back-pressure)."""

    def __init__(
        self, connection: socket.socket, wrap: Callable[[list[Any]], Any], hand_off: bool = False
    ) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_SECONDS, 0)
        )
        self.connection = connection
        self._wrap = wrap
        self._hand_off = hand_off
        self._pending: list[Any] = []
        self._pending_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._backlog: list[bytes] | None = None  # a writer thread is sending these
        self._backlog_bytes = 0
        self._closed = False

    def queue(self, message: Any) -> None:
        with self._pending_lock:
            self._pending.append(message)

    def flush(self) -> None:
        """Write what is queued. Taking and writing under one lock keeps the order."""
        with self._send_lock:
            with self._pending_lock:
                items, self._pending = self._pending, []
            if not items or self._closed:
                return
            try:
                data = frames(items, self._wrap)
            except FrameError:  # one message over the cap: the peer could not take it
                self._close_locked()
                return
            if not self._hand_off:
                try:
                    self.connection.sendall(data)
                except OSError:
                    self._close_locked()  # its reader sees the stream end, reports it gone
                return
            if self._backlog is not None:  # the writer has more to send: behind it
                self._add_backlog(data)
                return
            try:
                sent = self._send_now(data)
            except OSError:
                self._close_locked()
                return
            if sent < len(data):
                self._backlog = []
                self._add_backlog(data[sent:])
                threading.Thread(
                    target=self._write_backlog, name="client-writer", daemon=True
                ).start()

    def _send_now(self, data: bytes) -> int:
        """As many bytes of ``data`` as the socket takes without waiting."""
        connection = self.connection
        if isinstance(connection, socket.socket):
            sent = 0
            while sent < len(data):
                try:
                    sent += connection.send(memoryview(data)[sent:], socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
            return sent
        # A TLS stream encrypts whole writes: one goes out now if it is small and there is room.
        if len(data) <= SMALL_WRITE_BYTES:
            _, writable, _ = select.select([], [connection], [], 0)
            if writable:
                connection.sendall(data)
                return len(data)
        return 0

    def _add_backlog(self, data: bytes) -> None:
        assert self._backlog is not None
        self._backlog.append(data)
        self._backlog_bytes += len(data)
        if self._backlog_bytes > MAX_BACKLOG_BYTES:
            self._close_locked()  # it stopped reading its events

    def _write_backlog(self) -> None:
        while True:
            with self._send_lock:
                backlog = self._backlog or []
                if not backlog or self._closed:
                    self._backlog, self._backlog_bytes = None, 0
                    return
                self._backlog, self._backlog_bytes = [], 0
            try:
                self.connection.sendall(b"".join(backlog))
            except OSError:
                with self._send_lock:
                    self._backlog, self._backlog_bytes = None, 0
                    self._close_locked()
                return

    def _close_locked(self) -> None:
        self._closed = True
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class HeldCompletions:
    """Flushes a client's held completions at most ``MAX_HOLD_SECONDS`` after the first one
    was held, from one thread (a timer per hold would start a thread per batch)."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[float, Peer]] = {}
        self._changed = threading.Condition()
        threading.Thread(target=self._run, name="held-completions", daemon=True).start()

    def hold(self, peer: Peer) -> None:
        with self._changed:
            if id(peer) not in self._due:
                self._due[id(peer)] = (time.monotonic() + MAX_HOLD_SECONDS, peer)
                self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._due:
                    self._changed.wait()
                now = time.monotonic()
                due = [key for key, (when, _) in self._due.items() if when <= now]
                if not due:
                    self._changed.wait(min(when for when, _ in self._due.values()) - now)
                    continue
                peers = [self._due.pop(key)[1] for key in due]
            for peer in peers:
                peer.flush()  # nothing to write if its next event took them already


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
        tls: Tls | None = None,
        *,
        max_queued_per_client: int | None = None,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        run_length: int = DEFAULT_RUN_LENGTH,
        executor_timeout: float = DEFAULT_EXECUTOR_TIMEOUT_SECONDS,
        trace_limit: int = DEFAULT_TRACE_LIMIT,
        session_key: bytes | None = None,
        max_queued_per_tenant: int | None = None,
    ) -> None:
        """``session_key``: every session's hello must carry a credential it signed, and the
        session is held to its grant (see :mod:`pathways_core.wire.credentials`)."""
        self.island = island
        self._tls = tls
        self._session_key = session_key
        self._grants: dict[str, SessionGrant] = {}  # per session, with a session key
        self._lock = threading.Lock()
        self._clients: dict[str, Peer] = {}
        self._executors: dict[int, Peer] = {}
        # Executors' command streams: when each last sent anything (its heartbeat at least
        # every second), and why one silent too long was cut off.
        self._streams: dict[int, socket.socket] = {}
        self._heard: dict[int, float] = {}
        self._silent: dict[int, str] = {}
        self._executor_timeout = executor_timeout
        self._held = HeldCompletions()
        # Each executor's process, by its incarnation: a lost one is taken back only as a
        # new process (see ``_take_back``).
        self._incarnations: dict[int, str] = {}
        # This process's, in its hello: an executor that hears a new one drops what the
        # sessions of the one before left (a scheduler restarted alone, as its pod is).
        self.incarnation = uuid.uuid4().hex
        answers = []
        for index, endpoint in enumerate(executor_endpoints):
            with channel(endpoint, MESSAGE_OPTIONS, tls) as executor:
                info = stub(executor, EXECUTOR, "Info")(pb.Empty(), timeout=60, wait_for_ready=True)
            if info.index != index:
                raise SystemExit(
                    f"executor {endpoint} says it is host {info.index}, but it is listed as "
                    f"host {index}: pass --executor once per host, in host order"
                )
            answers.append(_executor_spec(index, endpoint, info))
            self._incarnations[index] = info.incarnation
        self.dispatcher = IslandDispatcher(
            [spec for spec, _ in answers],
            Policy(policy),
            max_queued,
            max_in_flight,
            island=island,
            max_queued_per_client=max_queued_per_client,
            max_artifact_bytes=max_artifact_bytes,
            run_length=run_length,
            trace_limit=trace_limit,
            max_queued_per_tenant=max_queued_per_tenant,
            # Past every sequence number a scheduler started before this one gave: events of
            # its commands, still reported by executors, are never taken for this one's.
            first_seq=time.time_ns() // 1000,
        )
        for spec, control in answers:
            self._read_executor(spec, self._open_executor_stream(spec, control))
        if executor_timeout > 0:
            threading.Thread(target=self._watch_executors, name="heartbeats", daemon=True).start()
        self._listener = socket.create_server((host, session_port), backlog=64)
        self.session_endpoint = f"{host}:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="sessions", daemon=True).start()

    # -- executors ---------------------------------------------------------------------------

    def _connect_control(self, control: tuple[str, int]) -> socket.socket:
        """Connect to an executor's control endpoint and say hello: from then on, it takes
        its commands from this connection."""
        connection = socket.create_connection(control, timeout=60)
        try:
            if self._tls is not None:  # the executor's certificate is checked, ours presented
                connection = self._tls.connect_stream(connection, control[0])
            connection.settimeout(None)
            # The executor takes this stream as its scheduler's only after this hello.
            token = os.environ.get(CONTROL_TOKEN_ENV, "")
            hello = pb.ControlHello(island=self.island, token=token, scheduler=self.incarnation)
            connection.sendall(frame(pb.CommandBatch(commands=[pb.ExecutorCommand(hello=hello)])))
        except OSError:
            connection.close()
            raise
        return connection

    def _open_executor_stream(
        self, spec: ExecutorSpec, control: tuple[str, int], connection: socket.socket | None = None
    ) -> socket.socket:
        """An executor's command stream (``connection``, else a new one), the island's
        commands for it going there from now on (its events are read by ``_read_executor``)."""
        connection = connection or self._connect_control(control)
        peer = Peer(connection, lambda commands: pb.CommandBatch(commands=commands))
        with self._lock:  # no stimulus is writing to the stream it replaces meanwhile
            self._executors[spec.index] = peer
            self._streams[spec.index] = connection
            self._heard[spec.index] = time.monotonic()
            self._silent.pop(spec.index, None)
        return connection

    def _read_executor(
        self,
        spec: ExecutorSpec,
        connection: socket.socket,
        events: Iterator[pb.EventBatch] | None = None,
    ) -> None:
        """Read an executor's events (``events``, if some were read already) on a thread of
        their own; when its stream ends, it is lost, and the thread waits for a restarted one
        to take back."""
        batches = events or messages(connection.recv, pb.EventBatch.FromString)

        def incoming() -> None:
            reason = "its command stream ended"
            try:
                for batch in batches:
                    self._heard[spec.index] = time.monotonic()
                    if batch.events:  # else a heartbeat
                        self._handle(
                            lambda d, b=batch: [i for e in b.events for i in d.executor_event(e)]
                        )
            except (OSError, FrameError) as error:
                reason = f"{type(error).__name__}: {error}"
            except Exception as error:  # a bug handling its events: its work fails, not hangs
                traceback.print_exc()
                reason = f"the scheduler failed on its events ({type(error).__name__}: {error})"
                with contextlib.suppress(OSError):
                    connection.close()
            reason = self._silent.get(spec.index, reason)
            self._handle(lambda d: d.executor_lost(spec.index, reason))
            _say(f"executor {spec.index} ({spec.endpoint}) is lost: {reason}")
            self._take_back(spec.index, spec.endpoint)

        threading.Thread(target=incoming, name=f"executor-{spec.index}", daemon=True).start()

    def _take_back(self, index: int, endpoint: str) -> None:
        """Wait for a restarted executor at a lost one's endpoint (a kubelet restarts its
        container, a pod is recreated at its name) and take it back in its place. Only a new
        process is: one that answers again after it was lost (stopped, cut off) holds state
        the island has given up on, so it is retired (it exits, to be restarted)."""
        noted = ""
        retired = ""  # the incarnation told to exit
        while True:
            time.sleep(REJOIN_POLL_SECONDS)
            try:
                # A fresh channel each time: one kept would wait out gRPC's reconnect backoff
                # (up to 2 minutes) and keep the address a recreated pod's name had before.
                with channel(endpoint, MESSAGE_OPTIONS, self._tls) as executor:
                    info = stub(executor, EXECUTOR, "Info")(
                        pb.Empty(), timeout=REJOIN_POLL_SECONDS * 5
                    )
            except grpc.RpcError:
                continue  # not up (yet)
            spec, control = _executor_spec(index, endpoint, info)
            problem = None
            if info.incarnation == self._incarnations[index]:
                problem = "it answers again as the process that was lost"
                if retired != info.incarnation and self._retire(index, control):
                    retired = info.incarnation
                    problem += ": told it to exit, to be restarted and taken back"
                elif retired == info.incarnation:
                    problem += (
                        " and did not exit when told to: did it refuse the scheduler's hello "
                        f"(is its {CONTROL_TOKEN_ENV} the island's)? Restart it"
                    )
            elif info.index != index:
                problem = f"it says it is host {info.index}, not host {index}"
            else:
                problem = self.read(lambda d, s=spec: d.rejoin_problem(s))
            taken = None
            if problem is None:
                taken = self._answered_hello(control)
                if isinstance(taken, str):
                    problem, taken = taken, None
            if problem is not None or taken is None:
                if problem is not None and problem != noted:  # said once, not every second
                    _say(f"executor {index} ({endpoint}) is not taken back: {problem}")
                    noted = problem
                continue
            connection, events = taken
            self._open_executor_stream(spec, control, connection)
            self._incarnations[index] = info.incarnation
            # Taken back before its events are read: an end of the new stream is a new loss.
            self._handle(lambda d, s=spec: d.executor_rejoined(s))
            _say(f"executor {index} ({endpoint}) was restarted and is taken back")
            self._read_executor(spec, connection, events)
            return

    def _answered_hello(
        self, control: tuple[str, int]
    ) -> tuple[socket.socket, Iterator[pb.EventBatch]] | str | None:
        """A command stream to a restarted executor that took the hello (its first frame, a
        heartbeat, came back), with the rest of its events; why not, if it refused it; None
        if it could not be reached."""
        try:
            connection = self._connect_control(control)
        except OSError:
            return None
        events = messages(connection.recv, pb.EventBatch.FromString)
        connection.settimeout(HELLO_ANSWER_SECONDS)
        try:
            first = next(events, None)
        except (OSError, FrameError):
            first = None
        if first is None:
            connection.close()
            return (
                "it refused the scheduler's hello (closed the stream, or sent nothing within "
                f"{HELLO_ANSWER_SECONDS:g} s): is its {CONTROL_TOKEN_ENV} the island's?"
            )
        connection.settimeout(None)
        return connection, itertools.chain([first], events)

    def _retire(self, index: int, control: tuple[str, int]) -> bool:
        """Tell a lost executor that answers again as the same process to exit; whether
        the word was sent."""
        reason = (
            f"island {self.island!r} lost it ({self.dispatcher.lost_reason(index)}) and it "
            "answers again as the same process: exiting to be restarted and taken back"
        )
        retire = pb.ExecutorCommand(retire=pb.Retire(reason=reason))
        try:
            with self._connect_control(control) as connection:
                connection.sendall(frame(pb.CommandBatch(commands=[retire])))
        except OSError:
            return False  # gone meanwhile, or not answering: asked again at the next poll
        return True

    def _watch_executors(self) -> None:
        """Cut off an executor that sends nothing, not even its heartbeat, for the executor
        timeout: it is lost as one whose stream ended (a stopped or hung process keeps its
        connections open, and work reading from it waited minutes)."""
        timeout = self._executor_timeout
        interval = min(1.0, timeout / 4)
        last = time.monotonic()
        while True:
            time.sleep(interval)
            now = time.monotonic()
            if now - last > timeout / 2:
                # This process was itself stopped (or starved) meanwhile: what it did not hear
                # says nothing of the executors. They get a fresh timeout.
                for index in list(self._heard):
                    self._heard[index] = max(self._heard[index], now)
            last = now
            for index in list(self._heard):
                # Decided under the lock a taken-back executor's new stream is installed under:
                # its fresh stream is never cut off for the silence of the lost one.
                with self._lock:
                    heard = self._heard[index]
                    if index in self._silent or now - heard <= timeout:
                        continue
                    self._silent[index] = (
                        f"it sent nothing for {now - heard:.0f} s, not even its heartbeat "
                        f"(stopped, hung or cut off; --executor-timeout is {timeout:g} s)"
                    )
                    stream = self._streams[index]
                with contextlib.suppress(OSError):  # ends its reader, which reports it lost
                    socket.socket.shutdown(stream, socket.SHUT_RDWR)

    def _handle(self, stimulus: Callable[[IslandDispatcher], list[Instruction]]) -> None:
        touched: dict[int, Peer] = {}
        # Peers sent only deletions so far go last: each flush wakes its reader, which on a
        # small host takes a core from the rest (a chain's call reached its first executor
        # ~0.2 ms later when the executor freeing the call before's result was flushed first).
        freed: dict[int, Peer] = {}
        refused: list[pb.ExecutorEvent] = []
        with self._lock:
            instructions = stimulus(self.dispatcher)
            for instruction in instructions:
                if isinstance(instruction, ToExecutor):
                    peer = self._executors[instruction.executor]
                    for command in _sendable(instruction.command, instruction.executor, refused):
                        peer.queue(command)
                    if instruction.command.HasField("delete"):
                        freed[id(peer)] = peer
                        continue
                elif isinstance(instruction, ToClient):
                    peer = self._clients.get(instruction.client)
                    if peer is None:
                        continue
                    peer.queue(instruction.event)
                    if instruction.deferrable:  # goes out with the client's next event
                        self._held.hold(peer)
                        continue
                touched[id(peer)] = peer
        for peer in (touched | freed).values():
            peer.flush()
        if refused:  # commands too large for a frame were not sent: their computations fail
            self._handle(lambda d: [i for e in refused for i in d.executor_event(e)])

    def read(self, view: Callable[[IslandDispatcher], T]) -> T:
        """``view`` of the dispatcher, taken under the lock its stimuli hold (keep it quick)."""
        with self._lock:
            return view(self.dispatcher)

    # -- clients -----------------------------------------------------------------------------

    def _apply_batch(self, client: str, batch: Sequence[pb.ClientMessage]) -> None:
        """A client's messages in order, in chunks holding 1, 2, 4, ... computations or calls
        (with whatever else comes before the next): the first computations of a long batch
        reach their executors while the rest are being dispatched, and the later ones still
        travel together."""
        start, size = 0, 1
        while start < len(batch):
            end, work = start, 0
            while end < len(batch) and work < size:
                work += batch[end].WhichOneof("kind") in WORK
                end += 1
            while end < len(batch) and batch[end].WhichOneof("kind") not in WORK:
                end += 1
            chunk = batch[start:end]
            self._handle(lambda d, c=chunk: _apply(d, client, c, self._hello_again))
            start, size = end, size * 2

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._secure_session, args=(connection,), name="session", daemon=True
            ).start()

    def _secure_session(self, connection: socket.socket) -> None:
        """With TLS, a session's handshake first (on its own thread: a silent peer holds no
        one else up); a client without a certificate of our CA is refused by it."""
        if self._tls is not None:
            try:
                connection = self._tls.accept_stream(connection)
            except OSError:
                connection.close()
                return
        self._session(connection)

    def _session(self, connection: socket.socket) -> None:
        """One client's session: a hello naming the client, then its requests; events back."""
        peer = Peer(connection, lambda events: pb.ClientEventBatch(events=events), hand_off=True)
        incoming = messages(connection.recv, pb.ClientBatch.FromString)
        client = ""
        try:
            # The hello must come soon: a peer that sends nothing holds its thread briefly.
            connection.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
            try:
                first = next(incoming, None)
            except TimeoutError:
                raise FrameError(
                    f"no hello within {HANDSHAKE_TIMEOUT_SECONDS:.0f} s of connecting"
                ) from None
            connection.settimeout(None)  # a session may then stay idle as long as it likes
            batch = list(first.messages) if first is not None else []
            problem = None
            if not batch or batch[0].WhichOneof("kind") != "hello" or not batch[0].hello.client:
                problem = "a session starts with hello naming the client"
            elif (name_problem := _client_name_problem(batch[0].hello.client)) is not None:
                problem = name_problem
            else:
                hello = batch.pop(0).hello
                grant, problem = self._admit(hello)

                def begin(dispatcher: IslandDispatcher) -> list[Instruction]:
                    # The name is taken and the session opened in one step under the lock,
                    # as they are let go of in one at its end.
                    nonlocal client, problem
                    if hello.client in self._clients:
                        problem = f"client {hello.client!r} already has a session on this island"
                        return []
                    client = hello.client
                    self._clients[client] = peer
                    if grant is not None:
                        self._grants[client] = grant
                    return _connect(dispatcher, client, hello, grant)

                if problem is None:
                    self._handle(begin)
            if problem is not None:
                peer.queue(
                    pb.ClientEvent(kind=pb.ClientEvent.REJECTED, message=problem, ends_session=True)
                )
                peer.flush()
                return
            self._apply_batch(client, batch)
            for batch_in in incoming:
                self._apply_batch(client, batch_in.messages)
        except FrameError as error:  # bytes that are not our frames: say why, then hang up
            with contextlib.suppress(OSError):
                peer.queue(
                    pb.ClientEvent(
                        kind=pb.ClientEvent.REJECTED, message=str(error), ends_session=True
                    )
                )
                peer.flush()
        except OSError:
            pass
        except Exception as error:  # a bug of ours: end this session only, saying why
            message = f"the scheduler failed on this session: {type(error).__name__}: {error}"
            print(message, file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                peer.queue(
                    pb.ClientEvent(kind=pb.ClientEvent.REJECTED, message=message, ends_session=True)
                )
                peer.flush()
        finally:
            if client:
                # In one step under the lock: a session of the same name opening meanwhile
                # would otherwise be closed in the dispatcher by this one's end.
                self._handle(lambda d: self._end_session(d, client))
            peer.close()
            connection.close()

    def _admit(self, hello: pb.Hello) -> tuple[SessionGrant | None, str | None]:
        """The grant of a hello's credential, or why the hello claims more than it may; no
        grant and no problem when this island takes sessions without credentials."""
        if self._session_key is None:
            return None, None
        if not hello.credential:
            return None, credential_needed(self.island)
        try:
            grant = verify(hello.credential, self._session_key, self.island, time.time())
        except CredentialError as error:
            return None, str(error)
        return grant, grant.problem(hello.client, max(1, hello.weight), hello.priority)

    def _hello_again(
        self, dispatcher: IslandDispatcher, client: str, hello: pb.Hello
    ) -> list[Instruction]:
        """A hello within a session: its new weight and priority, and with a credential, its
        new grant (the name and tenant stay; without one, the grant it had still holds). One
        that claims more than it may is refused, and the session goes on as it was."""
        if self._session_key is None:
            return dispatcher.connect(client, hello.weight, hello.priority)
        held = self._grants[client]
        grant, problem = self._admit(hello) if hello.credential else (held, None)
        if grant is not None and problem is None:
            if grant.tenant != held.tenant:
                problem = (
                    f"the session credential is for tenant {grant.tenant!r}, not the "
                    f"session's {held.tenant!r}"
                )
            else:
                problem = grant.problem(client, max(1, hello.weight), hello.priority)
        if problem is not None:
            return [ToClient(client, pb.ClientEvent(kind=pb.ClientEvent.REJECTED, message=problem))]
        assert grant is not None
        self._grants[client] = grant
        return _connect(dispatcher, client, hello, grant)

    def _end_session(self, dispatcher: IslandDispatcher, client: str) -> list[Instruction]:
        """A client's session ends: its name is free again, its work and buffers go."""
        self._clients.pop(client, None)
        self._grants.pop(client, None)
        return dispatcher.disconnect(client)

    def Info(self, request, context):
        dispatcher = self.dispatcher
        return pb.IslandInfo(
            island=self.island,
            policy=dispatcher.queue.policy.value,
            session_endpoint=self.session_endpoint,
            max_queued=dispatcher.queue.max_queued,
            max_queued_per_client=dispatcher.queue.max_queued_per_client,
            functions=dispatcher.functions_held,
            programs=dispatcher.programs_held,
            credentials_required=self._session_key is not None,
            executors=[
                pb.ExecutorInfo(
                    index=s.index,
                    endpoint=s.endpoint,
                    devices=s.devices,
                    data_endpoint=s.data_endpoint,
                    lost=dispatcher.lost_reason(s.index),
                )
                for s in dispatcher.executors.values()
            ],
        )

    def GetTrace(self, request, context):
        clients = list(request.clients) if request is not None else []
        since_ns = request.since_ns if request is not None else 0
        with self._lock:
            entries = self.dispatcher.trace_entries(clients)
            dropped = dict(self.dispatcher.trace_dropped_until_ns())
        records = [  # made outside the lock: not holding up dispatch meanwhile
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
            for r in self.dispatcher.records_of(entries)
            if r.start_ns >= since_ns
        ]
        wanted = set(clients)
        kept = {c: until for c, until in dropped.items() if not wanted or c in wanted}
        # The marks asked for, and the newest records that fit in one answer with them: long
        # names made a full trace larger than a message may be, and no one's trace could be
        # read at all; so did the marks of many clients, not counted. A record left out marks
        # its client, or moves its mark later: room for a mark of the longest (its name and
        # at most 17 bytes) per client marked or with records.
        marked = kept.keys() | {record.client for record in records}
        budget = MAX_TRACE_ANSWER_BYTES - sum(len(client.encode()) + 20 for client in marked)
        if budget < 0:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the trace's marks of {len(marked)} clients alone would take more than one "
                f"answer of {MAX_TRACE_ANSWER_BYTES} bytes: ask for some (TraceRequest.clients)",
            )
        size, keep = 0, len(records)
        while keep and size + records[keep - 1].ByteSize() + 8 <= budget:
            keep -= 1
            size += records[keep].ByteSize() + 8
        for record in records[:keep]:
            kept[record.client] = max(kept.get(record.client, 0), record.end_ns)
        return pb.Trace(dropped_until_ns=kept, records=records[keep:])


def _executor_spec(
    index: int, endpoint: str, info: pb.ExecutorInfo
) -> tuple[ExecutorSpec, tuple[str, int]]:
    """An executor as its ``Info`` describes it, reached at ``endpoint``; and its control
    endpoint."""
    # Peers pull from the data plane at the name the executor was reached at (which its
    # certificate carries), not at the wildcard it listens on.
    data_endpoint = _reachable(info.data_endpoint, endpoint) if info.data_endpoint else ""
    spec = ExecutorSpec(index, endpoint, tuple(info.devices), data_endpoint)
    control_host, port = _reachable(info.control_endpoint, endpoint).rsplit(":", 1)
    return spec, (control_host.strip("[]"), int(port))


def _say(message: str) -> None:
    print(f"pathways_scheduler: {message}", file=sys.stderr, flush=True)


def _reachable(advertised: str, contacted: str) -> str:
    """Where to reach an executor's advertised ``host:port``: one listening on every interface
    is reached at the host its gRPC server was reached at."""
    host, port = advertised.rsplit(":", 1)
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = contacted.rsplit(":", 1)[0]
    return f"{host}:{port}"


def _client_name_problem(name: str) -> str | None:
    """Why a hello's client name is refused, or None. Ids are owned by the prefix
    ``<client>/``, so a name holding '/' would own another client's ids."""
    if len(name) > MAX_CLIENT_NAME:
        return f"hello.client is {len(name)} characters long; at most {MAX_CLIENT_NAME}"
    if "/" in name or not name.isprintable():
        return f"hello.client {name[:64]!r} must be printable and hold no '/'"
    return None


def _request_problem(message: pb.ClientMessage, kind: str | None) -> pb.ClientEvent | None:
    """A refusal of a message too large to pass on (``None`` when it is fine); the rest is
    checked by the dispatcher. A function's artifact is bounded by the artifact limit."""
    if kind == "function":
        size = message.function.ByteSize() - len(message.function.artifact)
    elif kind in ("computation", "placed", "program", "call", "remote_failed", "remote_ready"):
        size = message.ByteSize()
    else:
        return None
    if size <= MAX_REQUEST_BYTES:
        return None
    event = pb.ClientEvent(
        kind=pb.ClientEvent.REJECTED,
        message=f"a {kind} message of {size} bytes is larger than the {MAX_REQUEST_BYTES} "
        f"bytes a scheduler accepts",
    )
    if kind == "computation" and len(message.computation.id) <= MAX_CLIENT_NAME * 2:
        event.computation_id = message.computation.id
    if kind == "call" and len(message.call.id) <= MAX_CLIENT_NAME * 2:
        event.computation_id = message.call.id
    if kind == "program" and len(message.program.program_id) <= 64:
        event.program_id = message.program.program_id
    if kind == "function" and len(message.function.function_id) <= 64:
        event.function_id = message.function.function_id
    return event


def _sendable(
    command: pb.ExecutorCommand, executor: int, refused: list[pb.ExecutorEvent]
) -> list[pb.ExecutorCommand]:
    """``command`` as commands that fit in a frame: a deletion of many buffers in pieces; a
    command still too large is not sent, and a computation's is reported failed (``refused``)
    rather than breaking the executor's stream."""
    if command.WhichOneof("kind") == "delete" and len(command.delete.ids) > DELETE_PIECE:
        ids = list(command.delete.ids)
        return [
            pb.ExecutorCommand(
                seq=command.seq, delete=pb.DeleteBuffers(ids=ids[i : i + DELETE_PIECE])
            )
            for i in range(0, len(ids), DELETE_PIECE)
        ]
    size = command.ByteSize()
    if size <= MAX_FRAME_BYTES - 64:
        return [command]
    kind = command.WhichOneof("kind")
    if kind in ("run", "call"):
        refused.append(
            pb.ExecutorEvent(
                seq=command.seq,
                computation_id=command.run.id if kind == "run" else command.call.id,
                ok=False,
                message=f"its command to executor {executor} would be {size} bytes, more than "
                f"a control frame holds ({MAX_FRAME_BYTES})",
                executor=executor,
            )
        )
    return []


def _connect(
    dispatcher: IslandDispatcher, client: str, hello: pb.Hello, grant: SessionGrant | None
) -> list[Instruction]:
    """A session opens, or says hello again, as its grant lets it (None: as it says)."""
    if grant is None:
        return dispatcher.connect(client, hello.weight, hello.priority)
    return dispatcher.connect(
        client, hello.weight, hello.priority, tenant=grant.tenant, devices=grant.devices
    )


def _apply(
    dispatcher: IslandDispatcher,
    client: str,
    batch: Any,
    hello_again: Callable[[IslandDispatcher, str, pb.Hello], list[Instruction]],
) -> list[Instruction]:
    """A client's batch of messages, in order (a hello within the session goes to
    ``hello_again``)."""
    instructions: list[Instruction] = []
    for message in batch:
        kind = message.WhichOneof("kind")
        refusal = _request_problem(message, kind)
        if refusal is not None:
            instructions.append(ToClient(client, refusal))
        elif kind == "computation":
            instructions += dispatcher.submit(client, message.computation)
        elif kind == "function":
            instructions += dispatcher.register(client, message.function)
        elif kind == "placed":
            instructions += dispatcher.placed(client, message.placed)
        elif kind == "delete":
            instructions += dispatcher.delete(client, message.delete.ids)
        elif kind == "program":
            instructions += dispatcher.register_program(client, message.program)
        elif kind == "call":
            instructions += dispatcher.call(client, message.call)
        elif kind == "remote_failed":
            instructions += dispatcher.remote_failed(client, message.remote_failed)
        elif kind == "remote_ready":
            instructions += dispatcher.remote_ready(client, message.remote_ready)
        elif kind == "hello":  # again: the session's new weight and priority (its name stays)
            instructions += hello_again(dispatcher, client, message.hello)
    return instructions


def _limit_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the queue and artifact limits of the command line, if anything
    (``args.max_artifact_bytes`` is resolved from the environment when not given)."""
    if args.max_in_flight < 1:
        return f"--max-in-flight must be >= 1, not {args.max_in_flight}"
    if args.max_queued < 1:
        return f"--max-queued must be >= 1, not {args.max_queued}"
    if args.max_queued_per_client is not None and args.max_queued_per_client < 1:
        return f"--max-queued-per-client must be >= 1, not {args.max_queued_per_client}"
    if args.max_queued_per_tenant is not None and args.max_queued_per_tenant < 1:
        return f"--max-queued-per-tenant must be >= 1, not {args.max_queued_per_tenant}"
    if args.run_length < 1:
        return f"--run-length must be >= 1, not {args.run_length}"
    if args.trace_limit < 1:
        return f"--trace-limit must be >= 1, not {args.trace_limit}"
    if not (args.executor_timeout == 0 or 2 <= args.executor_timeout < float("inf")):
        # Executors beat every second: less than two would take a busy one for lost.
        timeout = args.executor_timeout
        return f"--executor-timeout must be 0 (never) or at least 2 seconds, not {timeout}"
    try:
        if args.max_artifact_bytes is None:
            args.max_artifact_bytes = artifact_limit_from(os.environ)
        else:
            check_artifact_limit(args.max_artifact_bytes, "--max-artifact-bytes")
    except ValueError as error:
        return str(error)
    return None


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
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=16,
        help="computations dispatched and unfinished at once; the policy picks among the rest",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        default=DEFAULT_MAX_QUEUED,
        help="computations the island queues in all; beyond, clients are told it is busy",
    )
    parser.add_argument(
        "--max-queued-per-client",
        type=int,
        default=None,
        help="computations one client may queue (default: a quarter of --max-queued)",
    )
    parser.add_argument(
        "--max-queued-per-tenant",
        type=int,
        default=None,
        help="computations the sessions of one tenant (their credentials name it) may queue "
        "together (default: half of --max-queued)",
    )
    parser.add_argument(
        "--max-artifact-bytes",
        type=int,
        default=None,
        help=f"largest function artifact accepted (default: ${ARTIFACT_LIMIT_ENV}, else "
        f"{DEFAULT_MAX_ARTIFACT_BYTES})",
    )
    parser.add_argument(
        "--run-length",
        type=int,
        default=DEFAULT_RUN_LENGTH,
        help="proportional share: computations a client may run in a row before another "
        "client's turn (1 switches at every computation)",
    )
    parser.add_argument(
        "--executor-timeout",
        type=float,
        default=DEFAULT_EXECUTOR_TIMEOUT_SECONDS,
        help="seconds after which an executor that sends nothing, not even its heartbeat "
        "(every second), is taken as lost (0: never)",
    )
    parser.add_argument(
        "--trace-limit",
        type=int,
        default=DEFAULT_TRACE_LIMIT,
        help="trace records the island keeps in all; past it, the oldest of the client "
        "holding the most go first (GetTrace says whose, and until when)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=flags.port, default=0, help="gRPC port (0 picks a free one)")
    parser.add_argument(
        "--health-port",
        type=flags.port,
        default=None,
        help="serve the liveness endpoint GET /healthz and the metrics GET /metrics on this "
        "port (0 picks a free one; unset: none)",
    )
    parser.add_argument(
        "--session-port",
        type=flags.port,
        default=0,
        help="client sessions' port (0 picks a free one)",
    )
    parser.add_argument(
        "--exit-with-launcher",
        action="store_true",
        help="stop when standard input closes (a local launcher holds its other end)",
    )
    args = parser.parse_args()
    limit_problem = _limit_problem(args)
    if limit_problem:
        parser.error(limit_problem)
    try:
        tls = load()
    except TlsConfigError as error:
        parser.exit(2, f"pathways_scheduler: {error}\n")
    session_key = None
    if os.environ.get(SESSION_KEY_ENV):
        try:
            session_key = check_key(os.environ[SESSION_KEY_ENV])
        except ValueError as error:
            parser.exit(2, f"pathways_scheduler: {error}\n")
    health = None if args.health_port is None else serve_health(args.host, args.health_port)
    service = SchedulerService(
        args.island,
        args.executor,
        args.policy,
        args.max_in_flight,
        args.max_queued,
        args.host,
        args.session_port,
        tls,
        max_queued_per_client=args.max_queued_per_client,
        max_artifact_bytes=args.max_artifact_bytes,
        run_length=args.run_length,
        executor_timeout=args.executor_timeout,
        trace_limit=args.trace_limit,
        session_key=session_key,
        max_queued_per_tenant=args.max_queued_per_tenant,
    )
    publish_metrics(renderer(service))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64),
        # A port another process listens on is refused, not shared (gRPC's SO_REUSEPORT).
        options=[*MESSAGE_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers([generic_handler(SCHEDULER, service)])
    address = f"{args.host}:{args.port}"
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.server_credentials())
    server.start()
    ready: dict[str, Any] = {"ready": True, "port": port}
    if health is not None:
        ready["health"] = health
    print(json.dumps(ready), flush=True)
    if args.exit_with_launcher:
        stop_when_stdin_closes()
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=1)
    sys.exit(0)
