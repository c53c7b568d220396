"""Stopping with the process that started this one (the embedded mode's supervisor).

The executor, the scheduler and the API each hold a copy of this module, as of ``tls.py``:
components never import each other, and ``pathways_core`` does no I/O."""

from __future__ import annotations

import os
import signal
import sys
import threading


def stop_when_stdin_closes() -> None:
    """SIGTERM this process once its standard input reaches end of file. The supervisor holds
    the pipe's other end, so its processes stop with it even when it dies without stopping them
    (SIGKILL, a crash), as a parent-death signal would, but tied to the supervisor's process,
    not to the thread that started them."""

    def watch() -> None:
        # The file descriptor, not sys.stdin: a thread blocked in the buffered reader holds
        # its lock, and the interpreter's shutdown, which takes it, aborts the process.
        while os.read(descriptor, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    descriptor = sys.stdin.fileno()
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
