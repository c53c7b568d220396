"""The SDK through the REST API of an embedded cluster: slices are VirtualSlices bound by the
resource manager, charged to the tenant, released on exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pathways_client as pw
from pathways_client.api_client import ApiCallError
from pathways_client.embedded import read_info


def test_slices_are_virtual_slices_of_the_tenant(embedded_state: Path) -> None:
    with pw.connect(state=embedded_state, tenant="team-a") as cluster:
        assert cluster.tenant == "team-a"
        with cluster.slice(devices=2) as devices:
            stored = cluster.api.get("virtualslices", devices.name)
            assert stored["status"]["phase"] == "Bound"
            assert tuple(stored["status"]["devices"]) == devices.devices
            double = pw.function(lambda x: x * 2, slice=devices, name="double")
            np.testing.assert_array_equal(double(np.arange(4.0)).result(), [0, 2, 4, 6])
        # Released on exit: deleted, and gone once the resource manager has freed its devices.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                cluster.api.get("virtualslices", devices.name)
            except ApiCallError as error:
                assert error.status == 404
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"slice {devices.name} was not released")


def test_a_slice_that_can_never_fit_fails_fast(embedded_state: Path) -> None:
    with pw.connect(state=embedded_state, tenant="team-a") as cluster:
        with pytest.raises(pw.SliceError, match="cannot be bound: ShapeDoesNotFit"):
            cluster.slice(devices=64, timeout=60)
        pending = [
            s for s in cluster.api.list("virtualslices") if "deletionTimestamp" not in s["metadata"]
        ]
        assert pending == []  # nothing left behind


def test_a_bad_token_is_refused(embedded_state: Path) -> None:
    info = read_info(embedded_state)
    assert info is not None
    with pytest.raises(pw.ConnectError, match="refused the session"):
        pw.connect(info.api, token="not-a-token")


def test_a_slice_request_interrupted_while_pending_leaves_no_slice(embedded_state: Path) -> None:
    """Ctrl-C (or SIGTERM, in the proxy) while a slice waited left it behind: it bound later
    and held devices and quota for no one."""
    waiter = (
        "import sys\n"
        "import pathways_client as pw\n"
        f"with pw.connect(state={str(embedded_state)!r}, tenant='team-a') as cluster:\n"
        "    print('WAITING', flush=True)\n"
        "    cluster.slice(devices=2, name='waiter', timeout=120)\n"
    )
    with (
        pw.connect(state=embedded_state, tenant="team-a") as cluster,
        cluster.slice(devices=3),  # one device left: the waiter's two cannot bind yet
    ):
        process = subprocess.Popen(
            [sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline() == "WAITING\n"
        deadline = time.monotonic() + 30
        while not any(s["metadata"]["name"] == "waiter" for s in cluster.api.list("virtualslices")):
            assert time.monotonic() < deadline, "the waiter's slice never appeared"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.wait(30) != 0
        left = [
            s
            for s in cluster.api.list("virtualslices")
            if s["metadata"]["name"] == "waiter" and "deletionTimestamp" not in s["metadata"]
        ]
        assert left == []


def test_the_demo_replaces_a_previous_demos_program_of_its_name(embedded_state: Path) -> None:
    """A second `pathways demo --state DIR` showed the first one's result again, then was
    refused: its idempotency key named another body."""
    from pathways_client.api_client import ApiClient
    from pathways_client.demo import submit_fresh
    from pathways_client.embedded import tokens

    info = read_info(embedded_state)
    assert info is not None
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "demo-replaced"},
        "spec": {"slices": [{"name": "main", "devices": 1}], "driver": {"source": "pass"}},
    }
    with ApiClient(info.api, tokens(embedded_state)["team-a"]) as client:
        assert submit_fresh(client, document, "run-1") == "demo-replaced"
        first = client.get("programs", "demo-replaced")["metadata"]["uid"]
        assert submit_fresh(client, document, "run-2") == "demo-replaced"
        assert client.get("programs", "demo-replaced")["metadata"]["uid"] != first
        client.delete("programs", "demo-replaced")


def test_the_demos_table_finds_each_programs_trace_records(embedded_state: Path) -> None:
    """The demo's table of tenants' shares looked their trace records up by a client name
    programs no longer have ('<tenant>-<program>'): `make demo` failed at its second part."""
    from pathways_client.api_client import ApiClient
    from pathways_client.demo import submit_fresh, tenant_of_client
    from pathways_client.embedded import tokens

    info = read_info(embedded_state)
    assert info is not None
    source = (
        "import numpy as np\nimport pathways_client as pw\nwith pw.connect() as cluster:\n"
        "    main = cluster.slice('main')\n"
        "    pw.function(lambda x: x + 1, slice=main, name='inc')(np.zeros(4)).result()\n"
    )
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "demo-traced"},
        "spec": {"slices": [{"name": "main", "devices": 1}], "driver": {"source": source}},
    }
    with ApiClient(info.api, tokens(embedded_state)["team-a"]) as client:
        name = submit_fresh(client, document, "traced")

        def ended() -> bool:
            phase = (client.get("programs", name).get("status") or {}).get("phase")
            return phase in ("Succeeded", "Failed")

        wait_until(ended, "the program to end", timeout=120)
        assert client.get("programs", name)["status"]["phase"] == "Succeeded", client.logs(name)
        records = client.trace(name)
        assert records, "no trace records kept"
        assert {record["client"] for record in records} == set(tenant_of_client({"team-a": name}))
        client.delete("programs", name)


def slice_status(cluster: pw.Cluster, name: str) -> dict[str, Any]:
    return cluster.api.get("virtualslices", name).get("status") or {}


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_killed_sessions_slices_are_released_when_their_lease_runs_out(
    embedded_state: Path,
) -> None:
    """A client killed (SIGKILL, OOM) before it deleted its slices held them, their devices
    and its tenant's quota, for ever."""
    holder = (
        "import time\n"
        "import pathways_client as pw\n"
        f"cluster = pw.connect(state={str(embedded_state)!r}, tenant='team-a', lease_seconds=5)\n"
        "cluster.slice(devices=2, name='killed')\n"
        "print('BOUND', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "BOUND\n"
        with pw.connect(state=embedded_state, tenant="team-a", lease_seconds=5) as cluster:
            with cluster.slice(devices=1) as live:
                # The holder renews its lease while it runs: bound past the lease.
                time.sleep(7)
                assert slice_status(cluster, "killed")["phase"] == "Bound"
                process.kill()
                process.wait(30)
                killed_at = time.monotonic()
                wait_until(
                    lambda: slice_status(cluster, "killed").get("reason") == "LeaseExpired",
                    "the killed session's slice to be released",
                )
                # Within its lease and a renewal period of the last renewal.
                assert time.monotonic() - killed_at < 5 + 5 / 3 + 2
                assert slice_status(cluster, "killed")["phase"] == "Released"
                # This session renews its own: still bound, and usable.
                assert slice_status(cluster, live.name)["phase"] == "Bound"
                double = pw.function(lambda x: x * 2, slice=live, name="double")
                np.testing.assert_array_equal(double(np.arange(2.0)).result(), [0, 2])
                assert cluster.api.me()["usage"]["devices"] == 1
            cluster.api.delete("virtualslices", "killed")
    finally:
        process.kill()
        process.wait(30)


def test_a_session_frozen_past_its_lease_is_told_its_slice_is_gone(
    embedded_state: Path, pathways: Any
) -> None:
    with pw.connect(state=embedded_state, tenant="team-a", lease_seconds=5) as cluster:
        frozen = cluster.slice(devices=1)
        keeper = cluster._leases
        assert keeper is not None
        keeper._stop.set()  # as a process stopped (SIGSTOP) renews nothing
        identity = pw.function(lambda x: x, slice=frozen, name="identity")
        # Past its lease unrenewed, the session refuses it on its own: the cluster may have
        # given its devices to another already (it computed on them, the API unreachable).
        time.sleep(5.5)
        with pytest.raises(pw.SliceError, match=r"its lease was last renewed \d+ s ago, longer"):
            identity(np.zeros(1))
        wait_until(
            lambda: slice_status(cluster, frozen.name).get("phase") == "Released",
            "the frozen session's slice to be released",
        )
        # `get --events` shows why (it showed a slice's Events not at all).
        at = ("--state", str(embedded_state), "--tenant", "team-a", "--kind", "virtualslices")
        shown = pathways("get", frozen.name, *at, "--events").output
        assert "LeaseExpired" in shown and "did not renew its lease for 5 s" in shown
        keeper._stop.clear()  # thawed: its next renewal is refused
        keeper.renew_all()
        assert "LeaseExpired" not in (frozen.lost or "")  # said in words, below
        with pytest.raises(pw.SliceError, match="released by the cluster: the lease of"):
            identity(np.zeros(1))
    for bad in (1, 5.5, "60", True):
        with pytest.raises(ValueError, match=r"lease_seconds must be whole seconds from 5 to 864"):
            pw.connect(state=embedded_state, tenant="team-a", lease_seconds=bad)  # type: ignore[arg-type]
    # A bad share was taken, then named as an island that "did not answer", or made 1.
    for share, message in (
        ({"weight": 0}, "weight: expected"),
        ({"priority": 2**40}, "priority: expected a 32-bit"),
    ):
        with pytest.raises(ValueError, match=f"connect: {message}"):
            pw.connect(state=embedded_state, tenant="team-a", **share)  # type: ignore[arg-type]


def test_a_slice_deleted_and_made_again_under_its_name_is_not_the_holders(
    embedded_state: Path,
) -> None:
    """The holder renewed by name: it renewed the new slice (someone else's) for ever, ran on
    its devices, and its release would have deleted it."""
    with pw.connect(state=embedded_state, tenant="team-a", lease_seconds=5) as cluster:
        held = cluster.slice(devices=1, name="reused")
        assert cluster.api is not None and held.uid
        cluster.api.delete("virtualslices", "reused")
        wait_until(lambda: not _exists(cluster, "reused"), "the slice to go")
        again = cluster.api.submit(
            {
                "apiVersion": "pathways.dev/v1alpha1",
                "kind": "VirtualSlice",
                "metadata": {"name": "reused"},
                "spec": {"devices": 1, "leaseSeconds": 600},
            }
        )
        assert cluster._leases is not None
        cluster._leases.renew_all()
        assert held.lost is not None and "of uid" in held.lost
        stored = cluster.api.get("virtualslices", "reused")
        assert stored["metadata"]["uid"] == again["metadata"]["uid"]
        assert "pathways.dev/renewed-at" not in (stored["metadata"].get("annotations") or {})
        held.release()  # the new one stays: it is not this session's
        assert _exists(cluster, "reused")
        cluster.api.delete("virtualslices", "reused", uid=again["metadata"]["uid"])


def _exists(cluster: Any, name: str) -> bool:
    try:
        cluster.api.get("virtualslices", name)
    except ApiCallError as error:
        if error.status == 404:
            return False
        raise
    return True
