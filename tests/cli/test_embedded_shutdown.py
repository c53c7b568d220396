"""How the embedded cluster stops, and says it did not start: `down` stops the programs' runs a
resource manager left running (and the next `up` starts them again), finds a supervisor whose
cluster.json is gone, and says "stopped" only once nothing runs; a failed `up` shows its reason
and this start's log only; a crash loop's error names its cause."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from processes import assert_all_stop

from pathways_client import embedded
from pathways_client.embedded import (
    MAX_QUICK_FAILURES,
    STABLE_AFTER,
    EmbeddedError,
    Restarts,
    Supervisor,
    _alive,
    down,
    read_info,
    up,
)

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "state"
    folder.mkdir()
    yield folder
    try:
        down(folder)
    finally:  # whatever a failed test left running of it
        for group in (group for run in recorded_runs(folder) for group in run if group):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def recorded_runs(state: Path) -> list[tuple[int, int]]:
    """The wrapper's and the command's pid of each run the state's records name."""
    records = [json.loads(path.read_text()) for path in state.glob("runs/*/*.json")]
    return [(int(record["pid"]), int(record.get("child") or 0)) for record in records]


# -- runs a resource manager left running --------------------------------------------------------


def start_run(state: Path, name: str = "sleeper-run-1", grace: float = 1.0) -> tuple[int, int]:
    """A run as the resource manager starts one (its wrapper in a process group of its own,
    outliving the manager); its wrapper's and its command's pids, once it recorded them."""
    record = state / "runs" / "default" / name
    wrapper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pathways_api.run_job",
            "--record",
            str(record),
            "--uid",
            "uid-1",
            "--grace",
            str(grace),
            "--",
            sys.executable,
            "-c",
            "import time\nwhile True: time.sleep(0.1)",
        ],
        stdout=subprocess.DEVNULL,
        process_group=0,
    )
    recorded = record.with_name(name + ".json")
    wait_until(
        lambda: "child" in (json.loads(recorded.read_text()) if recorded.exists() else {}),
        "the run's record",
        timeout=30,
    )
    return wrapper.pid, int(json.loads(recorded.read_text())["child"])


def test_down_stops_the_runs_a_manager_left_and_only_this_states(
    state: Path, tmp_path: Path, pathways
) -> None:
    """A manager killed or dead left its runs (each a process group of its own) running after
    `down` said "stopped", until the next `up`."""
    wrapper, command = start_run(state)
    # A copy of the state folder holds the records of the original's live runs: not its own.
    copy = tmp_path / "copy"
    shutil.copytree(state, copy)
    assert down(copy) is False
    assert _alive(wrapper) and _alive(command)

    stopped = pathways("down", "--state", str(state))
    assert stopped.exit_code == 0, stopped.output
    assert "stopped" in stopped.output
    assert not _alive(wrapper) and not _alive(command)
    # No record, no exit status: the next manager takes its Job's run as interrupted (it
    # starts again), not as failed with the status SIGTERM gave it.
    assert not list((state / "runs" / "default").iterdir())


