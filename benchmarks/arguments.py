"""Argument types the benchmark scripts share: a number out of its range is refused at once,
naming the flag (``argument --sizes: must be >= 1, not -5``), before any island starts."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def at_least(least: int) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number of at least ``least``."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, not {value}")
        return value

    return whole_number


def fraction(text: str) -> float:
    """An ``argparse`` type: a number above 0 and below 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and below 1, not {value}")
    return value
