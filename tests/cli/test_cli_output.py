"""What `pathways get` prints (dumps that submit again, Events, watches), what the commands
that wait do when the embedded cluster runs without a part, and which islands `up` starts
after `down`. The commands talk to a real API server (``tests/api/api_server.py``: no
resource manager, so nothing is bound and nothing deleted ever goes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pathways_client.embedded import read_info

sys.path.append(str(Path(__file__).parents[1] / "api"))  # after the rest: shadows nothing
from api_server import Server, serve

TWO_SLICES = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: VirtualSlice
    metadata: {name: first, labels: {team: vision}}
    spec: {devices: 1}
    ---
    apiVersion: pathways.dev/v1alpha1
    kind: VirtualSlice
    metadata: {name: second}
    spec: {devices: 2}
    """
)

PROGRAM = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: waits}
    spec:
      slices:
        - {name: main, devices: 1}
      driver:
        source: print("never runs here")
    """
)

LONG_MESSAGE = "no island has 1 free device " + "x" * 200


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = _serve(tmp_path / "api")
    yield running
    running.stop()


@pytest.fixture
def other_server(tmp_path: Path) -> Iterator[Server]:
    """A second API server: where a dump of the first is submitted again."""
    running = _serve(tmp_path / "other")
    yield running
    running.stop()


def _serve(folder: Path) -> Server:
    folder.mkdir()
    return serve(folder)


def _at(server: Server) -> tuple[str, ...]:
    return ("--api", server.url, "--token", "token-a")


@pytest.fixture
def slices(server: Server, tmp_path: Path, pathways) -> tuple[str, ...]:
    """Two VirtualSlices of tenant team-a submitted; the options that reach them."""
    manifest = tmp_path / "slices.yaml"
    manifest.write_text(TWO_SLICES)
    submitted = pathways("submit", str(manifest), *_at(server))
    assert submitted.exit_code == 0, submitted.output
    return (*_at(server), "--kind", "virtualslices")


def _record_event(server: Server, name: str, reason: str, message: str) -> None:
    """An Event about team-a's slice ``name``, as the resource manager records one."""
    from pathways_core.control.common import Event, ObjectRef

    with server.client("token-a") as client:
        uid = client.get(f"/v1/virtualslices/{name}").json()["metadata"]["uid"]
    target = ObjectRef("pathways.dev/v1alpha1", "VirtualSlice", name, "team-a", uid)
    server.store.record_events([Event(target, "Warning", reason, message)])


# -- dumps that submit again -------------------------------------------------------------------


def test_a_yaml_dump_of_a_list_is_one_document_per_object_and_submits_again(
    slices: tuple[str, ...], other_server: Server, tmp_path: Path, pathways
) -> None:
    """It was one YAML sequence, which `submit` refused: "document 1 is not a mapping"."""
    dumped = pathways("get", *slices, "-o", "yaml")
    assert dumped.exit_code == 0, dumped.output
    documents = list(yaml.safe_load_all(dumped.output))
    assert [d["metadata"]["name"] for d in documents] == ["first", "second"]
    dump = tmp_path / "dump.yaml"
    dump.write_text(dumped.output)
    again = pathways("submit", str(dump), *_at(other_server))
    assert again.exit_code == 0, again.output
    assert "VirtualSlice first submitted" in again.output
    assert "VirtualSlice second submitted" in again.output
    listed = pathways("get", *_at(other_server), "--kind", "virtualslices", "-o", "yaml")
    assert [d["spec"]["devices"] for d in yaml.safe_load_all(listed.output)] == [1, 2]


def test_a_json_dump_of_a_list_is_a_list_object_and_submits_again(
    slices: tuple[str, ...], other_server: Server, tmp_path: Path, pathways
) -> None:
    """It was a bare JSON array, which `submit` refused; now kubectl's `kind: List`."""
    dumped = pathways("get", *slices, "-o", "json")
    listed = json.loads(dumped.output)
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert [item["metadata"]["name"] for item in listed["items"]] == ["first", "second"]
    dump = tmp_path / "dump.json"
    dump.write_text(dumped.output)
    again = pathways("submit", str(dump), *_at(other_server))
    assert again.exit_code == 0, again.output
    assert "VirtualSlice second submitted" in again.output
    empty = json.loads(pathways("get", *slices, "-l", "team=none", "-o", "json").output)
    assert empty == {"apiVersion": "v1", "kind": "List", "items": []}


def test_one_objects_dump_is_the_object_alone(slices: tuple[str, ...], pathways) -> None:
    as_yaml = yaml.safe_load(pathways("get", "first", *slices, "-o", "yaml").output)
    as_json = json.loads(pathways("get", "first", *slices, "-o", "json").output)
    assert as_yaml == as_json and as_json["kind"] == "VirtualSlice"


