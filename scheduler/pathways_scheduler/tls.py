"""The scheduler's TLS (off unless the ``PATHWAYS_TLS_*`` variables are set; see
``pathways_core.wire.tls``): mutual TLS on its gRPC server and client sessions, and on its
channels and command streams to the executors."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pathways_core.wire.tls import (
    CA_ENV,
    CERT_ENV,
    KEY_ENV,
    TlsConfigError,
    TlsSettings,
    TlsStream,
    not_a_key_pair,
    read_pem,
    tls_settings,
    unreadable,
)

__all__ = ["Tls", "TlsConfigError", "channel", "load"]


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

    def connect_stream(self, connection: socket.socket, host: str) -> TlsStream:
        """The client end of a control stream to ``host``, handshake done and the server's
        certificate checked (``OSError`` if refused)."""
        name = self.settings.peer_name(host)
        return TlsStream.opened(connection, self.client, server_hostname=name, lock=threading.Lock)

    def channel(self, endpoint: str, options: list[tuple[str, Any]]) -> grpc.Channel:
        """A gRPC channel presenting our certificate and checking the server's."""
        credentials = grpc.ssl_channel_credentials(
            self.pem[CA_ENV], self.pem[KEY_ENV], self.pem[CERT_ENV]
        )
        if self.settings.server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.settings.server_name)]
        return grpc.secure_channel(endpoint, credentials, options=options)


def channel(endpoint: str, options: list[tuple[str, Any]], tls: Tls | None) -> grpc.Channel:
    """A channel to ``endpoint``: TLS with ``tls``, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(endpoint, options=options)
    return tls.channel(endpoint, options)


def load(environ: Mapping[str, str] = os.environ) -> Tls | None:
    """The TLS of the environment (``None``: plaintext); ``TlsConfigError`` naming the variable
    and file when it is half set or a file is unusable."""
    settings = tls_settings(environ)
    if settings is None:
        return None
    settings.require_identity("the scheduler")
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
