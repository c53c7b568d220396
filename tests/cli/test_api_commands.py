"""API commands without a cluster to talk to: one clear line and exit code 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_yaml import HOSTILE_MANIFESTS


@pytest.mark.parametrize(
    "arguments",
    [
        ("get",),
        ("status",),
        ("cancel", "p"),
        ("suspend", "p"),
        ("resume", "p"),
        ("logs", "p"),
        ("trace", "p", "--out", "t.json"),
    ],
)
def test_without_a_cluster_the_commands_say_how_to_start_one(
    pathways, tmp_path: Path, arguments: tuple[str, ...]
) -> None:
    result = pathways(*arguments, "--state", str(tmp_path / "none"))
    assert result.exit_code == 1
    assert "pathways up" in result.output


def test_an_unreachable_api_is_named(pathways, tmp_path: Path) -> None:
    result = pathways("get", "--api", "http://127.0.0.1:9", "--token", "t")
    assert result.exit_code == 1
    assert "Unreachable" in result.output and "127.0.0.1:9" in result.output


@pytest.mark.parametrize(
    ("api", "token", "said"),
    [
        ("http://[::1", "t", "API URL 'http://[::1' is not a URL (Invalid port"),
        ("http://a:b:c", "t", "API URL 'http://a:b:c' is not a URL"),
        ("localhost:8080", "t", "API URL 'localhost:8080': expected http(s)://HOST[:PORT]"),
        ("http://127.0.0.1:9", "a\nb", "has character U+000A at position 1"),
        ("http://127.0.0.1:9", "\u00e4", "has character U+00E4 at position 0"),
    ],
)
def test_a_malformed_api_url_or_token_is_named_not_a_traceback(
    pathways, api: str, token: str, said: str
) -> None:
    """``httpx.InvalidURL`` was a traceback; a token with a newline was "Unreachable"."""
    result = pathways("get", "--api", api, "--token", token)
    assert result.exit_code == 1 and said in result.output, result.output
    assert token not in result.output or token == "t"  # a token is never printed


def test_a_token_files_newline_is_no_part_of_the_token(pathways) -> None:
    result = pathways("get", "--api", "http://127.0.0.1:9", "--token", "secret\n")
    assert "Unreachable" in result.output and "secret" not in result.output


@pytest.mark.parametrize(
    "command", ["get", "cancel", "suspend", "resume", "delete", "logs", "trace"]
)
@pytest.mark.parametrize("name", ["a/../b", "Big", "x" * 254, "x."])
def test_a_name_no_object_can_have_is_refused_before_calling_the_api(
    pathways, command: str, name: str
) -> None:
    result = pathways(command, name, "--api", "http://127.0.0.1:9", "--token", "t")
    assert result.exit_code == 2  # a usage error: Unreachable (exit 1) would mean it was sent
    assert "cannot name an object: names are lowercase letters" in result.output


def test_get_filters_a_list_not_one_object(pathways) -> None:
    result = pathways("get", "p", "--phase", "Running", "--api", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "--selector and --phase filter a list: give them without NAME" in result.output


def test_logs_refuses_a_window_larger_than_the_api_answers(pathways) -> None:
    result = pathways(
        "logs", "p", "--limit-bytes", str(16 * 2**20 + 1), "--api", "http://127.0.0.1:9"
    )
    assert result.exit_code == 2  # refused before calling the API
    assert "'--limit-bytes'" in result.output and "1<=x<=16777216" in result.output


def test_the_clis_log_window_limit_is_the_apis() -> None:
    from pathways_api.logs import MAX_LOG_BYTES as API_MAX
    from pathways_client.api_client import MAX_LOG_BYTES

    assert MAX_LOG_BYTES == API_MAX


def test_down_without_a_cluster(pathways, tmp_path: Path) -> None:
    result = pathways("down", "--state", str(tmp_path))
    assert result.exit_code == 0 and "no embedded cluster is running" in result.output


def test_submit_refuses_a_file_that_is_not_yaml(pathways, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [\n")
    result = pathways("submit", str(bad), "--api", "http://127.0.0.1:9", "--token", "t")
    assert result.exit_code == 1 and "invalid YAML at line 2" in result.output


@pytest.mark.parametrize(("manifest", "expected"), [case[1:] for case in HOSTILE_MANIFESTS])
def test_submit_refuses_a_hostile_file_before_sending_it(
    pathways, tmp_path: Path, manifest: str, expected: str
) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_text(manifest)
    result = pathways("submit", str(path), "--api", "http://127.0.0.1:9", "--token", "t")
    assert result.exit_code == 1
    assert f"{path}: document 1: " in result.output and expected in result.output
    assert "Unreachable" not in result.output  # refused before sending


def test_submit_reads_every_file_and_folder_first_and_sends_nothing_if_one_is_wrong(
    pathways, tmp_path: Path
) -> None:
    """Several files and folders, as `kubectl apply -f` takes them; nothing is sent (the API
    here is unreachable) before every file was read and every document is of a kind a
    tenant submits."""
    api = ("--api", "http://127.0.0.1:9", "--token", "t")
    folder = tmp_path / "manifests"
    (folder / "nested").mkdir(parents=True)
    (folder / "a.yaml").write_text("kind: PathwaysProgram\nmetadata: {name: a}\n")
    (folder / "nested" / "b.yml").write_text("kind: VirtualSlice\nmetadata: {name: b}\n")
    (folder / "notes.txt").write_text("not a manifest")
    island = tmp_path / "island.yaml"
    island.write_text("kind: Island\nmetadata: {name: i}\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [\n")
    refused = pathways("submit", str(folder), str(island), *api)
    assert refused.exit_code == 1
    assert f"{island}: document 1 is of kind 'Island': only PathwaysPrograms" in refused.output
    assert "Unreachable" not in refused.output
    unreadable = pathways("submit", str(folder), str(broken), *api)
    assert f"{broken}: document 1: invalid YAML" in unreadable.output
    assert "Unreachable" not in unreadable.output
    sent = pathways("submit", str(folder), *api)  # read and checked: the first is sent
    assert f"{folder / 'a.yaml'}: document 1: Unreachable" in sent.output
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = pathways("submit", str(empty), *api)
    assert nothing.exit_code == 1 and "a folder with no manifests" in nothing.output


def test_submit_refuses_an_object_defined_twice_before_sending_any(
    pathways, tmp_path: Path
) -> None:
    """`validate` flagged it, but `submit` created the first and failed on the second,
    leaving the set half submitted."""
    slice_ = "kind: VirtualSlice\nmetadata: {name: s, namespace: team}\nspec: {devices: 1}\n"
    path = tmp_path / "twice.yaml"
    path.write_text(slice_ + "---\n" + slice_.replace("devices: 1", "devices: 2"))
    result = pathways("submit", str(path), "--api", "http://127.0.0.1:9", "--token", "t")
    assert result.exit_code == 1
    assert (
        f"{path}: document 2 (VirtualSlice s): metadata.name: defined already, by {path}: "
        "document 1 (VirtualSlice s): names must differ" in " ".join(result.output.split())
    )
    assert "Unreachable" not in result.output  # refused before sending
    path.write_text(slice_ + "---\n" + slice_.replace("team", "other"))  # another object
    sent = pathways("submit", str(path), "--api", "http://127.0.0.1:9", "--token", "t")
    assert f"{path}: document 1: Unreachable" in sent.output


def test_submit_refuses_a_timeout_without_wait_before_reading_the_file(
    pathways, tmp_path: Path
) -> None:
    result = pathways("submit", __file__, "--timeout", "5", "--api", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "--timeout is a limit of --wait" in result.output
    refused = pathways("submit", __file__, "--wait", "--timeout", "0")
    assert refused.exit_code == 2 and "Invalid value for '--timeout'" in refused.output


def test_submit_reads_standard_input_and_names_a_file_it_cannot_read(
    pathways, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from pathways_client.cli import main

    api = ("--api", "http://127.0.0.1:9", "--token", "t")
    piped = CliRunner().invoke(main, ["submit", "-", *api], input="kind: PathwaysProgram\n")
    assert piped.exit_code == 1
    assert "standard input: document 1: Unreachable" in piped.output  # read, then sent
    broken = CliRunner().invoke(main, ["submit", "-", *api], input="a: [\n")
    assert broken.exit_code == 1
    assert "standard input: document 1: invalid YAML at line 2" in broken.output
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    result = pathways("submit", str(binary), *api)
    assert result.exit_code == 1 and "cannot be read as UTF-8 text" in result.output


def test_up_names_a_state_directory_it_cannot_make(pathways, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = pathways("up", "--state", str(blocker / "state"))
    assert result.exit_code == 1
    assert f"cannot use the state directory: a file is in the way ({blocker / 'state'})" in (
        result.output
    )


def test_table_rows_say_where_they_cut_and_what_a_slice_holds() -> None:
    """Messages were cut mid-word without a mark; a Pending slice showed '?/? free', a
    finished program's slices 'train@?'."""
    from pathways_client.cli import MESSAGE_WIDTH, _cells

    finished = {
        "kind": "PathwaysProgram",
        "metadata": {"name": "p"},
        "status": {
            "phase": "Succeeded",
            "message": "x" * 100,
            "slices": [{"name": "train", "virtualSliceName": "p-train", "phase": "Released"}],
        },
    }
    _, _, _, slices, message = _cells(finished)
    assert slices == "train (Released)"
    assert len(message) == MESSAGE_WIDTH and message.endswith("…")
    pending = {"kind": "VirtualSlice", "metadata": {"name": "s"}, "status": {"phase": "Pending"}}
    assert _cells(pending)[3] == "-"
    island = {
        "kind": "Island",
        "metadata": {"name": "i"},
        "status": {"devicesFree": 3, "devicesTotal": 4},
    }
    assert _cells(island)[3] == "3/4 free"
    # One being deleted says so (it showed its last phase, Pending SliceNameTaken, say).
    deleting = {**pending, "metadata": {"name": "s", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert _cells(deleting)[1] == "Terminating"


def test_submit_sends_a_dump_without_what_the_system_set(tmp_path: Path) -> None:
    """A `get -o yaml` dump resubmitted: the API refused its uid (validate said it was
    valid), and a leased slice's renewal annotation; what the system sets goes, as its status
    went."""
    from pathways_client.cli import _submittable_documents

    dump = tmp_path / "dump.yaml"
    dump.write_text(
        "apiVersion: pathways.dev/v1alpha1\nkind: VirtualSlice\n"
        "metadata: {name: vs, namespace: team, uid: u-1, resourceVersion: '7', generation: 2,\n"
        "  creationTimestamp: '2026-11-29T10:00:00Z', managedFields: [], labels: {a: b},\n"
        "  annotations: {pathways.dev/renewed-at: '2026-11-29T10:00:01.5Z'}}\n"
        "spec: {devices: 1}\nstatus: {phase: Bound}\n"
    )
    ((where, document),) = _submittable_documents((str(dump),))
    assert where == f"{dump}: document 1"
    assert document == {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "VirtualSlice",
        "metadata": {"name": "vs", "namespace": "team", "labels": {"a": "b"}},
        "spec": {"devices": 1},
    }
