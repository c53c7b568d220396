"""Waiting for programs to finish, with a progress bar (the CLI and the demo)."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pathways_client.api_client import ApiClient
from pathways_core.control.common import printable

TERMINAL = ("Succeeded", "Failed")
"""Phases a program never leaves (a cancelled one is ``Suspended`` for good too: see
:func:`finished`)."""


class WaitTimeout(TimeoutError):
    """The wait's time ran out: ``finished`` and ``pending`` hold the programs' last documents
    (by the keys the wait was given), those that finished and those that had not."""

    def __init__(
        self,
        message: str,
        finished: dict[Hashable, dict[str, Any]],
        pending: dict[Hashable, dict[str, Any]],
    ) -> None:
        super().__init__(message)
        self.finished, self.pending = finished, pending


def phase_of(document: dict[str, Any]) -> str:
    """A program's phase (``Pending`` until its status says otherwise)."""
    return (document.get("status") or {}).get("phase") or "Pending"


def finished(document: dict[str, Any]) -> bool:
    """Whether a program will run no more: succeeded, failed, or cancelled."""
    status = document.get("status") or {}
    return phase_of(document) in TERMINAL or (
        status.get("phase") == "Suspended" and status.get("reason") == "Cancelled"
    )


def standing(document: dict[str, Any]) -> str:
    """Where a program stands: its phase, and why (its status message), if it says."""
    message = (document.get("status") or {}).get("message")
    return phase_of(document) + (f" ({printable(message)})" if message else "")


def wait_programs(
    programs: Mapping[Hashable, tuple[ApiClient, str]],
    console: Console,
    what: str = "programs",
    timeout: float | None = 1800.0,
    report: bool = False,
) -> dict[Hashable, dict[str, Any]]:
    """Poll programs (any key -> the client of its tenant and its name) until each is
    Succeeded, Failed or cancelled; their last documents. With ``report``, print a line each time a
    program's phase or status message changes (why it waits, in logs too, where the progress
    bar is not drawn). :class:`WaitTimeout` after ``timeout`` seconds (``None``: no limit)."""
    done: dict[Hashable, dict[str, Any]] = {}
    last: dict[Hashable, dict[str, Any]] = {}
    said: dict[Hashable, str] = {}
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} finished"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(what, total=len(programs))
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(done) < len(programs):
            phases = []
            for key, (client, name) in programs.items():
                if key in done:
                    continue
                document = last[key] = client.get("programs", name)
                phase, now = phase_of(document), standing(document)
                if report and said.get(key) != now:
                    said[key] = now
                    progress.console.print(f"{name}: {now}", markup=False)
                phases.append(f"{name}: {phase}")
                if finished(document):
                    done[key] = document
            progress.update(
                task, completed=len(done), description=f"{what} ({', '.join(phases[:2])})"
            )
            if len(done) == len(programs):
                break
            if deadline is not None and time.monotonic() > deadline:
                pending = {key: last[key] for key in programs if key not in done}
                ended = {key: done[key] for key in programs if key in done}
                raise WaitTimeout(f"{what}: still running after {timeout:g} s", ended, pending)
            time.sleep(0.3)
    return {key: done[key] for key in programs}


def changes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of ``after`` that are new or changed since ``before`` (another
    resourceVersion), in their order; then those of ``before`` gone from ``after``, each with
    its phase set to Deleted."""
    versions = {_key(d): d["metadata"].get("resourceVersion") for d in before}
    changed = [d for d in after if versions.get(_key(d)) != d["metadata"]["resourceVersion"]]
    present = {_key(d) for d in after}
    deleted = [
        {**d, "status": {**(d.get("status") or {}), "phase": "Deleted"}}
        for d in before
        if _key(d) not in present
    ]
    return changed + deleted


def _key(document: dict[str, Any]) -> tuple[str, str]:
    meta = document["metadata"]
    return meta.get("namespace") or "", meta["name"]
