"""An island with a session key: a real scheduler opens sessions only for hellos carrying a
credential its key signed, and holds each to its grant (name, weight, priority, devices),
while the sessions that keep to theirs compute on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import increment

from pathways_client.cluster import connect
from pathways_client.island_client import IslandClient, IslandError, IslandUnavailable
from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.wire import SCHEDULER, pb
from pathways_core.wire.credentials import (
    SESSION_CREDENTIALS_ENV,
    SESSION_KEY_ENV,
    SessionGrant,
    credentials_text,
    sign,
)
from pathways_core.wire.streams import frame, messages

KEY = "a-session-key-of-at-least-32-characters"


@pytest.fixture(scope="module")
def keyed(compilation_cache: Path) -> Iterator[LocalIsland]:
    """One host of 4 fake devices whose scheduler has a session key."""
    with LocalIsland(
        hosts=1,
        devices_per_host=4,
        name="keyed",
        compilation_cache=compilation_cache,
        environment={SESSION_KEY_ENV: KEY},
    ) as running:
        yield running


def credential(client: str, devices=(0, 1), weight: int = 2, priority: int = 0, **change) -> str:
    grant = SessionGrant(
        island=change.pop("island", "keyed"),
        client=client,
        tenant=change.pop("tenant", "team-a"),
        weight=weight,
        priority=priority,
        devices=None if devices is None else frozenset(devices),
        expires=change.pop("expires", int(time.time()) + 600),
    )
    return sign(grant, change.pop("key", KEY).encode())


def run_on(client: IslandClient, device: int) -> np.ndarray:
    function = client.register(increment(), "increment")
    x = client.put(np.arange(4, dtype=np.float32), device=device)
    done = client.submit(function, [device], [x], 1)
    done.wait(60)
    return client.get(done.outputs[0], timeout=60)


def raw_hello(island: LocalIsland, name: str) -> str:
    """What the scheduler answers a bare hello (no credential) on its session port."""
    with grpc.insecure_channel(island.scheduler_endpoint) as channel:
        info = stub(channel, SCHEDULER, "Info")(pb.Empty(), timeout=30)
    host, port = info.session_endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        hello = pb.ClientMessage(hello=pb.Hello(client=name))
        connection.sendall(frame(pb.ClientBatch(messages=[hello])))
        batch = next(messages(connection.recv, pb.ClientEventBatch.FromString))
    (event,) = batch.events
    assert event.kind == pb.ClientEvent.REJECTED and event.ends_session
    return event.message


def refusal(client: IslandClient) -> str:
    with pytest.raises(IslandError) as raised:
        client.register(increment(), "increment", timeout=30)
    # The request's fault, not the island's: not to be retried as it is.
    assert not isinstance(raised.value, IslandUnavailable)
    return str(raised.value)


def test_a_session_on_its_granted_devices_computes_and_others_are_refused(keyed) -> None:
    with IslandClient(keyed.scheduler_endpoint, "train", 2, credential=credential("train")) as a:
        np.testing.assert_array_equal(run_on(a, 1), np.arange(4) + 1)
        function = a.register(increment(), "increment")
        x = a.put(np.zeros(4, np.float32), device=0)
        outside = a.submit(function, [2], [x], 1)
        with pytest.raises(IslandError, match=r"names devices \[2\] this session's credential"):
            outside.wait(30)
        # A new credential within the session (a slice bound since) lets it use device 2.
        a.renew(credential("train", devices=(0, 1, 2)))
        np.testing.assert_array_equal(run_on(a, 2), np.arange(4) + 1)


def test_hellos_claiming_more_than_their_credentials_are_refused(keyed) -> None:
    # The SDK says so before it opens a session (the island's Info tells it), and the scheduler
    # refuses a hello without one from a client that does not look.
    with pytest.raises(IslandError, match=r"signed credential only.*pw\.connect\(state=DIR\)"):
        IslandClient(keyed.scheduler_endpoint, "c0")
    assert "signed credential only" in raw_hello(keyed, "c1")
    cases = [  # (client, weight, priority, credential, what the refusal says)
        ("c2", 1, 0, credential("c2", key="k" * 40), "not signed by island 'keyed'"),
        ("c3", 1, 0, credential("c3", island="other"), "for island 'other', not 'keyed'"),
        ("c4", 1, 0, credential("c4", expires=int(time.time()) - 5), "expired"),
        ("c5", 3, 0, credential("c5"), "hello.weight 3 is above the 2"),
        ("c6", 1, 1, credential("c6"), "hello.priority 1 is above the 0"),
        ("squat", 1, 0, credential("c7"), "'squat' is not the client 'c7'"),
    ]
    for name, weight, priority, given, expected in cases:
        with IslandClient(
            keyed.scheduler_endpoint, name, weight, priority, credential=given
        ) as client:
            assert expected in refusal(client)
    # The island keeps serving the sessions that keep to their grants.
    with IslandClient(keyed.scheduler_endpoint, "after", 1, credential=credential("after")) as ok:
        np.testing.assert_array_equal(run_on(ok, 0), np.arange(4) + 1)


def test_a_program_connects_with_the_credentials_its_environment_gives(keyed, monkeypatch) -> None:
    monkeypatch.setenv(
        SESSION_CREDENTIALS_ENV, credentials_text({"keyed": credential("prog", weight=1)})
    )
    with connect(islands={"keyed": keyed.scheduler_endpoint}, client="prog") as cluster:
        np.testing.assert_array_equal(run_on(cluster.session("keyed"), 0), np.arange(4) + 1)
    monkeypatch.setenv(SESSION_CREDENTIALS_ENV, '{"keyed": 1}')
    with pytest.raises(Exception, match="must map island names to credentials"):
        connect(islands={"keyed": keyed.scheduler_endpoint})


def test_a_scheduler_refuses_a_key_too_short_to_be_secret() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pathways_scheduler", "--executor", "127.0.0.1:1"],
        env={**os.environ, SESSION_KEY_ENV: "short"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "PATHWAYS_SESSION_KEY must be at least 32 characters" in done.stderr
