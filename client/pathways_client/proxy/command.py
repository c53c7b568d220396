"""``pathways proxy``: serve the IFRT proxy protocol to stock JAX programs.

Where the work goes (``--backend``):

- ``island`` (default): every IFRT session is a client of an island scheduler, on a virtual
  slice of ``--devices`` devices. The islands are ``--islands name=host:port,...`` (island
  schedulers, slices bound by the proxy), ``--state DIR`` (the embedded cluster ``pathways up``
  started, through its REST API: VirtualSlices charged to ``--tenant``'s quota), ``--api URL``
  (a REST API, with ``--token`` or ``$PATHWAYS_TOKEN``), the ``PATHWAYS_SLICES`` /
  ``PATHWAYS_ISLANDS`` / ``PATHWAYS_API`` settings of the environment, or, with none of
  these, a local island the command starts itself (``--hosts`` x ``--devices-per-host`` fake
  CPU devices) and stops on exit;
- ``local``: the proxy process's own ``--devices`` fake CPU devices (the reference backend).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import click

from pathways_client.signals import interrupt
from pathways_core.control.programs import island_client_name
from pathways_core.flags import PORT_MAX
from pathways_core.resources.virtual_slice import (
    DEFAULT_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
)
from pathways_core.scheduling import Policy

ENV_SETTINGS = ("PATHWAYS_SLICES", "PATHWAYS_ISLANDS", "PATHWAYS_API")


def _protocol_range(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        low, high = (int(part) for part in value.split("-", 1))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not MIN-MAX (e.g. 16-25)", param_hint="'--protocol-range'"
        ) from None
    if low > high:
        raise click.BadParameter(f"{value!r}: MIN is above MAX", param_hint="'--protocol-range'")
    return low, high


def _islands(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    islands = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, endpoint = item.partition("=")
        if not sep or not name or not endpoint or ":" not in endpoint:
            raise click.BadParameter(
                f"expected name=host:port, got {item!r}", param_hint="'--islands'"
            )
        islands[name] = endpoint
    if not islands:
        raise click.BadParameter("names no island", param_hint="'--islands'")
    return islands


@click.command("proxy")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, PORT_MAX),
    default=8476,
    show_default=True,
    help="Port to listen on (0: any free).",
)
@click.option(
    "--backend",
    type=click.Choice(["island", "local"]),
    default="island",
    show_default=True,
    help="island: sessions run on virtual slices of islands; local: on this process's fake "
    "CPU devices.",
)
@click.option(
    "--devices",
    type=click.IntRange(1, 4096),
    default=None,
    help="Devices each session sees: its slice's size (island, default 4), or this process's "
    "fake CPU devices (local, default 8).",
)
@click.option("--islands", "islands_value", help="Island schedulers: name=host:port,...")
@click.option(
    "--state",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the embedded cluster 'pathways up' started (through its REST API).",
)
@click.option("--api", help="URL of a Pathways REST API (token: --token or $PATHWAYS_TOKEN).")
@click.option("--token", help="API token of the tenant (with --api).")
@click.option("--island", "island_name", help="Bind the sessions' slices on this island.")
@click.option(
    "--slice",
    "slice_name",
    help="Run every session on this slice, already bound (PATHWAYS_SLICES, in Kubernetes).",
)
@click.option(
    "--slice-lease",
    type=click.IntRange(MIN_LEASE_SECONDS, MAX_LEASE_SECONDS),
    default=DEFAULT_LEASE_SECONDS,
    show_default=True,
    help="Through the API: seconds the cluster keeps a session's slice once the proxy stops "
    "renewing it (killed, frozen, cut off).",
)
@click.option("--tenant", default=None, help="Tenant of the sessions (default: the API's).")
@click.option("--weight", type=click.IntRange(1), default=None, help="Share of device time.")
@click.option("--priority", type=int, default=None, help="Strictly higher priority runs first.")
@click.option(
    "--hosts", default=2, show_default=True, type=click.IntRange(1, 64), help="Started island."
)
@click.option(
    "--devices-per-host",
    default=4,
    show_default=True,
    type=click.IntRange(1, 512),
    help="Started island.",
)
@click.option(
    "--policy",
    type=click.Choice([policy.value for policy in Policy]),
    default="proportional-share",
    show_default=True,
    help="Scheduling policy of the started island.",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Serve TLS with this PEM certificate chain (with --tls-key).",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The PEM private key of --tls-cert.",
)
@click.option(
    "--protocol-range",
    default=None,
    help="Accept only these IFRT proxy protocol versions, MIN-MAX (default: all implemented).",
)
@click.option(
    "--max-sessions",
    default=64,
    show_default=True,
    type=click.IntRange(1, 4096),
    help="Sessions served at once (a thread each); one more is refused, not kept waiting.",
)
def proxy_command(
    host: str,
    port: int,
    backend: str,
    devices: int | None,
    islands_value: str | None,
    state: Path | None,
    api: str | None,
    token: str | None,
    island_name: str | None,
    slice_name: str | None,
    slice_lease: int,
    tenant: str | None,
    weight: int | None,
    priority: int | None,
    hosts: int,
    devices_per_host: int,
    policy: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    protocol_range: str | None,
    max_sessions: int,
) -> None:
    """Serve stock JAX programs over the IFRT proxy protocol (jax_platforms='proxy').

    See docs/proxy.md for the lines a program adds to use it."""
    versions = _protocol_range(protocol_range)
    islands = _islands(islands_value)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    chosen = [
        name
        for name, value in (("--islands", islands), ("--state", state), ("--api", api))
        if value
    ]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)}: give one way to reach the islands")
    if backend == "local" and (chosen or slice_name or island_name):
        given = chosen[0] if chosen else "--slice/--island"
        raise click.UsageError(f"--backend local runs on this process: {given} does not apply")
    credentials = _tls_credentials(tls_cert, tls_key)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per API call is no news
    # Until it serves, SIGTERM unwinds as Ctrl-C does: a slice being bound is deleted.
    signal.signal(signal.SIGTERM, interrupt)
    # Before JAX creates its CPU client: the device count is fixed then.
    import jax

    if backend == "local":
        jax.config.update("jax_num_cpu_devices", devices or 8)
        # Arrays keep the dtypes clients send: without it a client's float64 was stored as
        # float32 (its reads failed on the size, its programs on the argument types).
        jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")  # the island backend only parses programs here
    from pathways_client.proxy.protocol import ProtocolUnavailable
    from pathways_client.proxy.server import PROTOCOL_MAX, PROTOCOL_MIN, ProxyConfig, serve

    low, high = versions or (PROTOCOL_MIN, PROTOCOL_MAX)
    if not PROTOCOL_MIN <= low <= high <= PROTOCOL_MAX:  # (it was taken as given, and served)
        raise click.BadParameter(
            f"{low}-{high} is not within the versions the Pathways proxy implements, "
            f"{PROTOCOL_MIN}-{PROTOCOL_MAX}",
            param_hint="'--protocol-range'",
        )
    with contextlib.ExitStack() as stack:
        if backend == "local":
            from pathways_client.proxy.local import LocalBackend

            served: Any = LocalBackend()
            where = f"{devices or 8} cpu devices of this process"
        else:
            served, where = _island_backend(
                stack,
                devices=devices or 4,
                islands=islands,
                state=state,
                api=api,
                token=token,
                island=island_name,
                slice_name=slice_name,
                slice_lease=slice_lease,
                tenant=tenant,
                weight=weight,
                priority=priority,
                hosts=hosts,
                devices_per_host=devices_per_host,
                policy=policy,
            )
        try:
            server, bound, _ = serve(
                ProxyConfig(served, protocol_min=low, protocol_max=high, max_sessions=max_sessions),
                f"{host}:{port}",
                credentials=credentials,
            )
        except ProtocolUnavailable as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:
            raise click.ClickException(f"{exc} (--host, --port)") from exc
        click.echo(
            # Tests and scripts read the address from this line: it follows "listening on".
            f"pathways proxy: listening on {host}:{bound} ({where}, IFRT proxy protocol "
            f"{low}-{high}, {'TLS' if credentials else 'insecure'})"
        )
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.stop(grace=2)


# The proxy's own island is started again at most this many times within RESTART_WINDOW s.
MAX_RESTARTS, RESTART_WINDOW = 3, 300.0


def _keep_running(island: Any, stop: threading.Event) -> None:
    """Start the proxy's own island again, whole, when one of its processes exits (its
    executors are one JAX group, and it had no one else to restart it: every later session
    then waited for devices of a lost host), until ``stop``; a few times at most in a while,
    then it says why it gives up."""
    from pathways_client.launcher import LaunchError

    restarts: list[float] = []
    while not stop.wait(1.0):
        process = island.exited()
        if process is None:
            continue
        why = f"the local island's {process.name} exited with code {process.popen.returncode}"
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
        if len(restarts) > MAX_RESTARTS:
            click.echo(
                f"pathways proxy: {why}, its {MAX_RESTARTS + 1}th time within "
                f"{RESTART_WINDOW:.0f} s: it is not started again; sessions fail until the "
                "proxy is restarted (Ctrl-C, then run it again)",
                err=True,
            )
            return
        click.echo(f"pathways proxy: {why}; starting the island again", err=True)
        island.stop(grace=2.0)
        try:
            island.start()
        except LaunchError as exc:
            click.echo(f"pathways proxy: the local island did not start again: {exc}", err=True)
            return
        click.echo("pathways proxy: the local island is back; new sessions use it", err=True)


def _tls_credentials(cert: Path | None, key: Path | None) -> Any:
    """The server credentials of ``--tls-cert`` and ``--tls-key``, checked to be a PEM
    certificate and its private key (gRPC says only that the port cannot be bound)."""
    if cert is None or key is None:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, ValueError) as exc:
        raise click.UsageError(
            f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate and its private "
            f"key ({exc.__class__.__name__}: {exc})"
        ) from None
    import grpc

    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])


def _island_backend(
    stack: contextlib.ExitStack,
    *,
    devices: int,
    islands: dict[str, str] | None,
    state: Path | None,
    api: str | None,
    token: str | None,
    island: str | None,
    slice_name: str | None,
    slice_lease: int,
    tenant: str | None,
    weight: int | None,
    priority: int | None,
    hosts: int,
    devices_per_host: int,
    policy: str,
) -> tuple[Any, str]:
    """The island backend and a description of where its sessions run."""
    from pathways_client.cluster import DirectDevices, connect
    from pathways_client.errors import ConnectError, PathwaysError
    from pathways_client.proxy.island import IslandBackend

    target: Any = api
    if not (islands or state or api) and not any(os.environ.get(v) for v in ENV_SETTINGS):
        from pathways_client.launcher import LaunchError, LocalIsland

        started = LocalIsland(hosts=hosts, devices_per_host=devices_per_host, policy=policy)
        click.echo(
            f"pathways proxy: starting a local island of {hosts} x {devices_per_host} devices"
        )
        try:
            started.start()
        except LaunchError as exc:
            raise click.ClickException(str(exc)) from exc
        stack.callback(started.stop)
        keeping = threading.Event()
        keeper = threading.Thread(
            target=_keep_running, args=(started, keeping), name="island-keeper", daemon=True
        )
        keeper.start()
        stack.callback(keeper.join, 30)
        stack.callback(keeping.set)  # (callbacks run last first: the keeper stops first)
        target = started

    shared = DirectDevices()  # without a resource manager, sessions bind from one allocator

    def connector(client: str) -> Any:
        return connect(
            target,
            islands=islands,
            token=token,
            state=state,
            client=client,
            tenant=tenant,
            weight=weight,
            priority=priority,
            devices=shared,
            lease_seconds=slice_lease,
        )

    program = os.environ.get("PATHWAYS_PROGRAM")
    # Beside a program, on its slices: its sessions are the program's own.
    owner = island_client_name(program) if slice_name and program else None
    backend = IslandBackend(
        connector,
        devices,
        island=island,
        slice_name=slice_name,
        tenant=tenant or os.environ.get("PATHWAYS_TENANT") or "default",
        owner=owner,
    )
    click.echo(
        f"pathways proxy: binding a slice of {devices} device(s) to check the island backend "
        "(waits while it is pending; Ctrl-C gives it back)"
    )
    try:
        found = backend.probe()
    except PathwaysError as exc:
        # The settings to look at: where the islands are, or the slice asked for.
        if isinstance(exc, ConnectError):
            check = "--islands, --state or --api"
        else:
            check = "--slice" if slice_name else "--devices and --island"
        raise click.ClickException(
            f"the island backend cannot start: {exc} (check {check})"
        ) from exc
    return backend, (
        f"sessions on slices of {backend.size} {found['platform']} devices of island "
        f"{found['island']!r}"
    )
