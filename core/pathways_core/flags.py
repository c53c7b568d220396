"""``argparse`` types for the numbers of the command lines (executor, scheduler, API and the
benchmark scripts): a number out of range is refused when the command line is read, naming the
flag (``argument --port: must be from 0 to 65535, not 99999``), rather than wrapping (gRPC
listens on 99999 as 34463) or failing later in a traceback."""

from __future__ import annotations

import argparse
from collections.abc import Callable

PORT_MAX = 65535


def at_least(least: int) -> Callable[[str], int]:
    """A whole number of at least ``least``."""

    def whole_number(text: str) -> int:
        value = _whole(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, not {value}")
        return value

    return whole_number


def port(text: str) -> int:
    """A TCP port, 0 for any free one."""
    value = _whole(text)
    if not 0 <= value <= PORT_MAX:
        raise argparse.ArgumentTypeError(f"must be from 0 to {PORT_MAX}, not {value}")
    return value


def fraction(text: str) -> float:
    """A number above 0 and below 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1, not {value}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
