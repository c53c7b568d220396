"""The embedded cluster end to end with real processes, driven by the CLI: up, submit, get,
logs, trace (JSON and PNG), cancel, status, down, then up again with the state intact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest
import yaml
from processes import assert_all_stop

from pathways_client.embedded import _alive, read_info

PROGRAM = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: double}
    spec:
      weight: 2
      slices:
        - {name: main, devices: 2}
      driver:
        source: |
          import numpy as np
          import pathways_client as pw
          with pw.connect() as cluster:
              main = cluster.slice("main")
              double = pw.function(lambda x: x * 2 + 1, slice=main, name="double")
              print("RESULT", double(np.arange(4, dtype=np.float32)).result().tolist())
    ---
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: sleeper}
    spec:
      slices:
        - {name: main, devices: 1}
      driver:
        source: |
          import time
          import numpy as np
          from pathways_client import checkpoint
          restored = checkpoint.restore()
          step = restored[0] if restored else 0
          print("from step", step, flush=True)
          while step < 6000:
              time.sleep(0.1)
              step += 1
              checkpoint.save(step, {"step": np.array(step)})
              print("step", step, flush=True)
    """
)


def wait_until(check: Callable[[], bool], what: str = "", timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.2)


@pytest.fixture
def state(tmp_path: Path, pathways) -> Iterator[Path]:
    folder = tmp_path / "state"
    yield folder
    pathways("down", "--state", str(folder))


