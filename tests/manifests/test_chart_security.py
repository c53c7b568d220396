"""The chart's security parts against the pods the operator really creates: NetworkPolicies
evaluated on pods built by the pure builders of pathways_core.control, TLS wiring and DNS
names, and secrets that never reach values, ConfigMaps or env."""

from __future__ import annotations

import base64
import fnmatch
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, VALUES_FILES, Run, render

from pathways_core.control import island_children, parse, program_job
from pathways_core.control.islands import (
    EXECUTOR_PORT,
    HEALTH_PORT,
    SCHEDULER_PORT,
    SESSION_PORT,
    control_secret_name,
    control_token_secret,
    executor_host,
)
from pathways_core.control.programs import ProgramView
from pathways_core.resources import Island, PathwaysProgram
from pathways_core.wire.credentials import MASTER_KEY_ENV, SESSION_KEY_ENV, island_key
from pathways_operator.config import Config

NAMESPACE = "pathways-system"
TLS_ON = (
    "tls.enabled=true",
    "tls.certManager.issuerRef.name=pathways-ca",
    "tls.certManager.issuerRef.kind=ClusterIssuer",
)

# --- pods -------------------------------------------------------------------------------------


def pod(name: str, namespace: str, template: dict[str, Any]) -> dict[str, Any]:
    """A pod as NetworkPolicies see it: namespace, labels and named container ports."""
    ports = {
        port["name"]: port["containerPort"]
        for container in template["spec"]["containers"]
        for port in container.get("ports", [])
        if "name" in port
    }
    return {
        "name": name,
        "namespace": namespace,
        "labels": template["metadata"]["labels"],
        "ports": ports,
    }


def operator_pods(run) -> dict[str, dict[str, Any]]:
    """Every island's scheduler and executor pods, and a driver pod in namespace "team", as the
    operator's pure builders make them for the Islands the chart renders."""
    pods: dict[str, dict[str, Any]] = {}
    for document in run.of_kind("Island"):
        document = {**document, "metadata": {**document["metadata"], "uid": "u"}}
        island, problem = parse(document)
        assert isinstance(island, Island), problem
        name = document["metadata"]["name"]
        for child in island_children(document, island, NAMESPACE):
            if child["kind"] in ("Deployment", "StatefulSet"):
                component = child["spec"]["template"]["metadata"]["labels"][
                    "pathways.dev/component"
                ]
                pods[f"{name}/{component}"] = pod(name, NAMESPACE, child["spec"]["template"])
    program_document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "p", "namespace": "team", "uid": "u"},
        "spec": {"slices": [{"name": "main", "devices": 2}], "driver": {"source": "pass"}},
    }
    program, problem = parse(program_document)
    assert isinstance(program, PathwaysProgram), problem
    job = program_job(program_document, program, ProgramView(program_document), 1, "img")
    pods["program"] = pod("p-run-1", "team", job["spec"]["template"])
    return pods


def chart_pods(run) -> dict[str, dict[str, Any]]:
    return {
        deployment["metadata"]["name"].rsplit("-", 1)[-1]: pod(
            deployment["metadata"]["name"], NAMESPACE, deployment["spec"]["template"]
        )
        for deployment in run.of_kind("Deployment")
    }


STRANGER = {"name": "x", "namespace": "default", "labels": {"app": "x"}, "ports": {}}

