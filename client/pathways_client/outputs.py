"""Paths a command will write, checked when its command line is read.

A benchmark run takes ~20 minutes and the demo a minute: an output path that cannot be written
must fail before the work, naming its option, not in a traceback after it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click


class OutputPath(click.ParamType):
    """A file the command writes (a folder with ``folder``), ending in one of ``suffixes``
    when given: its folders are made and it is tried for writing, leaving what is there (the
    folders made are removed when the command ends with nothing written in them)."""

    name = "path"

    def __init__(self, folder: bool = False, suffixes: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.suffixes = suffixes

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        path = Path(value)
        if self.suffixes and path.suffix not in self.suffixes:
            ending = " or ".join(self.suffixes)
            self.fail(f"must end in {ending}, not {path.suffix or 'nothing'!r}", param, ctx)
        in_the_way = next(p for p in (path, *path.parents) if p.exists())
        if in_the_way != path and not in_the_way.is_dir():
            self.fail(f"{in_the_way} is a file, not a folder", param, ctx)
        if path.exists() and path.is_dir() != self.folder:
            self.fail(f"{path} is not {'a folder' if self.folder else 'a file'}", param, ctx)
        folder = path if self.folder else path.parent
        made = [p for p in (folder, *folder.parents) if not p.exists()]
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _try_writing(path, self.folder)
        except OSError as error:
            self.fail(f"cannot write {path}: {error.strerror or error}", param, ctx)
        finally:
            if ctx is not None:  # the folders made go when nothing was written in them
                ctx.call_on_close(lambda: _remove_empty(made))
        return path


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (the command wrote there), or gone
            return


def _try_writing(path: Path, folder: bool) -> None:
    """Write to ``path`` (a file in it if a folder) without changing what is there."""
    if folder:
        with tempfile.TemporaryFile(dir=path):
            return
    existed = path.exists()
    with path.open("a"):
        pass
    if not existed:
        path.unlink()
