"""The embedded resource manager over the SQLite store: the operator's decisions run programs'
Jobs as real local processes with the contract's environment, release what finished, cancelled
and deleted programs hold, and recover after a restart. The island here is only registered (its
endpoint answers nothing): these drivers never connect to it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from unittest.mock import ANY

import pytest

from pathways_api.errors import StoreDamaged
from pathways_api.manager import Manager
from pathways_api.run_job import ALREADY_RUNNING, paths, process_start, read_json
from pathways_api.store import EVENTS_KEPT, SqliteStore
from pathways_core.control import Event, ObjectRef

T = TypeVar("T")
ENDPOINT = "127.0.0.1:9"  # registered, never called by these drivers


def wait_for(check: Callable[[], T], timeout: float = 60.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or check}")


class Running:
    """A manager in a thread, stopped (as SIGTERM would) by ``stop``."""

    def __init__(self, state: Path) -> None:
        self.store = SqliteStore(state / "pathways.db")
        self.manager = Manager(self.store, state, interval=0.05)
        self.thread = threading.Thread(target=self.manager.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.manager._stop.set()
        self.thread.join(timeout=30)
        self.manager.stop()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "islands.json").write_text(
        json.dumps(
            {"local": {"endpoint": ENDPOINT, "hosts": 1, "devicesPerHost": 4, "policy": "fifo"}}
        )
    )
    return tmp_path


@pytest.fixture
def running(state: Path) -> Iterator[Running]:
    manager = Running(state)
    yield manager
    manager.stop()


def submit(store: SqliteStore, name: str, source: str, **spec: Any) -> None:
    slices = spec.pop("slices", [{"name": "main", "devices": 2}])
    store.insert(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "PathwaysProgram",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"slices": slices, "driver": {"source": source}, **spec},
        },
        devices=2,
    )


def phase(store: SqliteStore, kind: str, name: str, namespace: str | None = "team") -> Any:
    return ((store.read(kind, namespace, name) or {}).get("status") or {}).get("phase")


PRINT_SETTINGS = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('PATHWAYS_')}))"
)


def test_a_program_runs_with_the_contract_environment_and_gives_its_devices_back(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = running.store
    # The manager's own environment stays its own: a driver is started as a pod is, with
    # its Job's variables and the machine's basics, never a token.
    monkeypatch.setenv("PATHWAYS_TOKEN", "another-tenants-token")
    monkeypatch.setenv("CLOUD_SECRET", "the-admins")
    wait_for(lambda: phase(store, "Island", "local", None) == "Ready", what="island Ready")
    submit(
        store, "hello", PRINT_SETTINGS.replace("'PATHWAYS_'", "('PATHWAYS_', 'CLOUD_')"), weight=3
    )
    wait_for(lambda: phase(store, "PathwaysProgram", "hello") == "Succeeded", what="Succeeded")
    log = store.log_path("team", "hello-run-1").read_text()
    settings = json.loads(log.strip().splitlines()[-1])
    assert "PATHWAYS_TOKEN" not in settings and "CLOUD_SECRET" not in settings
    # Its slice queued from the program's creation, timed to the microsecond.
    program = store.read("PathwaysProgram", "team", "hello")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", program["metadata"]["creationTimestamp"]
    )
    assert settings["PATHWAYS_PROGRAM"] == "team/hello"
    assert settings["PATHWAYS_WEIGHT"] == "3"
    assert settings["PATHWAYS_RUN"] == "1"
    program = store.read("PathwaysProgram", "team", "hello")
    checkpoints = Path(settings["PATHWAYS_CHECKPOINT_DIR"])
    assert (
        checkpoints
        == running.manager.state / "checkpoints" / "team" / "hello" / (program["metadata"]["uid"])
    )
    assert checkpoints.is_dir()
    assert json.loads(settings["PATHWAYS_SLICES"]) == {
        "main": {
            "virtualSlice": "hello-main",
            "island": "local",
            "scheduler": ENDPOINT,
            "devices": [0, 1],
            "shape": None,
        }
    }
    # Its inline slice is released, then removed; the island's devices are all free again.
    wait_for(lambda: store.read("VirtualSlice", "team", "hello-main") is None, what="released")
    wait_for(
        lambda: (
            (store.read("Island", None, "local") or {}).get("status", {}).get("devicesFree") == 4
        ),
        what="devices free",
    )
    assert not store.read("PathwaysProgram", "team", "hello")["metadata"].get("deletionTimestamp")


def test_failed_runs_restart_then_fail_and_time_shared_programs_share(running: Running) -> None:
    store = running.store
    submit(store, "flaky", "import sys; sys.exit(3)", restartPolicy="OnFailure", maxRestarts=1)
    # A long last line keeps its end, where the cause is (cut at 300, it was lost); the codes
    # a terminal obeys are shown as text (they cleared and recoloured the screens of `get`).
    submit(store, "wordy", "raise SystemExit('upstream ' * 200 + 'ROOT CAUSE\\x1b[2J')")
    for name in ("one", "two"):
        submit(
            store,
            name,
            "import time; time.sleep(1)",
            slices=[{"name": "main", "devices": 4, "timeShared": True}],
        )
    wait_for(lambda: phase(store, "PathwaysProgram", "flaky") == "Failed", what="Failed")
    status = store.read("PathwaysProgram", "team", "flaky")["status"]
    assert (status["runs"], status["restarts"]) == (2, 1)
    assert "the driver exited with code 3" in status["message"]
    wait_for(lambda: phase(store, "PathwaysProgram", "wordy") == "Failed", what="wordy Failed")
    wordy = store.read("PathwaysProgram", "team", "wordy")["status"]["message"]
    assert wordy.endswith("ROOT CAUSE\\x1b[2J") and " ... " in wordy, wordy
    assert "\x1b" not in wordy
    # Both time-shared programs hold all 4 devices of the island at once.
    wait_for(
        lambda: (
            phase(store, "PathwaysProgram", "one") == "Running"
            and phase(store, "PathwaysProgram", "two") == "Running"
        ),
        what="both running",
    )
    devices = [
        store.read("VirtualSlice", "team", f"{n}-main")["status"]["devices"] for n in ("one", "two")
    ]
    assert devices == [[0, 1, 2, 3], [0, 1, 2, 3]]
    for name in ("one", "two"):
        wait_for(lambda name=name: phase(store, "PathwaysProgram", name) == "Succeeded")


def test_a_deleted_program_takes_no_slice_of_its_name_that_is_not_its_own(
    running: Running,
) -> None:
    """Deleted, a program refused as SliceNameTaken took the user's VirtualSlice with it."""
    store = running.store
    store.insert(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "VirtualSlice",
            "metadata": {"name": "job1-main", "namespace": "team"},
            "spec": {"devices": 1},
        },
        devices=1,
    )
    submit(store, "job1", "print(1)")
    wait_for(
        lambda: (
            (store.read("PathwaysProgram", "team", "job1") or {}).get("status", {}).get("reason")
            == "SliceNameTaken"
        ),
        what="SliceNameTaken",
    )
    store.mark_deleting("PathwaysProgram", "team", "job1")
    wait_for(lambda: store.read("PathwaysProgram", "team", "job1") is None, what="deleted")
    kept = store.read("VirtualSlice", "team", "job1-main")
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")
    assert phase(store, "VirtualSlice", "job1-main") == "Bound"


