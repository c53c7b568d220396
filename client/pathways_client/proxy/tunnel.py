"""``pathways proxy-tunnel``: TLS for the stock jaxlib client, from its own loopback.

jaxlib's IFRT proxy client chooses its gRPC credentials in one place
(``xla/python/ifrt_proxy/common/grpc_credentials_possibly_insecure_wrapper.cc``): plaintext when
``IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true``, else ALTS (Google Cloud's transport security,
usable only on GCP machines with its handshaker service). It has no TLS credentials and no
setting naming a CA. To reach a proxy that serves TLS (the chart's, with ``tls.enabled``), the
client speaks plaintext to this tunnel on its loopback, and the tunnel carries the bytes to the
proxy over TLS: the proxy's certificate checked against the CA (``--ca``, else
``PATHWAYS_TLS_CA``) and the name it is reached by, ALPN ``h2`` (gRPC servers refuse TLS
without it), and this process's certificate presented when ``PATHWAYS_TLS_CERT`` /
``PATHWAYS_TLS_KEY`` are set. The plaintext side listens on loopback only.

asyncio does the TLS: each connection's two directions never share one SSL object between
threads.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import ssl
import threading
from pathlib import Path

import click

from pathways_core.flags import PORT_MAX

log = logging.getLogger(__name__)

CHUNK = 1 << 16


class Tunnel:
    """Plaintext connections accepted on ``listen`` (loopback), each carried to ``target``
    (``host:port``) over TLS with ``context``, the server's certificate checked for
    ``server_name`` (default: the target's host)."""

    def __init__(
        self,
        target: str,
        context: ssl.SSLContext,
        *,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        server_name: str | None = None,
    ) -> None:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= PORT_MAX:
            raise ValueError(f"target {target!r} is not host:port (a port of 1 to {PORT_MAX})")
        self.host, self.port = host.strip("[]"), int(port)
        self.server_name = server_name or self.host
        self.context = context
        self.listen = listen
        self.connections = 0  # carried to the target (TLS handshake done)
        self.refused = 0  # the target could not be reached or its certificate was refused
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> str:
        """Listen (on a thread of its own); returns ``host:port`` of the plaintext side.
        ``OSError`` if the address cannot be bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._server = self._loop.run_until_complete(
                    asyncio.start_server(self._handle, *self.listen)
                )
            except OSError as error:
                failure.append(error)
                ready.set()
                return
            host, port = self._server.sockets[0].getsockname()[:2]  # type: ignore[attr-defined]
            self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="proxy-tunnel", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self.address

    def stop(self) -> None:
        """Stop listening and drop the open connections."""
        if self._thread is None:
            return

        def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)
        self._thread.join(10)
        self._thread = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.context, server_hostname=self.server_name
            )
        except (OSError, ssl.SSLError) as error:
            # The client sees its connection closed, retries until its own timeout and then
            # reports it; the reason is here.
            self.refused += 1
            log.warning("cannot reach %s:%d over TLS: %s", self.host, self.port, error)
            writer.close()
            return
        self.connections += 1
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until either side ends, then close the other side."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
    except (OSError, ssl.SSLError):
        pass  # a reset or a TLS alert ends the connection like an EOF
    finally:
        sink.close()


def client_context(ca: Path | None) -> ssl.SSLContext:
    """The TLS client context: ``ca`` (else ``PATHWAYS_TLS_CA``), this process's certificate
    when ``PATHWAYS_TLS_CERT``/``PATHWAYS_TLS_KEY`` are set, ALPN ``h2``. ``click`` errors
    name what is missing or unusable."""
    from pathways_client.tls import TlsConfigError, load

    try:
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca))
        else:
            loaded = load()
            if loaded is None:
                raise click.UsageError(
                    "no CA to check the proxy's certificate against: give --ca FILE or set "
                    "PATHWAYS_TLS_CA"
                )
            context = loaded.client
    except TlsConfigError as error:
        raise click.UsageError(str(error)) from None
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        raise click.BadParameter(
            f"{ca}: not a PEM CA certificate: {getattr(error, 'reason', None) or error}",
            param_hint="--ca",
        ) from None
    context.set_alpn_protocols(["h2"])
    return context


def _listen_address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or int(port) > PORT_MAX:
        raise click.BadParameter(f"{value!r} is not HOST:PORT", param_hint="--listen")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise click.BadParameter(
            f"{host!r} is not a loopback address: the tunnel's plaintext side must stay on "
            "this machine (127.0.0.1 or ::1)",
            param_hint="--listen",
        )
    return host, int(port)


@click.command("proxy-tunnel")
@click.argument("target")
@click.option(
    "--listen",
    default="127.0.0.1:8476",
    show_default=True,
    help="Loopback HOST:PORT the stock client connects to, in plaintext (port 0: any free).",
)
@click.option(
    "--ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA that signs the proxy's certificate (default: $PATHWAYS_TLS_CA).",
)
@click.option(
    "--server-name",
    help="Name the proxy's certificate must carry (default: $PATHWAYS_TLS_SERVER_NAME, else "
    "TARGET's host).",
)
def tunnel_command(target: str, listen: str, ca: Path | None, server_name: str | None) -> None:
    """Carry a stock JAX client's IFRT proxy connection to TARGET (host:port of a `pathways
    proxy` serving TLS) over TLS.

    The client connects to --listen with IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true (see
    docs/proxy.md)."""
    import os

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    address = _listen_address(listen)
    context = client_context(ca)
    server_name = server_name or os.environ.get("PATHWAYS_TLS_SERVER_NAME", "").strip() or None
    try:
        tunnel = Tunnel(target, context, listen=address, server_name=server_name)
        bound = tunnel.start()
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="TARGET") from None
    except OSError as error:
        raise click.ClickException(f"cannot listen on {listen}: {error}") from None
    # Scripts and tests read the address from this line: it follows "listening on".
    click.echo(
        f"pathways proxy-tunnel: listening on {bound} (plaintext), to {target} over TLS "
        f"(certificate name {tunnel.server_name!r})"
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    tunnel.stop()
