"""Pods the control plane creates are locked down, per accelerator kind and program kind, mount
the TLS Secret only when TLS is on, and read the island's control token from its own Secret only
when control tokens are on (pure builders, checked with Kubernetes' schemas)."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from pathways_core.control import island_children, parse, program_job
from pathways_core.control.islands import control_secret_name, control_token_secret
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


def island_document(kind: str, topology: str, hosts: int, uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": {"name": "isl", "uid": uid},
        "spec": {"acceleratorKind": kind, "topology": topology, "hosts": hosts},
    }


def island_pods(
    kind: str, topology: str, hosts: int, tls: str | None = None, control: str | None = None
) -> list[Any]:
    """The island's scheduler Deployment and executor StatefulSet."""
    document = island_document(kind, topology, hosts)
    island, problem = parse(document)
    assert isinstance(island, Island), problem
    children = island_children(
        document, island, "pathways-system", tls_secret=tls, control_secret=control
    )
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


def test_pull_secrets_reach_every_pod_the_operator_makes() -> None:
    """The chart's imagePullSecrets reached its own pods only: island and program pods of a
    private registry's image never pulled it."""
    document = island_document("cpu-fake", "2x2", 1)
    island, problem = parse(document)
    assert isinstance(island, Island), problem
    pods = [
        child["spec"]["template"]["spec"]
        for child in island_children(document, island, "ns", pull_secrets=("regcred", "other"))
        if child["kind"] in ("Deployment", "StatefulSet")
    ]
    program = program_document(**PROGRAMS["inline-source"])
    parsed, problem = parse(program)
    assert isinstance(parsed, PathwaysProgram), problem
    job = program_job(program, parsed, ProgramView(program), 1, IMAGE, pull_secrets=("regcred",))
    pods.append(job["spec"]["template"]["spec"])
    assert [pod["imagePullSecrets"][0] for pod in pods] == [{"name": "regcred"}] * 3
    assert pods[0]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    for _, workload in workloads():
        assert "imagePullSecrets" not in workload["spec"]["template"]["spec"]


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
    # No control token unless asked for (the executor then takes an empty one: dev clusters).
    assert "PATHWAYS_CONTROL_TOKEN" not in names, where
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


# --- control tokens ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "topology", "hosts"), KINDS)
def test_island_pods_read_the_control_token_from_the_islands_secret(
    kind: str, topology: str, hosts: int
) -> None:
    """The scheduler (it sends the token) and every executor (they check it) read the same key
    of the same Secret, never a literal; TLS and the token combine."""
    expected = {
        "name": "PATHWAYS_CONTROL_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "isl-control-u1", "key": "token"}},
    }
    workloads = island_pods(kind, topology, hosts, tls=SECRET, control="isl-control-u1")
    assert [w["kind"] for w in workloads] == ["Deployment", "StatefulSet"]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert_locked_down(kind, pod)
        for container in pod["containers"]:
            tokens = [e for e in container["env"] if e["name"] == "PATHWAYS_CONTROL_TOKEN"]
            assert tokens == [expected], (kind, workload["kind"])
            names = {e["name"] for e in container["env"]}
            assert {"PATHWAYS_TLS_CERT", "PATHWAYS_TLS_KEY", "PATHWAYS_TLS_CA"} <= names
        kubernetes_validate.validate(workload, "1.30", strict=True)
    # Programs never get the token: they are clients of the scheduler, not its executors.
    job = program_job_of("inline-source", SECRET)["spec"]["template"]["spec"]
    assert all(e["name"] != "PATHWAYS_CONTROL_TOKEN" for e in job["containers"][0]["env"])


def test_the_control_secret_is_the_islands_own_immutable_and_owned() -> None:
    document = island_document("cpu-fake", "2x4", 2, uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    secret = control_token_secret(document, "pathways-system", "s3cr3t")
    kubernetes_validate.validate(secret, "1.30", strict=True)
    assert secret["metadata"]["name"] == control_secret_name(document) == "isl-control-0f1e2d3c"
    assert secret["metadata"]["namespace"] == "pathways-system"
    assert secret["metadata"]["labels"]["pathways.dev/island"] == "isl"
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Island",
        "isl",
        document["metadata"]["uid"],
    )
    assert owner["controller"] is True  # garbage-collected with the island
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert base64.b64decode(secret["data"]["token"]) == b"s3cr3t"
    # No content hash: the operator only creates it, it never compares or patches it.
    assert "annotations" not in secret["metadata"]


def test_a_recreated_island_gets_a_new_control_secret_and_new_pods() -> None:
    """The Island's uid is in the Secret's name: an island deleted and created again never
    picks up its predecessor's Secret (on its way to garbage collection), and its pods, which
    name the new Secret, roll."""
    old = island_document("cpu-fake", "2x4", 2, uid="aaaaaaaa-0000-0000-0000-000000000000")
    new = island_document("cpu-fake", "2x4", 2, uid="bbbbbbbb-0000-0000-0000-000000000000")
    assert control_secret_name(old) != control_secret_name(new)
    hashes = []
    for document in (old, new):
        island, _ = parse(document)
        assert isinstance(island, Island)
        children = island_children(
            document, island, "ns", control_secret=control_secret_name(document)
        )
        hashes.append([c["metadata"]["annotations"]["pathways.dev/spec-hash"] for c in children])
    assert hashes[0][0] != hashes[1][0] and hashes[0][2] != hashes[1][2]  # Deployment, StatefulSet


def test_an_empty_control_token_is_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="token: an island's control token must not be empty"):
        control_token_secret(island_document("cpu-fake", "2x4", 2), "ns", "")