def test_a_run_no_process_could_start_fails_alone(running: Running) -> None:
    """A Job whose command held a NUL character (the API now refuses it) raised at each of
    the manager's rounds before it started anything after it: no tenant's later run began."""
    store = running.store
    wait_for(lambda: phase(store, "Island", "local", None) == "Ready", what="island Ready")
    container = {"name": "driver", "args": ["python", "-c", "print(1)\0"]}
    store.insert(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "broken", "namespace": "team"},
            "spec": {"template": {"spec": {"containers": [container]}}},
        }
    )
    submit(store, "hello", "print('hello')")
    wait_for(lambda: phase(store, "PathwaysProgram", "hello") == "Succeeded", what="Succeeded")
    (condition,) = store.read("Job", "team", "broken")["status"]["conditions"]
    assert condition["type"] == "Failed"
    assert condition["message"] == "could not start: embedded null byte"


def test_two_programs_that_fit_only_one_at_a_time_both_run(running: Running) -> None:
    """Their slices bound one by one, gx held 2 devices and gy 1, each waiting for 2 more
    for ever once z had ended (4 devices)."""
    store = running.store
    wait_for(lambda: phase(store, "Island", "local", None) == "Ready", what="island Ready")
    submit(store, "z", "import time; time.sleep(2)", slices=[{"name": "main", "devices": 1}])
    wait_for(lambda: phase(store, "PathwaysProgram", "z") == "Running", what="z Running")
    for name, sizes in (("gx", (2, 2)), ("gy", (1, 2))):
        slices = [{"name": part, "devices": n} for part, n in zip("ab", sizes, strict=True)]
        submit(store, name, "print(1)", slices=slices)
    for name in ("z", "gx", "gy"):
        wait_for(
            lambda name=name: phase(store, "PathwaysProgram", name) == "Succeeded",
            what=f"{name} Succeeded",
        )


