"""Output paths and ports of the CLI's commands are checked when the command line is read: a
path that cannot be written fails at once, naming its option, before any work or any call to
the API."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("kept")
    return path


def test_trace_refuses_an_output_it_could_not_write(a_file: Path, pathways) -> None:
    nowhere = ["--api", "http://127.0.0.1:9", "--token", "unused"]  # never reached
    for out, expected in (
        (f"{a_file}/trace.png", f"Invalid value for '--out': {a_file} is a file, not a folder"),
        ("trace.txt", "Invalid value for '--out': must end in .json or .png, not '.txt'"),
        ("/proc/trace.json", "Invalid value for '--out': cannot write /proc/trace.json"),
    ):
        result = pathways("trace", "some-program", *nowhere, "--out", out)
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.output.split())
    assert a_file.read_text() == "kept"


def test_the_demo_refuses_an_output_it_could_not_write_before_starting(
    a_file: Path, tmp_path: Path, pathways
) -> None:
    result = pathways("demo", "--state", str(tmp_path / "state"), "--out", f"{a_file}/t.png")
    assert result.exit_code == 2
    assert f"Invalid value for '--out': {a_file} is a file, not a folder" in result.output
    assert not (tmp_path / "state").exists()


def test_an_output_in_folders_yet_to_be_made_is_made_room_for(tmp_path: Path) -> None:
    from pathways_client.outputs import OutputPath

    path = OutputPath().convert(str(tmp_path / "a" / "b" / "out.json"), None, None)
    assert path.parent.is_dir() and not path.exists()  # tried, and left as it was
    folder = OutputPath(folder=True).convert(str(tmp_path / "plots" / "png"), None, None)
    assert folder.is_dir() and not any(folder.iterdir())


def test_folders_made_for_an_output_go_when_the_command_fails_before_writing(
    tmp_path: Path, pathways
) -> None:
    """``pathways trace x --out /new/dir/t.json`` with no API made /new/dir, and left it."""
    out = tmp_path / "new" / "dir" / "t.json"
    result = pathways("trace", "x", "--state", str(tmp_path / "none"), "--out", str(out))
    assert result.exit_code == 1 and "pathways up" in result.output
    assert not (tmp_path / "new").exists()


def test_crds_refuses_a_folder_it_could_not_write(a_file: Path, pathways) -> None:
    for out in (a_file, a_file / "crds"):
        result = pathways("crds", "--out", str(out))
        assert result.exit_code == 2
        assert "Invalid value for '--out'" in result.output
    assert a_file.read_text() == "kept"


def test_the_proxy_refuses_a_port_out_of_range(pathways) -> None:
    """gRPC would have listened on 99999 as 34463."""
    result = pathways("proxy", "--port", "99999")
    assert result.exit_code == 2
    assert "Invalid value for '--port': 99999 is not in the range 0<=x<=65535." in result.output


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        # click's range let nan through (every comparison with it is false): no limit at all.
        (
            ("submit", "-", "--wait", "--timeout", "nan"),
            "Invalid value for '--timeout': 'nan' is not a number of seconds",
        ),
        # They said "Invalid value: ..." naming no option.
        (
            ("proxy", "--protocol-range", "abc"),
            "Invalid value for '--protocol-range': 'abc' is not MIN-MAX",
        ),
        (
            ("proxy", "--islands", "garbage"),
            "Invalid value for '--islands': expected name=host:port, got 'garbage'",
        ),
    ],
)
def test_a_bad_option_value_is_refused_naming_the_option(
    pathways, arguments: tuple[str, ...], said: str
) -> None:
    result = pathways(*arguments)
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
