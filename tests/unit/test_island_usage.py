"""Each client's usage of an island (what the scheduler's metrics export): computations and
calls completed, failed and refused, and the device time its work held, per executor."""

from __future__ import annotations

from test_dispatcher import computation, finish, island, to_executors
from test_program_dispatch import call, chain, registered

from pathways_core.scheduling.island import MAX_USAGE_CLIENTS, ClientUsage
from pathways_core.wire import pb


def test_completed_failed_and_refused_are_counted_per_client() -> None:
    dispatcher = island(max_queued=2, max_queued_per_client=2, max_in_flight=1)
    seqs = []
    for n in range(3):
        sent = to_executors(dispatcher.submit("a", computation("a", n, devices=(0, 1))))
        seqs += [command.seq for _, command in sent if command.HasField("run")]
    dispatcher.submit("a", computation("a", 9, devices=(42,)))  # no such device: refused
    dispatcher.submit("a", computation("a", 3))  # the queue is full: refused
    finish(dispatcher, seqs[0], 0)  # ran 1 ns on 2 devices
    usage = dispatcher.usage["a"]
    assert (usage.completed, usage.failed, usage.refused) == (1, 0, 2)
    assert usage.device_ns == 2
    assert "b" not in dispatcher.usage  # no work, no usage


def test_a_failure_and_a_lost_executor_count_as_failed() -> None:
    dispatcher = island()
    sent = to_executors(dispatcher.submit("b", computation("b", 1)))
    (run,) = [command for _, command in sent if command.HasField("run")]
    finish(dispatcher, run.seq, 0, ok=False, message="boom")
    sent = to_executors(dispatcher.submit("b", computation("b", 2, devices=(4,))))
    dispatcher.executor_lost(1, "killed")
    assert sent
    usage = dispatcher.usage["b"]
    assert (usage.completed, usage.failed) == (0, 2)


def test_a_calls_device_time_is_its_nodes_on_each_executor() -> None:
    dispatcher = island()
    program = registered(dispatcher, chain([0, 4]))  # one node on each executor
    sent = to_executors(dispatcher.call("a", call(program, 1)))
    seq = next(c.seq for _, c in sent if c.HasField("call"))
    for executor, (start, end) in ((0, (10, 30)), (1, (40, 45))):
        dispatcher.executor_event(
            pb.ExecutorEvent(
                seq=seq,
                executor=executor,
                ok=True,
                node_indices=[executor],
                node_starts_ns=[start],
                node_ends_ns=[end],
            )
        )
    assert dispatcher.usage["a"] == ClientUsage(completed=1, device_ns=20 + 5)


def test_usage_is_kept_for_a_bounded_number_of_clients_ended_sessions_first() -> None:
    dispatcher = island()
    for n in range(MAX_USAGE_CLIENTS + 5):
        client = f"gone{n}"
        dispatcher.connect(client)
        dispatcher.submit(client, computation(client, 1, devices=(99,)))  # refused: usage
        dispatcher.disconnect(client)
    dispatcher.submit("a", computation("a", 1, devices=(99,)))
    assert len(dispatcher.usage) == MAX_USAGE_CLIENTS
    assert "a" in dispatcher.usage and "gone0" not in dispatcher.usage


def test_the_usage_of_the_session_that_ended_longest_ago_goes_first() -> None:
    dispatcher = island()
    dispatcher.connect("daily")  # seen first, and back every day
    dispatcher.submit("daily", computation("daily", 1, devices=(99,)))
    dispatcher.disconnect("daily")
    for n in range(MAX_USAGE_CLIENTS - 1):
        client = f"once{n}"
        dispatcher.connect(client)
        dispatcher.submit(client, computation(client, 1, devices=(99,)))
        dispatcher.disconnect(client)
    dispatcher.connect("daily")
    dispatcher.disconnect("daily")
    dispatcher.submit("a", computation("a", 1, devices=(99,)))  # one more client: one goes
    assert "daily" in dispatcher.usage and "once0" not in dispatcher.usage
