"""HTTPS for the REST API when the ``PATHWAYS_TLS_*`` variables are set (see
``pathways_core.wire.tls``). Callers authenticate with their bearer tokens: the API asks for no
client certificate (a browser or the CLI has none)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path

from pathways_core.wire.tls import TlsConfigError, not_a_key_pair, read_pem, tls_settings

__all__ = ["TlsConfigError", "https_options"]


def https_options(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """uvicorn's ``ssl_certfile`` and ``ssl_keyfile`` (empty: plain HTTP), the files checked
    first so that a bad one is a ``TlsConfigError`` naming its variable, not a traceback."""
    settings = tls_settings(environ)
    if settings is None:
        return {}
    settings.require_identity("the API")
    read_pem(settings, lambda path: Path(path).read_bytes())
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            settings.cert, settings.key
        )
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise not_a_key_pair(settings, error) from None
    return {"ssl_certfile": settings.cert, "ssl_keyfile": settings.key}
