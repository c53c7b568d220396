"""The SDK's TLS (off unless the ``PATHWAYS_TLS_*`` variables are set; see
``pathways_core.wire.tls``): islands' gRPC channels and sessions present this process's
certificate and check the servers' against the CA; the REST API client checks the API's
certificate against the CA (its bearer token authenticates the caller)."""

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
    """The files' bytes and the client context (without ``PATHWAYS_TLS_CERT``: no certificate
    presented, which islands refuse)."""

    settings: TlsSettings
    pem: dict[str, bytes]
    client: ssl.SSLContext

    def channel(self, endpoint: str, options: list[tuple[str, Any]]) -> grpc.Channel:
        """A gRPC channel presenting our certificate and checking the server's."""
        credentials = grpc.ssl_channel_credentials(
            self.pem[CA_ENV], self.pem.get(KEY_ENV), self.pem.get(CERT_ENV)
        )
        if self.settings.server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.settings.server_name)]
        return grpc.secure_channel(endpoint, credentials, options=options)

    def connect_stream(self, connection: socket.socket, host: str) -> TlsStream:
        """The client end of a session stream to ``host``, handshake done and the server's
        certificate checked (``OSError`` if refused)."""
        name = self.settings.peer_name(host)
        return TlsStream.opened(connection, self.client, server_hostname=name, lock=threading.Lock)


def load(environ: Mapping[str, str] = os.environ) -> Tls | None:
    """The TLS of the environment (``None``: plaintext); ``TlsConfigError`` naming the variable
    and file when it is half set or a file is unusable."""
    settings = tls_settings(environ)
    if settings is None:
        return None
    pem = read_pem(settings, lambda path: Path(path).read_bytes())
    try:
        context = ssl.create_default_context(cafile=settings.ca)
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise unreadable(CA_ENV, settings.ca, error) from None
    if settings.identity:
        try:
            context.load_cert_chain(settings.cert, settings.key)
        except (OSError, ValueError) as error:
            raise not_a_key_pair(settings, error) from None
    return Tls(settings, pem, context)


def channel(endpoint: str, options: list[tuple[str, Any]], tls: Tls | None) -> grpc.Channel:
    """A channel to ``endpoint``: TLS with ``tls``, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(endpoint, options=options)
    return tls.channel(endpoint, options)
