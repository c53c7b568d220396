"""Island traces as Chrome trace events: one row per device, one event per computation per
device; a computation spanning executors is counted once."""

from __future__ import annotations

import json

import pytest

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


def test_the_dump_says_which_islands_let_go_of_the_clients_records(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib

    from pathways_client import trace_dump
    from pathways_core.wire import pb

    answers = {
        "full": pb.Trace(dropped_until_ns={"other": 500}),  # another client's records went
        "cut": pb.Trace(dropped_until_ns={"mine": 150}),  # mine, since the run began
        "old": pb.Trace(dropped_until_ns={"mine": 50}),  # mine, of an earlier run
    }
    for trace in answers.values():
        trace.records.add(seq=1, client="mine", name="f", start_ns=200, end_ns=300, ok=True)
    monkeypatch.setattr(
        trace_dump.tls, "channel", lambda endpoint, *_: contextlib.nullcontext(endpoint)
    )
    monkeypatch.setattr(
        trace_dump, "stub", lambda endpoint, *_: lambda *args, **kwargs: answers[endpoint]
    )
    islands = [f"--island={name}={name}" for name in answers]
    assert trace_dump.main([*islands, "--client", "mine", "--since-ns", "100"]) == 0
    dumped = json.loads(capsys.readouterr().out)
    assert list(dumped["incomplete"]) == ["cut"]
    assert [record["island"] for record in dumped["records"]] == ["full", "cut", "old"]
