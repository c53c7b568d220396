"""TLS for the hops between clients, schedulers and executors: the settings the
``PATHWAYS_TLS_*`` variables give, and a TLS stream for the framed control streams.

The operator and the chart mount a ``kubernetes.io/tls`` Secret and point three variables at
its files (see ``pathways_core.control.security`` and docs/security.md):

- ``PATHWAYS_TLS_CERT`` and ``PATHWAYS_TLS_KEY``: this process's certificate and key, presented
  by its servers and by its clients (one certificate for server and client auth);
- ``PATHWAYS_TLS_CA``: the CA that signs every peer's certificate;
- ``PATHWAYS_TLS_SERVER_NAME`` (optional): the name every server's certificate must carry,
  instead of the host each endpoint names.

All unset: plaintext. Set: the scheduler's and executors' servers require a client certificate
signed by the CA (mutual TLS) and every client verifies its server against the CA. A client of
the REST API may give the CA alone (it authenticates with its bearer token).

This module opens no file or socket and starts no thread: the components read the files
(:func:`read_pem` is given their reading function), build their ``ssl.SSLContext`` and gRPC
credentials, and hand ``TlsStream`` their connected socket and locks (as ``streams.messages``
reads through the ``recv`` it is given); the TLS state itself lives in memory buffers
(``ssl.MemoryBIO``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from pathways_core.wire.streams import RECEIVE_BYTES

Bytes = bytes | bytearray | memoryview

CERT_ENV = "PATHWAYS_TLS_CERT"
KEY_ENV = "PATHWAYS_TLS_KEY"
CA_ENV = "PATHWAYS_TLS_CA"
SERVER_NAME_ENV = "PATHWAYS_TLS_SERVER_NAME"
# A peer that has not finished its handshake by then is dropped: a connection that sends
# nothing must not hold a server's thread forever.
HANDSHAKE_TIMEOUT_SECONDS = 30.0


class TlsConfigError(ValueError):
    """The ``PATHWAYS_TLS_*`` variables are half set or name unusable files; the message names
    the variable and the file."""


@dataclass(frozen=True)
class TlsSettings:
    """Paths of the PEM files (``cert`` and ``key`` empty: a client without a certificate)."""

    ca: str
    cert: str = ""
    key: str = ""
    server_name: str = ""

    @property
    def identity(self) -> bool:
        """Whether this process has a certificate of its own to present."""
        return bool(self.cert)

    def files(self) -> list[tuple[str, str]]:
        """``(variable, path)`` of every file to read: the CA first, then the certificate and
        key when set."""
        files = [(CA_ENV, self.ca)]
        if self.identity:
            files += [(CERT_ENV, self.cert), (KEY_ENV, self.key)]
        return files

    def require_identity(self, who: str) -> None:
        """Raise ``TlsConfigError`` unless a certificate and key are set: ``who`` (a server of
        mutual TLS) must present one."""
        if not self.identity:
            raise TlsConfigError(
                f"{CA_ENV} is set but {CERT_ENV} and {KEY_ENV} are not: {who} serves mutual "
                "TLS and needs a certificate and key of its own"
            )

    def peer_name(self, host: str) -> str:
        """The name a server reached at ``host`` must carry in its certificate."""
        return self.server_name or host.strip("[]")


def tls_settings(environ: Mapping[str, str]) -> TlsSettings | None:
    """The TLS settings of an environment: ``None`` when TLS is off (none of the variables
    set); ``TlsConfigError`` naming the variables when they are half set."""
    value = {name: environ.get(name, "").strip() for name in (CERT_ENV, KEY_ENV, CA_ENV)}
    server_name = environ.get(SERVER_NAME_ENV, "").strip()
    if not any(value.values()):
        if server_name:
            raise TlsConfigError(
                f"{SERVER_NAME_ENV} is set but TLS is off: set {CERT_ENV}, {KEY_ENV} and "
                f"{CA_ENV} too, or unset {SERVER_NAME_ENV}"
            )
        return None
    cert, key, ca = value[CERT_ENV], value[KEY_ENV], value[CA_ENV]
    if bool(cert) != bool(key):
        given, missing = (CERT_ENV, KEY_ENV) if cert else (KEY_ENV, CERT_ENV)
        raise TlsConfigError(
            f"{given} is set ({value[given]}) but {missing} is not: set both (a certificate "
            "and its key) or neither"
        )
    if not ca:
        raise TlsConfigError(
            f"{CERT_ENV} and {KEY_ENV} are set but {CA_ENV} is not: mutual TLS needs the CA "
            "that signs the peers' certificates"
        )
    return TlsSettings(ca=ca, cert=cert, key=key, server_name=server_name)


def unreadable(variable: str, path: str, error: BaseException) -> TlsConfigError:
    """The error for a file a variable names that cannot be read or used."""
    reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
    return TlsConfigError(f"{variable}={path}: cannot use this file: {reason}")


def not_a_key_pair(settings: TlsSettings, error: BaseException) -> TlsConfigError:
    """The error for a certificate and key that ``ssl`` cannot load as a pair."""
    return TlsConfigError(
        f"{CERT_ENV}={settings.cert} and {KEY_ENV}={settings.key}: not a certificate and "
        f"its key: {getattr(error, 'reason', None) or error}"
    )


def read_pem(settings: TlsSettings, read: Callable[[str], bytes]) -> dict[str, bytes]:
    """The bytes of the settings' files by variable (``TlsSettings.files``), each read with the
    caller's ``read``; ``TlsConfigError`` naming the variable and the file for one that cannot
    be read."""
    pem = {}
    for variable, path in settings.files():
        try:
            pem[variable] = read(path)
        except OSError as error:
            raise unreadable(variable, path, error) from None
    return pem


class Connection(Protocol):
    """What ``TlsStream`` needs of a connected socket."""

    def recv(self, size: int, /) -> bytes: ...
    def sendall(self, data: Bytes, /) -> None: ...
    def settimeout(self, timeout: float | None, /) -> None: ...


class TlsStream:
    """TLS over a connected socket for a control stream: one thread reads while any number of
    others write, which ``ssl.SSLSocket`` cannot do safely (OpenSSL forbids concurrent reads
    and writes on one connection). The TLS state lives in memory buffers; ``state_lock`` guards
    it for the short encrypt and decrypt steps, ``write_lock`` keeps the encrypted bytes of
    concurrent writers in order. The reader never waits for a writer blocked on a full socket
    (plaintext streams behave the same way).

    Other socket methods (``setsockopt``, ``shutdown``, ``close``, ...) go to the socket.
    """

    def __init__(
        self,
        connection: Connection,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None,
        state_lock: AbstractContextManager[Any],
        write_lock: AbstractContextManager[Any],
    ) -> None:
        self.connection = connection
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=server_side,
            server_hostname=None if server_side else server_hostname,
        )
        self._state_lock, self._write_lock = state_lock, write_lock

    @classmethod
    def opened(
        cls,
        connection: Connection,
        context: ssl.SSLContext,
        *,
        server_hostname: str | None,
        lock: Callable[[], AbstractContextManager[Any]],
    ) -> TlsStream:
        """A stream with its handshake done (see :meth:`handshake`): the server end when
        ``server_hostname`` is ``None``, else the client end, the server's certificate checked
        for that name. ``lock()`` makes each of its two locks (``threading.Lock``)."""
        stream = cls(
            connection,
            context,
            server_side=server_hostname is None,
            server_hostname=server_hostname,
            state_lock=lock(),
            write_lock=lock(),
        )
        stream.handshake()
        return stream

    def handshake(self, timeout: float = HANDSHAKE_TIMEOUT_SECONDS) -> None:
        """Run the TLS handshake on the caller's thread, before the stream is shared. Raises
        ``ssl.SSLError`` when either side refuses the other's certificate (the alert is sent
        to the peer first), ``OSError`` (``TimeoutError``) when the peer is silent; the socket
        is left blocking."""
        self.connection.settimeout(timeout)
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
            except ssl.SSLError:
                self._flush()  # the alert tells the peer why
                raise
            received = self.connection.recv(RECEIVE_BYTES)
            if not received:
                raise ConnectionResetError("the peer closed the connection during the handshake")
            self._incoming.write(received)
        self._flush()
        self.connection.settimeout(None)

    def recv(self, size: int) -> bytes:
        """Up to ``size`` decrypted bytes; ``b""`` when the peer closed the stream."""
        while True:
            with self._state_lock:
                try:
                    return self._tls.read(size)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    return b""
            received = self.connection.recv(RECEIVE_BYTES)
            if not received:
                return b""
            with self._state_lock:
                self._incoming.write(received)

    def sendall(self, data: Bytes) -> None:
        """Encrypt and send all of ``data`` (with whatever TLS records reading produced, such
        as a key update's answer: they go out in order with the next write)."""
        with self._write_lock:
            with self._state_lock:
                self._tls.write(data)
                encrypted = self._outgoing.read()
            self.connection.sendall(encrypted)

    def getpeercert(self) -> dict[str, Any] | None:
        """The peer's verified certificate (``ssl.SSLSocket.getpeercert``)."""
        return self._tls.getpeercert()

    def _flush(self) -> None:
        if data := self._outgoing.read():
            self.connection.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)
