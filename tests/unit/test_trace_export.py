"""Island traces as Chrome trace events: one row per device, one event per computation per
device; a computation spanning executors is counted once."""

from __future__ import annotations

from pathways_client.trace_export import chrome_trace, computation_count


def record(seq: int, executor: int, devices: list[int], island: str = "a") -> dict:
    return {
        "seq": seq,
        "client": "team-a.train",
        "name": f"stage-{seq}",
        "devices": devices,
        "executor": executor,
        "start_ns": 1_000 * seq,
        "end_ns": 1_000 * seq + 500,
        "ok": True,
        "island": island,
    }


def test_a_computation_spanning_two_executors_is_one_computation_on_each_of_its_devices() -> None:
    records = [
        record(0, 0, [0, 1]),
        record(0, 1, [2, 3]),  # the same computation, its other executor's record
        record(1, 0, [0]),
        record(0, 0, [0], island="b"),  # another island's order
    ]
    assert computation_count(records) == 3
    events = chrome_trace(records)["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 6  # one per computation per device
    rows = {(e["pid"], e["tid"]) for e in complete}
    assert len(rows) == 5  # island a's four devices and island b's one


def test_an_island_that_does_not_answer_is_said_in_one_line(capsys) -> None:
    """Collected after a run whose island went down, the dump failed with gRPC's traceback,
    logged whole by the embedded manager."""
    from pathways_client import trace_dump

    assert trace_dump.main(["--island", "gone=127.0.0.1:9", "--timeout", "5"]) == 1
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith("island 'gone' at 127.0.0.1:9 gave no trace: UNAVAILABLE: ")
    assert said.err.count("\n") == 1
