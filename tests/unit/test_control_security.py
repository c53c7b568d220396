"""Pods the control plane creates are locked down, per accelerator kind and program kind, and
mount the TLS Secret only when TLS is on (pure builders, checked with Kubernetes' schemas)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from pathways_core.control import island_children, parse, program_job
from pathways_core.control.programs import ProgramView
from pathways_core.control.security import TLS_MOUNT
from pathways_core.resources import Island, PathwaysProgram

IMAGE = "ghcr.io/pathways-k8s/pathways:test"
KINDS = [
    ("cpu-fake", "2x4", 2),
    ("tpu-v5e", "2x4", 1),
    ("tpu-v5p", "2x2x2", 2),
    ("gpu-h100", "8", 1),
]
SECRET = "pw-pathways-tls"


def island_pods(kind: str, topology: str, hosts: int, tls: str | None = None) -> list[Any]:
    """(workload, pod spec) of the island's scheduler Deployment and executor StatefulSet."""
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": {"name": "isl", "uid": "u-1"},
        "spec": {"acceleratorKind": kind, "topology": topology, "hosts": hosts},
    }
    island, problem = parse(document)
    assert isinstance(island, Island), problem
    children = island_children(document, island, "pathways-system", tls_secret=tls)
    return [c for c in children if c["kind"] in ("Deployment", "StatefulSet")]


def program_document(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "p", "namespace": "team", "uid": "u-p"},
        "spec": {"slices": [{"name": "main", "devices": 2}], **spec},
    }


PROGRAMS = {
    "inline-source": {"driver": {"source": "print(1)", "args": ["--x"]}},
    "own-image-command": {"driver": {"image": "me/driver:1", "command": ["/bin/run"]}},
    "own-image-source": {"driver": {"image": "me/driver:1", "source": "print(2)"}},
    "graph": {
        "graph": {
            "functions": [{"name": "f", "uri": "file:///f.bin"}],
            "nodes": [{"name": "n", "function": "f", "slice": "main"}],
        }
    },
}


def program_job_of(name: str, tls: str | None = None) -> dict[str, Any]:
    document = program_document(**PROGRAMS[name])
    program, problem = parse(document)
    assert isinstance(program, PathwaysProgram), problem
    return program_job(document, program, ProgramView(document), 1, IMAGE, tls_secret=tls)


def workloads(tls: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    found = [
        (f"{kind}/{w['kind']}", w)
        for kind, topology, hosts in KINDS
        for w in island_pods(kind, topology, hosts, tls)
    ]
    return found + [(f"program/{name}", program_job_of(name, tls)) for name in PROGRAMS]


def assert_locked_down(where: str, pod: dict[str, Any]) -> None:
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True, where
    assert (security["runAsUser"], security["runAsGroup"]) == (65532, 65532), where
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}, where
    assert pod["automountServiceAccountToken"] is False, where
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, where
        assert context["allowPrivilegeEscalation"] is False, where
        assert context["capabilities"] == {"drop": ["ALL"]}, where
        assert "privileged" not in context, where
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        for path in ("/tmp", "/var/cache/pathways"):
            assert "emptyDir" in volumes[mounts[path]], (where, path)


@pytest.mark.parametrize(
    ("where", "workload"), workloads(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_pod_is_locked_down_and_valid(where: str, workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert_locked_down(where, pod)
    # No TLS unless asked for.
    assert all(v["name"] != "pathways-tls" for v in pod["volumes"]), where
    names = {e["name"] for c in pod["containers"] for e in c.get("env", [])}
    assert not names & {"PATHWAYS_TLS_CERT", "PATHWAYS_TLS_KEY", "PATHWAYS_TLS_CA"}, where
    # Raises naming the field at fault when a builder writes something Kubernetes rejects.
    kubernetes_validate.validate(workload, "1.30", strict=True)


@pytest.mark.parametrize(("kind", "topology", "hosts"), KINDS)
def test_island_pods_keep_the_tini_entrypoint(kind: str, topology: str, hosts: int) -> None:
    for workload in island_pods(kind, topology, hosts):
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert "command" not in container, (kind, workload["kind"])
    scheduler, executors = island_pods(kind, topology, hosts)
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["args"][:3] == [
        "python",
        "-m",
        "pathways_scheduler",
    ]
    script = executors["spec"]["template"]["spec"]["containers"][0]["args"][-1]
    # Executors compile into the writable cache volume, not under the read-only $HOME.
    assert "--compilation-cache /var/cache/pathways/jax" in script


def test_programs_keep_the_tini_entrypoint_in_the_pathways_image_only() -> None:
    inline = program_job_of("inline-source")["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in inline and inline["args"] == ["python", "-c", "print(1)", "--x"]
    own = program_job_of("own-image-command")["spec"]["template"]["spec"]["containers"][0]
    assert own["command"] == ["/bin/run"] and own["image"] == "me/driver:1"
    other = program_job_of("own-image-source")["spec"]["template"]["spec"]["containers"][0]
    assert other["command"] == ["python", "-c", "print(2)"]


@pytest.mark.parametrize(
    ("where", "workload"), workloads(SECRET), ids=lambda v: v if isinstance(v, str) else ""
)
def test_tls_secret_is_mounted_read_only_with_its_paths(
    where: str, workload: dict[str, Any]
) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert_locked_down(where, pod)
    volume = next(v for v in pod["volumes"] if v["name"] == "pathways-tls")
    assert volume["secret"]["secretName"] == SECRET
    assert volume["secret"]["defaultMode"] == 0o440
    for container in pod["containers"]:
        mount = next(m for m in container["volumeMounts"] if m["name"] == "pathways-tls")
        assert mount == {"name": "pathways-tls", "mountPath": TLS_MOUNT, "readOnly": True}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PATHWAYS_TLS_CERT"] == f"{TLS_MOUNT}/tls.crt"
        assert env["PATHWAYS_TLS_KEY"] == f"{TLS_MOUNT}/tls.key"
        assert env["PATHWAYS_TLS_CA"] == f"{TLS_MOUNT}/ca.crt"
    kubernetes_validate.validate(workload, "1.30", strict=True)


def test_program_pods_carry_the_labels_network_policies_select() -> None:
    labels = program_job_of("inline-source")["spec"]["template"]["metadata"]["labels"]
    assert labels["pathways.dev/component"] == "program"
    assert labels["pathways.dev/program"] == "p"
    for workload in island_pods("cpu-fake", "2x4", 2):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert labels["pathways.dev/island"] == "isl"
        assert labels["pathways.dev/component"] in ("scheduler", "executor")
