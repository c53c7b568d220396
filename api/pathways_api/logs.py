"""A window on a program's output: its last lines, at most so many bytes, or what came after an
offset, read from the runs' log files without loading the rest.

A program's output is its runs' logs, each after a ``--- run N ---`` line, one after the other:
a byte sequence that only grows at its end (a run starts when the one before it has ended), so
a byte offset into it stays valid, and ``pathways logs --follow`` asks only for what is new.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

MAX_LOG_BYTES = 16 << 20
"""The most one answer carries (and the API reads): its last bytes when there are more."""

_CHUNK = 1 << 16


@dataclass(frozen=True)
class LogWindow:
    """Which part of the output to read: only run ``run``'s (every run's when None), from
    ``offset``, only the last ``tail_lines`` lines, and at most the last ``limit_bytes`` bytes
    of what that leaves."""

    offset: int = 0
    tail_lines: int | None = None
    limit_bytes: int = MAX_LOG_BYTES
    run: int | None = None


@dataclass(frozen=True)
class LogText:
    """Output read through a window: ``text`` decodes the bytes ``start`` to ``end`` of the
    output (``end`` stops before a character still being written); ``size`` is all there was."""

    text: str
    start: int
    end: int
    size: int
    lines_cut: bool = False
    """The lines asked for (``tail_lines``) begin before ``start``: the byte limit cut them."""


class Part(Protocol):
    """One piece of the output."""

    @property
    def size(self) -> int: ...

    def read(self, start: int, length: int) -> bytes: ...


@dataclass(frozen=True)
class LogBytes:
    """A piece held in memory (a run's header; a pod's log fetched whole)."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, start: int, length: int) -> bytes:
        return self.data[start : start + length]


class LogFile:
    """A run's log file as long as it was when first measured (a running program writes on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.size = path.stat().st_size
        except FileNotFoundError:
            self.size = 0

    def read(self, start: int, length: int) -> bytes:
        length = max(0, min(length, self.size - start))
        if not length:
            return b""
        with self.path.open("rb") as file:
            file.seek(start)
            return file.read(length)


def run_parts(runs: Sequence[tuple[int, Part]]) -> list[Part]:
    """The output of runs (number, log), oldest first: each after its ``--- run N ---`` line,
    a newline between two runs."""
    parts: list[Part] = []
    for index, (number, log) in enumerate(runs):
        header = ("\n" if index else "") + f"--- run {number} ---\n"
        parts.append(LogBytes(header.encode()))
        parts.append(log)
    return parts


def read_window(parts: Sequence[Part], window: LogWindow) -> LogText:
    """The window's part of the output ``parts`` make up, read in chunks: never more than
    ``window.limit_bytes`` (and a chunk) of it."""
    output = _Joined(parts)
    end = output.size
    start = min(max(window.offset, end - window.limit_bytes), end)
    lines_cut = False
    if window.tail_lines is not None:
        # One byte before the limit too: lines that begin before it were cut by it (lines
        # beginning right at it, after a newline, were not).
        floor = start - 1 if start > max(window.offset, 0) else start
        lines_start = _line_start(output, end, window.tail_lines, floor=floor)
        lines_cut = lines_start < start
        start = max(start, lines_start)
    data = output.read(start, end - start)
    skipped = _continuation_bytes(data)  # a window cutting a character starts after it
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data[skipped:], final=False)
    unfinished = len(decoder.getstate()[0])  # a character whose last bytes are not written yet
    return LogText(text, start + skipped, end - unfinished, output.size, lines_cut)


class _Joined:
    """Parts read as one byte sequence."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = [part for part in parts if part.size]
        self.size = sum(part.size for part in self.parts)

    def read(self, start: int, length: int) -> bytes:
        pieces, at = [], 0
        for part in self.parts:
            if length <= 0:
                break
            if start < at + part.size:
                offset = max(0, start - at)
                piece = part.read(offset, min(length, part.size - offset))
                pieces.append(piece)
                length -= len(piece)
                start += len(piece)
            at += part.size
        return b"".join(pieces)


def _line_start(output: _Joined, end: int, lines: int, floor: int) -> int:
    """Where the last ``lines`` lines before ``end`` begin (a final newline ends the last line,
    it does not start another), looking back no further than ``floor``."""
    if lines == 0:
        return end
    if end <= floor:
        return floor
    wanted = lines + 1 if output.read(end - 1, 1) == b"\n" else lines
    position = end
    while position > floor:
        chunk_start = max(floor, position - _CHUNK)
        chunk = output.read(chunk_start, position - chunk_start)
        index = len(chunk)
        while (index := chunk.rfind(b"\n", 0, index)) >= 0:
            wanted -= 1
            if not wanted:
                return chunk_start + index + 1
        position = chunk_start
    return floor


def _continuation_bytes(data: bytes) -> int:
    """How many bytes at the start of ``data`` continue a character begun before it."""
    count = 0
    while count < min(3, len(data)) and data[count] & 0xC0 == 0x80:
        count += 1
    return count