def test_cancel_and_delete_stop_the_run_and_release_the_slices(running: Running) -> None:
    store = running.store
    saves = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    submit(store, "long", saves)
    submit(store, "doomed", "import time; time.sleep(600)")
    for name in ("long", "doomed"):
        wait_for(lambda name=name: phase(store, "PathwaysProgram", name) == "Running")
    # A tick writes the programs' Running status, then starts their Jobs' processes.
    expected = {"team/long-run-1", "team/doomed-run-1"}
    processes = wait_for(
        lambda: (found := dict(running.manager.running)).keys() >= expected and found,
        what="both runs' processes",
    )
    assert set(processes) == expected
    # Stopped only once it listens for SIGTERM (stopped before, it died of it, silently).
    wait_for(
        lambda: "ready" in store.log_path("team", "long-run-1").read_text(),
        what="the driver's SIGTERM handler",
    )

    def cancel(document: dict[str, Any]) -> dict[str, Any]:
        document["spec"]["suspend"] = True
        return document

    store.replace(store.read("PathwaysProgram", "team", "long"), cancel, bump_generation=True)
    store.mark_deleting("PathwaysProgram", "team", "doomed")
    wait_for(lambda: phase(store, "PathwaysProgram", "long") == "Suspended", what="Suspended")
    wait_for(lambda: store.read("PathwaysProgram", "team", "doomed") is None, what="deleted")
    # Their processes are stopped (SIGTERM, as a pod's) and gone.
    wait_for(
        lambda: all(job.popen.poll() is not None for job in processes.values()),
        timeout=20,
        what="the runs' processes gone",
    )
    assert "got SIGTERM" in store.log_path("team", "long-run-1").read_text()
    wait_for(lambda: store.read("VirtualSlice", "team", "long-main") is None)
    assert store.read("Job", "team", "doomed-run-1") is None
    # A Job of a run the status never recorded (its decision's status write lost to an
    # edit) is deleted, not left running on released slices or taken for the next run.
    uid = store.read("PathwaysProgram", "team", "long")["metadata"]["uid"]
    driver = {"name": "driver", "image": "x", "command": ["python", "-c", "import time"]}
    store.insert(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "long-run-2",
                "namespace": "team",
                "labels": {"pathways.dev/program": "long"},
                "ownerReferences": [{"kind": "PathwaysProgram", "uid": uid, "controller": True}],
            },
            "spec": {"template": {"spec": {"containers": [driver]}}},
        }
    )
    wait_for(lambda: store.read("Job", "team", "long-run-2") is None, what="the stray deleted")


