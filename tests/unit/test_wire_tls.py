"""TLS settings from the PATHWAYS_TLS_* variables, the components' loaders, and the duplex TLS
stream of the control streams (one reader, many writers, both directions at once)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from certificates import Authority, write_files

from pathways_api.tls import https_options
from pathways_client import tls as client_tls
from pathways_core.wire.tls import (
    CA_ENV,
    CERT_ENV,
    KEY_ENV,
    SERVER_NAME_ENV,
    TlsConfigError,
    TlsSettings,
    tls_settings,
)
from pathways_executor import tls as executor_tls
from pathways_scheduler import tls as scheduler_tls

# -- the settings parser (pure) --------------------------------------------------------------

ALL = {CERT_ENV: "/t/tls.crt", KEY_ENV: "/t/tls.key", CA_ENV: "/t/ca.crt"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({CERT_ENV: " ", KEY_ENV: "", CA_ENV: ""}, None),  # blank is unset
        ({"HOME": "/root"}, None),
        (ALL, TlsSettings(ca="/t/ca.crt", cert="/t/tls.crt", key="/t/tls.key")),
        ({CA_ENV: "/t/ca.crt"}, TlsSettings(ca="/t/ca.crt")),  # a client without a certificate
        (
            {**ALL, SERVER_NAME_ENV: "pathways.internal"},
            TlsSettings("/t/ca.crt", "/t/tls.crt", "/t/tls.key", "pathways.internal"),
        ),
    ],
)
def test_settings_of_complete_environments(environ, expected) -> None:
    assert tls_settings(environ) == expected


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({CERT_ENV: "/t/tls.crt", CA_ENV: "/t/ca.crt"}, [KEY_ENV, CERT_ENV, "/t/tls.crt"]),
        ({KEY_ENV: "/t/tls.key", CA_ENV: "/t/ca.crt"}, [CERT_ENV, KEY_ENV, "/t/tls.key"]),
        ({CERT_ENV: "/t/tls.crt", KEY_ENV: "/t/tls.key"}, [CA_ENV]),
        ({SERVER_NAME_ENV: "pathways.internal"}, [SERVER_NAME_ENV]),
    ],
)
def test_half_set_environments_are_errors_naming_the_variables(environ, named) -> None:
    with pytest.raises(TlsConfigError) as caught:
        tls_settings(environ)
    for word in named:
        assert word in str(caught.value)


def test_servers_require_a_certificate_of_their_own() -> None:
    settings = TlsSettings(ca="/t/ca.crt")
    assert not settings.identity
    with pytest.raises(TlsConfigError, match=f"{CERT_ENV} and {KEY_ENV} are not.*the scheduler"):
        settings.require_identity("the scheduler")
    TlsSettings(**{"ca": "c", "cert": "a", "key": "b"}).require_identity("the scheduler")


def test_the_name_a_server_must_carry() -> None:
    assert TlsSettings(ca="c").peer_name("[::1]") == "::1"
    assert TlsSettings(ca="c").peer_name("isl-scheduler.ns.svc") == "isl-scheduler.ns.svc"
    assert TlsSettings(ca="c", server_name="pw").peer_name("10.0.0.3") == "pw"


def test_files_lists_what_is_set() -> None:
    assert TlsSettings(ca="c").files() == [(CA_ENV, "c")]
    assert TlsSettings(ca="c", cert="a", key="b").files() == [
        (CA_ENV, "c"),
        (CERT_ENV, "a"),
        (KEY_ENV, "b"),
    ]


# -- the components' loaders (files) ---------------------------------------------------------

LOADERS: dict[str, Callable[[dict[str, str]], Any]] = {
    "scheduler": scheduler_tls.load,
    "executor": executor_tls.load,
    "client": client_tls.load,
    "api": https_options,
}


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.create("pathways-test-ca")


@pytest.mark.parametrize("component", LOADERS)
def test_loaders_accept_a_secret_s_files(component, authority, tmp_path) -> None:
    assert LOADERS[component](write_files(tmp_path, authority))
    assert not LOADERS[component]({})  # unset: plaintext


@pytest.mark.parametrize("component", LOADERS)
@pytest.mark.parametrize("variable", [CERT_ENV, KEY_ENV, CA_ENV])
def test_a_missing_file_is_named_with_its_variable(component, variable, authority, tmp_path):
    environ = write_files(tmp_path, authority)
    Path(environ[variable]).unlink()
    with pytest.raises(TlsConfigError) as caught:
        LOADERS[component](environ)
    assert f"{variable}={environ[variable]}" in str(caught.value)
    assert "No such file" in str(caught.value)


@pytest.mark.parametrize("component", LOADERS)
def test_files_that_are_not_pem_are_named(component, authority, tmp_path) -> None:
    environ = write_files(tmp_path, authority)
    if component != "api":  # the API does not verify clients: its CA file is not used
        Path(environ[CA_ENV]).write_text("not a certificate\n")
        with pytest.raises(TlsConfigError, match=f"{CA_ENV}={environ[CA_ENV]}"):
            LOADERS[component](environ)
        write_files(tmp_path, authority)
    other = write_files(tmp_path / "other", authority)
    environ[KEY_ENV] = other[KEY_ENV]  # a key that is not the certificate's
    with pytest.raises(TlsConfigError) as caught:
        LOADERS[component](environ)
    assert f"{CERT_ENV}={environ[CERT_ENV]} and {KEY_ENV}={other[KEY_ENV]}" in str(caught.value)


@pytest.mark.parametrize("component", ["scheduler", "executor", "api"])
def test_servers_refuse_to_start_without_a_certificate(component, authority, tmp_path) -> None:
    environ = write_files(tmp_path, authority)
    with pytest.raises(TlsConfigError, match=f"{CERT_ENV} and {KEY_ENV} are not"):
        LOADERS[component]({CA_ENV: environ[CA_ENV]})


# -- the duplex stream -----------------------------------------------------------------------


def connected(
    server: executor_tls.Tls, client: scheduler_tls.Tls, host: str = "127.0.0.1"
) -> tuple[Any, Any, dict[str, BaseException]]:
    """A control stream over loopback: the executor's end and the scheduler's end, or the
    errors each side raised."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[Any] = []
    errors: dict[str, BaseException] = {}

    def accept() -> None:
        connection, _ = listener.accept()
        try:
            accepted.append(server.accept_stream(connection))
        except OSError as error:
            errors["server"] = error
            connection.close()

    thread = threading.Thread(target=accept)
    thread.start()
    raw = socket.create_connection(listener.getsockname(), timeout=10)
    try:
        stream = client.connect_stream(raw, host)
    except OSError as error:
        errors["client"] = error
        stream = None
    thread.join(10)
    listener.close()
    return (accepted[0] if accepted else None), stream, errors