def test_down_names_what_it_could_not_stop_and_does_not_say_stopped(
    state: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper, command = start_run(state, grace=0.2)
    # As for a process of another user's: the signals do not reach it.
    monkeypatch.setattr(embedded, "_signal_group", lambda *_: None)
    monkeypatch.setattr(embedded, "RUN_KILL_MARGIN", 0.2)
    result = pathways("down", "--state", str(state))
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "✓" not in output
    left = f"run default/sleeper-run-1 (pid {wrapper}, its command {command})"
    assert f"is not stopped; still running: {left}" in output
    assert f"kill -KILL {wrapper} {command}" in output
    assert (state / "runs" / "default" / "sleeper-run-1.json").exists()  # its record is kept
    monkeypatch.undo()
    assert down(state) is True  # now it can
    assert not _alive(wrapper) and not _alive(command)


def test_down_that_kills_the_supervisors_group_stops_the_runs_too(state: Path) -> None:
    """down's last resort, SIGKILL of the supervisor's process group (with its manager and
    API), left the runs, each in a group of its own, running."""
    info = up(state, [])  # the manager and the API: no island needed
    wrapper, command = start_run(state)  # one the manager runs
    os.kill(info.manager_pid, signal.SIGSTOP)  # the supervisor waits 30 s for it to stop
    assert down(state, timeout=1.0) is True
    assert not any(_alive(pid) for pid in (wrapper, command))
    assert_all_stop([info.supervisor, info.manager_pid, info.api_pid])


PROGRAM = """
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata: {name: sleeper}
spec:
  slices:
    - {name: main, devices: 1}
  driver:
    source: |
      import os, time
      with open(STARTS, "a") as starts:
          starts.write(f"{os.getpid()} {os.environ['PATHWAYS_RUN']}\\n")
      while True:
          time.sleep(0.1)
"""


def test_down_stops_the_runs_of_a_manager_that_does_not_stop_and_up_runs_them_again(
    state: Path, tmp_path: Path, pathways
) -> None:
    """`kill -STOP <manager>; pathways down`: down waited 30 s for the manager, killed it,
    said "stopped", and the program's driver ran on until the next `up`."""
    options = ("--state", str(state), "--hosts", "1", "--devices", "1")
    started = pathways("up", *options)
    assert started.exit_code == 0, started.output
    starts = tmp_path / "starts"
    manifest = tmp_path / "program.yaml"
    manifest.write_text(PROGRAM.replace("STARTS", repr(str(starts))))
    assert pathways("submit", str(manifest), "--state", str(state)).exit_code == 0

    def started_runs() -> list[str]:
        return starts.read_text().splitlines() if starts.exists() else []

    wait_until(lambda: len(started_runs()) == 1, "the program's run")
    driver = int(started_runs()[0].split()[0])
    wait_until(lambda: len(recorded_runs(state)) == 1, "the run's record")
    [(wrapper, _)] = recorded_runs(state)
    info = read_info(state)
    assert info is not None
    os.kill(info.manager_pid, signal.SIGSTOP)  # a manager that does not stop in time

    stopped = pathways("down", "--state", str(state))
    assert stopped.exit_code == 0, stopped.output
    assert "stopped" in stopped.output
    assert not any(_alive(pid) for pid in (wrapper, driver, info.manager_pid))

    # As the README says of `down`: the next `up` starts the run again (interrupted, not failed).
    again = pathways("up", *options)
    assert again.exit_code == 0, again.output
    wait_until(lambda: len(started_runs()) == 2, "the program's run after up")
    events = pathways("get", "sleeper", "--state", str(state), "--events").output
    assert "RunInterrupted" in events, events


# -- a supervisor whose cluster.json is gone ----------------------------------------------------


def test_a_supervisor_whose_cluster_json_is_gone_is_named_by_up_and_stopped_by_down(
    state: Path,
) -> None:
    """With cluster.json deleted, `down` said no cluster runs (it ran on), and `up` said only
    that the cluster did not start."""
    info = up(state, [])  # the manager and the API: no island needed
    (state / "cluster.json").unlink()
    with pytest.raises(EmbeddedError) as refused:
        up(state, [])
    message = str(refused.value)
    assert f"another supervisor (pid {info.supervisor}) holds {state}" in message
    assert f"run 'pathways down --state {state}'" in message
    # A supervisor that wrote no pid in its lock (of an older version) is found by /proc.
    with (state / "supervisor.lock").open("r+") as lock:
        lock.truncate(0)
    assert down(state) is True
    assert_all_stop([info.supervisor, info.api_pid, info.manager_pid])


# -- what a failed start says ------------------------------------------------------------------


BAD_TOKENS = "tenants:\n  Bad_Name:\n    tokens: [abc]\n"  # the API refuses it at start


def test_a_failed_up_shows_its_reason_and_what_this_start_logged_only(state: Path) -> None:
    """It showed the last 15 lines of a log appended across starts (lines of earlier runs)
    ending in the supervisor's traceback, after the reason that the traceback repeated."""
    (state / "tokens.yaml").write_text(BAD_TOKENS)
    earlier = "".join(f"2020-01-01 00:00:00 a line of an earlier run {i}\n" for i in range(20))
    (state / "supervisor.log").write_text(earlier)
    with pytest.raises(EmbeddedError) as failed:
        up(state, [])
    message = str(failed.value)
    assert message.startswith("the embedded cluster did not start: the api did not start (exit")
    assert "tenants.Bad_Name" in message
    assert "earlier run" not in message and "Traceback" not in message, message
    logged = (state / "supervisor.log").read_text()
    assert logged.startswith(earlier) and "Traceback" not in logged
    assert "the cluster did not start: the api did not start" in logged[len(earlier) :]
    assert read_info(state) is None


def test_a_supervisor_that_cannot_start_logs_why_without_a_traceback_and_exits_1(
    state: Path,
) -> None:
    (state / "tokens.yaml").write_text(BAD_TOKENS)
    supervisor = subprocess.run(
        [sys.executable, "-m", "pathways_client.embedded", "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert supervisor.returncode == 1
    said = supervisor.stdout + supervisor.stderr
    assert "the cluster did not start: the api did not start" in said
    assert "Traceback" not in said, said


# -- crash loops ---------------------------------------------------------------------------------


def test_a_crash_loop_error_names_the_cause_from_the_components_log(tmp_path: Path) -> None:
    """It said "the api exited with code 1": "Address already in use" was only in api.log."""
    supervisor = Supervisor(tmp_path, [], None)
    # An earlier start's last words are not this one's.
    (tmp_path / "api.log").write_text("Traceback ...\nValueError: an earlier start's error\n")
    in_use = "OSError: [Errno 98] Address already in use"

    def start_on_a_taken_port() -> None:
        supervisor._spawn("api", ["-c", f"import sys; sys.exit({in_use!r})"])

    guard = Restarts(started=time.monotonic())
    guard.streak = MAX_QUICK_FAILURES  # the last restart allowed in a row
    supervisor._guards["api"] = guard
    supervisor._restart("api", guard, 0.0, start_on_a_taken_port, ())
    supervisor.watch()
    error = supervisor.info.error or ""
    assert error.startswith(f"the api exited with code 1: {in_use}; it failed"), error
    assert f"failed {MAX_QUICK_FAILURES + 1} times in a row" in error
    assert json.loads((tmp_path / "cluster.json").read_text())["error"] == error


def test_the_readme_gives_the_crash_loop_limit_the_code_has() -> None:
    """The README said a component is left down after 5 quick failures; the code started it
    again after the 5th, and left it down at the 6th."""
    guard, now, restarts = Restarts(started=0.0), 0.0, 0
    while guard.failed(now + 1.0) is not None:  # each failure a second after its start
        now += 1.0
        guard.started = now
        restarts += 1
    assert restarts == MAX_QUICK_FAILURES
    readme = " ".join((ROOT / "README.md").read_text().split())
    crash_loops = readme[readme.index("**Crash loops**") :][:600]
    assert f"within {STABLE_AFTER:.0f} s of each start" in crash_loops
    assert re.search(
        rf"at most {restarts} times in a row: the {restarts + 1}th such failure leaves it down",
        crash_loops,
    ), crash_loops