def test_submit_names_what_is_wrong_in_a_list(tmp_path: Path, pathways) -> None:
    """Refused before anything is sent (the API here is unreachable), naming the item."""
    unreachable = ("--api", "http://127.0.0.1:9", "--token", "t")
    cases = {
        '{"kind": "List", "items": {"a": 1}}': "document 1: a List's 'items' must be a list",
        '{"kind": "List", "items": [{"kind": "Island", "metadata": {"name": "i"}}]}': (
            "document 1: items[0] is of kind 'Island': only PathwaysPrograms"
        ),
        '{"kind": "List", "items": [3]}': "document 1: items[0] is not a mapping",
        '{"kind": "List", "items": []}': "no PathwaysProgram or VirtualSlice to submit",
    }
    for number, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"list-{number}.json"
        path.write_text(text)
        result = pathways("submit", str(path), *unreachable)
        assert result.exit_code == 1 and f"{path}: " in result.output, result.output
        assert expected in " ".join(result.output.split()), result.output
        assert "Unreachable" not in result.output


# -- Events ------------------------------------------------------------------------------------


def test_events_with_json_or_yaml_are_event_objects_in_the_dump(
    slices: tuple[str, ...], server: Server, other_server: Server, tmp_path: Path, pathways
) -> None:
    """They were printed as console text after the JSON (invalid JSON, long lines wrapped)."""
    _record_event(server, "first", "InsufficientDevices", LONG_MESSAGE)
    as_json = pathways("get", "first", *slices, "-o", "json", "--events")
    assert as_json.exit_code == 0, as_json.output
    listed = json.loads(as_json.output)
    assert listed["kind"] == "List"
    shown, event = listed["items"]
    assert shown["kind"] == "VirtualSlice" and shown["metadata"]["name"] == "first"
    assert event["apiVersion"] == "v1" and event["kind"] == "Event"
    assert event["involvedObject"] == {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "name": "first",
        "namespace": "team-a",
        "uid": shown["metadata"]["uid"],
    }
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        "InsufficientDevices",
        LONG_MESSAGE,
    )
    assert event["lastTimestamp"]
    as_yaml = pathways("get", "first", *slices, "-o", "yaml", "--events")
    assert list(yaml.safe_load_all(as_yaml.output)) == listed["items"]
    # Submitted again, the object is; its Events are the cluster's records, skipped.
    dump = tmp_path / "with-events.yaml"
    dump.write_text(as_yaml.output)
    again = pathways("submit", str(dump), *_at(other_server))
    assert again.exit_code == 0, again.output
    assert "VirtualSlice first submitted" in again.output
    assert f"skipped 1 Event of {dump}" in again.output


def test_events_as_text_are_lines_never_wrapped(
    slices: tuple[str, ...], server: Server, pathways
) -> None:
    _record_event(server, "first", "InsufficientDevices", LONG_MESSAGE)
    shown = pathways("get", "first", *slices, "--events")
    assert shown.exit_code == 0, shown.output
    assert any(
        line.endswith(f" Warning InsufficientDevices: {LONG_MESSAGE}")
        for line in shown.output.splitlines()
    ), shown.output


def test_what_programs_printed_is_shown_never_obeyed(
    slices: tuple[str, ...], server: Server, pathways
) -> None:
    """A driver's last line, in a status message or an Event, retitled the terminal, cleared
    it and left it red (a table row cut it before its reset): control codes are shown."""
    from pathways_client.cli import _cells
    from pathways_client.watch import standing

    codes = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL"
    shown = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mEVIL"
    _record_event(server, "first", "BackOff", codes)
    listed = pathways("get", "first", *slices, "--events")
    assert listed.exit_code == 0, listed.output
    assert "\x1b" not in listed.output and f"BackOff: {shown}" in listed.output
    program = {
        "kind": "PathwaysProgram",
        "metadata": {"name": "loud"},
        "status": {"phase": "Failed", "runs": 1, "message": f"the driver failed: {codes}"},
    }
    assert _cells(program)[-1] == f"the driver failed: {shown}"
    assert standing(program) == f"Failed (the driver failed: {shown})"


def test_events_without_a_name_or_of_islands_are_refused(
    slices: tuple[str, ...], server: Server, pathways
) -> None:
    """Both were ignored without a word."""
    listed = pathways("get", *slices, "--events")
    assert listed.exit_code == 2
    assert "--events shows the Events of one object: give its NAME" in listed.output
    islands = pathways("get", "island-0", *_at(server), "--kind", "islands", "--events")
    assert islands.exit_code == 2
    assert "--events: islands have no Events to show" in " ".join(islands.output.split())


