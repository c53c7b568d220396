"""Waiting for programs to finish, with a progress bar (the CLI and the demo)."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from pathways_client.api_client import ApiClient

TERMINAL = ("Succeeded", "Failed")


def wait_programs(
    programs: Mapping[Hashable, tuple[ApiClient, str]],
    console: Console,
    what: str = "programs",
    timeout: float = 1800.0,
) -> dict[Hashable, dict[str, Any]]:
    """Poll programs (any key -> the client of its tenant and its name) until each is
    Succeeded or Failed; their last documents. TimeoutError after ``timeout`` seconds."""
    done: dict[Hashable, dict[str, Any]] = {}
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
        deadline = time.monotonic() + timeout
        while len(done) < len(programs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: still running after {timeout:.0f} s")
            phases = []
            for key, (client, name) in programs.items():
                if key in done:
                    continue
                document = client.get("programs", name)
                phase = (document.get("status") or {}).get("phase") or "Pending"
                phases.append(f"{name}: {phase}")
                if phase in TERMINAL:
                    done[key] = document
            progress.update(
                task, completed=len(done), description=f"{what} ({', '.join(phases[:2])})"
            )
            if len(done) < len(programs):
                time.sleep(0.3)
    return {key: done[key] for key in programs}
