"""Plain JAX running the parallel suite's chain with no control plane at all, as a JAX user
writes it (the island's executor, moving inputs through the runtime's copy, dispatches a
node faster than ``jax.device_put`` does). One process per host of 4 fake CPU devices; stage s
runs ``x * 1.0001 + 1`` on 1,024 floats on the island's device s % (4 x hosts), as in
``dispatch.py``'s chain suite, each stage's input put on its device by ``jax.device_put`` as a
JAX user does. Where the chain moves to the other host the array goes over one kept loopback
TCP connection (JAX has no point-to-point transfer between processes on CPU): the bytes alone,
no framing, no thread hand-offs. Started by ``dispatch.py`` (once per host) and kept running,
so its rounds interleave with the island's.

Reads ``CHAIN STAGES`` on stdin (every process gets each) and answers on stdout: the first
process the chains per second of one chain (its first stage dispatched to its last stage's
result ready, on the machine's monotonic clock, which both processes share), the other ``ok``.
The last stage's process checks the result (after the clock stops) and exits if it is wrong.

    python benchmarks/jax_stage_chain.py INDEX HOSTS PORT
"""

from __future__ import annotations

import socket
import struct
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402

DEVICES_PER_HOST = 4
WIDTH = 1024
CLOCK = struct.Struct("q")
STEP = jax.jit(lambda x: x * 1.0001 + 1)


def connect(index: int, port: int) -> socket.socket:
    """The kept connection between the two processes: the first listens, the second dials."""
    if index == 0:
        with socket.create_server(("127.0.0.1", port)) as listener:
            connection, _ = listener.accept()
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                connection = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def receive(connection: socket.socket, size: int) -> bytearray:
    """Exactly ``size`` bytes from the other process."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        count = connection.recv_into(view[got:])
        if count == 0:
            raise ConnectionError("the other process closed the connection")
        got += count
    return data


def check(result: np.ndarray, stages: int) -> None:
    """Exit naming the problem unless the chain computed what its stages should have."""
    expected = np.ones(WIDTH, np.float32)
    for _ in range(stages):
        expected = expected * np.float32(1.0001) + np.float32(1)
    if not np.allclose(result, expected, rtol=1e-5):
        raise SystemExit(f"the {stages}-stage chain gave {result[:3]}, expected {expected[:3]}")


def run_chain(
    index: int, hosts: int, stages: int, x: jax.Array, peer: socket.socket | None
) -> float | None:
    """One chain; its chains per second on the first process, None on the other."""
    devices = jax.devices()
    owners = [(s % (DEVICES_PER_HOST * hosts)) // DEVICES_PER_HOST for s in range(stages)]
    start = time.perf_counter_ns()
    y: jax.Array | np.ndarray | None = x if index == 0 else None
    for s, owner in enumerate(owners):
        if owner != index:
            if s and owners[s - 1] == index:  # the chain moves to the other host
                assert peer is not None
                peer.sendall(np.asarray(y).tobytes())
            y = None
            continue
        if y is None:  # it comes from the other host
            assert peer is not None
            y = np.frombuffer(receive(peer, WIDTH * 4), np.float32)
        y = STEP(jax.device_put(y, devices[s % DEVICES_PER_HOST]))
    if owners[-1] == index:
        assert isinstance(y, jax.Array)
        y.block_until_ready()
        end = time.perf_counter_ns()
        check(np.asarray(y), stages)
        if index == 0:
            return 1e9 / (end - start)
        assert peer is not None
        peer.sendall(CLOCK.pack(end))  # when the chain ended, for the first process
        return None
    if index != 0:
        return None
    assert peer is not None
    (end,) = CLOCK.unpack(receive(peer, CLOCK.size))
    return 1e9 / (end - start)


def main() -> None:
    index, hosts, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    for device in jax.devices():  # compiled for every device before the first chain
        STEP(jax.device_put(np.ones(WIDTH, np.float32), device)).block_until_ready()
    # As the island's chains, this one starts from an array already on the first device.
    x = jax.device_put(np.ones(WIDTH, np.float32), jax.devices()[0])
    peer = connect(index, port) if hosts > 1 else None
    for line in sys.stdin:
        command, value = line.split()
        if command != "CHAIN":
            raise SystemExit(f"unknown command {command!r}: expected CHAIN STAGES")
        rate = run_chain(index, hosts, int(value), x, peer)
        print("ok" if rate is None else repr(rate), flush=True)


if __name__ == "__main__":
    main()