# -- watching ----------------------------------------------------------------------------------


@pytest.fixture
def interrupt_watch(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """`get --watch` interrupted (Ctrl-C) at its second wait; what to do at its first wait
    may be appended (one callable)."""
    import pathways_client.cli as cli

    first: list[Any] = []
    waits = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) > 1:
            raise KeyboardInterrupt
        for action in first:
            action()

    monkeypatch.setattr(cli, "time", types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    return first


def test_watching_one_object_prints_rows_only(
    slices: tuple[str, ...], interrupt_watch: list[Any], pathways
) -> None:
    """It printed the object's YAML first, then a header and rows."""
    watched = pathways("get", "first", *slices, "--watch")
    assert watched.exit_code == 130
    lines = watched.output.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "ISLAND", "DEVICES", "MESSAGE"]
    assert lines[1].split() == ["first", "-", "-"], lines
    assert len(lines) == 2 and "apiVersion" not in watched.output


def test_watching_a_list_prints_its_rows_then_each_change_alike(
    slices: tuple[str, ...], server: Server, interrupt_watch: list[Any], pathways
) -> None:
    """It printed a boxed table first, then the header of the rows that followed."""
    third = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {"name": "third"},
        "spec": {"devices": 1},
    }

    def submit_third() -> None:
        with server.client("token-a") as client:
            client.post("/v1/virtualslices", json=third).raise_for_status()

    interrupt_watch.append(submit_third)
    watched = pathways("get", *slices, "--watch")
    assert watched.exit_code == 130
    rows = [line.split()[0] for line in watched.output.splitlines()]
    assert rows == ["NAME", "first", "second", "third"], watched.output
    yaml_watch = pathways("get", *slices, "--watch", "-o", "yaml")
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(yaml_watch.output)] == [
        "first",
        "second",
        "third",
    ]


def test_the_island_table_shows_each_islands_mesh() -> None:
    """Its Island column was always empty (an Island is bound on no island)."""
    from pathways_client.cli import ISLAND_COLUMNS, _cells

    island = {
        "kind": "Island",
        "metadata": {"name": "island-0"},
        "spec": {"topology": "2x2"},
        "status": {"phase": "Ready", "devicesFree": 3, "devicesTotal": 4},
    }
    assert ISLAND_COLUMNS == ("Name", "Phase", "Mesh", "Devices", "Message")
    assert _cells(island) == ("island-0", "Ready", "2x2", "3/4 free", "")


# -- a cluster running without a part ----------------------------------------------------------

SUPERVISOR_GAVE_UP = (
    "the manager exited with code 1; it failed 5 times in a row, each within 10 s of its "
    "start, so it is not started again (see STATE/supervisor.log)"
)


@pytest.fixture
def broken_cluster(server: Server, tmp_path: Path) -> Iterator[Path]:
    """The state folder of an embedded cluster whose supervisor gave up on its resource
    manager: ``cluster.json`` as the supervisor leaves it (ready, with its error), the API of
    ``server`` (which has no manager either), and a process standing for the supervisor
    (``read_info`` trusts a record only while a process of its command line runs)."""
    state = tmp_path / "api"  # the server's folder: its tokens file is the cluster's
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(300)",
            "pathways_client.embedded",
            "--state",
            str(state),
        ]
    )
    record = {"supervisor": supervisor.pid, "api": server.url, "ready": True}
    (state / "cluster.json").write_text(json.dumps({**record, "error": SUPERVISOR_GAVE_UP}))
    # Once trusted: a loaded CI machine once ran a command before it was (no API, it said).
    deadline = time.monotonic() + 30
    while read_info(state) is None:
        assert time.monotonic() < deadline, f"{state}/cluster.json names no running supervisor"
        time.sleep(0.05)
    yield state
    supervisor.kill()
    supervisor.wait()


def test_commands_warn_that_the_cluster_runs_without_a_part(broken_cluster: Path, pathways) -> None:
    """`get` showed stale phases without a word."""
    shown = pathways("get", "--state", str(broken_cluster), "--tenant", "team-a")
    assert shown.exit_code == 0, shown.output
    warning = " ".join(shown.stderr.split())
    broken = runs_without_a_part(broken_cluster)
    assert f"warning: {broken}" in warning, warning
    assert "Run 'pathways down', then 'pathways up'" in warning


def runs_without_a_part(state: Path) -> str:
    """What the CLI says of the embedded cluster of ``state`` whose supervisor gave up."""
    return f"the embedded cluster of {state} runs without a part: {SUPERVISOR_GAVE_UP}"


