"""Run one Job's command so that its outcome survives the resource manager.

``python -m pathways_api.run_job --record PREFIX --uid UID -- COMMAND...`` is what the embedded
resource manager starts for every run (in a session of its own, so a manager killed by SIGKILL
leaves it running). It

1. takes an exclusive ``flock`` on ``PREFIX.lock`` for its whole life: a second wrapper of the
   same run (a restarted manager that started it again before it saw the first) exits at once
   with :data:`ALREADY_RUNNING` and runs nothing, so a run's command runs at most once;
2. writes ``PREFIX.json``: the Job's uid, its own pid and the start time of that pid (from
   ``/proc``), so a restarted manager can tell this process from a later one with the same pid
   and *adopt* the run;
3. runs the command as its child, in a process group of its own, and waits; SIGTERM and SIGINT
   are passed on to that group, and ``--grace`` seconds after SIGTERM whatever is left is
   killed (a pod's ``terminationGracePeriodSeconds``). The child's output (stdout and stderr)
   passes through it to its own, the run's log, up to ``--max-output`` bytes (then one line
   says the rest is dropped, and the rest is read and dropped, but for its last 64 KiB, written
   when the run ends: a program printing in a loop can fill no disk, never blocks on a full
   pipe, and its last words are kept);
4. when the command ends, kills every process it left (it is their *subreaper*: a child that
   started a session of its own is still its descendant), as a container's end does: they
   kept computing on devices given to other programs, and wrote the next run's checkpoints;
5. writes the exit status to ``PREFIX.exit`` (atomically, with the uid) and exits with it (a
   command killed by signal N exits 128 + N, as a shell says it).

A manager that finds the run's pid gone reads ``PREFIX.exit``; no such file means the wrapper
itself was killed, and the run was lost.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ALREADY_RUNNING = 75
"""Exit code of a wrapper that found another one running the same run (EX_TEMPFAIL)."""
MAX_OUTPUT_BYTES = 1 << 30
"""The most of a run's output its log keeps by default (the kubelet keeps 50 MiB of a
container's, rotated; a run's log is kept whole, up to this)."""


def paths(prefix: Path) -> tuple[Path, Path, Path]:
    """The lock, record and exit files of a run."""
    return (
        prefix.with_name(prefix.name + ".lock"),
        prefix.with_name(prefix.name + ".json"),
        prefix.with_name(prefix.name + ".exit"),
    )


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, field 22 of ``/proc/PID/stat``), or
    ``None`` if no such process runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_wrapper_of(pid: int, record: Path) -> bool:
    """Whether process ``pid`` is this module's wrapper of the run whose files are at
    ``record``: a copy of a state folder holds the records of another cluster's live runs,
    whose processes that cluster's manager, not the copy's, may adopt and stop."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    words = arguments.split("\0")
    given = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--record"]
    return any(Path(path).resolve() == record.resolve() for path in given)


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` to ``path`` atomically (a reader sees the old file or the new one)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with temporary.open("w") as handle:
        json.dump(value, handle)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object written by :func:`write_json`, or ``None``."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


OUTPUT_DRAIN_SECONDS = 5.0
"""How long an ended command's last output is waited for."""
GRACE_SECONDS = 10.0
"""How long a command has between SIGTERM and SIGKILL, by default."""
TAIL_BYTES = 1 << 16
"""The last bytes of an output over the limit that are kept all the same (its last words)."""
PR_SET_CHILD_SUBREAPER = 36


def copy_output(source: int, limit: int) -> None:
    """Copy what ``source`` gives to standard output (the run's log) until it closes: the
    first ``limit`` bytes, then one line saying the rest is dropped, and at the end the last
    :data:`TAIL_BYTES` of what was dropped."""
    kept = dropped = 0
    tail = bytearray()
    while chunk := _read(source):
        part = chunk[: max(0, limit - kept)]
        if part:
            _write_all(part)
            kept += len(part)
        rest = chunk[len(part) :]
        if not rest:
            continue
        if not dropped:
            _write_all(
                f"\n[run_job] the output went over {limit} bytes: the rest is not kept but "
                "for its last 64 KiB, written when the run ends (--max-output of the resource "
                "manager, PATHWAYS_MAX_OUTPUT_BYTES)\n".encode()
            )
        dropped += len(rest)
        tail += rest
        del tail[: max(0, len(tail) - TAIL_BYTES)]
    if dropped:
        _write_all(
            f"\n[run_job] {dropped - len(tail)} bytes not kept; the last {len(tail)}:\n".encode()
            + bytes(tail)
        )


def _read(source: int) -> bytes:
    try:
        return os.read(source, 1 << 16)
    except OSError:  # the pipe is gone
        return b""


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sys.stdout.fileno(), view) :]


def main(argv: list[str] | None = None) -> int:
    """Run the command once; return its exit status."""
    parser = argparse.ArgumentParser(prog="python -m pathways_api.run_job", description=__doc__)
    parser.add_argument("--record", type=Path, required=True, help="Prefix of the run's files.")
    parser.add_argument("--uid", required=True, help="The Job's uid.")
    parser.add_argument(
        "--max-output",
        type=int,
        default=MAX_OUTPUT_BYTES,
        help="Bytes of the command's output to keep; the rest is dropped.",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=GRACE_SECONDS,
        help="Seconds from SIGTERM to SIGKILL of what the command left.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    arguments = parser.parse_args(argv)
    command = arguments.command[1:] if arguments.command[:1] == ["--"] else arguments.command
    if not command:
        parser.error("no command given after --")
    lock_path, record_path, exit_path = paths(arguments.record)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path.open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"run_job: {arguments.record} already runs in another process", file=sys.stderr)
        return ALREADY_RUNNING
    record = read_json(exit_path)
    if record is not None and record.get("uid") == arguments.uid:
        # This run already ran to its end (a manager started it again after it finished).
        return ALREADY_RUNNING
    write_json(
        record_path,
        {
            "uid": arguments.uid,
            "pid": os.getpid(),
            "start": process_start(os.getpid()),
            "started": time.time(),
        },
    )
    become_subreaper()
    try:
        # A group of its own: a command that kills its group does not kill this wrapper.
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0
        )
    except OSError as error:
        print(f"run_job: could not start {command[0]!r}: {error}", file=sys.stderr)
        write_json(exit_path, {"uid": arguments.uid, "code": 127, "error": str(error)})
        return 127
    record = read_json(record_path) or {}
    write_json(record_path, {**record, "child": child.pid})

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        if signum == signal.SIGTERM:  # then, after the grace period, whatever is left
            timer = threading.Timer(arguments.grace, end_all, args=(child.pid,))
            timer.daemon = True
            timer.start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    assert child.stdout is not None
    pump = threading.Thread(
        target=copy_output, args=(child.stdout.fileno(), arguments.max_output), daemon=True
    )
    pump.start()
    code = child.wait()
    end_all(child.pid)  # what it left behind ends with it, as in a container
    pump.join(timeout=OUTPUT_DRAIN_SECONDS)  # a process out of reach may hold the pipe
    write_json(exit_path, {"uid": arguments.uid, "code": code, "ended": time.time()})
    return 128 - code if code < 0 else code


def become_subreaper() -> None:
    """Make the processes the command leaves orphaned (a child that started a session of its
    own, say) this process's children rather than init's, so that :func:`end_all` finds them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def end_all(command: int, timeout: float = 5.0) -> None:
    """SIGKILL the command's process group and every process below this one, and reap them
    (the orphans of those killed come to this process, and are killed in turn). The command
    itself is left to its ``Popen`` to reap, which would otherwise read its status as 0."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(command, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in descendants(os.getpid()) if pid != command]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # those that became this process's children


if __name__ == "__main__":
    sys.exit(main())