def test_both_directions_at_once_with_many_writers(authority, tmp_path) -> None:
    environ = write_files(tmp_path, authority)
    server, client, errors = connected(executor_tls.load(environ), scheduler_tls.load(environ))
    assert not errors
    assert server.getpeercert()["subject"] == ((("commonName", "pathways"),),)
    writers, count, size = 4, 300, 3000
    received: dict[str, bytearray] = {"server": bytearray(), "client": bytearray()}

    def write(stream, tag: int) -> None:
        for i in range(count):
            # Each record is its writer's tag, index and a body: interleaving is fine,
            # tearing (bytes of two writes mixed) is not.
            body = bytes([tag]) * size
            stream.sendall(b"%d:%06d:" % (tag, i) + body + b"\n")

    def read(stream, name: str) -> None:
        expected = writers * count * (size + 10)
        while len(received[name]) < expected:
            data = stream.recv(1 << 16)
            if not data:
                return
            received[name] += data

    threads = [threading.Thread(target=read, args=(server, "server"))]
    threads.append(threading.Thread(target=read, args=(client, "client")))
    for tag in range(writers):
        threads.append(threading.Thread(target=write, args=(client, tag)))
        threads.append(threading.Thread(target=write, args=(server, tag)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name in received:
        lines = bytes(received[name]).split(b"\n")[:-1]
        assert len(lines) == writers * count
        seen: dict[int, list[int]] = {}
        for line in lines:
            tag, index, body = line.split(b":")
            assert body == bytes([int(tag)]) * size
            seen.setdefault(int(tag), []).append(int(index))
        assert seen == {tag: list(range(count)) for tag in range(writers)}  # each in order
    client.shutdown(socket.SHUT_RDWR)
    assert server.recv(10) == b""  # the peer's end is the stream's end
    server.close()
    client.close()


@pytest.mark.parametrize("intruder", ["other CA", "no certificate"])
def test_a_peer_without_our_ca_s_certificate_is_refused(intruder, authority, tmp_path) -> None:
    environ = write_files(tmp_path / "island", authority)
    if intruder == "other CA":  # trusts our CA, presents another's certificate
        stranger = write_files(tmp_path / "x", Authority.create("other"), trusted=authority)
    else:
        stranger = {CA_ENV: environ[CA_ENV]}
    server, client, errors = connected(executor_tls.load(environ), client_tls.load(stranger))
    assert server is None
    assert isinstance(errors["server"], ssl.SSLError), errors
    if client is not None:  # TLS 1.3: the client learns of the refusal when it reads
        with pytest.raises(ssl.SSLError, match=r"(?i)certificate|alert"):
            while client.recv(100):
                pass


def test_a_server_with_a_certificate_for_another_name_is_refused(authority, tmp_path) -> None:
    environ = write_files(tmp_path, authority, dns_names=("elsewhere.example",))
    server, client, errors = connected(executor_tls.load(environ), scheduler_tls.load(environ))
    assert client is None
    assert "certificate is not valid for '127.0.0.1'" in str(errors["client"])
    # PATHWAYS_TLS_SERVER_NAME names what the certificates carry instead.
    environ[SERVER_NAME_ENV] = "elsewhere.example"
    server, client, errors = connected(executor_tls.load(environ), scheduler_tls.load(environ))
    assert not errors
    client.sendall(b"hello")
    assert server.recv(5) == b"hello"
    server.close()
    client.close()


# -- the data plane ----------------------------------------------------------------------------


def test_data_plane_pulls_over_tls_keep_their_connection(authority, tmp_path) -> None:
    from pathways_core.wire.arrays import Assembly
    from pathways_executor.data_plane import DataPlaneServer, Puller

    tls = executor_tls.load(write_files(tmp_path, authority))
    served: set[threading.Thread] = set()
    values = {"c/small": np.arange(6, dtype=np.float32), "c/large": np.arange(1 << 20) * 0.5}

    def lookup(buffer_id: str, timeout: float, appear: float | None) -> np.ndarray:
        served.add(threading.current_thread())
        if buffer_id not in values:
            raise LookupError(f"unknown buffer {buffer_id!r}")
        return values[buffer_id]

    def fetch(puller: Puller, buffer_id: str) -> np.ndarray:
        assembly = Assembly()
        puller.pull(server.endpoint, buffer_id, 10.0, assembly)
        assert assembly.array is not None
        return assembly.array

    server = DataPlaneServer(lookup, tls=tls)
    puller, plain = Puller(tls), Puller()
    try:
        for buffer_id in ["c/small", "c/large", "c/small"]:
            np.testing.assert_array_equal(fetch(puller, buffer_id), values[buffer_id])
        with pytest.raises(LookupError, match="unknown buffer 'c/missing'"):
            fetch(puller, "c/missing")
        assert len(served) == 1  # one kept TLS connection served every request
        with pytest.raises((OSError, ValueError)):  # plaintext gets no buffer
            fetch(plain, "c/small")
        np.testing.assert_array_equal(fetch(puller, "c/large"), values["c/large"])
    finally:
        puller.close()
        plain.close()
        server.close()