def test_submit_wait_stops_at_once_naming_the_part_that_is_down(
    broken_cluster: Path, tmp_path: Path, pathways
) -> None:
    """It waited, without a reason, for a manager that would never bind anything."""
    manifest = tmp_path / "program.yaml"
    manifest.write_text(PROGRAM)
    at = ("--state", str(broken_cluster), "--tenant", "team-a")
    began = time.monotonic()
    waited = pathways("submit", str(manifest), *at, "--wait", "--timeout", "8")
    assert time.monotonic() - began < 8
    assert waited.exit_code == 1
    said = " ".join(waited.stderr.split())
    broken = runs_without_a_part(broken_cluster)
    assert f"stopped waiting: {broken}" in said, said
    assert "'pathways down', then 'pathways up'" in said
    assert "the programs stay submitted" in said


def test_delete_stops_waiting_at_once_naming_the_part_that_is_down(
    broken_cluster: Path, slices: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, pathways
) -> None:
    monkeypatch.setattr("pathways_client.cli.DELETE_TIMEOUT", 8.0)
    at = ("--state", str(broken_cluster), "--tenant", "team-a", "--kind", "virtualslices")
    began = time.monotonic()
    deleted = pathways("delete", "first", *at)
    assert time.monotonic() - began < 8
    assert deleted.exit_code == 1
    said = " ".join(deleted.stderr.split())
    broken = runs_without_a_part(broken_cluster)
    assert f"first: stopped waiting for it to be deleted: {broken}" in said, said
    assert "'pathways down', then 'pathways up'" in said


# -- `up` after `down` -------------------------------------------------------------------------


@pytest.fixture
def last_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Any]]:
    """A state folder whose last cluster had one island of 1 host x 4 devices, mesh 2x2,
    policy fifo (``islands.json`` as its supervisor wrote it); ``up`` starts no process but
    records the islands it was asked for."""
    from pathways_client import embedded

    state = tmp_path / "state"
    state.mkdir()
    last = {"hosts": 1, "devicesPerHost": 4, "policy": "fifo", "topology": "2x2"}
    (state / "islands.json").write_text(json.dumps({"island-0": {**last, "endpoint": "x"}}))
    asked: list[Any] = []

    def start(state: Path, islands: list[Any], tenants: list[str], progress: Any) -> Any:
        asked.append(islands)
        described = {
            spec.name: {
                "hosts": spec.hosts,
                "devicesPerHost": spec.devices_per_host,
                "policy": spec.policy,
                "topology": spec.mesh,
                "endpoint": "127.0.0.1:1",
            }
            for spec in islands
        }
        return embedded.ClusterInfo(0, "http://127.0.0.1:1", islands=described, ready=True)

    monkeypatch.setattr(embedded, "up", start)
    return state, asked


def test_up_takes_the_last_clusters_values_for_the_options_not_given(
    last_cluster: tuple[Path, list[Any]], pathways
) -> None:
    """`up --hosts 2` after `down` reset the others to the defaults (4 devices a host, one
    axis, proportional-share) without a word."""
    from pathways_client.embedded import IslandSpec

    state, asked = last_cluster
    started = pathways("up", "--state", str(state), "--hosts", "2", "--devices", "2")
    assert started.exit_code == 0, started.output
    # The mesh 2x2 still fits 2 x 2 devices; the policy stays.
    assert asked[-1] == [IslandSpec("island-0", 2, 2, "fifo", topology="2x2")]
    said = " ".join(started.output.split())
    assert (
        "note: the islands differ from the last cluster's: island-0 2 x 2, mesh 2x2, fifo "
        "(was 1 x 4, mesh 2x2, fifo)" in said
    ), said
    # A mesh that no longer fits the devices goes back to one axis of them all.
    again = pathways("up", "--state", str(state), "--devices", "8", "--policy", "fifo")
    assert asked[-1] == [IslandSpec("island-0", 1, 8, "fifo", topology="")]
    assert "island-0 1 x 8, mesh 8, fifo (was 1 x 4, mesh 2x2, fifo)" in " ".join(
        again.output.split()
    )
    # Options that change nothing: no note.
    same = pathways("up", "--state", str(state), "--policy", "fifo")
    assert asked[-1] == [IslandSpec("island-0", 1, 4, "fifo", topology="2x2")]
    assert "differ" not in same.output
    more = pathways("up", "--state", str(state), "--islands", "2")
    assert [spec.name for spec in asked[-1]] == ["island-0", "island-1"]
    assert asked[-1][1] == IslandSpec("island-1", 1, 4, "fifo", topology="2x2")
    assert "island-1 new (1 x 4, mesh 2x2, fifo)" in " ".join(more.output.split())
