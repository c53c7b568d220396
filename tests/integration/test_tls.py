"""Mutual TLS on every hop of a real island (scheduler and executor processes on loopback) and
HTTPS on the REST API, with throwaway CAs: who gets in, who is refused, and that the island
keeps serving."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import yaml
from certificates import Authority, write_files
from conftest import export, f32, increment

from pathways_client import tls as client_tls
from pathways_client.api_client import ApiCallError, ApiClient
from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LaunchError, LocalIsland
from pathways_client.rpc import MESSAGE_OPTIONS, stub
from pathways_core.wire import EXECUTOR, bulk, pb
from pathways_core.wire.streams import frame
from pathways_core.wire.tls import CA_ENV, CERT_ENV, KEY_ENV

INCREMENT = increment()
DOUBLE = export(lambda x: x * 2, f32(4))
LARGE = 1 << 20  # 4 MiB of float32: a data-plane reply in many TLS records
DOUBLE_LARGE = export(lambda x: x * 2, f32(LARGE))
TLS_ALERT = 0x15  # the content type of a TLS alert record


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority.create("pathways-island-ca")


@pytest.fixture(scope="module")
def tls_files(authority: Authority, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_files(tmp_path_factory.mktemp("tls"), authority)


@pytest.fixture(scope="module")
def tls_island(tls_files: dict[str, str], compilation_cache: Path) -> Iterator[LocalIsland]:
    """2 executors x 4 fake devices, every process with the certificate, key and CA."""
    with LocalIsland(
        hosts=2, devices_per_host=4, compilation_cache=compilation_cache, environment=tls_files
    ) as running:
        yield running


def chain(client: IslandClient) -> np.ndarray:
    """Three nodes over both executors: each hop pulls its input over the data plane."""
    increment = client.register(INCREMENT, "increment")
    double = client.register(DOUBLE, "double")
    x = client.put(np.arange(4, dtype=np.float32), device=1)  # executor 0
    a = client.submit(increment, [1], [x], 1, name="a")
    b = client.submit(double, [6], [a.outputs[0]], 1, name="b")  # executor 1 pulls a
    c = client.submit(increment, [2], [b.outputs[0]], 1, name="c")  # executor 0 pulls b
    c.wait(60)
    return client.get(c.outputs[0])


def test_a_computation_across_executors_over_mutual_tls(
    tls_island: LocalIsland, tls_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads the PATHWAYS_TLS_* variables, as in a program's pod.
    for variable, path in tls_files.items():
        monkeypatch.setenv(variable, path)
    with IslandClient(tls_island.scheduler_endpoint, "tls-chain") as client:
        np.testing.assert_array_equal(chain(client), (np.arange(4) + 1) * 2 + 1)
        # A large array crosses the data plane in many records, straight into its buffer.
        value = np.arange(LARGE, dtype=np.float32)
        x = client.put(value, device=0)
        doubled = client.submit(client.register(DOUBLE_LARGE, "double-large"), [5], [x], 1)
        doubled.wait(60)
        np.testing.assert_array_equal(client.get(doubled.outputs[0]), value * 2)
    # Nothing secret in the island's logs.
    key = Path(tls_files[KEY_ENV]).read_text().splitlines()[1]
    for log in Path(tls_island.workdir).glob("*.log"):
        assert key not in log.read_text(errors="replace"), log


@pytest.mark.parametrize("intruder", ["plaintext", "no certificate", "another CA"])
def test_clients_without_a_certificate_of_the_island_s_ca_are_refused(
    intruder: str, tls_island: LocalIsland, tls_files: dict[str, str], tmp_path: Path
) -> None:
    if intruder == "plaintext":
        tls, hint = None, "if the island serves TLS, set PATHWAYS_TLS_CERT"
    elif intruder == "no certificate":
        tls = client_tls.load({CA_ENV: tls_files[CA_ENV]})
        hint = "requires a client certificate"
    else:  # trusts the island's CA, presents a certificate of its own CA
        other = write_files(tmp_path, Authority.create("other"))
        tls = client_tls.load({**other, CA_ENV: tls_files[CA_ENV]})
        hint = "signed by the other's CA"
    with pytest.raises(IslandError, match="did not answer") as refused:
        IslandClient(tls_island.scheduler_endpoint, "intruder", tls=tls, connect_timeout=5)
    assert hint in str(refused.value)
    # The island keeps serving its own.
    with IslandClient(
        tls_island.scheduler_endpoint, "witness", tls=client_tls.load(tls_files)
    ) as client:
        np.testing.assert_array_equal(chain(client), (np.arange(4) + 1) * 2 + 1)


def read_until_closed(endpoint: str, data: bytes) -> bytes:
    """Connect without TLS, send ``data``, and read until the server hangs up."""
    host, port = endpoint.rsplit(":", 1)
    received = b""
    with socket.create_connection((host, int(port)), timeout=20) as raw:
        raw.sendall(data)
        try:
            while chunk := raw.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
    return received


def test_plaintext_connections_to_every_port_are_refused(
    tls_island: LocalIsland, tls_files: dict[str, str]
) -> None:
    good = client_tls.load(tls_files)
    with IslandClient(tls_island.scheduler_endpoint, "ports", tls=good) as client:
        info = client.info
        executors = []
        for executor in info.executors:
            with good.channel(executor.endpoint, MESSAGE_OPTIONS) as channel:
                executors.append(stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=20))
        hello = frame(pb.ClientBatch(messages=[pb.ClientMessage(hello=pb.Hello(client="x"))]))
        attempts = [(info.session_endpoint, hello)]
        for executor in executors:
            # A plaintext peer could otherwise replace the scheduler's command stream, or
            # pull any buffer it can name.
            attempts.append(
                (executor.control_endpoint, frame(pb.CommandBatch(commands=[pb.ExecutorCommand()])))
            )
            attempts.append((executor.data_endpoint, bulk.request("ports/b0", 1.0)))
        for endpoint, data in attempts:
            answer = read_until_closed(endpoint, data)
            # Closed with nothing, or with a TLS alert: never an answer of the protocol.
            assert answer == b"" or answer[0] == TLS_ALERT, (endpoint, answer[:20])
        # Executors' gRPC refuses plaintext too.
        for executor in info.executors:
            with grpc.insecure_channel(executor.endpoint) as channel:
                with pytest.raises(grpc.RpcError) as refused:
                    # Refused at once; the deadline only bounds a loaded machine's delay.
                    stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30)
                assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        # The scheduler's command streams and the data plane are untouched.
        np.testing.assert_array_equal(chain(client), (np.arange(4) + 1) * 2 + 1)


def start_api(environment: dict[str, str], state: Path) -> tuple[subprocess.Popen[str], dict]:
    """``python -m pathways_api`` on a free loopback port; its ready line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pathways_api", "--host", "127.0.0.1", "--port", "0"],
        env={**os.environ, "PATHWAYS_STATE": str(state), **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()))
    reader.start()
    reader.join(60)
    return process, (json.loads(line[0]) if line and line[0] else {})