def test_a_deleted_program_stays_until_its_run_has_stopped(running: Running) -> None:
    """A deleted program went as soon as its slices did, with its checkpoints, while its run,
    given its grace period, still saved one there; ``pathways delete`` said it was deleted."""
    store = running.store
    saves_slowly = (
        "import os, pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(1.5)\n"
        "    folder = pathlib.Path(os.environ['PATHWAYS_CHECKPOINT_DIR'])\n"
        "    (folder / 'saved').write_text('1')\n"
        "    print('saved', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    submit(store, "saver", saves_slowly)
    log = store.log_path("team", "saver-run-1")
    wait_for(lambda: log.exists() and "ready" in log.read_text(), what="the SIGTERM handler")
    process = running.manager.running["team/saver-run-1"]
    store.mark_deleting("PathwaysProgram", "team", "saver")
    wait_for(lambda: store.read("VirtualSlice", "team", "saver-main") is None, what="released")
    while store.read("PathwaysProgram", "team", "saver") is not None:
        time.sleep(0.02)
    assert not process.alive(), "the program went while its run still ran"
    assert process.popen is not None and process.popen.returncode == 0  # saved, not killed


def test_a_program_made_again_under_a_deleted_ones_name_starts_with_nothing_of_it(
    running: Running,
) -> None:
    """The Events (and traces) of a deleted program were shown as those of the next program of
    its name, and its logs were kept for ever."""
    store = running.store

    def events(uid: str) -> list[str]:
        found = asyncio.run(store.events("PathwaysProgram", "team", "again", uid))
        return [event["reason"] for event in found]

    submit(store, "again", "print('first')")
    wait_for(lambda: phase(store, "PathwaysProgram", "again") == "Succeeded")
    first = store.read("PathwaysProgram", "team", "again")["metadata"]["uid"]
    store.store_trace("team", "again", 1, [{"client": "again"}])
    assert events(first)[-1] == "JobSucceeded"
    log = store.log_path("team", "again-run-1")
    assert log.read_text() == "first\n"
    store.mark_deleting("PathwaysProgram", "team", "again")
    wait_for(lambda: store.read("PathwaysProgram", "team", "again") is None, what="deleted")
    assert not log.exists() and asyncio.run(store.trace("team", "again", 0, 10)).records == []
    assert events(first)[-1] == "JobSucceeded"  # kept an hour, as an API server keeps them
    submit(store, "again", "print('second')")
    wait_for(lambda: phase(store, "PathwaysProgram", "again") == "Succeeded")
    second = store.read("PathwaysProgram", "team", "again")["metadata"]["uid"]
    assert events(second).count("JobSucceeded") == 1 and log.read_text() == "second\n"


def test_events_are_an_objects_latest_two_hundred_and_of_gone_objects_an_hours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pathways_api.store as stores

    store = SqliteStore(tmp_path / "pathways.db")
    for name in ("busy", "quiet", "gone"):
        submit(store, name, "print(1)")
    uid = {
        name: store.read("PathwaysProgram", "team", name)["metadata"]["uid"]
        for name in ("busy", "quiet", "gone")
    }
    ref = {
        name: ObjectRef("pathways.dev/v1alpha1", "PathwaysProgram", name, "team", uid[name])
        for name in uid
    }
    store.record_events([Event(ref["quiet"], "Normal", "Started", "once")])
    store.record_events([Event(ref["gone"], "Normal", "Started", "once")])
    for batch in range(5):
        store.record_events(
            [Event(ref["busy"], "Warning", "Restarting", f"{batch}-{i}") for i in range(50)]
        )

    def events(name: str) -> list[dict[str, Any]]:
        return asyncio.run(store.events("PathwaysProgram", "team", name, uid[name]))

    kept = events("busy")
    assert len(kept) == EVENTS_KEPT == 200
    assert kept[0]["message"] == "1-0" and kept[-1]["message"] == "4-49"
    store.remove("PathwaysProgram", "team", "gone")
    assert len(events("gone")) == 1  # an hour, not yet
    monkeypatch.setattr(stores, "EVENTS_OF_GONE_OBJECTS_KEPT", timedelta(hours=-1))
    store.remove("PathwaysProgram", "team", "never-was")  # any removal drops expired ones
    assert events("gone") == [] and len(events("quiet")) == 1 and len(events("busy")) == 200


def test_a_stopped_manager_keeps_bindings_and_its_runs_start_again_uncounted(
    state: Path,
) -> None:
    """`pathways down` counted its runs as failures: a laptop's restart failed a program
    that never restarts and used up the restarts of one that does. They are interrupted, as
    a pod a node drain evicts is, and start again with the cluster."""
    first = Running(state)
    store = first.store
    for name, policy in (("survivor", "OnFailure"), ("once", "Never")):
        submit(store, name, "print('started'); import time; time.sleep(600)", restartPolicy=policy)
    for name in ("survivor", "once"):
        wait_for(lambda n=name: phase(store, "PathwaysProgram", n) == "Running", what=name)
    log = store.log_path("team", "once-run-1")
    wait_for(lambda: log.exists() and "started" in log.read_text(), what="the first start")
    before = store.read("VirtualSlice", "team", "survivor-main")["status"]
    first.stop()  # the cluster stops (SIGTERM, `pathways down`): the runs are interrupted
    second = Running(state)
    try:
        for name in ("survivor", "once"):
            job = wait_for(
                lambda n=name: (
                    (second.store.read("Job", "team", f"{n}-run-1") or {}).get("status") or {}
                ).get("active"),
                what=f"{name}'s run started again",
            )
            assert job
            status = second.store.read("PathwaysProgram", "team", name)["status"]
            assert (status["phase"], status["runs"], status.get("restarts", 0)) == (
                "Running",
                1,
                0,
            )
        after = second.store.read("VirtualSlice", "team", "survivor-main")["status"]
        assert after["devices"] == before["devices"]  # restored from the store, not re-decided
        assert after["boundTime"] == before["boundTime"]
        (message,) = (
            second.store._db()
            .execute("SELECT message FROM events WHERE name = 'once' AND reason = 'RunInterrupted'")
            .fetchone()
        )
        assert "once-run-1) was interrupted: the embedded cluster stopped" in message
        assert "not counted as a restart" in message
        # The run's output goes on in the same log, saying it was started again.
        output = wait_for(
            lambda: text if (text := log.read_text()).splitlines().count("started") == 2 else None,
            what="the second start's output",
        )
        assert "--- interrupted (the embedded cluster stopped); started again (1) ---" in output
    finally:
        second.stop()


def test_a_graph_program_runs_the_graph_runner_on_its_mounted_spec(running: Running) -> None:
    store = running.store
    store.insert(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "PathwaysProgram",
            "metadata": {"name": "graph", "namespace": "team"},
            "spec": {
                "slices": [{"name": "main", "devices": 1}],
                "graph": {
                    "functions": [{"name": "f", "uri": "file:///nowhere/f.bin"}],
                    "nodes": [{"name": "n", "function": "f", "slice": "main"}],
                },
            },
        }
    )
    wait_for(lambda: phase(store, "PathwaysProgram", "graph") == "Failed", what="Failed")
    # The ConfigMap "mount" is a file of the state directory, and the runner read it: it
    # failed on the function's artifact, not on the spec.
    spec = running.manager.state / "configmaps" / "team" / "graph-graph" / "program.json"
    assert json.loads(spec.read_text())["graph"]["nodes"][0]["function"] == "f"
    log = store.log_path("team", "graph-run-1").read_text()
    assert "/nowhere/f.bin" in log and "/etc/pathways" not in log


def wait_for_file(path: Path) -> str:
    """Driver source that waits until ``path`` exists."""
    return (
        f"import pathlib, time\nwhile not pathlib.Path({str(path)!r}).exists(): time.sleep(0.02)\n"
    )


