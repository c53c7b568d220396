"""Helpers of the proxy tests (and benchmarks/proxy.py): a real proxy server process on
loopback, and stock JAX clients run as subprocesses.

Every JAX client runs in its own process: the proxy backend is chosen when JAX starts, and a
client that the IFRT library aborts must not take the test process with it."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


def client_env() -> dict[str, str]:
    """The environment of a client process: no JAX settings inherited from the tests."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS"] = "true"
    return env


@dataclass
class ProxyProcess:
    """A ``pathways proxy`` process and the address it listens on."""

    process: subprocess.Popen[str]
    address: str
    lines: list[str]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.process.poll() is None


def start_proxy(
    *args: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> ProxyProcess:
    """Start ``pathways proxy --port 0 ARGS`` (with ``env`` over the clients' environment);
    returns once it listens."""
    return start_listening(["proxy", "--port", "0", *args], timeout, env)


def start_listening(
    command: list[str], timeout: float = 60.0, env: dict[str, str] | None = None
) -> ProxyProcess:
    """Start ``pathways COMMAND`` as a process (with ``env`` over the clients' environment);
    returns once it prints ``listening on ADDRESS``."""
    process = subprocess.Popen(
        [PYTHON, "-m", "pathways_client", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**client_env(), **(env or {})},
    )
    lines: list[str] = []
    found: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "listening on" in line:
                found.put(line.split("listening on ", 1)[1].split()[0])
        found.put("")

    threading.Thread(target=pump, daemon=True).start()
    try:
        address = found.get(timeout=timeout)
    except queue.Empty:
        address = ""
    if not address:
        process.kill()
        raise RuntimeError(f"pathways {command[0]} did not start:\n" + "".join(lines))
    return ProxyProcess(process, address, lines)


def stop_proxy(proxy: ProxyProcess) -> None:
    proxy.process.terminate()
    try:
        proxy.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proxy.process.kill()
        proxy.process.wait(timeout=20)


def run_client(code_or_args: list[str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run a JAX client process (``python ARGS``), bounded in time."""
    return subprocess.run(
        [PYTHON, *code_or_args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=client_env(),
        cwd=HERE,
    )


def run_program(address: str, body: str) -> Any:
    """Run ``body`` in a stock JAX client of the proxy at ``address``; it must succeed and print
    JSON last: returns that, decoded."""
    result = run_client(["-c", connect_snippet(address) + body])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def connect_snippet(address: str, timeout: int = 30) -> str:
    """The lines of docs/proxy.md that make a program use the proxy at ``address``."""
    return f"""
import jax
from jax.extend import backend
options = backend.ifrt_proxy.ClientConnectionOptions()
options.connection_timeout_in_seconds = {timeout}
backend.register_backend_factory(
    "proxy", lambda: backend.ifrt_proxy.get_client("grpc://{address}", options), priority=-1
)
jax.config.update("jax_platforms", "proxy")
"""