# --- NetworkPolicy semantics ------------------------------------------------------------------


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector against labels (None: matches nothing)."""
    if selector is None:
        return False
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def peer_matches(peer: dict[str, Any], policy_namespace: str, other: dict[str, Any]) -> bool:
    if "ipBlock" in peer:
        return False  # pods are not addressed by the link-local blocks the chart allows
    namespace_labels = {"kubernetes.io/metadata.name": other["namespace"]}
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"] or {}, namespace_labels):
            return False
    elif other["namespace"] != policy_namespace:
        return False
    return selects(peer.get("podSelector") or {}, other["labels"])


def port_matches(rule: dict[str, Any], target: dict[str, Any], port: int) -> bool:
    if not rule.get("ports"):
        return True
    for item in rule["ports"]:
        wanted = item.get("port")
        if wanted is None or wanted == port or target["ports"].get(wanted) == port:
            return True
    return False


def allowed(
    policies: list[dict[str, Any]], source: dict[str, Any], target: dict[str, Any], port: int
) -> bool:
    """Whether a connection from ``source`` to ``target:port`` passes the policies: the target's
    ingress policies (if any select it) and the source's egress policies (if any)."""

    def side(
        pod_: dict[str, Any], kind: str, other: dict[str, Any], rules_key: str, peers_key: str
    ) -> bool:
        selecting = [
            p
            for p in policies
            if p["metadata"]["namespace"] == pod_["namespace"]
            and kind in p["spec"]["policyTypes"]
            and selects(p["spec"]["podSelector"], pod_["labels"])
        ]
        if not selecting:
            return True
        return any(
            (
                not rule.get(peers_key)
                or any(
                    peer_matches(peer, p["metadata"]["namespace"], other)
                    for peer in rule[peers_key]
                )
            )
            and port_matches(rule, target, port)
            for p in selecting
            for rule in p["spec"].get(rules_key) or []
        )

    return side(target, "Ingress", source, "ingress", "from") and side(
        source, "Egress", target, "egress", "to"
    )


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_network_policies_render_and_validate(rendered, values_file: str) -> None:
    run = rendered(values_file)
    policies = run.of_kind("NetworkPolicy")
    names = {p["metadata"]["name"] for p in policies}
    assert {"pw-pathways-schedulers", "pw-pathways-executors", "pw-pathways-api"} <= names
    for island in run.of_kind("Island"):
        assert f"pw-pathways-executors-{island['metadata']['name']}" in names
    for policy in policies:
        for version in ("1.37", "1.30"):
            kubernetes_validate.validate(policy, version, strict=True)
    assert not rendered(values_file, "networkPolicy.enabled=false").of_kind("NetworkPolicy")


@pytest.mark.parametrize("values_file", ["values-kind.yaml", "values-gke-tpu.yaml"])
def test_network_policies_select_the_pods_the_operator_creates(rendered, values_file: str) -> None:
    run = rendered(values_file, "networkPolicy.crossIslandTransfers=false")
    policies = run.of_kind("NetworkPolicy")
    pods = operator_pods(run)
    chart = chart_pods(run)
    api, operator, program = chart["api"], chart["operator"], pods["program"]
    islands = [i["metadata"]["name"] for i in run.of_kind("Island")]
    assert len(islands) == 2
    for island in islands:
        scheduler, executor = pods[f"{island}/scheduler"], pods[f"{island}/executor"]
        other = next(i for i in islands if i != island)
        # Schedulers: from programs (any namespace), the API and the operator only.
        for caller in (program, api, operator):
            for port in (SCHEDULER_PORT, SESSION_PORT):  # gRPC, and the session stream
                assert allowed(policies, caller, scheduler, port), (island, caller["name"], port)
        for caller in (STRANGER, executor, pods[f"{other}/executor"]):
            for port in (SCHEDULER_PORT, SESSION_PORT):
                assert not allowed(policies, caller, scheduler, port), (island, caller, port)
        # Executors: gRPC and the data plane (any port) from their island and programs only.
        for port in (EXECUTOR_PORT, 8476, 41234):
            for caller in (scheduler, executor, program):
                assert allowed(policies, caller, executor, port), (island, caller["name"], port)
        for caller in (
            STRANGER,
            api,
            operator,
            pods[f"{other}/scheduler"],
            pods[f"{other}/executor"],
        ):
            assert not allowed(policies, caller, executor, EXECUTOR_PORT), (island, caller)
        # Island pods send DNS and island traffic, nothing else of the cluster.
        dns = {
            "name": "dns",
            "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns"},
            "ports": {},
        }
        assert allowed(policies, executor, dns, 53)
        assert not allowed(policies, executor, api, 8080)
        # Liveness and Prometheus metrics: the health port, from anywhere.
        for target in (scheduler, executor):
            assert allowed(policies, STRANGER, target, HEALTH_PORT), (island, target["name"])
    # The API from anywhere, on its port.
    assert allowed(policies, STRANGER, api, 8080)
    assert not allowed(policies, STRANGER, api, 9999)


def test_cross_island_transfers_are_allowed_by_default(rendered) -> None:
    """Executors pull arrays from the producing island's executors (programs over DCN)."""
    run = rendered("values-kind.yaml")
    pods = operator_pods(run)
    policies = run.of_kind("NetworkPolicy")
    assert allowed(policies, pods["fake-b/executor"], pods["fake-a/executor"], 41234)
    assert not allowed(policies, pods["fake-b/scheduler"], pods["fake-a/executor"], EXECUTOR_PORT)


