"""The proxy on an embedded cluster (``pathways up``): each session's slice is a VirtualSlice of
the tenant, bound by the resource manager through the REST API and deleted when it ends."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from proxy_harness import HERE, PYTHON, client_env, connect_snippet, start_proxy, stop_proxy

import pathways_client as pw

TENANT = "team-a"  # the embedded_state fixture's tenant (tests/conftest.py)


def _proxy_slices(cluster: pw.Cluster) -> list[dict]:
    return [
        s
        for s in cluster.api.list("virtualslices")
        if "-proxy-" in s["metadata"]["name"] and "deletionTimestamp" not in s["metadata"]
    ]


def _start_client(script: str, *paths: Path) -> subprocess.Popen[str]:
    """A stock JAX client running ``script`` with ``paths`` as its arguments, once it touched
    the first (its session is open)."""
    run = subprocess.Popen(
        [PYTHON, "-c", script, *map(str, paths)],
        cwd=HERE,
        env=client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not paths[0].exists():
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the client did not start"
        time.sleep(0.05)
    return run


def test_sessions_get_virtual_slices_of_the_tenant(embedded_state: Path, tmp_path: Path) -> None:
    proxy = start_proxy(
        "--state", str(embedded_state), "--tenant", TENANT, "--devices", "2", timeout=120
    )
    ready, go = tmp_path / "ready", tmp_path / "go"
    script = connect_snippet(proxy.address) + (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "import numpy as np\n"
        "ids = [d.id for d in jax.devices()]\n"
        "Path(sys.argv[1]).touch()\n"
        "while not Path(sys.argv[2]).exists():\n"
        "    time.sleep(0.05)\n"
        "y = jax.jit(lambda v: v * 3)(np.arange(4.0, dtype=np.float32))\n"
        "print(json.dumps({'ids': ids, 'y': np.asarray(y).tolist()}))\n"
    )
    run = _start_client(script, ready, go)
    try:
        with pw.connect(state=embedded_state, tenant=TENANT) as cluster:
            # While the session is open its slice is a Bound VirtualSlice of the tenant.
            (held,) = _proxy_slices(cluster)
            assert held["metadata"]["name"].startswith(f"{TENANT}-proxy-")
            assert held["status"]["phase"] == "Bound"
            assert len(held["status"]["devices"]) == 2
            go.touch()
            out, err = run.communicate(timeout=120)
            assert run.returncode == 0, err[-3000:]
            seen = json.loads(out.strip().splitlines()[-1])
            assert seen == {"ids": [0, 1], "y": [0.0, 3.0, 6.0, 9.0]}
            # Released when the session ended.
            deadline = time.monotonic() + 60
            while _proxy_slices(cluster) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _proxy_slices(cluster) == []
    finally:
        if run.poll() is None:
            run.kill()
        stop_proxy(proxy)


def test_a_killed_proxys_session_slices_are_released_when_their_lease_runs_out(
    embedded_state: Path, tmp_path: Path
) -> None:
    """A proxy killed (SIGKILL, OOM) while a session held a slice left it bound for ever."""
    proxy = start_proxy(
        "--state",
        str(embedded_state),
        "--tenant",
        TENANT,
        "--devices",
        "2",
        "--slice-lease",
        "5",
        timeout=120,
    )
    ready = tmp_path / "ready"
    script = connect_snippet(proxy.address) + (
        "import sys, time\n"
        "from pathlib import Path\n"
        "jax.devices()\n"
        "Path(sys.argv[1]).touch()\n"
        "time.sleep(600)\n"
    )
    run = _start_client(script, ready)
    try:
        with pw.connect(state=embedded_state, tenant=TENANT) as cluster:
            (held,) = _proxy_slices(cluster)
            assert held["spec"]["leaseSeconds"] == 5
            proxy.process.kill()
            proxy.process.wait(30)
            deadline = time.monotonic() + 30
            while (
                status := cluster.api.get("virtualslices", held["metadata"]["name"])["status"]
            ).get("phase") != "Released":
                assert time.monotonic() < deadline, f"still {status}"
                time.sleep(0.2)
            assert status["reason"] == "LeaseExpired"
            assert cluster.api.me()["usage"]["devices"] == 0
            cluster.api.delete("virtualslices", held["metadata"]["name"])
    finally:
        run.kill()
        run.wait(30)
        stop_proxy(proxy)
