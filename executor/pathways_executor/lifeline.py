"""Stopping with the process that started this one (a local launcher).

The executor, the scheduler and the API each hold a copy of this module, as of ``tls.py``:
components never import each other, and ``pathways_core`` does no I/O."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

GRACE_SECONDS = 5.0
"""How long SIGTERM has to stop the process before it exits regardless."""


def stop_when_stdin_closes() -> None:
    """SIGTERM this process once its standard input reaches end of file. The launcher holds the
    pipe's other end, so its processes stop with it even when it dies without stopping them
    (SIGKILL, a crash), as a parent-death signal would, but tied to the launcher's process, not
    to the thread that started them. Started before anything that may hang (joining a JAX
    distributed group), and a process SIGTERM does not stop exits ``GRACE_SECONDS`` later."""

    def watch() -> None:
        # The file descriptor, not sys.stdin: a thread blocked in the buffered reader holds
        # its lock, and the interpreter's shutdown, which takes it, aborts the process.
        while os.read(descriptor, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        # Still here: the signal was taken by a handler that does not exit (JAX's, while it
        # joins its distributed group, waited for a dead coordinator for minutes).
        time.sleep(GRACE_SECONDS)
        os._exit(1)

    descriptor = sys.stdin.fileno()
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
