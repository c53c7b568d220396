"""An island's limits with real processes: a client flooding the island is told it is busy (at
its own bound, or the island's) with the island, the limit and "retry later", while other
clients' work still runs and the accepted work completes intact; artifacts over the limit are
refused by the SDK before sending and by the scheduler, and the session keeps serving."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import export, f32, increment

from pathways_client.island_client import IslandBusy, IslandClient, IslandError, Submitted
from pathways_client.launcher import LocalIsland
from pathways_core.scheduling import DEFAULT_MAX_ARTIFACT_BYTES
from pathways_core.wire import pb


def _slow(x):
    # ~0.2 s on these machines: long enough that a flood arrives while work is queued.
    return jax.lax.fori_loop(0, 200, lambda _, v: jnp.tanh(v @ v), x)


SLOW = export(_slow, f32(256, 256))
INPUT = (np.eye(256, dtype=np.float32) * 0.5 + 0.01).astype(np.float32)
EXPECTED = np.asarray(jax.jit(_slow)(INPUT))
ISLAND = "limits"
MAX_QUEUED, PER_CLIENT, MAX_ARTIFACT, TRACE_LIMIT = 8, 3, 64 << 10, 20


@pytest.fixture(scope="module")
def island(compilation_cache: Path) -> Iterator[LocalIsland]:
    """One executor of 2 devices, one computation in flight at a time, a queue of 8 (3 per
    client), artifacts of at most 64 KiB and a trace of 20 records."""
    with LocalIsland(
        hosts=1,
        devices_per_host=2,
        name=ISLAND,
        max_in_flight=1,
        max_queued=MAX_QUEUED,
        max_queued_per_client=PER_CLIENT,
        max_artifact_bytes=MAX_ARTIFACT,
        trace_limit=TRACE_LIMIT,
        compilation_cache=compilation_cache,
    ) as running:
        yield running


def prepare(client: IslandClient) -> tuple[str, str]:
    """The slow function registered and its input put on device 0 (round trips a flood
    should not wait for). The client then ignores the SDK's flow control, as a hostile or
    foreign client would: the island's own bounds are what is tested."""
    client.window = 1 << 30
    return client.register(SLOW, "slow"), client.put(INPUT, device=0)


def send(client: IslandClient, prepared: tuple[str, str], count: int) -> list[Submitted]:
    """``count`` computations sent at once (one message), none awaited."""
    function, x = prepared
    with client.batch():
        return [client.submit(function, [0], [x], 1, name=f"n{n}") for n in range(count)]


def flood(client: IslandClient, count: int) -> list[Submitted]:
    """``count`` computations of a freshly prepared client sent at once, none awaited."""
    return send(client, prepare(client), count)


def outcomes(calls: list[Submitted]) -> tuple[list[Submitted], list[IslandBusy]]:
    """The computations that completed, and the busy refusals (anything else fails the test)."""
    done, busy = [], []
    for call in calls:
        try:
            call.wait(timeout=300)
            done.append(call)
        except IslandBusy as error:
            busy.append(error)
    return done, busy


def test_a_flooding_client_is_told_busy_and_another_clients_work_still_runs(
    island: LocalIsland,
) -> None:
    endpoint = island.scheduler_endpoint
    with IslandClient(endpoint, "flood") as flooder, IslandClient(endpoint, "other") as other:
        flooded = flood(flooder, 30)
        # The flooder holds at most its share of the queue: the other client gets in at once.
        work = flood(other, PER_CLIENT)
        done, busy = outcomes(flooded)
        assert busy, "a flood of 30 onto a queue of 3 per client was never refused"
        message = str(busy[0])
        assert message.startswith("island busy:") and message.endswith("retry later")
        assert "client 'flood'" in message and f"island '{ISLAND}'" in message
        assert f"max-queued-per-client {PER_CLIENT}" in message
        assert outcomes(work) == (work, [])
        # The accepted work completed intact.
        for call in [*done, *work]:
            client = flooder if call in done else other
            np.testing.assert_allclose(client.get(call.outputs[0]), EXPECTED, rtol=1e-5)
        # Once its work drained, the flooder is served again: "retry later" means it.
        again = flood(flooder, 1)
        assert outcomes(again) == (again, [])


def test_the_trace_is_bounded_and_says_whose_records_went(island: LocalIsland) -> None:
    """The island keeps at most its trace limit: a chatty client loses its oldest records,
    a quiet one none, and the SDK's trace says whose went and until when (it said nothing:
    shares read from it were silently wrong)."""
    endpoint = island.scheduler_endpoint
    with IslandClient(endpoint, "quiet") as quiet, IslandClient(endpoint, "chatty") as chatty:
        for client, count in ((quiet, 2), (chatty, TRACE_LIMIT + 5)):
            function = client.register(increment(), "inc")
            x = client.put(np.zeros(4, np.float32), device=0)
            with client.batch():
                calls = [client.submit(function, [0], [x], 1) for _ in range(count)]
            assert outcomes(calls) == (calls, [])
        trace = quiet.trace()
    assert len(trace) <= TRACE_LIMIT
    assert [record.client for record in trace].count("quiet") == 2
    assert "chatty" in trace.dropped_until_ns and "quiet" not in trace.dropped_until_ns
    kept = [record for record in trace if record.client == "chatty"]
    assert kept and min(record.end_ns for record in kept) >= trace.dropped_until_ns["chatty"]