def start_manager(state: Path) -> subprocess.Popen[bytes]:
    manager = subprocess.Popen(
        [sys.executable, "-m", "pathways_api.manager", "--state", str(state), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=(state / "manager.log").open("ab"),
    )
    assert manager.stdout is not None and b"manager" in manager.stdout.readline()
    return manager


def test_a_manager_killed_mid_run_leaves_its_runs_to_the_next_one(state: Path) -> None:
    """SIGKILL the manager with three runs under way; meanwhile one run ends with an exit
    code and one is killed with its wrapper. The next manager adopts the running one (it is
    not started again and succeeds), takes the exit code of the ended one, and counts only
    the killed one as lost (OnFailure: it runs again, as run 2)."""
    store = SqliteStore(state / "pathways.db")
    release, go = state / "release", state / "go"
    one = [{"name": "main", "devices": 1}]
    submit(store, "survivor", wait_for_file(release) + "print('SURVIVED')", slices=one)
    submit(store, "ended", wait_for_file(go) + "raise SystemExit('no data: 4')", slices=one)
    submit(
        store,
        "killed",
        "import os, time\nif os.environ['PATHWAYS_RUN'] == '1': time.sleep(600)\n",
        restartPolicy="OnFailure",
        slices=one,
    )
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(start_manager(state))
        names = ("survivor", "ended", "killed")
        for name in names:
            wait_for(lambda name=name: phase(store, "PathwaysProgram", name) == "Running")
        records = {
            name: wait_for(
                lambda name=name: read_json(state / "runs" / "team" / f"{name}-run-1.json"),
                what=f"the record of {name}",
            )
            for name in names
        }
        processes[0].kill()  # the manager dies; its runs do not
        processes[0].wait()
        assert all(process_start(r["pid"]) == r["start"] for r in records.values())
        os.killpg(records["killed"]["pid"], signal.SIGKILL)  # this one leaves no exit status
        go.touch()
        wait_for(lambda: (state / "runs" / "team" / "ended-run-1.exit").exists(), what="exit")

        processes.append(start_manager(state))
        wait_for(lambda: phase(store, "PathwaysProgram", "ended") == "Failed", what="ended")
        ended = store.read("PathwaysProgram", "team", "ended")["status"]
        # The exit status, with the driver's last words.
        assert "the driver exited with code 1: no data: 4" in ended["message"], ended
        wait_for(lambda: phase(store, "PathwaysProgram", "killed") == "Succeeded", what="rerun")
        killed = store.read("PathwaysProgram", "team", "killed")["status"]
        assert (killed["runs"], killed["restarts"]) == (2, 1)
        events = store._db().execute(
            "SELECT message FROM events WHERE name = 'killed' AND reason = 'Restarting'"
        )
        assert "left no exit status" in events.fetchone()[0]
        # The adopted run was never started again: still run 1, still the same process.
        assert phase(store, "PathwaysProgram", "survivor") == "Running"
        survivor = records["survivor"]
        assert process_start(survivor["pid"]) == survivor["start"]
        release.touch()
        wait_for(lambda: phase(store, "PathwaysProgram", "survivor") == "Succeeded")
        assert store.read("PathwaysProgram", "team", "survivor")["status"]["runs"] == 1
        assert "SURVIVED" in store.log_path("team", "survivor-run-1").read_text()
        wait_for(
            lambda: (
                (store.read("Island", None, "local") or {}).get("status", {}).get("devicesFree")
                == 4
            ),
            what="devices free",
        )
    finally:
        release.touch()
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)


def test_a_run_started_twice_runs_once(tmp_path: Path) -> None:
    """Two wrappers of the same run (a manager that died before it recorded the start, and
    the next one): exactly one runs the command, the other exits at once."""
    marker = tmp_path / "ran"
    command = [
        sys.executable,
        "-c",
        f"import pathlib, time; p = pathlib.Path({str(marker)!r}); "
        "p.write_text(p.read_text() + 'x' if p.exists() else 'x'); time.sleep(1)",
    ]
    wrapper = [sys.executable, "-m", "pathways_api.run_job", "--record", str(tmp_path / "job")]
    first = subprocess.Popen([*wrapper, "--uid", "u", "--", *command])
    wait_for(lambda: read_json(tmp_path / "job.json"), what="the first wrapper's record")
    second = subprocess.run([*wrapper, "--uid", "u", "--", *command], check=False, timeout=60)
    assert second.returncode == ALREADY_RUNNING
    assert first.wait(timeout=60) == 0
    assert marker.read_text() == "x"
    assert read_json(tmp_path / "job.exit") == {"uid": "u", "code": 0, "ended": ANY}