def test_up_submit_trace_cancel_down_and_up_again(
    state: Path, tmp_path: Path, pathways, root: Path
) -> None:
    started = pathways(
        "up", "--state", str(state), "--hosts", "1", "--devices", "4", "--tenant", "team-a"
    )
    assert started.exit_code == 0, started.output
    info = read_info(state)
    assert info is not None and info.ready
    assert "island-0" in started.output and info.api in started.output
    assert (state / "tokens.yaml").stat().st_mode & 0o777 == 0o600
    # The store holds every tenant's specs: its user's alone, as the tokens are.
    assert (state / "pathways.db").stat().st_mode & 0o777 == 0o600
    manifest = tmp_path / "programs.yaml"
    manifest.write_text(PROGRAM)
    api = ("--state", str(state), "--tenant", "team-a")

    submitted = pathways("submit", str(manifest), *api)
    assert submitted.exit_code == 0, submitted.output
    assert "PathwaysProgram double submitted" in submitted.output

    # A bad manifest is refused with the field at fault, and stores nothing.
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: PathwaysProgram\nmetadata: {name: bad}\nspec: {slicez: []}\n")
    refused = pathways("submit", str(bad), *api)
    assert refused.exit_code == 1
    assert "InvalidField" in refused.output and "spec.slicez" in refused.output

    again = pathways("submit", str(manifest), *api, "--wait")  # already exists
    assert again.exit_code == 1 and "already exists" in again.output
    quick = tmp_path / "quick.yaml"
    quick.write_text(
        "kind: PathwaysProgram\nmetadata: {name: quick}\nspec:\n"
        "  slices: [{name: main, devices: 1}]\n  driver: {source: 'print(6 * 7)'}\n"
    )
    waited = pathways("submit", str(quick), *api, "--wait")
    assert waited.exit_code == 0, waited.output
    assert "quick: Succeeded" in waited.output and "42" in waited.output
    # The driver example runs as shipped, on the devices there are here (it used a field the
    # SDK did not have: cluster.steps, the program's spec.steps).
    example = yaml.safe_load((root / "examples/programs/driver-train.yaml").read_text())
    example["metadata"] = {"name": "train-example"}
    example["spec"].update(steps=3, slices=[{"name": "train", "devices": 2}])
    adapted = tmp_path / "driver-train.yaml"
    adapted.write_text(yaml.safe_dump(example))
    trained = pathways("submit", str(adapted), *api, "--wait")
    assert trained.exit_code == 0, trained.output
    assert "train-example: Succeeded" in trained.output and "[-0.03 -0.03" in trained.output

    from pathways_client.api_client import ApiClient
    from pathways_client.embedded import tokens

    with ApiClient(info.api, tokens(state)["team-a"]) as client:
        deadline = time.monotonic() + 180
        while client.get("programs", "double").get("status", {}).get("phase") != "Succeeded":
            assert time.monotonic() < deadline, client.get("programs", "double")
            time.sleep(0.2)

    logs = pathways("logs", "double", *api)
    assert "RESULT [1.0, 3.0, 5.0, 7.0]" in logs.output
    document = yaml.safe_load(pathways("get", "double", *api, "-o", "yaml").output)
    assert document["status"]["phase"] == "Succeeded"
    assert document["metadata"]["namespace"] == "team-a"
    # The resource manager records a transition's Events just after the status that reports it.
    deadline = time.monotonic() + 30
    while "JobSucceeded" not in (shown := pathways("get", "double", *api, "--events").output):
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)

    listed = pathways("get", *api)
    assert "double" in listed.output and "sleeper" in listed.output
    islands = pathways("get", "--kind", "islands", *api, "-o", "json")
    assert json.loads(islands.output)["items"][0]["status"]["phase"] == "Ready"

    out_json, out_png = tmp_path / "trace.json", tmp_path / "trace.png"
    assert pathways("trace", "double", *api, "--out", str(out_json)).exit_code == 0
    events = json.loads(out_json.read_text())["traceEvents"]
    computations = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in computations} == {0, 1}  # the slice's two devices
    assert {e["cat"] for e in computations} == {"team-a.double"}
    assert pathways("trace", "double", *api, "--out", str(out_png)).exit_code == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Another tenant sees none of it.
    other = pathways("get", "double", "--state", str(state), "--tenant", "default")
    assert other.exit_code == 1 and "NotFound" in other.output

    # Suspended, a program's run stops and its devices are free; resumed, its next run goes on
    # from its last checkpoint.
    with ApiClient(info.api, tokens(state)["team-a"]) as client:
        wait_until(lambda: "step 3\n" in pathways("logs", "sleeper", *api).output, "step 3")
        suspended = pathways("suspend", "sleeper", *api)
        assert suspended.exit_code == 0 and "program sleeper suspended" in suspended.output
        wait_until(lambda: client.get("programs", "sleeper")["status"]["phase"] == "Suspended")
        wait_until(lambda: client.get("islands", "island-0")["status"]["devicesFree"] == 4)
        saved = int(pathways("logs", "sleeper", *api).output.split()[-1])
        resumed = pathways("resume", "sleeper", *api)
        assert resumed.exit_code == 0 and "program sleeper resumed" in resumed.output
        wait_until(lambda: "from step" in pathways("logs", "sleeper", *api, "--run", "2").output)
        second = pathways("logs", "sleeper", *api, "--run", "2").output.splitlines()
        # The last step it printed, or one more saved as it was stopped before printing it.
        assert second[0] == "--- run 2 ---"
        assert second[1] in (f"from step {saved}", f"from step {saved + 1}"), second[:3]
        assert client.get("programs", "sleeper")["status"]["phase"] == "Running"

    assert pathways("cancel", "sleeper", *api).exit_code == 0
    refused = pathways("resume", "sleeper", *api)
    assert refused.exit_code == 1 and "was cancelled, so it cannot resume" in refused.output
    # Its status says cancelled, not suspended like one to be resumed.
    wait_until(
        lambda: (
            json.loads(pathways("get", "sleeper", *api, "-o", "json").output)["status"].get(
                "reason"
            )
            == "Cancelled"
        )
    )
    status = pathways("status", *api)
    assert "island-0" in status.output and "Ready" in status.output

    pids = [info.supervisor, info.api_pid, info.manager_pid]
    pids += [pid for island in info.islands.values() for pid in island["pids"]]
    # A stopped supervisor is woken to stop everything (down waited 90 s, saying nothing).
    os.kill(info.supervisor, signal.SIGSTOP)
    began = time.monotonic()
    assert pathways("down", "--state", str(state)).exit_code == 0
    assert time.monotonic() - began < 30
    assert not any(_alive(pid) for pid in pids)
    assert pathways("status", "--state", str(state)).exit_code == 1

    # The state survives: the same API port, the same objects.
    again = pathways("up", "--state", str(state), "--hosts", "1", "--devices", "4")
    assert again.exit_code == 0, again.output
    restarted = read_info(state)
    assert restarted is not None and restarted.api == info.api
    assert restarted.supervisor != info.supervisor
    shown = yaml.safe_load(pathways("get", "double", *api, "-o", "yaml").output)
    assert shown["status"]["phase"] == "Succeeded"
    assert "RESULT" in pathways("logs", "double", *api).output
    assert os.path.exists(state / "pathways.db")


def test_a_killed_supervisor_leaves_nothing_running(state: Path, pathways) -> None:
    """The API, the resource manager and the islands stop with a supervisor that is killed
    (it cannot stop them): each watches a pipe whose other end only the supervisor holds."""
    started = pathways("up", "--state", str(state), "--hosts", "1", "--devices", "4")
    assert started.exit_code == 0, started.output
    info = read_info(state)
    assert info is not None and info.ready
    pids = [info.api_pid, info.manager_pid]
    pids += [pid for island in info.islands.values() for pid in island["pids"]]
    assert len(pids) == 4 and all(_alive(pid) for pid in pids)  # API, manager, scheduler, executor
    os.kill(info.supervisor, signal.SIGKILL)
    assert_all_stop(pids)


@pytest.mark.parametrize("flag", ["--islands", "--hosts", "--devices"])
def test_up_refuses_a_count_below_one_naming_it_and_starts_nothing(
    tmp_path: Path, pathways, flag: str
) -> None:
    state = tmp_path / "state"
    result = pathways("up", "--state", str(state), flag, "0")
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}': 0 is not in the range x>=1." in result.output
    assert not (state / "cluster.json").exists()


