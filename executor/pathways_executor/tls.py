"""The executor's TLS (off unless the ``PATHWAYS_TLS_*`` variables are set; see
``pathways_core.wire.tls``): mutual TLS on its gRPC server, its control stream and its data
plane, and on its pulls from other executors' data planes."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from pathways_core.wire.tls import (
    CA_ENV,
    CERT_ENV,
    HANDSHAKE_TIMEOUT_SECONDS,
    KEY_ENV,
    TlsConfigError,
    TlsSettings,
    TlsStream,
    not_a_key_pair,
    read_pem,
    tls_settings,
    unreadable,
)

__all__ = ["Tls", "TlsConfigError", "load"]


@dataclass(frozen=True)
class Tls:
    """The files' bytes and the contexts of both ends (the server one requires a client
    certificate signed by the CA)."""

    settings: TlsSettings
    pem: dict[str, bytes]
    server: ssl.SSLContext
    client: ssl.SSLContext

    def server_credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials requiring a client certificate."""
        return grpc.ssl_server_credentials(
            [(self.pem[KEY_ENV], self.pem[CERT_ENV])],
            root_certificates=self.pem[CA_ENV],
            require_client_auth=True,
        )

    def accept_stream(self, connection: socket.socket) -> TlsStream:
        """The server end of a control stream, handshake done (``OSError`` if refused)."""
        return TlsStream.opened(connection, self.server, server_hostname=None, lock=threading.Lock)

    def accept(self, connection: socket.socket) -> ssl.SSLSocket:
        """The server end of a data-plane connection, handshake done (``OSError`` if refused;
        one thread uses it at a time, so a plain ``SSLSocket`` serves)."""
        connection.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        secure = self.server.wrap_socket(connection, server_side=True)
        secure.settimeout(None)
        return secure

    def connect(self, connection: socket.socket, host: str) -> ssl.SSLSocket:
        """The client end of a data-plane connection to ``host``, its certificate checked."""
        return self.client.wrap_socket(connection, server_hostname=self.settings.peer_name(host))


def load(environ: Mapping[str, str] = os.environ) -> Tls | None:
    """The TLS of the environment (``None``: plaintext); ``TlsConfigError`` naming the variable
    and file when it is half set or a file is unusable."""
    settings = tls_settings(environ)
    if settings is None:
        return None
    settings.require_identity("the executor")
    pem = read_pem(settings, lambda path: Path(path).read_bytes())
    return Tls(settings, pem, _context(settings, True), _context(settings, False))


def _context(settings: TlsSettings, server: bool) -> ssl.SSLContext:
    purpose = ssl.Purpose.CLIENT_AUTH if server else ssl.Purpose.SERVER_AUTH
    try:
        context = ssl.create_default_context(purpose, cafile=settings.ca)
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise unreadable(CA_ENV, settings.ca, error) from None
    try:
        context.load_cert_chain(settings.cert, settings.key)
    except (OSError, ValueError) as error:
        raise not_a_key_pair(settings, error) from None
    context.verify_mode = ssl.CERT_REQUIRED  # servers too: mutual TLS
    return context
