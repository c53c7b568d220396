"""The proxy over TLS, and what the stock jaxlib client can and cannot do about it.

jaxlib's IFRT proxy client (``xla/python/ifrt_proxy/common/grpc_credentials*.cc``) picks its
gRPC channel credentials in one place: insecure (plaintext) when
``IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true``, else ALTS, Google Cloud's own transport
security, which needs a GCP machine and its handshaker service. It has no TLS credentials and no
setting naming a CA (``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` only feeds TLS credentials, which it
never creates). So:

- a TLS proxy is tested with a Python gRPC client checking the CA, and with the stock client
  through ``pathways proxy-tunnel`` on its own loopback (plaintext in, TLS out);
- the stock client's own refusals are pinned down: plaintext to a TLS port fails cleanly (the
  client gets a ``RuntimeError``, the proxy goes on), and its default credentials are not TLS;
- the other way to keep every hop off the machine encrypted is tested end to end: the proxy next
  to the program on loopback, and TLS from the proxy to the cluster (``PATHWAYS_TLS_*``).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from certificates import Authority, write_files
from proxy_harness import (
    HERE,
    PYTHON,
    ProxyProcess,
    client_env,
    connect_snippet,
    run_client,
    start_listening,
    start_proxy,
    stop_proxy,
)
from raw_client import RawSession, get_version

TRY_DEVICES = (
    "try:\n"
    "    print('DEVICES', [d.id for d in jax.devices()])\n"
    "except RuntimeError as e:\n"
    "    print('REFUSED', e)\n"
)


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.create("proxy-test-ca")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory, authority: Authority) -> dict[str, str]:
    """``PATHWAYS_TLS_*`` of a certificate naming ``localhost`` and ``127.0.0.1``."""
    return write_files(tmp_path_factory.mktemp("tls"), authority)


@pytest.fixture(scope="module")
def tls_proxy(tls_files: dict[str, str]) -> Iterator[ProxyProcess]:
    """A proxy of 4 fake CPU devices serving TLS only."""
    running = start_proxy(
        "--backend",
        "local",
        "--devices",
        "4",
        "--tls-cert",
        tls_files["PATHWAYS_TLS_CERT"],
        "--tls-key",
        tls_files["PATHWAYS_TLS_KEY"],
    )
    try:
        yield running
    finally:
        stop_proxy(running)


def secure_channel(address: str, ca: bytes) -> grpc.Channel:
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))


def stock_client(address: str, **environment: str | None) -> subprocess.CompletedProcess[str]:
    """The documented client snippet asking for the devices, with ``environment`` changed
    (``None`` removes a variable)."""
    env = client_env()
    for name, value in environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    script = connect_snippet(address, timeout=5) + TRY_DEVICES
    return subprocess.run(
        [PYTHON, "-c", script], capture_output=True, text=True, timeout=180, env=env, cwd=HERE
    )


def sessions_opened(proxy: ProxyProcess) -> int:
    return sum(" opened by " in line for line in proxy.lines)


def assert_serves(proxy: ProxyProcess, ca: bytes) -> None:
    """The proxy is alive and answers a client that checks its certificate."""
    assert proxy.alive(), "".join(proxy.lines[-30:])
    with secure_channel(proxy.address, ca) as channel:
        assert get_version(channel, 16, 25).version.protocol_version == 25


# --- the TLS server, with a gRPC client that checks the CA -------------------------------------


def test_a_client_checking_the_ca_gets_sessions_and_buffers(
    tls_proxy: ProxyProcess, authority: Authority
) -> None:
    assert "TLS)" in "".join(tls_proxy.lines)  # the start line says what it serves
    with secure_channel(tls_proxy.address, authority.pem) as channel:
        assert get_version(channel, 16, 25).version.protocol_version == 25
        session = RawSession(channel)
        init = session.init()
        assert [device.id for device in init.all_devices] == [0, 1, 2, 3]
        data = bytes(range(256)) * 9000  # over 2 MiB: several chunks each way
        session.store(3, data, chunk=500_000)
        assert b"".join(session.lookup(3)) == data


def test_clients_without_the_ca_or_without_tls_are_refused_and_it_goes_on(
    tls_proxy: ProxyProcess, authority: Authority
) -> None:
    stranger = Authority.create("another-ca")
    with secure_channel(tls_proxy.address, stranger.pem) as channel:
        with pytest.raises(grpc.RpcError) as untrusted:
            get_version(channel, 16, 25)
        assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(tls_proxy.address) as channel:
        with pytest.raises(grpc.RpcError) as plaintext:
            get_version(channel, 16, 25)
        assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    assert_serves(tls_proxy, authority.pem)


# --- the stock client --------------------------------------------------------------------------


def test_a_plaintext_stock_client_is_refused_and_the_proxy_goes_on(
    tls_proxy: ProxyProcess, authority: Authority
) -> None:
    """The documented loopback snippet (insecure credentials) against a TLS port: the client
    gets a RuntimeError (its process is not aborted), the proxy opens no session."""
    sessions = sessions_opened(tls_proxy)
    result = stock_client(tls_proxy.address)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REFUSED" in result.stdout, result.stdout
    assert "Unable to establish connection" in result.stdout
    assert sessions_opened(tls_proxy) == sessions
    assert_serves(tls_proxy, authority.pem)


def test_the_stock_client_has_no_tls_credentials(
    tls_proxy: ProxyProcess, tls_files: dict[str, str], authority: Authority
) -> None:
    """Without the insecure switch the stock client uses ALTS, not TLS: even with gRPC's
    roots variable naming the proxy's CA it cannot reach a TLS proxy. (Off Google Cloud its
    ALTS credentials are unusable: "Invalid credentials".) If a jaxlib ever gains TLS
    credentials this test fails, and docs/proxy.md should say how to use them."""
    sessions = sessions_opened(tls_proxy)
    result = stock_client(
        tls_proxy.address,
        IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=None,
        GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=tls_files["PATHWAYS_TLS_CA"],
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "REFUSED" in result.stdout, result.stdout
    assert sessions_opened(tls_proxy) == sessions
    if not on_google_cloud():
        assert "Invalid credentials" in result.stdout, result.stdout
    assert_serves(tls_proxy, authority.pem)


def on_google_cloud() -> bool:
    """What gRPC's ALTS checks: the machine's DMI product name."""
    with contextlib.suppress(OSError):
        return "Google" in Path("/sys/class/dmi/id/product_name").read_text()
    return False


def start_tunnel(target: str, *args: str, env: dict[str, str] | None = None) -> ProxyProcess:
    """``pathways proxy-tunnel TARGET --listen 127.0.0.1:0 ARGS``, as a process; returns once
    it listens (its plaintext address)."""
    return start_listening(["proxy-tunnel", target, "--listen", "127.0.0.1:0", *args], env=env)


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def test_stock_jax_through_the_tunnel_matches_plain_jax(
    tls_proxy: ProxyProcess, tls_files: dict[str, str], tmp_path: Path
) -> None:
    """The unmodified program of test_proxy_programs, connected in plaintext to
    ``pathways proxy-tunnel`` on its loopback, which carries it to the TLS proxy (the CA from
    ``PATHWAYS_TLS_CA``, as in a pod with the chart's Secret): the same numbers as plain JAX."""
    tunnel = start_tunnel(tls_proxy.address, "--server-name", "localhost", env=tls_files)
    try:
        assert "(certificate name 'localhost')" in "".join(tunnel.lines)
        local = run_client(["jax_program.py", "local", "4", str(tmp_path / "local.npz")])
        assert local.returncode == 0, local.stderr[-3000:]
        through = run_client(["jax_program.py", "proxy", tunnel.address, str(tmp_path / "p.npz")])
        assert through.returncode == 0, through.stderr[-3000:]
        assert "done" in through.stdout
        assert tunnel.alive()
    finally:
        stop_proxy(tunnel)
    expected, got = _load(tmp_path / "local.npz"), _load(tmp_path / "p.npz")
    assert set(got) == set(expected) >= {"sharded_collective", "losses", "weights"}
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert tls_proxy.alive()


def test_a_tunnel_that_does_not_trust_the_proxy_carries_nothing(
    tls_proxy: ProxyProcess, authority: Authority, tmp_path: Path
) -> None:
    """A tunnel given another CA refuses the proxy's certificate: the client gets a
    RuntimeError, the tunnel says why and goes on, the proxy opens no session."""
    other = tmp_path / "other-ca.crt"
    other.write_bytes(Authority.create("another-ca").pem)
    tunnel = start_tunnel(tls_proxy.address, "--ca", str(other))
    try:
        sessions = sessions_opened(tls_proxy)
        result = stock_client(tunnel.address)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "REFUSED" in result.stdout, result.stdout
        assert tunnel.alive()
        logged = "".join(tunnel.lines)
        assert f"cannot reach {tls_proxy.address} over TLS" in logged, logged[-2000:]
        assert "CERTIFICATE_VERIFY_FAILED" in logged
        assert sessions_opened(tls_proxy) == sessions
    finally:
        stop_proxy(tunnel)
    assert_serves(tls_proxy, authority.pem)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["h:1", "--listen", "0.0.0.0:8476"], "'0.0.0.0' is not a loopback address"),
        (["h:1", "--listen", "10.1.2.3:8476"], "'10.1.2.3' is not a loopback address"),
        (["h:1", "--listen", "127.0.0.1:http"], "'127.0.0.1:http' is not HOST:PORT"),
        (["h:1"], "give --ca FILE or set PATHWAYS_TLS_CA"),
        (["h:1", "--ca", __file__], "not a PEM CA certificate"),
        (["no-port", "--ca", "CA"], "'no-port' is not host:port"),
        (["h:99999", "--ca", "CA"], "'h:99999' is not host:port (a port of 1 to 65535)"),
        (["h:1", "--ca", "CA", "--listen", "127.0.0.1:70000"], "is not HOST:PORT"),
    ],
)
def test_the_tunnel_refuses_bad_arguments_by_name(
    args: list[str], message: str, tls_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from pathways_client.cli import main

    for variable in ("PATHWAYS_TLS_CA", "PATHWAYS_TLS_CERT", "PATHWAYS_TLS_KEY"):
        monkeypatch.delenv(variable, raising=False)
    args = [tls_files["PATHWAYS_TLS_CA"] if arg == "CA" else arg for arg in args]
    result = CliRunner().invoke(main, ["proxy-tunnel", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output


def test_a_certificate_and_key_that_do_not_match_are_refused_by_name(
    tls_files: dict[str, str],
) -> None:
    """gRPC said only "Failed to bind to address", in a traceback."""
    from click.testing import CliRunner

    from pathways_client.cli import main

    for cert, key in (
        (tls_files["PATHWAYS_TLS_CA"], tls_files["PATHWAYS_TLS_KEY"]),  # another's certificate
        (tls_files["PATHWAYS_TLS_KEY"], tls_files["PATHWAYS_TLS_CERT"]),  # swapped
    ):
        args = ["proxy", "--backend", "local", "--tls-cert", cert, "--tls-key", key]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "are not a PEM certificate and its private key" in result.output, result.output


def test_a_port_another_proxy_listens_on_is_refused(tls_proxy: ProxyProcess) -> None:
    """gRPC's SO_REUSEPORT let a second proxy listen on it too: clients went to either."""
    port = tls_proxy.address.rsplit(":", 1)[1]
    second = subprocess.run(
        [PYTHON, "-m", "pathways_client", "proxy", "--backend", "local", "--port", port],
        capture_output=True,
        text=True,
        timeout=120,
        env=client_env(),
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in second.stderr, second.stderr
    assert tls_proxy.alive()


# --- the proxy next to the program, TLS to the cluster -------------------------------------------

TENANT = "team-tls"


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """An embedded cluster (``pathways up``) with every hop TLS: islands mutual TLS, the API
    HTTPS. Yields its state folder and the ``PATHWAYS_TLS_*`` of its certificate."""
    from click.testing import CliRunner

    from pathways_client.cli import main

    folder = tmp_path_factory.mktemp("tls-cluster")
    files = write_files(folder / "tls", Authority.create("cluster-ca"))
    state = folder / "state"
    runner = CliRunner()

    def invoke(*args: str) -> object:
        # Only the cluster's processes get the certificate (they inherit it at start): the
        # tests' own environment stays without it.
        with pytest.MonkeyPatch.context() as mp:
            for name, value in files.items():
                mp.setenv(name, value)
            return runner.invoke(main, [*args, "--state", str(state)])

    started = invoke("up", "--hosts", "1", "--devices", "2", "--tenant", TENANT)
    try:
        assert started.exit_code == 0, started.output  # type: ignore[attr-defined]
        yield state, files
    finally:
        invoke("down")


def test_a_proxy_beside_the_program_reaches_a_tls_cluster(
    tls_cluster: tuple[Path, dict[str, str]],
) -> None:
    """The stock client talks plaintext to a proxy on its own loopback; the proxy reaches the
    cluster as the SDK does, over HTTPS (the API) and mutual TLS (the island, which serves
    nothing else). Without the CA the same proxy cannot start."""
    from pathways_client.embedded import read_info

    state, files = tls_cluster
    info = read_info(state)
    assert info is not None and info.api.startswith("https://"), info
    proxy = start_proxy("--state", str(state), "--tenant", TENANT, "--devices", "2", env=files)
    try:
        script = connect_snippet(proxy.address) + (
            "import json\n"
            "import numpy as np\n"
            "y = jax.jit(lambda v: v * 3 + 1)(np.arange(4.0, dtype=np.float32))\n"
            "print(json.dumps({'ids': [d.id for d in jax.devices()],\n"
            "                  'y': np.asarray(y).tolist()}))\n"
        )
        result = run_client(["-c", script])
        assert result.returncode == 0, result.stderr[-3000:]
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"ids": [0, 1], "y": [1.0, 4.0, 7.0, 10.0]}
        assert proxy.alive()
    finally:
        stop_proxy(proxy)
    # Without the CA the proxy does not trust the cluster's API: it says so and stops.
    with pytest.raises(RuntimeError, match="did not start") as refused:
        start_proxy("--state", str(state), "--tenant", TENANT, "--devices", "2")
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value), str(refused.value)[-2000:]