def test_up_refuses_more_executor_processes_than_the_memory_holds_and_starts_nothing(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up --hosts 200` started 200 executor processes of ~220 MiB each, on any machine."""
    import pathways_client.embedded as embedded

    monkeypatch.setattr(embedded, "_memory_available", lambda: 3 << 30)
    state = tmp_path / "state"
    result = pathways("up", "--state", str(state), "--hosts", "12")
    assert result.exit_code == 2
    assert "Invalid value for '--hosts': 1 island(s) of 12 host(s) start 12 executor" in (
        result.output
    )
    assert "about 3.2 GiB of memory, and this machine has 3.0 GiB available" in result.output
    islands = pathways("up", "--state", str(state), "--islands", "6", "--hosts", "2")
    assert islands.exit_code == 2 and "Invalid value for '--islands'" in islands.output
    assert not (state / "cluster.json").exists()
    spec = embedded.IslandSpec("i", hosts=2)
    assert embedded.memory_problem([spec], available=1 << 30) is None  # 0.75 GiB needed
    assert "start 4 executor processes" in str(embedded.memory_problem([spec] * 2, 1 << 30))


@pytest.mark.parametrize(
    ("arguments", "option", "expected"),
    [
        (("--devices", "100"), "--devices", "expected a number <= 64 (got 100)"),
        (("--hosts", "5000"), "--hosts", "expected a number <= 4096 (got 5000)"),
        (
            ("--topology", "3x3"),
            "--topology",
            "3x3 has 9 devices, but --hosts x --devices is 1 x 4 = 4",
        ),
        (("--topology", "2x2x2x2"), "--topology", "expected a mesh shape of 1 to 3"),
        (("--hosts", "2", "--topology", "2x2"), "--topology", "2x2 has 4 devices, but"),
        (("--tenant", "Team_[/x]"), "--tenant", "'Team_[/x]' is not a lowercase RFC 1123 label"),
    ],
)
def test_up_refuses_an_island_its_resource_manager_would_refuse_and_starts_nothing(
    tmp_path: Path, pathways, arguments: tuple[str, ...], option: str, expected: str
) -> None:
    """An island of more fake devices per host than a cpu-fake host can have used to start,
    and stay Pending with no devices forever (the manager could not register it)."""
    state = tmp_path / "state"
    result = pathways("up", "--state", str(state), *arguments)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': {expected}" in result.output
    assert not (state / "cluster.json").exists()


SHAPED = textwrap.dedent(
    """
    kind: PathwaysProgram
    metadata: {name: square}
    spec:
      slices: [{name: main, shape: 2x2}]
      driver: {source: "print('on', 2 * 2, 'devices')"}
    ---
    kind: PathwaysProgram
    metadata: {name: too-large}
    spec:
      slices: [{name: main, shape: 4x4}]
      driver: {source: "print('never')"}
    ---
    kind: PathwaysProgram
    metadata: {name: noisy}
    spec:
      slices: [{name: main, devices: 1}]
      driver: {source: "print('y' * 300); raise SystemExit('bad [/x] [bold]input')"}
    """
)


def test_up_with_a_topology_binds_shaped_slices_and_a_wait_says_why_a_program_waits(
    state: Path, tmp_path: Path, pathways
) -> None:
    started = pathways(
        "up", "--state", str(state), "--hosts", "2", "--devices", "2", "--topology", "2x2"
    )
    assert started.exit_code == 0, started.output
    assert "2x2" in started.output

    # The running cluster is kept; options that ask for another one are refused, naming them.
    same = pathways("up", "--state", str(state))
    assert same.exit_code == 0, same.output
    other = pathways("up", "--state", str(state), "--hosts", "1", "--policy", "fifo")
    assert other.exit_code == 1
    assert "island-0 has hosts 2, not --hosts 1" in other.output
    assert "island-0 has policy proportional-share, not --policy fifo" in other.output
    assert "pathways down" in other.output
    assert read_info(state).islands["island-0"]["hosts"] == 2  # type: ignore[union-attr]

    status = pathways("status", "--state", str(state))
    assert "2x2" in status.output
    # Each island's Prometheus metrics: the scheduler's first, then its executors'.
    (line,) = [line for line in status.output.splitlines() if line.startswith("metrics of")]
    urls = [p.rstrip(";") for p in line.split(": ", 1)[1].split() if p.startswith("http")]
    assert len(urls) == 3 and "scheduler http" in line and "; executors http" in line
    assert "pathways_island_sessions{" in httpx.get(urls[0], timeout=10).text
    assert "pathways_executor_buffers{" in httpx.get(urls[1], timeout=10).text
    # kubectl's ``get islands`` is told how this command lists them.
    kind = pathways("get", "islands", "--state", str(state))
    assert kind.exit_code == 1
    assert "to list islands: pathways get --kind islands" in kind.output
    manifest = tmp_path / "shaped.yaml"
    manifest.write_text(SHAPED)
    began = time.monotonic()
    # Long enough for square and noisy to finish (seconds, even on a loaded machine):
    # too-large never does, so the wait always lasts all of it.
    waited = pathways("submit", str(manifest), "--state", str(state), "--wait", "--timeout", "10")
    assert waited.exit_code == 1, waited.output
    assert time.monotonic() - began < 60
    # The finished program's logs, then where the other stands and why.
    assert "square: Succeeded" in waited.output and "on 4 devices" in waited.output
    assert "too-large: Pending (main: ShapeDoesNotFit" in waited.output
    assert "(meshes: 2x2)" in waited.output
    assert "too-large: Pending after 10 s" in waited.output
    assert "the programs stay submitted" in waited.output
    shown = yaml.safe_load(pathways("get", "square", "--state", str(state), "-o", "yaml").output)
    # Finished, it holds no slice: its inline slice shows Released.
    assert [s["phase"] for s in shown["status"]["slices"]] == ["Released"]

    # What programs write is shown as written: never wrapped, never read as the console's
    # markup (a closing tag in a status message made `get` and its events a traceback).
    line = "y" * 300
    assert "noisy: Failed" in waited.output and line in waited.output.splitlines()
    at = ("--state", str(state))
    listed = pathways("get", *at)
    assert listed.exit_code == 0 and "[/x]" in listed.output, listed.output
    events = pathways("get", "noisy", *at, "--events")
    assert events.exit_code == 0 and "bad [/x] [bold]input" in events.output
    as_yaml = yaml.safe_load(pathways("get", "noisy", *at, "-o", "yaml").output)
    assert as_yaml == json.loads(pathways("get", "noisy", *at, "-o", "json").output)
    assert "[/x]" in as_yaml["status"]["message"]
    for follow in ((), ("--follow",)):
        logs = pathways("logs", "noisy", *at, *follow)
        assert logs.exit_code == 0
        assert sorted(logs.output.splitlines()) == ["--- run 1 ---", "bad [/x] [bold]input", line]
    # It ended before computing anything: no trace will come (it said "yet").
    untraced = pathways("trace", "noisy", *at, "--out", str(tmp_path / "noisy.json"))
    assert untraced.exit_code == 1
    assert "program 'noisy' (Failed) ran no computation on an island" in untraced.output
    never = pathways("logs", "too-large", *at)
    assert never.exit_code == 0
    assert "too-large has no output yet: Pending (main: ShapeDoesNotFit" in never.output
    # Following a program that waits says why at once, then keeps following until stopped.
    follower = subprocess.Popen(
        [sys.executable, "-m", "pathways_client", "logs", "too-large", *at, "--follow"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stderr is not None
        assert "too-large has no output yet: Pending" in follower.stderr.readline()
        assert follower.poll() is None
    finally:
        follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=30) == 130

    # A filter the API refuses is named by its option, as a usage error.
    for option, value, named in (
        ("--phase", "Nope", "Invalid value for '--phase': expected one of Pending"),
        ("-l", "team!=vision", "Invalid value for '-l' / '--selector': label selector terms"),
    ):
        refused = pathways("get", *at, option, value)
        assert refused.exit_code == 2 and named in refused.output, refused.output
    # Cancel and delete take several names, try each, and exit 1 if one failed.
    cancelled = pathways("cancel", "noisy", "nobody", *at)
    assert cancelled.exit_code == 1
    assert "noisy: Conflict: program 'noisy' already failed" in cancelled.output
    assert "nobody: NotFound" in cancelled.output
    # Deleted, a program and the slices made for it are gone, and its name is free again.
    deleted = pathways("delete", "too-large", "nobody", "noisy", *at)
    assert deleted.exit_code == 1 and "nobody: NotFound" in deleted.output
    assert "program too-large deleted" in deleted.output
    assert "program noisy deleted" in deleted.output
    for name in ("too-large", "noisy"):
        assert "NotFound" in pathways("get", name, *at).output
    slices = json.loads(pathways("get", "--kind", "virtualslices", *at, "-o", "json").output)[
        "items"
    ]
    assert "too-large-main" not in [item["metadata"]["name"] for item in slices]
    again = pathways("delete", "too-large", *at)
    assert again.exit_code == 1 and "NotFound" in again.output

    # A bare up after down starts the islands the state's objects were bound on (it started
    # the defaults: a 1 x 4 island of mesh 4, where the 2x2 programs could not fit) ...
    assert pathways("down", *at).exit_code == 0
    # ... also after a start that failed before the API came up (the record it left made
    # every later up a traceback).
    record = json.loads((state / "cluster.json").read_text())
    (state / "cluster.json").write_text(json.dumps({**record, "api": ""}))
    restarted = pathways("up", *at)
    assert restarted.exit_code == 0, restarted.output
    assert "the islands of the last cluster" in restarted.output
    island = read_info(state).islands["island-0"]  # type: ignore[union-attr]
    assert (island["hosts"], island["devicesPerHost"], island["topology"]) == (2, 2, "2x2")


def test_two_ups_at_once_start_one_cluster_and_a_second_supervisor_refuses(
    state: Path,
) -> None:
    """Two `pathways up` of one state at once started two supervisors: two islands, two
    resource managers running the same store's Jobs, two APIs."""
    from concurrent.futures import ThreadPoolExecutor

    from pathways_client.embedded import SUPERVISOR_RUNNING, IslandSpec, up

    specs = [IslandSpec("island-0", 1, 2)]
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: up(state, specs), range(2))
    assert first.supervisor == second.supervisor and first.api == second.api
    supervisors = subprocess.run(
        ["pgrep", "-f", f"pathways_client.embedded --state {state}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert supervisors == [str(first.supervisor)]
    supervisor = [sys.executable, "-m", "pathways_client.embedded", "--state", str(state)]
    another = subprocess.run(
        [*supervisor, "--island", "other:1:1:fifo:1:"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert another.returncode == SUPERVISOR_RUNNING
    assert "another supervisor runs the cluster of" in another.stderr
    assert read_info(state).supervisor == first.supervisor  # type: ignore[union-attr]


def test_an_up_killed_while_its_cluster_starts_is_followed_by_one_that_waits_for_it(
    state: Path,
) -> None:
    """An `up` killed while its cluster started (its terminal closed, say) left a supervisor
    that went on to start it; the next `up` refused it as 'starting or failing' and told the
    user to run `down`, throwing away a cluster a few seconds from ready."""
    from pathways_client.embedded import IslandSpec, up

    first = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from pathways_client.embedded import IslandSpec, up; "
            "up(Path(sys.argv[1]), [IslandSpec('island-0', 1, 2)])",
            str(state),
        ]
    )
    wait_until(lambda: read_info(state) is not None, "the first up's supervisor")
    first.kill()
    first.wait()
    started = read_info(state)
    assert started is not None and not started.ready  # (its cluster was still starting)
    info = up(state, [IslandSpec("island-0", 1, 2)])
    assert info.ready and info.supervisor == started.supervisor


def test_a_component_that_cannot_start_is_named_with_its_error(state: Path, pathways) -> None:
    """A hand-edited tokens file the API refuses: `up` said the cluster did not start and
    showed an empty log tail; now it says which component, and the error it died of."""
    state.mkdir(parents=True)
    (state / "tokens.yaml").write_text("tenants:\n  Bad_Name:\n    tokens: [abc]\n")
    result = pathways("up", "--state", str(state))
    assert result.exit_code == 1
    assert "the embedded cluster did not start: the api did not start (exit code 1): " in (
        result.output
    )
    assert "TokensFileError" in result.output and "tenants.Bad_Name" in result.output
    assert read_info(state) is None  # nothing left running


TICKER = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: ticker}
    spec:
      slices:
        - {name: main, devices: 1}
      driver:
        source: |
          import sys, time
          for i in range(30):
              print("tick", i, flush=True)
              time.sleep(0.1)
          out = sys.stdout.buffer
          out.write("café".encode()[:-1]); out.flush()  # a character in two writes
          time.sleep(1.5)
          out.write("é".encode()[-1:] + b"\\n"); out.flush()
    """
)


SECOND_TRY = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: flaky}
    spec:
      restartPolicy: OnFailure
      slices:
        - {name: main, devices: 1}
      driver:
        source: |
          import os, sys, time
          import numpy as np
          import pathways_client as pw
          first = os.environ["PATHWAYS_RUN"] == "1"
          print("first try" if first else "second try", flush=True)
          with pw.connect() as cluster:  # one computation a run, for the trace
              pw.function(lambda x: x + 1, slice=cluster.slice("main"))(np.zeros(2)).result()
          time.sleep(1)
          sys.exit(3 if first else 0)
    """
)


def test_logs_follow_a_running_program_each_byte_once_and_get_watches_it(
    state: Path, tmp_path: Path, pathways
) -> None:
    """`logs --follow` once asked for all of a program's output every half second, and printed
    what extended what it had shown; now it asks from where it stopped. `get --watch` prints
    its changes as they come."""
    at = ("--state", str(state))
    assert pathways("up", *at, "--hosts", "1", "--devices", "2").exit_code == 0
    manifest = tmp_path / "ticker.yaml"
    manifest.write_text(TICKER)
    command = [sys.executable, "-m", "pathways_client", "get", *at, "--watch"]
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    running = subprocess.Popen([*command, "--phase", "Running"], stdout=subprocess.PIPE, text=True)

    def bounded(process: subprocess.Popen[str]) -> None:  # a hung watch ends its lines
        deadline = threading.Timer(120, process.kill)
        deadline.daemon = True
        deadline.start()

    bounded(watcher)
    bounded(running)
    # Both have listed once, before the program exists: a watch that started late (a loaded
    # machine) listed it already Succeeded, and filtered by --phase Running never showed it.
    assert watcher.stdout is not None and running.stdout is not None
    watcher_head = _lines_until(watcher.stdout, lambda line: line.startswith("PROGRAM"))
    running_head = _lines_until(running.stdout, lambda line: line.startswith("PROGRAM"))
    assert pathways("submit", str(manifest), *at).exit_code == 0
    one = subprocess.Popen([*command, "ticker", "-o", "json"], stdout=subprocess.PIPE, text=True)
    bounded(one)
    follower = subprocess.run(
        [sys.executable, "-m", "pathways_client", "logs", "ticker", *at, "--follow"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert follower.returncode == 0, follower.stderr
    whole = pathways("logs", "ticker", *at).output
    expected = ["--- run 1 ---", *(f"tick {i}" for i in range(30)), "café"]
    assert whole.splitlines() == expected
    assert follower.stdout == whole
    assert "\ufffd" not in follower.stdout
    tail = pathways("logs", "ticker", *at, "--tail", "2")
    assert tail.output.splitlines() == ["tick 29", "café"]
    cut = pathways("logs", "ticker", *at, "--limit-bytes", "6")
    assert cut.output.endswith("café\n")
    assert f"… {len(whole.encode()) - 6} bytes of output not shown" in cut.output
    # Lines longer than the limit: cut to it, and said so (with --tail it was silent, then
    # counted every byte before the limit as cut, not the lines' alone).
    cut_tail = pathways("logs", "ticker", *at, "--tail", "2", "--limit-bytes", "6")
    assert cut_tail.output.endswith("café\n") and "bytes of output not shown" not in cut_tail.output
    assert "… the last 2 lines begin before the last --limit-bytes" in cut_tail.output
    alone = pathways("logs", "ticker", *at, "--previous")  # one run: none before it
    assert alone.exit_code == 1 and "ticker has no previous run: 1 started so far" in alone.output

    # `get --watch` prints an object again each time it changes: a row, or a JSON line. The
    # watch of one object ends when it is deleted; the watch of a list at Ctrl-C. (They look
    # every second: the test deletes the program once both have seen it succeed.)
    assert one.stdout is not None
    rows = watcher_head + _lines_until(
        watcher.stdout, lambda line: "ticker" in line and "Succeeded" in line
    )
    documents = _lines_until(one.stdout, lambda line: '"phase": "Succeeded"' in line)
    # Filtered, a list shows an object that leaves it as it is now, not as deleted.
    ended = (["ticker", "Succeeded"], ["ticker", "Deleted"])
    left = running_head + _lines_until(running.stdout, lambda line: line.split()[:2] in ended)
    assert left[-1].split()[:2] == ["ticker", "Succeeded"], left
    running.send_signal(signal.SIGINT)
    assert running.wait(timeout=30) == 130
    listed = pathways("get", *at, "--phase", "Succeeded", "-o", "json").output
    assert [item["metadata"]["name"] for item in json.loads(listed)["items"]] == ["ticker"]
    assert json.loads(pathways("get", *at, "-l", "team=none", "-o", "json").output)["items"] == []
    assert pathways("delete", "ticker", *at).exit_code == 0
    rows += _lines_until(watcher.stdout, lambda line: "ticker" in line and "Deleted" in line)
    watcher.send_signal(signal.SIGINT)
    assert watcher.wait(timeout=30) == 130
    documents += one.communicate(timeout=30)[0].splitlines()
    assert one.returncode == 0
    # Every line is a JSON document, the first too (it was printed over many lines).
    phases = [json.loads(line)["status"]["phase"] for line in documents]
    assert phases[-2:] == ["Succeeded", "Deleted"], phases
    header = next(line for line in rows if line.startswith("PROGRAM"))
    assert header.split() == ["PROGRAM", "PHASE", "RUNS", "SLICES", "MESSAGE"]
    succeeded, deleted = [line for line in rows if "ticker" in line][-2:]
    assert "Succeeded" in succeeded and deleted.split()[:2] == ["ticker", "Deleted"], rows

    # `logs --run N`: one run's output; with --follow, until that run has ended.
    manifest.write_text(SECOND_TRY)
    assert pathways("submit", str(manifest), *at).exit_code == 0
    follow = [sys.executable, "-m", "pathways_client", "logs", "flaky", *at, "--follow"]
    for run, said in ((1, "first try"), (2, "second try")):
        followed = subprocess.run(
            [*follow, "--run", str(run)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout.splitlines() == [f"--- run {run} ---", said]
    everything = pathways("logs", "flaky", *at).output.splitlines()
    assert everything == ["--- run 1 ---", "first try", "", "--- run 2 ---", "second try"]
    previous = pathways("logs", "flaky", *at, "--previous").output.splitlines()
    assert previous == ["--- run 1 ---", "first try"]
    assert pathways("logs", "flaky", *at, "-p", "--run", "1").exit_code == 2
    missing = pathways("logs", "flaky", *at, "--run", "3")
    assert missing.exit_code == 1
    assert "has no run 3: 2 started so far" in missing.output
    assert pathways("logs", "flaky", *at, "--run", "0").exit_code == 2  # refused by click
    # Each run keeps its own trace records (the runs are one client of the island: the second
    # kept the first's too).
    traced = tmp_path / "flaky.json"
    assert pathways("trace", "flaky", *at, "--out", str(traced)).exit_code == 0
    events = json.loads(traced.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert len([e for e in events if e.get("ph") == "X"]) == 2, events


def _lines_until(stream: IO[str], last: Callable[[str], bool]) -> list[str]:
    """Lines read from ``stream`` up to the first for which ``last`` is true (fails at EOF)."""
    lines = []
    while not lines or not last(lines[-1]):
        line = stream.readline()
        assert line, f"the stream ended after {lines}"
        lines.append(line.rstrip("\n"))
    return lines


SLEEPER = """
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata: {name: NAME}
spec:
  slices:
    - {name: main, devices: 1}
  driver:
    source: |
      import time
      print("started", flush=True)
      time.sleep(600)
"""


def test_waits_and_follows_end_when_a_program_is_cancelled_or_their_run_is_stopped(
    state: Path, tmp_path: Path, pathways
) -> None:
    """`submit --wait` and `logs --follow` waited for ever on a cancelled program, and
    `logs --run 1 --follow` on a run that suspension had stopped."""
    at = ("--state", str(state))
    assert pathways("up", *at, "--hosts", "1", "--devices", "2").exit_code == 0
    cli = [sys.executable, "-m", "pathways_client"]
    for name in ("napper", "waited"):
        (tmp_path / f"{name}.yaml").write_text(SLEEPER.replace("NAME", name))
    assert pathways("submit", str(tmp_path / "napper.yaml"), *at).exit_code == 0
    waiting = subprocess.Popen(
        [*cli, "submit", str(tmp_path / "waited.yaml"), *at, "--wait", "--timeout", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run_one = subprocess.Popen(
        [*cli, "logs", "napper", *at, "--run", "1", "--follow"], stdout=subprocess.PIPE, text=True
    )
    assert run_one.stdout is not None
    assert [run_one.stdout.readline() for _ in range(2)] == ["--- run 1 ---\n", "started\n"]
    assert pathways("suspend", "napper", *at).exit_code == 0
    assert run_one.wait(timeout=60) == 0  # the run it followed was stopped
    assert pathways("resume", "napper", *at).exit_code == 0
    whole = subprocess.Popen([*cli, "logs", "napper", *at, "--follow"], stdout=subprocess.PIPE)
    assert pathways("cancel", "napper", "waited", *at).exit_code == 0
    assert whole.wait(timeout=60) == 0  # the program will run no more
    output, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, output
    assert "waited: Suspended" in output and "after 300 s" not in output
    # Cancelled, it will compute nothing more: its trace is not 'yet' to come.
    untraced = pathways("trace", "napper", *at, "--out", str(tmp_path / "napper.json"))
    assert untraced.exit_code == 1
    assert "program 'napper' (Cancelled) ran no computation on an island" in untraced.output


COMPUTING = """
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata: {name: computing}
spec:
  slices:
    - {name: main, devices: 1}
  driver:
    source: |
      import numpy as np
      import pathways_client as pw
      with pw.connect() as cluster:
          step = pw.function(lambda x: x + 1, slice=cluster.slice("main"), name="step")
          x = np.zeros(4, np.float32)
          for n in range(1_000_000):
              x = step(x).result()
              print("step", n, flush=True)
"""


def test_a_stopped_run_keeps_its_trace(state: Path, tmp_path: Path, pathways) -> None:
    """Only runs that ended had their trace kept: one suspended or cancelled after hours had
    none."""
    at = ("--state", str(state))
    assert pathways("up", *at, "--hosts", "1", "--devices", "2").exit_code == 0
    (tmp_path / "computing.yaml").write_text(COMPUTING)
    assert pathways("submit", str(tmp_path / "computing.yaml"), *at).exit_code == 0
    wait_until(lambda: "step 20\n" in pathways("logs", "computing", *at).output, "step 20")
    assert pathways("cancel", "computing", *at).exit_code == 0
    out = tmp_path / "trace.json"
    wait_until(
        lambda: pathways("trace", "computing", *at, "--out", str(out)).exit_code == 0,
        "the cancelled run's trace",
    )
    events = json.loads(out.read_text())
    names = {e.get("name") for e in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert "step" in names, sorted(map(str, names))[:10]


def test_a_recorded_supervisor_pid_another_process_took_is_not_signalled(tmp_path: Path) -> None:
    """`down` sent SIGTERM to whatever process had the pid cluster.json recorded (pids wrap
    quickly), and `up` refused to start, taking it for a cluster still starting."""
    from pathways_client.embedded import down

    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (tmp_path / "cluster.json").write_text(
            json.dumps({"supervisor": stranger.pid, "ready": True, "api": "http://127.0.0.1:1"})
        )
        assert read_info(tmp_path) is None
        assert down(tmp_path, timeout=1) is False
        assert stranger.poll() is None  # untouched
    finally:
        stranger.kill()
        stranger.wait()


def test_status_says_why_the_supervisor_let_the_api_go(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the API given up on, status said only that it was unreachable: why was in the
    cluster's record, shown only while the API answered."""
    import pathways_client.embedded as embedded

    given_up = embedded.ClusterInfo(
        supervisor=1,
        api="http://127.0.0.1:1",
        islands={},
        ready=True,
        error="api exited with status 3; it failed 5 times in a row, so it is not started again",
    )
    monkeypatch.setattr(embedded, "read_info", lambda _: given_up)
    monkeypatch.setattr(embedded, "tokens", lambda _: {"default": "t"})
    result = pathways("status", "--state", str(tmp_path))
    assert result.exit_code == 1
    assert "Unreachable" in result.output or "127.0.0.1:1" in result.output, result.output
    assert "supervisor: api exited with status 3" in result.output, result.output


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tenants:\n  default: {tokens: [abc\n", "while parsing a flow sequence"),
        ("tenants: [1, 2]\n", "expected a mapping 'tenants: {name: {tokens: [...]}}'"),
        ("tenants:\n  default: {tokens: abc}\n", "tenants.default.tokens: expected a list"),
    ],
)
def test_a_damaged_tokens_file_is_named_and_starts_nothing(
    tmp_path: Path, pathways, text: str, problem: str
) -> None:
    """It gave a 92-line traceback that did not name the file."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "tokens.yaml").write_text(text)
    result = pathways("up", "--state", str(state), "--devices", "1")
    assert result.exit_code == 1, result.output
    assert f"{state}/tokens.yaml: " in result.output and problem in result.output
    assert "Fix it, or move it away" in result.output and "Traceback" not in result.output
    assert not (state / "cluster.json").exists()
    assert (state / "tokens.yaml").read_text() == text  # left as it was


def test_an_up_that_finds_a_cluster_started_meanwhile_with_other_options_says_so(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `up` at once with different options: the second found the first's cluster and
    said nothing of its other options (run one after the other, they were refused)."""
    import pathways_client.embedded as embedded

    started_meanwhile = embedded.ClusterInfo(
        supervisor=1,
        api="http://127.0.0.1:1",
        islands={"island-0": {"hosts": 1, "devicesPerHost": 4, "policy": "fifo", "endpoint": ""}},
        ready=True,
    )
    monkeypatch.setattr(embedded, "up", lambda *_, **__: started_meanwhile)
    result = pathways("up", "--state", str(tmp_path / "state"), "--devices", "8")
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert "was started meanwhile by another 'pathways up', and" in output
    assert "--devices 8" in output and "run 'pathways down --state" in output


def test_an_api_that_moved_to_another_port_is_noted(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pathways_client.embedded as embedded

    state = tmp_path / "state"
    state.mkdir()
    (state / "cluster.json").write_text(json.dumps({"supervisor": 1, "api": "http://127.0.0.1:7"}))
    moved = embedded.ClusterInfo(supervisor=1, api="http://127.0.0.1:8", islands={}, ready=True)
    monkeypatch.setattr(embedded, "up", lambda *_, **__: moved)
    monkeypatch.setattr(embedded, "tokens", lambda _: {"default": "t"})
    result = pathways("up", "--state", str(state))
    output = " ".join(result.output.split())
    assert "note: the API moved from http://127.0.0.1:7 to http://127.0.0.1:8" in output


def test_a_state_path_that_is_a_file_says_so(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As $PATHWAYS_STATE (--state checks its own value): it said 'File exists'."""
    in_the_way = tmp_path / "state"
    in_the_way.write_text("")
    monkeypatch.setenv("PATHWAYS_STATE", str(in_the_way))
    result = pathways("up", "--devices", "1")
    assert result.exit_code == 1
    output = " ".join(result.output.split())
    assert f"cannot use the state directory: a file is in the way ({in_the_way})" in output


def test_a_demo_stopped_while_its_cluster_starts_leaves_nothing_running(tmp_path: Path) -> None:
    """``timeout 30 pathways demo`` left its whole cluster running (~15 processes): SIGTERM
    was not handled, and an interrupt while the cluster started skipped its stop."""
    state = tmp_path / "state"
    demo = subprocess.Popen(
        [sys.executable, "-m", "pathways_client", "demo", "--state", str(state)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        pids: list[int] = []
        while time.monotonic() < deadline and demo.poll() is None:
            info = read_info(state)
            pids = [
                pid for island in (info.islands if info else {}).values() for pid in island["pids"]
            ]
            if pids:  # the first island runs; the cluster is still starting
                break
            time.sleep(0.1)
        assert pids and info is not None and not info.ready, "the cluster never began to start"
        demo.send_signal(signal.SIGTERM)
        _, errors = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode != 0, errors
    assert_all_stop([info.supervisor, *pids])
    assert read_info(state) is None


def test_up_on_a_cluster_its_supervisor_gave_up_a_part_of_says_so(
    tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The manager killed again and again: the supervisor left it down, and `up` printed the
    # cluster's table (exit 0) while every submission then waited without a word.
    from pathways_client import embedded

    error = "the manager exited with code -9; it failed 6 times in a row, ... not started again"
    (tmp_path / "cluster.json").write_text(
        json.dumps(
            {"supervisor": os.getpid(), "ready": True, "api": "http://127.0.0.1:1", "error": error}
        )
    )
    monkeypatch.setattr(embedded, "_is_supervisor", lambda *_: True)
    result = pathways("up", "--state", str(tmp_path))
    assert result.exit_code == 1
    assert "runs without a part: the manager exited with code -9" in result.output
    assert "'pathways down', then 'pathways up'" in result.output