def test_a_run_ends_whole_and_is_stopped_as_a_pod_is(tmp_path: Path) -> None:
    """Processes a driver started outlived its run (one of them in a session of its own kept
    computing on devices given to another program); a stopped driver got SIGKILL at once, so
    it could save nothing."""
    wrapper = [sys.executable, "-m", "pathways_api.run_job", "--record", str(tmp_path / "job")]
    leaver = (
        "import subprocess, sys\n"
        "for new_session in (False, True):\n"
        "    child = subprocess.Popen(['sleep', '300'], start_new_session=new_session)\n"
        "    print(child.pid, flush=True)\n"
    )
    done = subprocess.run(
        [*wrapper, "--uid", "u", "--", sys.executable, "-c", leaver],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0
    for pid in map(int, done.stdout.split()):
        assert process_start(pid) is None, f"{pid} outlived its run"

    graceful = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('saved', flush=True), sys.exit(3)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    for source, code, said in ((graceful, 3, "saved"), (stubborn, -9, "")):
        started = subprocess.Popen(
            [*wrapper, "--uid", f"u-{code}", "--grace", "1", "--", sys.executable, "-c", source],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert started.stdout is not None and started.stdout.readline() == "ready\n"
        sent = time.monotonic()
        started.send_signal(signal.SIGTERM)
        output, _ = started.communicate(timeout=30)
        assert output.strip() == said
        # Exit status 3 is its own handler's (killed, it would be -9): a bound of 0.5 s on
        # how soon failed on a loaded machine.
        assert read_json(paths(tmp_path / "job")[2])["code"] == code
        if code == -9:
            assert time.monotonic() - sent < 5  # killed once its grace of 1 s ran out


def test_a_run_keeps_its_output_up_to_the_limit_and_never_blocks(tmp_path: Path) -> None:
    """A program printing in a loop filled the disk with its log; now the wrapper keeps the
    first --max-output bytes, says so once, and reads and drops the rest but for its last
    64 KiB (its last words: a failure's reason was lost with the rest)."""
    chatty = "import sys\nfor i in range(100_000): print('x' * 99)\nprint('err', file=sys.stderr)"
    wrapper = [sys.executable, "-m", "pathways_api.run_job", "--record", str(tmp_path / "job")]
    log = tmp_path / "job.log"
    with log.open("wb") as output:
        done = subprocess.run(
            [*wrapper, "--uid", "u", "--max-output", "1000", "--", sys.executable, "-c", chatty],
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    assert done.returncode == 0
    kept = log.read_bytes()
    assert kept[:1000] == (b"x" * 99 + b"\n") * 10
    head, said, rest = kept[1000:].partition(b"\n[run_job] ")
    assert head == b"" and said
    assert rest.startswith(b"the output went over 1000 bytes: the rest is not kept but for ")
    dropped = 100_000 * 100 + len(b"err\n") - 1000
    ending = f"\n[run_job] {dropped - 65536} bytes not kept; the last 65536:\n".encode()
    assert ending in kept and kept.endswith(b"x" * 99 + b"\nerr\n")
    assert len(kept.partition(ending)[2]) == 65536
    quiet = "import sys; print('out'); print('err', file=sys.stderr, flush=True)"
    with log.open("wb") as output:
        subprocess.run(
            [*wrapper, "--uid", "v", "--", sys.executable, "-c", quiet],
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=60,
            check=True,
        )
    assert sorted(log.read_text().splitlines()) == ["err", "out"]  # stderr too, all of it


def test_a_state_folder_from_before_events_had_uids_is_read(tmp_path: Path) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "pathways.db") as db:
        db.execute(
            "CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
            "namespace TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, reason TEXT NOT "
            "NULL, message TEXT NOT NULL, time TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO events VALUES (1, 'PathwaysProgram', 'team', 'old', 'Normal', "
            "'Started', 'before', '2026-01-01T00:00:00Z')"
        )
    store = SqliteStore(tmp_path / "pathways.db")
    ref = ObjectRef("pathways.dev/v1alpha1", "PathwaysProgram", "old", "team", "u-1")
    store.record_events([Event(ref, "Normal", "Started", "after")])
    found = asyncio.run(store.events("PathwaysProgram", "team", "old", "u-1"))
    assert [event["message"] for event in found] == ["after"]  # not the uid-less one


def test_a_damaged_object_is_named_and_the_rest_of_the_cluster_goes_on(running: Running) -> None:
    """A row edited by hand stopped every reconcile (and the API's lists) with a bare
    JSONDecodeError; it is left out, named, and everything else is served."""
    store = running.store
    submit(store, "damaged", "print(1)")
    store._db().execute("UPDATE objects SET body = '{not json' WHERE name = 'damaged'")
    submit(store, "fine", "print(1)")
    wait_for(lambda: phase(store, "PathwaysProgram", "fine") == "Succeeded", what="fine runs")
    with pytest.raises(StoreDamaged) as damaged:
        store.read("PathwaysProgram", "team", "damaged")
    assert "the stored body of PathwaysProgram team/damaged in " in damaged.value.message
    assert "is not valid JSON" in damaged.value.message
    assert "DELETE FROM objects WHERE kind = 'PathwaysProgram' AND name = 'damaged'" in (
        damaged.value.message
    )
    page = asyncio.run(store.list("PathwaysProgram", "team", limit=10, token=None))
    assert [item["metadata"]["name"] for item in page.items] == ["fine"]


def test_a_store_missing_a_table_is_refused_and_usage_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "pathways.db"
    store = SqliteStore(path)
    submit(store, "holder", "print(1)")
    store._db().execute("UPDATE usage SET devices = 99, programs = 7")  # drifted, by hand
    reopened = SqliteStore(path)
    assert reopened._db().execute("SELECT namespace, devices, programs FROM usage").fetchall() == [
        ("team", 2, 1)
    ]
    reopened._db().execute("DROP TABLE objects")
    with pytest.raises(StoreDamaged, match=r"pathways\.db lacks its table objects: it was"):
        SqliteStore(path)


def test_a_file_that_is_not_a_store_is_named(tmp_path: Path) -> None:
    path = tmp_path / "pathways.db"
    path.write_bytes(b"not a database, but long enough to be read as one " * 100)
    with pytest.raises(StoreDamaged, match=r"pathways\.db cannot be used as the store: file is"):
        SqliteStore(path)


def test_a_run_failed_as_its_island_went_down_is_interrupted_and_runs_again(
    running: Running, state: Path
) -> None:
    """A driver fails at once when an executor of its island dies; the supervisor reports the
    island down a moment later. Judged at once, a program with ``restartPolicy: Never``
    failed for its island's loss."""
    store = running.store
    islands = state / "islands.json"
    healthy = json.loads(islands.read_text())
    run = "os.environ['PATHWAYS_RUN']"
    source = f"import os, sys; print('run', {run}); sys.exit({run} == '1')"
    submit(store, "hit", source)

    def status() -> dict[str, Any]:
        return store.read("PathwaysProgram", "team", "hit").get("status") or {}

    held = wait_for(
        lambda: (s := status()).get("reason") == "RunEnded" and s,
        what="run 1's failure held for judgement",
    )
    assert held["phase"] == "Running" and "judged in" in held["message"]
    # The supervisor reports the island down, as when one of its processes died.
    down = {"local": {**healthy["local"], "schedulerReady": False, "readyHosts": []}}
    islands.write_text(json.dumps(down))
    uid = store.read("PathwaysProgram", "team", "hit")["metadata"]["uid"]

    def interrupted() -> list[dict[str, Any]]:
        events = asyncio.run(store.events("PathwaysProgram", "team", "hit", uid))
        return [e for e in events if e["reason"] == "RunInterrupted"]

    (event,) = wait_for(interrupted, what="the run interrupted")
    assert "not counted a failure" in event["message"], event
    assert (status()["phase"], status()["restarts"]) == ("Pending", 0)
    islands.write_text(json.dumps(healthy))  # back: the next run starts, and succeeds
    wait_for(lambda: phase(store, "PathwaysProgram", "hit") == "Succeeded", what="Succeeded")
    assert status()["runs"] == 2
    assert "run 2" in store.log_path("team", "hit-run-2").read_text()
    # A failure with its island whole is the program's, judged after the grace.
    submit(store, "broken", "import sys; sys.exit(4)")
    wait_for(lambda: phase(store, "PathwaysProgram", "broken") == "Failed", what="Failed")
    assert store.read("PathwaysProgram", "team", "broken")["status"]["runs"] == 1


def test_a_checkpoint_claim_is_the_state_folders_checkpoints_here(running: Running) -> None:
    """A program written for a cluster (its driver's checkpointClaim) runs here unchanged: its
    checkpoints go to the state folder, not to the claim's mount path, absent here."""
    store = running.store
    wait_for(lambda: phase(store, "Island", "local", None) == "Ready", what="island Ready")
    store.insert(
        {
            "apiVersion": "pathways.dev/v1alpha1",
            "kind": "PathwaysProgram",
            "metadata": {"name": "claimed", "namespace": "team"},
            "spec": {
                "slices": [{"name": "main", "devices": 1}],
                "driver": {"source": PRINT_SETTINGS, "checkpointClaim": "team-checkpoints"},
            },
        },
        devices=1,
    )
    wait_for(lambda: phase(store, "PathwaysProgram", "claimed") == "Succeeded", what="Succeeded")
    settings = json.loads(store.log_path("team", "claimed-run-1").read_text().splitlines()[-1])
    uid = store.read("PathwaysProgram", "team", "claimed")["metadata"]["uid"]
    assert settings["PATHWAYS_CHECKPOINT_DIR"] == str(
        running.manager.state / "checkpoints" / "team" / "claimed" / uid
    )


def test_a_run_whose_trace_could_not_be_taken_is_named_incomplete(running: Running) -> None:
    """Its island unreachable (or restarted) when the run ended, the run was missing from the
    trace with nothing said."""
    store = running.store
    wait_for(lambda: phase(store, "Island", "local", None) == "Ready", what="island Ready")
    submit(store, "untraced", "print('done')")
    wait_for(lambda: phase(store, "PathwaysProgram", "untraced") == "Succeeded", what="done")
    page = wait_for(
        lambda: (page := asyncio.run(store.trace("team", "untraced", 0, 10))).incomplete and page,
        what="the run named incomplete",
    )
    assert page.records == []
    (note,) = page.incomplete
    assert note.startswith("run 1 on island 'local': its trace could not be read: ")


def test_a_run_resumed_while_the_last_one_stops_starts_once_that_one_is_gone(
    running: Running,
) -> None:
    # The last run saves a checkpoint on SIGTERM for 3 s: the next one waited for it, then
    # until something else changed in the store (for good, on a quiet cluster).
    store = running.store
    slow_stop = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(3)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    submit(store, "saver", slow_stop)
    wait_for(
        lambda: (
            store.log_path("team", "saver-run-1").exists()
            and "ready" in store.log_path("team", "saver-run-1").read_text()
        ),
        what="run 1 listening for SIGTERM",
    )

    def suspend(value: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def change(document: dict[str, Any]) -> dict[str, Any]:
            document["spec"]["suspend"] = value
            return document

        return change

    program = store.read("PathwaysProgram", "team", "saver")
    store.replace(program, suspend(True), bump_generation=True)
    wait_for(lambda: phase(store, "PathwaysProgram", "saver") == "Suspended", what="Suspended")
    store.replace(
        store.read("PathwaysProgram", "team", "saver"), suspend(False), bump_generation=True
    )
    wait_for(
        lambda: "team/saver-run-2" in running.manager.running,
        timeout=20,
        what="run 2 started once run 1 was gone",
    )


def test_a_run_still_stopping_when_the_manager_restarts_is_waited_for(state: Path) -> None:
    # Suspended, the run saves for 4 s; the manager dies meanwhile and the program is resumed.
    # The next manager knew nothing of the stopping run and started run 2 beside it (two runs
    # of one program at once, on one checkpoint directory).
    store = SqliteStore(state / "pathways.db")
    slow_stop = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    time.sleep(4)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    submit(store, "saver", slow_stop)
    runs = state / "runs" / "team"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(start_manager(state))
        wait_for(
            lambda: (
                store.log_path("team", "saver-run-1").exists()
                and "ready" in store.log_path("team", "saver-run-1").read_text()
            ),
            what="run 1 listening for SIGTERM",
        )
        first = read_json(runs / "saver-run-1.json")
        assert first is not None

        def suspend(value: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
            def change(document: dict[str, Any]) -> dict[str, Any]:
                document["spec"]["suspend"] = value
                return document

            return change

        store.replace(
            store.read("PathwaysProgram", "team", "saver"), suspend(True), bump_generation=True
        )
        wait_for(lambda: phase(store, "PathwaysProgram", "saver") == "Suspended")
        processes[0].kill()  # while run 1 saves
        processes[0].wait()
        store.replace(
            store.read("PathwaysProgram", "team", "saver"), suspend(False), bump_generation=True
        )
        processes.append(start_manager(state))
        while process_start(first["pid"]) == first["start"]:  # run 1 still stopping
            assert not (runs / "saver-run-2.json").exists(), "run 2 started beside run 1"
            time.sleep(0.05)
        wait_for(lambda: (runs / "saver-run-2.json").exists(), what="run 2 once run 1 is gone")
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=30)


def test_a_runs_start_removes_the_output_of_runs_older_than_the_latest_kept(
    state: Path,
) -> None:
    """A program restarted after every preemption (counted toward no limit) kept up to 1 GiB
    of output a run, for good."""
    from pathways_api.store import RUNS_KEPT

    store = SqliteStore(state / "pathways.db")
    manager = Manager(store, state, interval=0.05)
    latest = RUNS_KEPT + 3
    for run in range(1, latest + 1):
        path = store.log_path("team", f"p-run-{run}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("output\n")
    store.log_path("team", "other-run-1").write_text("another program's\n")
    manager._forget_old_outputs("team", f"p-run-{latest}")
    kept = sorted(int(p.name.split("-run-")[1][:-4]) for p in store.log_dir.glob("team/p-run-*"))
    assert kept == list(range(4, latest + 1))
    assert store.log_path("team", "other-run-1").exists()
    manager.stop()


def test_a_run_recorded_in_a_copied_state_folder_is_left_to_its_own_cluster(
    state: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A copy of a live cluster's state folder, started, adopted the original's runs from
    the records it copied (same pid, same start time) and stopped them as moved: that
    cluster's programs failed with -15. A run is adopted only if its wrapper runs this
    folder's record."""
    from pathways_api.run_job import is_wrapper_of, write_json

    original = tmp_path_factory.mktemp("original") / "runs" / "team" / "p-run-1"
    record = state / "runs" / "team" / "p-run-1"
    record.parent.mkdir(parents=True)
    sleeper = "import time; time.sleep(60)"
    theirs = subprocess.Popen([sys.executable, "-c", sleeper, "--record", str(original)])
    ours = subprocess.Popen([sys.executable, "-c", sleeper, "--record", str(record)])
    try:
        # Until an exec is through, a process's command line may still read empty.
        wait_for(lambda: is_wrapper_of(ours.pid, record) and is_wrapper_of(theirs.pid, original))
        assert not is_wrapper_of(theirs.pid, record)
        store = SqliteStore(state / "pathways.db")
        manager = Manager(store, state, interval=0.05)
        job = {"metadata": {"name": "p-run-1", "namespace": "team", "uid": "u1"}, "spec": {}}
        for process, adopted in ((theirs, False), (ours, True)):
            write_json(
                record.with_name("p-run-1.json"),
                {"uid": "u1", "pid": process.pid, "start": process_start(process.pid)},
            )
            running = manager._adopt(job)
            assert (running is not None) == adopted
        manager.stop()
    finally:
        for process in (theirs, ours):
            process.kill()
            process.wait()
