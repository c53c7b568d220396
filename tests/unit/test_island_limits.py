"""An island's limits as settings: the artifact limit from the environment, its ceiling (one
control frame), and the shape of the busy message clients recognise."""

from __future__ import annotations

import pytest

from pathways_core.scheduling import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    DEFAULT_MAX_QUEUED,
    MAX_ARTIFACT_BYTES_CEILING,
    SDK_WINDOW,
    artifact_limit_from,
    check_artifact_limit,
    client_window,
    default_max_queued_per_client,
    is_busy,
)
from pathways_core.scheduling.limits import busy_message
from pathways_core.wire.streams import MAX_MESSAGE_BYTES


@pytest.mark.parametrize(
    ("environment", "limit"),
    [
        ({}, DEFAULT_MAX_ARTIFACT_BYTES),
        ({"PATHWAYS_MAX_ARTIFACT_BYTES": ""}, DEFAULT_MAX_ARTIFACT_BYTES),
        ({"PATHWAYS_MAX_ARTIFACT_BYTES": " 1024 "}, 1024),
        (
            {"PATHWAYS_MAX_ARTIFACT_BYTES": str(MAX_ARTIFACT_BYTES_CEILING)},
            MAX_ARTIFACT_BYTES_CEILING,
        ),
    ],
)
def test_the_artifact_limit_comes_from_the_environment(environment, limit) -> None:
    assert artifact_limit_from(environment) == limit


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("32MiB", "must be a number of bytes, not '32MiB'"),
        ("0", "between 1 and"),
        (str(MAX_MESSAGE_BYTES), "one control frame"),
    ],
)
def test_an_unusable_artifact_limit_names_the_variable(value, message) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        artifact_limit_from({"PATHWAYS_MAX_ARTIFACT_BYTES": value})
    assert str(raised.value).startswith("PATHWAYS_MAX_ARTIFACT_BYTES")


def test_sdk_windows_fit_sixteen_clients_in_the_default_queue() -> None:
    per_client = default_max_queued_per_client(DEFAULT_MAX_QUEUED)
    assert client_window(per_client) == SDK_WINDOW
    assert 16 * client_window(per_client) <= DEFAULT_MAX_QUEUED
    assert client_window(3) == 3  # never past the island's own bound
    assert client_window(0) == SDK_WINDOW  # an island that does not say


def test_the_ceiling_leaves_room_in_a_frame() -> None:
    assert DEFAULT_MAX_ARTIFACT_BYTES <= MAX_ARTIFACT_BYTES_CEILING < MAX_MESSAGE_BYTES
    with pytest.raises(ValueError, match="--max-artifact-bytes must be between"):
        check_artifact_limit(MAX_ARTIFACT_BYTES_CEILING + 1, "--max-artifact-bytes")


@pytest.mark.parametrize("per_client", [True, False])
def test_busy_messages_are_recognised(per_client: bool) -> None:
    message = busy_message("isl", "alice", 8, 8, per_client)
    assert is_busy(message) and message.endswith("retry later")
    assert not is_busy("computation 'x' names no devices")


def test_the_executor_checks_the_artifact_limit_again() -> None:
    from pathways_executor.functions import FunctionCache, FunctionError

    cache = FunctionCache(max_artifact_bytes=10)
    with pytest.raises(FunctionError, match="larger than this executor accepts \\(10 bytes"):
        cache.register("0" * 64, b"x" * 11, "big")
    # Remembered: a computation calling it fails with the same reason.
    with pytest.raises(FunctionError, match="its artifact is 11 bytes"):
        cache.callable("0" * 64, [])


def test_an_islands_defaults_are_its_schedulers() -> None:
    """An Island that sets nothing runs its scheduler as ``pathways_scheduler`` would run
    with no flags."""
    from pathways_core.resources.island import IslandScheduler
    from pathways_core.scheduling import DEFAULT_RUN_LENGTH, DEFAULT_TRACE_LIMIT

    settings = IslandScheduler()
    assert settings.max_queued_computations == DEFAULT_MAX_QUEUED
    assert settings.run_length == DEFAULT_RUN_LENGTH
    assert settings.trace_records == DEFAULT_TRACE_LIMIT