def test_the_api_serves_https_only_and_still_wants_a_token(
    tls_files: dict[str, str], tmp_path: Path
) -> None:
    token = "tls-test-token-0123456789"
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({"tenants": {"ada": {"tokens": [token]}}}))
    process, ready = start_api(tls_files, tmp_path)
    try:
        assert ready, process.stderr.read() if process.poll() is not None else "no ready line"
        https = f"https://127.0.0.1:{ready['port']}"
        ca_only = client_tls.load({CA_ENV: tls_files[CA_ENV]})
        assert ca_only is not None
        with ApiClient(https, token, verify=ca_only.client) as api:
            assert api.call("GET", "/v1/me")["tenant"] == "ada"
        with ApiClient(https, None, verify=ca_only.client) as anonymous:
            with pytest.raises(ApiCallError) as refused:
                anonymous.call("GET", "/v1/me")
            assert refused.value.status == 401
        # Plain HTTP gets no answer; a client that does not trust the CA refuses the server.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{ready['port']}/healthz", timeout=10)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{https}/healthz", timeout=10)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert token not in stderr
    assert Path(tls_files[KEY_ENV]).read_text().splitlines()[1] not in stderr


def test_the_cli_s_api_client_checks_the_server_against_the_ca(
    tls_files: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({"tenants": {"ada": {"tokens": ["t"]}}}))
    process, ready = start_api(tls_files, tmp_path)
    try:
        assert ready
        monkeypatch.setenv(CA_ENV, tls_files[CA_ENV])  # all a CLI user needs
        with ApiClient(f"https://localhost:{ready['port']}", "t") as api:
            assert api.call("GET", "/v1/me")["tenant"] == "ada"
        monkeypatch.setenv(CERT_ENV, tls_files[CERT_ENV])  # a certificate without its key
        with pytest.raises(ValueError, match=f"{CERT_ENV} is set .* but {KEY_ENV} is not"):
            ApiClient(f"https://localhost:{ready['port']}", "t")
    finally:
        process.terminate()
        process.communicate(timeout=20)


def run_server(arguments: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *arguments],
        env={**os.environ, "JAX_PLATFORMS": "cpu", **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("arguments", "drop", "named"),
    [
        (["pathways_scheduler", "--executor", "127.0.0.1:1"], KEY_ENV, [KEY_ENV, CERT_ENV]),
        (["pathways_executor", "--fake-devices", "1"], CA_ENV, [CA_ENV]),
        (["pathways_api", "--port", "0"], CERT_ENV, [CERT_ENV, KEY_ENV]),
    ],
)
def test_a_half_configured_server_stops_with_the_variable_named(
    arguments: list[str],
    drop: str,
    named: list[str],
    tls_files: dict[str, str],
    tmp_path: Path,
) -> None:
    environment = {k: v for k, v in tls_files.items() if k != drop}
    environment["PATHWAYS_STATE"] = str(tmp_path)
    finished = run_server(arguments, environment)
    assert finished.returncode != 0
    assert "Traceback" not in finished.stderr, finished.stderr
    for variable in named:
        assert variable in finished.stderr, finished.stderr


def test_an_unreadable_file_stops_the_island_with_its_path(
    tls_files: dict[str, str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "absent.crt")
    island = LocalIsland(hosts=1, devices_per_host=1, environment={**tls_files, CA_ENV: missing})
    with pytest.raises(LaunchError, match=f"{CA_ENV}={missing}: cannot use this file"):
        island.start()
