"""Stand-ins for what the emulator cannot run: kubelet and the Job controller.

``JobRunner`` watches Jobs in the emulated cluster and runs each one's container as a local
subprocess with the Job's environment (``python`` is this interpreter), then writes the Job's
status as the Job controller would: ``succeeded: 1`` and a Complete condition, or ``failed: 1``
and a Failed condition with the exit code. A Job deleted while it runs has its process killed.
``mark_ready`` sets the readiness of an island's Deployment and StatefulSet as kubelet and the
workload controllers would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kube_cluster import Cluster

from pathways_core.control.common import now_utc, timestamp


class JobRunner:
    """Runs the cluster's Jobs until stopped; ``outputs`` holds each Job's combined output."""

    def __init__(self, cluster: Cluster, workdir: Path, run: bool = True) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.run = run
        self.outputs: dict[str, str] = {}
        self.environments: dict[str, dict[str, str]] = {}
        self.started: list[str] = []
        self._processes: dict[str, subprocess.Popen[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="job-runner", daemon=True)

    def __enter__(self) -> JobRunner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for process in self._processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def _loop(self) -> None:
        while not self._stop.is_set():
            jobs = {
                f"{job['metadata']['namespace']}/{job['metadata']['name']}": job
                for job in self.cluster.list("Job")
            }
            for key, job in jobs.items():
                if key not in self.started and not (job.get("status") or {}).get("conditions"):
                    self.started.append(key)
                    if self.run:
                        self._start(key, job)
            for key, process in list(self._processes.items()):
                if key not in jobs and process.poll() is None:
                    process.kill()  # the Job was deleted: its pod goes
                    process.wait()
                    del self._processes[key]
                elif process.poll() is not None:
                    self._finish(key, process)
                    del self._processes[key]
            time.sleep(0.1)

    def _start(self, key: str, job: dict[str, Any]) -> None:
        container = job["spec"]["template"]["spec"]["containers"][0]
        command = [*container.get("command", []), *container.get("args", [])]
        if command and command[0] == "python":
            command[0] = sys.executable
        environment = {item["name"]: item.get("value", "") for item in container.get("env", [])}
        self.environments[key] = environment
        log = self.workdir / f"{key.replace('/', '_')}.log"
        with log.open("w") as output:
            self._processes[key] = subprocess.Popen(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "JAX_PLATFORMS": "cpu", **environment},
            )

    def _finish(self, key: str, process: subprocess.Popen[str]) -> None:
        namespace, name = key.split("/")
        self.outputs[key] = (self.workdir / f"{namespace}_{name}.log").read_text()
        # As the Job controller stamps its conditions.
        moment = timestamp(now_utc())
        if process.returncode == 0:
            status = {
                "succeeded": 1,
                "conditions": [
                    {"type": "Complete", "status": "True", "lastTransitionTime": moment}
                ],
            }
        else:
            status = {
                "failed": 1,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": f"the driver exited with code {process.returncode}",
                        "lastTransitionTime": moment,
                    }
                ],
            }
        if self.cluster.get("Job", name, namespace) is not None:
            self.cluster.patch("Job", name, {"status": status}, namespace)


def mark_ready(
    cluster: Cluster, island: str, namespace: str, scheduler: int, executors: int
) -> None:
    """Set the ready replicas of an island's scheduler Deployment and executor StatefulSet."""
    cluster.patch(
        "Deployment", f"{island}-scheduler", {"status": {"readyReplicas": scheduler}}, namespace
    )
    cluster.patch(
        "StatefulSet", f"{island}-executor", {"status": {"readyReplicas": executors}}, namespace
    )


def set_executor_pods(
    cluster: Cluster, island: str, namespace: str, hosts: int, ready: set[int]
) -> None:
    """Create or update the executor pods of an island as the StatefulSet controller and
    kubelet would: one per host, labelled with its ordinal, Ready or not."""
    for index in range(hosts):
        name = f"{island}-executor-{index}"
        status = {
            "conditions": [{"type": "Ready", "status": "True" if index in ready else "False"}]
        }
        if cluster.get("Pod", name, namespace) is None:
            cluster.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {
                            "pathways.dev/island": island,
                            "pathways.dev/component": "executor",
                            "apps.kubernetes.io/pod-index": str(index),
                        },
                    },
                    "status": status,
                }
            )
        else:
            cluster.patch("Pod", name, {"status": status}, namespace)
    cluster.patch(
        "StatefulSet", f"{island}-executor", {"status": {"readyReplicas": len(ready)}}, namespace
    )
