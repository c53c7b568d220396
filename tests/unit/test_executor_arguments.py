"""The executor's command line: a wrong number is refused at once, naming the flag."""

from __future__ import annotations

import pytest

from pathways_executor.__main__ import parse


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--fake-devices", "-2"], "argument --fake-devices: must be >= 0, not -2"),
        (["--index", "-1"], "argument --index: must be >= 0, not -1"),
        (["--hosts", "0"], "argument --hosts: must be >= 1, not 0"),
        (["--first-device", "-4"], "argument --first-device: must be >= 0, not -4"),
        (["--heartbeat-timeout", "0"], "argument --heartbeat-timeout: must be >= 1, not 0"),
        (["--port", "70000"], "argument --port: must be from 0 to 65535, not 70000"),
        (["--port", "-1"], "argument --port: must be from 0 to 65535, not -1"),
        (["--hosts", "2", "--coordinator", "h:1", "--index", "2"], "--index must be below"),
        (["--fake-devices", "4", "--hosts", "2", "--index", "1"], "--hosts > 1 needs --coordi"),
        (
            ["--fake-devices", "four"],
            "argument --fake-devices: expected a whole number, not 'four'",
        ),
    ],
)
def test_bad_numbers_are_refused_naming_the_flag(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(arguments)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_what_the_launcher_and_the_operator_pass_is_accepted() -> None:
    """A launcher's island of several hosts without a JAX group gives each executor its index
    alone; the operator's pods of a group give the group's size and coordinator; on
    accelerators the coordinator may be left to JAX."""
    alone = parse(["--index", "1", "--first-device", "4", "--fake-devices", "4"])
    assert (alone.index, alone.hosts, alone.fake_devices) == (1, 1, 4)
    group = parse(["--hosts", "2", "--coordinator", "h:8476", "--index", "1", "--port", "0"])
    assert (group.index, group.hosts) == (1, 2)
    # On accelerator hosts JAX may find the group's coordinator itself (TPU slices do).
    assert parse(["--hosts", "4", "--index", "3"]).coordinator == ""