def test_executors_of_islands_created_elsewhere_are_still_confined(rendered) -> None:
    """Islands not in the values (kubectl apply) fall under the shared executors policy."""
    run = rendered("values.yaml")
    policies = run.of_kind("NetworkPolicy")
    document = {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "Island",
        "metadata": {"name": "adhoc", "uid": "u"},
        "spec": {"acceleratorKind": "cpu-fake", "topology": "4", "hosts": 1},
    }
    island, _ = parse(document)
    assert isinstance(island, Island)
    children = {c["kind"]: c for c in island_children(document, island, NAMESPACE)}
    executor = pod("e", NAMESPACE, children["StatefulSet"]["spec"]["template"])
    scheduler = pod("s", NAMESPACE, children["Deployment"]["spec"]["template"])
    assert allowed(policies, scheduler, executor, EXECUTOR_PORT)
    assert not allowed(policies, STRANGER, executor, EXECUTOR_PORT)


PROXY_ON = ("proxy.enabled=true", "proxy.tokenSecret.name=proxy-token")
NOTEBOOK = {
    "name": "nb",
    "namespace": "notebooks",
    "labels": {"app": "notebook"},
    "ports": {},
}


def test_the_proxy_reaches_the_islands_and_only_admitted_clients_reach_it(rendered) -> None:
    run = rendered(
        "values-kind.yaml",
        *PROXY_ON,
        "networkPolicy.crossIslandTransfers=false",
        "proxy.allowedClients[0].podSelector.matchLabels.app=notebook",
        r"proxy.allowedClients[0].namespaceSelector.matchLabels.kubernetes\.io/metadata\.name"
        "=notebooks",
    )
    policies = run.of_kind("NetworkPolicy")
    for policy in policies:
        kubernetes_validate.validate(policy, "1.30", strict=True)
    pods = operator_pods(run)
    chart = chart_pods(run)
    proxy, api, program = chart["proxy"], chart["api"], pods["program"]
    port = proxy["ports"]["grpc"]
    # The proxy is a client of every island: scheduler sessions, executor transfers, the API.
    for island in ("fake-a", "fake-b"):
        for scheduler_port in (SCHEDULER_PORT, SESSION_PORT):
            scheduler = pods[f"{island}/scheduler"]
            assert allowed(policies, proxy, scheduler, scheduler_port), (island, scheduler_port)
        for executor_port in (EXECUTOR_PORT, 41234):
            assert allowed(policies, proxy, pods[f"{island}/executor"], executor_port), island
    assert allowed(policies, proxy, api, 8080)
    dns = {"name": "dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
    assert allowed(policies, proxy, {**dns, "ports": {}}, 53)
    # ... and sends nothing else.
    assert not allowed(policies, proxy, STRANGER, 443)
    assert not allowed(policies, proxy, chart["operator"], 9090)
    # Its clients: program pods and proxy.allowedClients, on its port only.
    assert allowed(policies, program, proxy, port)
    assert allowed(policies, NOTEBOOK, proxy, port)
    assert not allowed(policies, NOTEBOOK, proxy, 9999)
    for stranger in (STRANGER, {**NOTEBOOK, "namespace": "other"}, api):
        assert not allowed(policies, stranger, proxy, port), stranger["name"]
    # Without the proxy, pods carrying its labels are not admitted by the islands.
    off = rendered("values-kind.yaml", "networkPolicy.crossIslandTransfers=false")
    off_pods = operator_pods(off)
    off_policies = off.of_kind("NetworkPolicy")
    assert not allowed(off_policies, proxy, off_pods["fake-a/scheduler"], SCHEDULER_PORT)
    assert not allowed(off_policies, proxy, off_pods["fake-a/executor"], EXECUTOR_PORT)


def test_the_proxy_token_is_never_a_literal(rendered) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    run = rendered("values.yaml", *PROXY_ON, *TLS_ON)
    assert leaks(run.documents, secret_like_values(values)) == []
    # The check would catch a token given to the proxy through values.
    token = "pr0xy-t0ken-0123456789abcdefgh"
    leaked = rendered(
        "values.yaml", *PROXY_ON, "proxy.env[0].name=PATHWAYS_TOKEN", f"proxy.env[0].value={token}"
    )
    assert leaks(leaked.documents, {token}) == ["Deployment/pw-pathways-proxy env PATHWAYS_TOKEN"]


def matches_dns(name: str, patterns: list[str]) -> bool:
    """A certificate name matches: a wildcard covers exactly one label."""
    return any(
        fnmatch.fnmatchcase(name, p) and (not p.startswith("*.") or name.count(".") == p.count("."))
        for p in patterns
    )


def test_tls_with_cert_manager_covers_every_server_and_is_mounted(rendered) -> None:
    run = rendered("values-gke-tpu.yaml", *TLS_ON)
    certificate = run.one("Certificate")
    assert certificate["apiVersion"] == "cert-manager.io/v1"
    spec = certificate["spec"]
    assert spec["issuerRef"] == {
        "name": "pathways-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert set(spec["usages"]) == {"server auth", "client auth"}
    names = spec["dnsNames"]
    assert matches_dns(f"pw-pathways-api.{NAMESPACE}.svc", names)
    for island in run.of_kind("Island"):
        name = island["metadata"]["name"]
        assert matches_dns(f"{name}-scheduler.{NAMESPACE}.svc", names)
        for index in range(island["spec"].get("hosts", 1)):
            assert matches_dns(executor_host(name, NAMESPACE, index), names)
    assert not matches_dns(f"x.y.{NAMESPACE}.svc", names)  # wildcards cover one label only
    # The operator learns the Secret's name; the API mounts it and serves HTTPS.
    operator = run.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["PATHWAYS_TLS_SECRET"] == spec["secretName"] == "pw-pathways-tls"
    api_pod = run.one("Deployment", "-api")["spec"]["template"]["spec"]
    api = api_pod["containers"][0]
    env = {e["name"]: e.get("value") for e in api["env"]}
    assert env["PATHWAYS_TLS_CERT"] == "/var/run/pathways/tls/tls.crt"
    assert env["PATHWAYS_TLS_KEY"] == "/var/run/pathways/tls/tls.key"
    assert env["PATHWAYS_TLS_CA"] == "/var/run/pathways/tls/ca.crt"
    assert {"name": "pathways-tls", "mountPath": "/var/run/pathways/tls", "readOnly": True} in api[
        "volumeMounts"
    ]
    volume = next(v for v in api_pod["volumes"] if v["name"] == "pathways-tls")
    assert volume["secret"]["secretName"] == "pw-pathways-tls"
    assert api["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    for document in run.documents:
        if document["kind"] not in (
            "Island",
            "ClusterKopfPeering",
            "ServiceMonitor",
            "Certificate",
        ):
            kubernetes_validate.validate(document, "1.30", strict=True)


def test_image_pull_secrets_reach_the_operator_for_its_pods(rendered) -> None:
    run = rendered("values.yaml", "imagePullSecrets[0].name=regcred", "imagePullSecrets[1].name=b")
    operator = run.one("Deployment", "-operator")["spec"]["template"]["spec"]
    assert operator["imagePullSecrets"] == [{"name": "regcred"}, {"name": "b"}]
    env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert env["PATHWAYS_IMAGE_PULL_SECRETS"] == "regcred,b"
    off = rendered("values.yaml").one("Deployment", "-operator")["spec"]["template"]["spec"]
    assert "PATHWAYS_IMAGE_PULL_SECRETS" not in {e["name"] for e in off["containers"][0]["env"]}


def test_tls_from_an_existing_secret_renders_no_certificate(rendered, helm) -> None:
    run = rendered("values.yaml", "tls.enabled=true", "tls.secretName=my-tls")
    assert not run.of_kind("Certificate")
    operator = run.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in operator["env"]}["PATHWAYS_TLS_SECRET"] == "my-tls"
    off = rendered("values.yaml")
    operator = off.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert "PATHWAYS_TLS_SECRET" not in {e["name"] for e in operator["env"]}
    failed = helm("template", "pw", str(CHART), "--set", "tls.enabled=true")
    assert failed.returncode != 0
    assert "tls.enabled: set tls.secretName" in failed.stderr


# --- secrets ----------------------------------------------------------------------------------

SECRET_NAME = re.compile(r"token|password|secret|credential|apikey|api_key", re.IGNORECASE)
TOKEN_LIKE = re.compile(r"^[A-Za-z0-9_\-+/=]{24,}$")


def secret_like_values(node: Any, path: str = "") -> set[str]:
    """String values of a values file that are secrets or look like one: under a key that
    names a secret, or long opaque strings."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            found |= secret_like_values(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found |= secret_like_values(value, f"{path}[{index}]")
    elif isinstance(node, str) and node:
        named = SECRET_NAME.search(path) and not path.endswith((".name", ".key"))
        if TOKEN_LIKE.match(node) or named:
            found.add(node)
    return found


def leaks(documents: list[dict[str, Any]], secrets: set[str]) -> list[str]:
    """Places where a secret could be read without access to Secrets: ConfigMap data, literal
    env values (a secret-named variable must come from a Secret or name a mounted file)."""
    found = []
    for document in documents:
        where = f"{document['kind']}/{document['metadata']['name']}"
        if document["kind"] == "ConfigMap":
            for key, value in (document.get("data") or {}).items():
                found += [f"{where} data.{key}" for secret in secrets if secret in str(value)]
        template = (document.get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers", []):
            for variable in container.get("env", []):
                value = variable.get("value")
                if value is None:
                    continue
                if any(secret in value for secret in secrets) or TOKEN_LIKE.match(value):
                    found.append(f"{where} env {variable['name']}")
                elif (
                    re.search(r"TOKEN|PASSWORD|KEY", variable["name"])
                    and not value.startswith("/")
                    # A switch (PATHWAYS_CONTROL_TOKENS: "true") holds no secret.
                    and value not in ("true", "false")
                ):
                    found.append(f"{where} env {variable['name']} is a literal, not a file")
    return found


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_no_secret_reaches_config_maps_or_env(rendered, values_file: str) -> None:
    values = yaml.safe_load((CHART / values_file).read_text())
    secrets = secret_like_values(values) | secret_like_values(
        yaml.safe_load((CHART / "values.yaml").read_text())
    )
    run = rendered(values_file, *TLS_ON)
    assert leaks(run.documents, secrets) == []
    # The API checks service-account tokens with TokenReview: no tokens file (the chart's
    # api.tokensSecret was read by no mode it runs), and no token of its own in env.
    api_pod = run.one("Deployment", "-api")["spec"]["template"]["spec"]
    assert "--tokens" not in api_pod["containers"][0]["args"]
    assert all(v["name"] != "tokens" for v in api_pod["volumes"])
    # The operator's own children: env paths only, even with TLS on.
    documents = [*run.documents]
    for island in run.of_kind("Island"):
        island = {**island, "metadata": {**island["metadata"], "uid": "u"}}
        parsed, _ = parse(island)
        assert isinstance(parsed, Island)
        documents += island_children(
            island,
            parsed,
            NAMESPACE,
            tls_secret="pw-pathways-tls",
            control_secret=control_secret_name(island),
        )
    assert leaks(documents, secrets) == []


def test_the_leak_check_catches_a_token_in_env(rendered) -> None:
    """The check above can fail: a token put in the API's env through values is reported."""
    token = "s3cr3t-t0ken-0123456789abcdef"
    run = rendered("values.yaml", "api.env[0].name=API_TOKEN", f"api.env[0].value={token}")
    values = {"api": {"env": [{"name": "API_TOKEN", "value": token}]}}
    assert token in secret_like_values(values)
    assert leaks(run.documents, {token}) == ["Deployment/pw-pathways-api env API_TOKEN"]


# --- control tokens ---------------------------------------------------------------------------


def operator_env(run: Run) -> dict[str, str | None]:
    container = run.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_control_tokens_are_on_by_default_with_create_only_rbac(
    rendered, values_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every values file turns the islands' control tokens on: the operator reads the flag the
    chart sets, and may create Secrets (only that) in the islands' namespace."""
    run = rendered(values_file)
    env = operator_env(run)
    monkeypatch.setenv("PATHWAYS_CONTROL_TOKENS", env["PATHWAYS_CONTROL_TOKENS"] or "")
    assert Config.from_environment().control_tokens is True
    (role,) = run.installed("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    (binding,) = run.installed("RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    account = run.one("ServiceAccount", "-operator")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    for document in (role, binding):
        kubernetes_validate.validate(document, "1.30", strict=True)
    # The island pods the operator then builds read the token from their island's Secret.
    for island in run.of_kind("Island"):
        island = {**island, "metadata": {**island["metadata"], "uid": "0123abcd-ffff"}}
        parsed, _ = parse(island)
        assert isinstance(parsed, Island)
        secret = control_token_secret(island, NAMESPACE, "t" * 43)
        kubernetes_validate.validate(secret, "1.30", strict=True)
        children = island_children(
            island, parsed, NAMESPACE, control_secret=secret["metadata"]["name"]
        )
        for workload in children:
            if workload["kind"] in ("Deployment", "StatefulSet"):
                container = workload["spec"]["template"]["spec"]["containers"][0]
                (token,) = [e for e in container["env"] if e["name"] == "PATHWAYS_CONTROL_TOKEN"]
                assert token["valueFrom"]["secretKeyRef"] == {
                    "name": secret["metadata"]["name"],
                    "key": "token",
                }


def test_control_tokens_off_grants_nothing_on_secrets(rendered) -> None:
    """operator.controlTokens=false (dev clusters): no flag, so no token, and no Role."""
    run = rendered("values.yaml", "operator.controlTokens=false")
    assert "PATHWAYS_CONTROL_TOKENS" not in operator_env(run)
    assert not run.installed("Role") and not run.installed("RoleBinding")
    for role in run.of_kind("ClusterRole"):
        assert all("secrets" not in rule["resources"] for rule in role["rules"])


def container_env(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"][0].get("env", [])


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_session_credentials_are_on_with_a_release_key_the_operator_and_api_read(
    rendered, values_file: str
) -> None:
    """Every values file keys its islands: a random release key in a Secret of its own, read
    by the operator (which derives each island's key and signs runs' credentials) and the API
    (which signs tenants' sessions); the island's scheduler reads its key from its Secret."""
    run = rendered(values_file)
    secret = run.one("Secret", "-session-key")
    kubernetes_validate.validate(secret, "1.30", strict=True)
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert len(key) == 48 and key.isalnum()
    reference = {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "key"}}
    master = {"name": MASTER_KEY_ENV, "valueFrom": reference}
    assert master in container_env(run.one("Deployment", "-operator"))
    for api in run.of_kind("Deployment"):
        if api["metadata"]["name"].endswith("-api"):
            assert master in container_env(api)
    for island in run.of_kind("Island"):
        island = {**island, "metadata": {**island["metadata"], "uid": "0123abcd-ffff"}}
        parsed, _ = parse(island)
        assert isinstance(parsed, Island)
        made = control_token_secret(island, NAMESPACE, "t" * 43, island_key(b"k" * 48, "u"))
        kubernetes_validate.validate(made, "1.30", strict=True)
        name = made["metadata"]["name"]
        scheduler, *_ = island_children(
            island, parsed, NAMESPACE, control_secret=name, session_keys=True
        )
        wanted = {"name": name, "key": "session-key", "optional": True}
        assert {"name": SESSION_KEY_ENV, "valueFrom": {"secretKeyRef": wanted}} in (
            container_env(scheduler)
        )


@pytest.mark.parametrize(
    "off", ["operator.sessionCredentials=false", "operator.controlTokens=false"]
)
def test_session_credentials_off_make_no_key(rendered, off: str) -> None:
    run = rendered("values.yaml", off)
    assert not [s for s in run.of_kind("Secret") if s["metadata"]["name"].endswith("-session-key")]
    for workload in run.of_kind("Deployment"):
        assert all(e["name"] != MASTER_KEY_ENV for e in container_env(workload))


def test_tenant_namespaces_get_client_only_certificates(rendered) -> None:
    """The docs said to copy the servers' Secret into each tenant namespace: anyone reading
    Secrets there then held the key the API and the islands serve with."""
    longest = "t" * 63  # a common name of pathways-client.<it> was over 64 bytes: never issued
    run = rendered(
        "values-kind.yaml",
        *TLS_ON,
        f"tls.certManager.clientNamespaces={{team-a,{NAMESPACE},{longest}}}",
    )
    clients = [c for c in run.of_kind("Certificate") if c["metadata"]["name"].endswith("-client")]
    # The release's own namespace mounts the servers' Secret: no second Certificate writes it.
    assert [c["metadata"]["namespace"] for c in clients] == ["team-a", longest]
    for certificate in clients:
        spec = certificate["spec"]
        assert spec["usages"] == ["client auth"] and "dnsNames" not in spec
        assert "commonName" not in spec
        namespace = certificate["metadata"]["namespace"]
        assert spec["uris"] == [f"spiffe://pathways.dev/ns/{namespace}/client"]
        assert spec["secretName"] == "pw-pathways-tls"  # what program Jobs mount
        assert spec["issuerRef"]["kind"] == "ClusterIssuer"
    namespaced = render(
        "values-kind.yaml",
        "tls.enabled=true",
        "tls.certManager.issuerRef.name=ca",
        "tls.certManager.clientNamespaces={team-a}",
    )
    assert namespaced.returncode != 0
    assert "certificates in namespace team-a need a ClusterIssuer" in namespaced.stderr
    assert "issuerRef.kind is Issuer (the default when unset)" in namespaced.stderr
    unissued = render("values-kind.yaml", "tls.certManager.clientNamespaces={team-a}")
    assert unissued.returncode != 0
    assert "clientNamespaces needs tls.enabled and tls.certManager.issuerRef" in unissued.stderr
