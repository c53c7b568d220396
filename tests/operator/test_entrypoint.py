"""The operator's real entrypoint, ``kopf run -m pathways_operator``, as a process of its own,
with kopf's liveness probe and our metrics endpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from kube_cluster import NAMESPACE, Cluster, wait_for
from kube_manifests import island

from pathways_client.launcher import free_port


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def test_kopf_run_module(cluster: Cluster, tmp_path: Path) -> None:
    liveness, metrics = free_port(), free_port()
    log = (tmp_path / "operator.log").open("w")
    kopf = Path(sys.executable).with_name("kopf")
    process = subprocess.Popen(
        [
            str(kopf),
            "run",
            "-m",
            "pathways_operator",
            "--all-namespaces",
            "--standalone",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
        ],
        env={
            **os.environ,
            "KUBECONFIG": os.environ["KUBECONFIG"],
            "PATHWAYS_METRICS_PORT": str(metrics),
            "PATHWAYS_NAMESPACE": NAMESPACE,
        },
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        cluster.create(island("proc", topology="2x2", hosts=1))
        wait_for(lambda: cluster.get("StatefulSet", "proc-executor", NAMESPACE), timeout=60)
        wait_for(lambda: fetch(f"http://127.0.0.1:{liveness}/healthz"), timeout=30)
        scraped = wait_for(
            lambda: (
                'pathways_island_devices_total{island="proc"} 4.0'
                in (t := fetch(f"http://127.0.0.1:{metrics}/metrics"))
                and t
            ),
            timeout=30,
        )
        assert "pathways_time_to_bind_seconds" in scraped
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
    assert code == 0, (tmp_path / "operator.log").read_text()[-3000:]


def test_a_malformed_setting_stops_the_operator_saying_which(
    cluster: Cluster, tmp_path: Path
) -> None:
    kopf = Path(sys.executable).with_name("kopf")
    run = subprocess.run(
        [str(kopf), "run", "-m", "pathways_operator", "--all-namespaces", "--standalone"],
        env={
            **os.environ,
            "PATHWAYS_METRICS_PORT": "0",
            "PATHWAYS_TENANTS": '{"vision": {"maxPriority": "high"}}',
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Not retried every minute while the pod looks alive: it stops, naming the setting.
    assert run.returncode != 0
    assert "PATHWAYS_TENANTS" in run.stdout + run.stderr
    assert "vision.maxPriority" in run.stdout + run.stderr