def test_the_sdk_waits_for_room_instead_of_overrunning_its_bound(island: LocalIsland) -> None:
    """A chain three times the per-client bound, sent as one batch by a client keeping the
    SDK's flow control: it sends what fits, waits for completions to make room, and every
    computation runs; none is refused."""
    with IslandClient(island.scheduler_endpoint, "patient") as client:
        assert client.window == PER_CLIENT  # the island told the client its bound
        function, x = client.register(SLOW, "slow"), client.put(INPUT, device=0)
        with client.batch():
            calls = [client.submit(function, [0], [x], 1) for _ in range(3 * PER_CLIENT)]
        assert outcomes(calls) == (calls, [])
        np.testing.assert_allclose(client.get(calls[-1].outputs[0]), EXPECTED, rtol=1e-5)


def test_the_island_bound_holds_over_all_clients(island: LocalIsland) -> None:
    endpoint = island.scheduler_endpoint
    clients = [IslandClient(endpoint, f"tenant-{n}") for n in range(3)]
    try:
        # Three clients of 3 each would queue 9: the island takes 8. Every client is prepared
        # first, so that the floods arrive together, before the computation in flight (~0.2 s)
        # ends and makes room in the queue.
        prepared = [prepare(client) for client in clients]
        floods = [send(client, p, 30) for client, p in zip(clients, prepared, strict=True)]
        messages = [str(e) for calls in floods for e in outcomes(calls)[1]]
        island_full = [m for m in messages if "max-queued 8" in m]
        assert island_full, messages[:3]
        assert f"island '{ISLAND}' already queues {MAX_QUEUED} computations" in island_full[0]
        assert island_full[0].endswith("retry later")
        late = flood(clients[2], 1)
        assert outcomes(late) == (late, [])
    finally:
        for client in clients:
            client.close()


def test_the_sdk_refuses_an_artifact_over_its_limit_before_sending(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "sdk-limit") as client:
        client.max_artifact_bytes = len(SLOW) - 1
        with pytest.raises(IslandError, match=f"larger than the SDK accepts \\({len(SLOW) - 1}"):
            client.register(SLOW, "slow")
        client.max_artifact_bytes = None  # the default: 32 MiB
        huge = bytes(DEFAULT_MAX_ARTIFACT_BYTES + 1)
        with pytest.raises(IslandError, match="PATHWAYS_MAX_ARTIFACT_BYTES") as raised:
            client.register(huge, "huge")
        assert f"its artifact is {len(huge)} bytes" in str(raised.value)
        # Nothing was sent: the session is intact and serves the next request.
        calls = flood(client, 1)
        assert outcomes(calls) == (calls, [])


def test_the_island_refuses_an_artifact_over_its_limit(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "island-limit") as client:
        padded = bytes(MAX_ARTIFACT + 1)  # under the SDK's limit, over the island's
        with pytest.raises(IslandError) as raised:
            client.register(padded, "padded")
        assert str(raised.value) == (
            f"function 'padded': its artifact is {MAX_ARTIFACT + 1} bytes, larger than island "
            f"'{ISLAND}' accepts ({MAX_ARTIFACT} bytes, max-artifact-bytes / "
            "PATHWAYS_MAX_ARTIFACT_BYTES)"
        )
        calls = flood(client, 1)
        assert outcomes(calls) == (calls, [])


def test_a_burst_larger_than_one_frame_is_split_and_the_session_survives(
    island: LocalIsland,
) -> None:
    """Two registrations of 33 MiB sent together (as a batch would): the client splits them
    into frames the scheduler accepts; the island refuses both by size, and serves on."""
    with IslandClient(island.scheduler_endpoint, "big-burst") as client:
        artifacts = [bytes([n]) * (33 << 20) for n in range(2)]
        registrations = []
        for n, artifact in enumerate(artifacts):
            function_id = hashlib.sha256(artifact).hexdigest()
            client._functions[function_id] = Future()  # what register() would wait on
            registrations.append(
                pb.ClientMessage(
                    function=pb.FunctionRegistration(
                        function_id=function_id, artifact=artifact, name=f"big{n}"
                    )
                )
            )
        client._write(registrations)
        for function_id in list(client._functions)[-2:]:
            with pytest.raises(IslandError, match=f"larger than island '{ISLAND}' accepts"):
                client._functions[function_id].result(timeout=120)
        calls = flood(client, 1)
        assert outcomes(calls) == (calls, [])


@pytest.mark.parametrize(
    ("arguments", "environment", "message"),
    [
        (["--max-artifact-bytes", "0"], {}, "--max-artifact-bytes must be between 1 and"),
        ([], {"PATHWAYS_MAX_ARTIFACT_BYTES": "1GiB"}, "PATHWAYS_MAX_ARTIFACT_BYTES must be a"),
        (["--max-queued", "0"], {}, "--max-queued must be >= 1"),
        (["--max-queued-per-client", "-1"], {}, "--max-queued-per-client must be >= 1"),
        (["--run-length", "0"], {}, "--run-length must be >= 1"),
        (["--trace-limit", "0"], {}, "--trace-limit must be >= 1, not 0"),
        (["--max-in-flight", "0"], {}, "--max-in-flight must be >= 1, not 0"),
        # gRPC would listen on 99999 as 34463
        (["--port", "99999"], {}, "argument --port: must be from 0 to 65535, not 99999"),
        (["--session-port", "-1"], {}, "argument --session-port: must be from 0 to 65535"),
    ],
)
def test_the_scheduler_refuses_bad_limits_naming_the_setting(
    arguments: list[str], environment: dict[str, str], message: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pathways_scheduler", "--executor", "127.0.0.1:1", *arguments],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert message in run.stderr


@pytest.mark.parametrize("setting", ["hosts", "devices_per_host", "max_in_flight"])
def test_a_local_island_refuses_a_count_below_one_naming_it(setting: str) -> None:
    """Before: no hosts failed in the scheduler's usage text, no devices per host started
    executors on the host's one real CPU device."""
    with pytest.raises(ValueError, match=f"LocalIsland's {setting} must be >= 1, not 0"):
        LocalIsland(**{setting: 0})
