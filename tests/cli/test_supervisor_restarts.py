"""The embedded supervisor's crash-loop guard: restarts at once after a healthy run, backs off
while a component keeps dying soon after its start, and gives up after a streak."""

from __future__ import annotations

from pathways_client.embedded import MAX_QUICK_FAILURES, STABLE_AFTER, Restarts


def test_quick_failures_back_off_then_give_up() -> None:
    guard = Restarts(started=100.0)
    delays = []
    now = 100.0
    for _ in range(MAX_QUICK_FAILURES):
        now += 1.0  # dies a second after each start
        delays.append(guard.failed(now))
        guard.started = now
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert guard.failed(now + 1.0) is None  # a crash loop: left down


def test_a_healthy_run_starts_a_new_streak() -> None:
    guard = Restarts(started=0.0)
    assert guard.failed(1.0) == 0.0
    guard.started = 1.0
    assert guard.failed(2.0) == 0.5
    guard.started = 2.0
    # It ran long enough this time: the next failure is restarted at once again.
    assert guard.failed(2.0 + STABLE_AFTER) == 0.0
    assert guard.streak == 1


def test_starts_that_fail_at_once_back_off_and_end_in_giving_up(tmp_path) -> None:
    # The API's port taken by another process: each start failed at once, yet was taken for
    # the first failure after a healthy run (restarted in 0.0 s, 35 times in 40 s, for ever).
    import time

    from pathways_client.embedded import Supervisor

    supervisor = Supervisor(tmp_path, [], None)
    guard = Restarts(started=time.monotonic() - 10 * STABLE_AFTER)  # healthy for long

    def port_taken() -> None:
        raise OSError("[Errno 98] Address already in use")

    delays = []
    for _ in range(MAX_QUICK_FAILURES + 1):
        delays.append(guard.failed(time.monotonic()))
        if delays[-1] is None:
            break
        supervisor._restart("api", guard, 0.0, port_taken, ())
    assert delays == [0.0, 0.5, 1.0, 2.0, 4.0, None]
    assert "api" in supervisor._down


def test_a_supervisor_told_to_stop_while_starting_stops_before_the_next_part(tmp_path) -> None:
    # `pathways down` 4 s into `up` was answered after the whole start: `up` then printed a
    # cluster (exit 0) that was already going away.
    import pytest

    from pathways_client.embedded import EmbeddedError, IslandSpec, Supervisor

    supervisor = Supervisor(tmp_path, [IslandSpec("local", 1, 2, "fifo")], None)
    supervisor._stop.set()  # the SIGTERM came
    with pytest.raises(EmbeddedError, match="stopped while it started"):
        supervisor.start()
    assert supervisor.islands == {} and not supervisor.info.ready
