"""Signal handling of the CLI's long commands: SIGTERM (what ``timeout``, CI runners and
Kubernetes send) unwinding as Ctrl-C does, so their cleanups run."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any


def interrupt(signum: int, frame: FrameType | None) -> None:
    """A signal handler raising ``KeyboardInterrupt``, as Ctrl-C does."""
    raise KeyboardInterrupt


def ignore(signum: int, frame: FrameType | None) -> None:
    """A signal handler doing nothing (not ``SIG_IGN``, which processes started meanwhile
    would inherit)."""


@contextlib.contextmanager
def handled(numbers: tuple[signal.Signals, ...], handler: Any) -> Iterator[None]:
    """``handler`` handles the signals ``numbers`` meanwhile, then the handlers before it
    again (in the main thread only: elsewhere Python cannot set them, and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {number: signal.signal(number, handler) for number in numbers}
    try:
        yield
    finally:
        for number, previous in before.items():
            signal.signal(number, previous)
