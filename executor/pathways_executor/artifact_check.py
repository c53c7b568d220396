"""Untrusted compiled functions are parsed in a helper process before the executor loads them.

A function artifact is chosen by a client. Its StableHLO module is parsed by MLIR's bytecode
reader, native code that is not hardened against hostile input: a few flipped bytes in an
artifact whose id (its sha256) is still right were seen to corrupt the heap and abort the
process (``malloc(): unsorted double linked list corrupted``), and an executor that aborts takes
its island down. So the executor first has a kept helper process (``python -m
pathways_executor.artifact_check``) parse the module; a module that crashes the helper or does
not parse is refused with a clear error, and the helper is started afresh for the next one.
The helper never touches the accelerators (it only parses, on the CPU platform).
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import subprocess
import sys
import threading

LENGTH = struct.Struct("!I")
# How long the helper may take to start (it imports JAX) and to parse one module.
START_TIMEOUT_SECONDS = 120.0
CHECK_TIMEOUT_SECONDS = 120.0
_READY = b"ready\n"


class ArtifactChecker:
    """Parses serialized StableHLO modules in a kept helper process; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def start_soon(self) -> None:
        """Start the helper in the background, so the first registration does not wait."""

        def start() -> None:
            with self._lock, contextlib.suppress(OSError, RuntimeError):
                self._helper()

        threading.Thread(target=start, name="artifact-check", daemon=True).start()

    def check(self, module: bytes) -> str | None:
        """None when ``module`` (an artifact's serialized StableHLO) parses in the helper;
        otherwise why not. Raises ``RuntimeError`` when the helper cannot be started."""
        with self._lock:
            process = self._helper()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(LENGTH.pack(len(module)) + module)
                process.stdin.flush()
                reply = _read_line(process.stdout, CHECK_TIMEOUT_SECONDS)
            except OSError:
                reply = b""
            if reply.startswith(b"ok"):
                return None
            if reply.startswith(b"error "):
                return reply[len(b"error ") :].decode(errors="replace").strip()
            # The module crashed the helper (or hung it): a new helper parses the next one.
            self._stop()
            code = process.returncode
            how = f"exit code {code}" if code is not None and code >= 0 else f"signal {-code}"
            if code is None:
                how = f"no answer within {CHECK_TIMEOUT_SECONDS:.0f} s"
            return f"its StableHLO module crashed the parser ({how})"

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _helper(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        environment = {**os.environ, "JAX_PLATFORMS": "cpu"}
        environment.pop("XLA_FLAGS", None)
        process = subprocess.Popen(
            [sys.executable, "-m", "pathways_executor.artifact_check"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=environment,
        )
        assert process.stdout is not None
        if _read_line(process.stdout, START_TIMEOUT_SECONDS) != _READY:
            process.kill()
            process.wait()
            raise RuntimeError("the artifact checker helper did not start")
        self._process = process
        return process

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()


def _read_line(pipe: object, timeout: float) -> bytes:
    """One line from the helper, or b"" if it ended or said nothing within ``timeout``."""
    ready, _, _ = select.select([pipe], [], [], timeout)
    if not ready:
        return b""
    return pipe.readline()  # type: ignore[attr-defined]


def main() -> None:
    """The helper: reads length-prefixed modules on stdin, answers ``ok`` or ``error ...``."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    incoming, outgoing = sys.stdin.buffer, sys.stdout.buffer
    outgoing.write(_READY)
    outgoing.flush()
    while len(header := incoming.read(LENGTH.size)) == LENGTH.size:
        (size,) = LENGTH.unpack(header)
        data = incoming.read(size)
        try:
            with mlir.make_ir_context():
                # Printing walks the whole parsed module, as the executor's lowering will.
                mlir.module_to_string(_jax.mlir.deserialize_portable_artifact(data))
            reply = b"ok"
        except Exception as error:
            reply = b"error " + f"{type(error).__name__}: {error}".encode()[:4000]
        outgoing.write(reply.replace(b"\n", b" ") + b"\n")
        outgoing.flush()


if __name__ == "__main__":
    main()
