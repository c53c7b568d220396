"""The Helm chart: lint, render, Kubernetes schemas, RBAC, security, islands, bad values."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, ROOT, VALUES_FILES, values_args
from chart_helpers import render as chart_render

from pathways_api.kube_store import ADMISSION_LEASE
from pathways_core.accelerators import AcceleratorKind, accelerator_info
from pathways_core.control import island_children, parse
from pathways_core.control.tenants import Tenants
from pathways_core.crds import all_crds
from pathways_core.manifests import check_document
from pathways_core.resources.island import Island

# The current Kubernetes release, and the oldest one the chart supports (Chart.yaml kubeVersion).
KUBERNETES_VERSIONS = ["1.37", "1.30"]
# Kinds kubernetes-validate has no schema for, and what checks them instead.
CUSTOM_KINDS = {"Island", "ClusterKopfPeering", "ServiceMonitor", "PodMonitor", "Certificate"}
# The IFRT proxy switched on (it needs the Secret of its tenant's API token).
PROXY_ON = ("proxy.enabled=true", "proxy.tokenSecret.name=proxy-token")
# Everything optional switched on, so that every template is rendered and validated.
ALL_ON = (
    *PROXY_ON,
    "api.ingress.enabled=true",
    "serviceMonitor.enabled=true",
    "operator.replicas=3",
    "tls.enabled=true",
    "tls.certManager.issuerRef.name=ca",
    "networkPolicy.crossIslandTransfers=false",
    "operator.admissionPolicy=true",
)
RENDERS = [(name, ()) for name in VALUES_FILES] + [("values-kind.yaml", ALL_ON)]
RENDER_IDS = [*VALUES_FILES, "all-features"]


def pathways_crd_schemas() -> dict[str, dict[str, Any]]:
    return {
        crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for crd in all_crds().values()
    }


def chart_crd_schema(kind: str) -> dict[str, Any]:
    """The schema of a CRD the chart ships in crds/, by kind."""
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd["spec"]["names"]["kind"] == kind:
                return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise KeyError(kind)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_lint_strict(helm, values_file: str) -> None:
    run = helm("lint", "--strict", str(CHART), *values_args(values_file))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 chart(s) failed" in run.stdout


@pytest.mark.parametrize(("values_file", "sets"), RENDERS, ids=RENDER_IDS)
def test_rendered_objects_pass_kubernetes_validate_strict(rendered, values_file, sets) -> None:
    run = rendered(values_file, *sets)
    kinds = {doc["kind"] for doc in run.documents}
    assert {"Deployment", "ClusterRole", "CustomResourceDefinition", "ClusterKopfPeering"} <= kinds
    checked = 0
    for doc in run.documents:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            # Raises kubernetes_validate.ValidationError naming the path at fault.
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 12


def test_kubernetes_validate_rejects_a_bad_object(rendered) -> None:
    """The validation above can fail: a misspelt field in a rendered Deployment is caught."""
    deployment = rendered("values.yaml").one("Deployment", "-operator")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize(("values_file", "sets"), RENDERS, ids=RENDER_IDS)
def test_custom_resources_match_their_crds(rendered, values_file, sets) -> None:
    """What kubernetes-validate cannot know is checked against the CRDs the chart ships: islands
    against the Island schema and model, the peering object against kopf's CRD. The
    ServiceMonitor (Prometheus Operator's CRD, not shipped) is checked for shape only."""
    run = rendered(values_file, *sets)
    schemas = pathways_crd_schemas()
    for island in run.of_kind("Island"):
        jsonschema.validate(island, schemas["Island"])
        checked = check_document(island)
        assert not checked.problems, checked.problems
    for peering in run.of_kind("ClusterKopfPeering"):
        assert peering["apiVersion"] == "kopf.dev/v1"
        jsonschema.validate(peering, chart_crd_schema("ClusterKopfPeering"))
    for monitor in run.of_kind("ServiceMonitor"):
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        ports = {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]}
        service_ports = {
            port["name"] for service in run.of_kind("Service") for port in service["spec"]["ports"]
        }
        assert ports <= service_ports
    for monitor in run.of_kind("PodMonitor"):
        # Island pods, as the operator makes them: the selector picks them, the port is theirs.
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        for island in run.of_kind("Island"):
            parsed, _ = parse(island)
            for child in island_children(
                {**island, "metadata": {**island["metadata"], "uid": "u"}}, parsed, "ns"
            ):
                template = child["spec"].get("template") if child["kind"] != "Service" else None
                if template is None:
                    continue
                labels = template["metadata"]["labels"]
                assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
                assert set(monitor["spec"]["podTargetLabels"]) <= labels.keys()
                names = {
                    p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])
                }
                assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= names


def test_chart_crds_equal_the_generated_crds() -> None:
    generated = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    in_chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert len(generated) == 3
    assert {name: in_chart.get(name) for name in generated} == generated
    # The one extra file is kopf's peering CRDs, written by hand.
    assert set(in_chart) - set(generated) == {"kopf.dev-peerings.yaml"}
    peering = yaml.safe_load_all((CHART / "crds/kopf.dev-peerings.yaml").read_text())
    kinds = {crd["spec"]["names"]["kind"] for crd in peering}
    assert kinds == {"ClusterKopfPeering", "KopfPeering"}


def test_the_island_template_checks_the_crds_required_fields() -> None:
    crd = all_crds()["islands.pathways.dev.yaml"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = (CHART / "templates" / "islands.yaml").read_text()
    listed = " ".join(f'"{field}"' for field in spec["required"])
    assert f"range list {listed} }}" in template


def test_values_schema_is_generated_from_the_island_model() -> None:
    script = ROOT / "scripts" / "values_schema.py"
    result = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# --- the GKE TPU islands -------------------------------------------------------------------


def test_gke_tpu_islands_carry_selectors_and_their_pods_tolerations_and_chips(
    rendered,
) -> None:
    islands = {i["metadata"]["name"]: i for i in rendered("values-gke-tpu.yaml").of_kind("Island")}
    assert set(islands) == {"v5e-2x4", "v5p-2x2x2"}
    expected = {"v5e-2x4": ("tpu-v5e", "2x4", 1, 8), "v5p-2x2x2": ("tpu-v5p", "2x2x2", 2, 4)}
    for name, (kind, topology, hosts, chips) in expected.items():
        island = Island.model_validate(islands[name])
        spec = island.spec
        assert (spec.accelerator_kind, spec.topology, spec.hosts) == (kind, topology, hosts)
        assert spec.host_devices == chips
        label_key, label_value = accelerator_info(kind).node_label  # type: ignore[misc]
        selector = spec.placement.node_selector
        assert selector[label_key] == label_value
        assert selector["cloud.google.com/gke-tpu-topology"] == topology
        # A multi-host slice is one node pool: both executor pods must land in it.
        assert selector["cloud.google.com/gke-nodepool"] == f"pathways-{name}"
        assert spec.image.endswith("-tpu")
        # The executor pods the operator makes tolerate the TPU taint (once) and take every
        # chip of their host: extended resources need requests equal to limits.
        children = island_children(islands[name], island, "pathways-system")
        statefulset = next(c for c in children if c["kind"] == "StatefulSet")
        pod = statefulset["spec"]["template"]["spec"]
        tpu = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
        assert pod["tolerations"].count(tpu) == 1
        resources = pod["containers"][0]["resources"]
        assert resources["requests"]["google.com/tpu"] == str(chips)
        assert resources["limits"]["google.com/tpu"] == str(chips)
        assert resources["requests"]["cpu"] == str(spec.placement.resources.requests["cpu"])


def test_kind_islands_match_the_kind_cluster_workers(rendered) -> None:
    config = yaml.safe_load((ROOT / "kind-config.yaml").read_text())
    worker_labels = [node.get("labels", {}) for node in config["nodes"] if node["role"] == "worker"]
    islands = rendered("values-kind.yaml").of_kind("Island")
    assert len(islands) == 2
    for island in islands:
        spec = Island.model_validate(island).spec
        assert spec.accelerator_kind == "cpu-fake"
        selector = spec.placement.node_selector
        matching = [labels for labels in worker_labels if selector.items() <= labels.items()]
        assert len(matching) == 1, (island["metadata"]["name"], selector, worker_labels)
        assert spec.image == "ghcr.io/pathways-k8s/pathways:dev"


def test_island_defaults_merge_under_each_island(rendered) -> None:
    # Required fields may come from the defaults (the schema asked for them in each island).
    given = rendered(
        "values.yaml",
        "islandDefaults.acceleratorKind=cpu-fake",
        "islandDefaults.topology=2x2",
        "islands[0].name=small",
        "islands[0].spec.hosts=1",
    )
    (small,) = given.of_kind("Island")
    assert (small["spec"]["acceleratorKind"], small["spec"]["topology"]) == ("cpu-fake", "2x2")
    run = rendered("values-kind.yaml", "islandDefaults.scheduler.policy=fifo")
    for island in run.of_kind("Island"):
        assert island["spec"]["scheduler"]["policy"] == "fifo"
        assert island["spec"]["placement"]["resources"]["requests"]["cpu"] == "250m"
        assert island["spec"]["placement"]["nodeSelector"]  # the island's own value kept
    no_islands = rendered("values.yaml")
    assert no_islands.of_kind("Island") == []


def test_a_one_axis_topology_given_as_a_number_reaches_the_island_as_a_string(
    helm, tmp_path
) -> None:
    """`topology=8` (a number to --set and to YAML) was refused with "got number, want string",
    though it is what users write for a one-axis mesh."""
    values = tmp_path / "islands.yaml"
    values.write_text(
        "islandDefaults: {acceleratorKind: cpu-fake}\n"
        "islands:\n"
        "  - {name: a, spec: {topology: 8}}\n"  # a number in a values file (a float to helm)
        "  - {name: b, spec: {topology: 2x4}}\n"
    )
    run = helm(
        "template",
        "pw",
        str(CHART),
        *("-f", str(values)),
        *("--set", "islands[1].spec.topology=8"),  # an integer from --set
    )
    assert run.returncode == 0, run.stderr
    islands = run.of_kind("Island")
    assert [island["spec"]["topology"] for island in islands] == ["8", "8"]
    schema = pathways_crd_schemas()["Island"]
    for island in islands:
        jsonschema.validate(island, schema)
        assert not check_document(island).problems


# --- workloads, security, RBAC -------------------------------------------------------------


def containers(run) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        (deployment["metadata"]["name"], deployment["spec"]["template"]["spec"], container)
        for deployment in run.of_kind("Deployment")
        for container in deployment["spec"]["template"]["spec"]["containers"]
    ]


def assert_locked_down(name: str, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The hardening every pod of the chart carries (docs/security.md, "Pods")."""
    assert pod["securityContext"]["runAsNonRoot"] is True, name
    assert pod["securityContext"]["runAsUser"] != 0, name
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True, name
    assert security["allowPrivilegeEscalation"] is False, name
    assert security["capabilities"]["drop"] == ["ALL"], name
    assert "command" not in container, name  # args only: tini stays PID 1
    # The read-only root needs writable scratch space at the paths the image uses.
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/tmp", "/var/cache/pathways"} <= mounts, name
    assert container["resources"]["requests"], name


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_pods_are_locked_down(rendered, values_file: str) -> None:
    run = rendered(values_file)
    found = containers(run)
    assert {name for name, _, _ in found} == {"pw-pathways-operator", "pw-pathways-api"}
    for name, pod, container in found:
        assert_locked_down(name, pod, container)
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert container["readinessProbe"]["httpGet"]["path"] in ("/healthz", "/readyz"), name


def test_entrypoints_follow_the_contracts(rendered) -> None:
    run = rendered("values-gke-tpu.yaml")
    operator = run.one("Deployment", "-operator")
    assert operator["spec"]["replicas"] == 2
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == [
        "kopf",
        "run",
        "-m",
        "pathways_operator",
        "--all-namespaces",
        "--peering=pathways",
        "--liveness=http://0.0.0.0:8080/healthz",
    ]
    env = {item["name"]: item for item in container["env"]}
    assert env["PATHWAYS_IMAGE"]["value"] == "ghcr.io/pathways-k8s/pathways:0.1.0"
    assert env["PATHWAYS_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert {port["containerPort"] for port in container["ports"]} == {8080, 9090}
    assert run.one("ClusterKopfPeering")["metadata"]["name"] == "pathways"

    api = run.one("Deployment", "-api")["spec"]["template"]["spec"]["containers"][0]
    assert api["args"] == ["python", "-m", "pathways_api", "--host", "0.0.0.0", "--port", "8080"]
    assert {item["name"]: item.get("value") for item in api["env"]}["PATHWAYS_API_MODE"] == (
        "kubernetes"
    )
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_api_limits_reach_the_api_pods(rendered) -> None:
    def limits(*sets: str) -> dict[str, str]:
        api = rendered("values.yaml", *sets).one("Deployment", "-api")
        env = api["spec"]["template"]["spec"]["containers"][0]["env"]
        return {
            item["name"]: item.get("value")
            for item in env
            if "LIMIT" in item["name"] or item["name"] == "PATHWAYS_API_MAX_BODY"
        }

    assert limits() == {
        "PATHWAYS_API_MAX_BODY": "1048576",
        "PATHWAYS_API_RATE_LIMIT": "100,5000",
        "PATHWAYS_API_READ_RATE_LIMIT": "1000,10000",
    }
    assert limits("api.limits.rateLimit=0", "api.limits.maxBodyBytes=4194304") == {
        "PATHWAYS_API_MAX_BODY": "4194304",
        "PATHWAYS_API_RATE_LIMIT": "0",
        "PATHWAYS_API_READ_RATE_LIMIT": "1000,10000",
    }


def test_api_quotas_reach_the_api_pods_and_no_tenant_preempts_by_default(rendered) -> None:
    """The chart set no quota: every tenant could ask for the highest priority and evict
    every other tenant's slices."""

    def quotas(*sets: str) -> dict[str, str]:
        api = rendered("values.yaml", *sets).one("Deployment", "-api")
        env = api["spec"]["template"]["spec"]["containers"][0]["env"]
        return {i["name"]: i.get("value") for i in env if "_QUOTA_" in i["name"]}

    assert quotas() == {
        "PATHWAYS_API_QUOTA_DEVICES": "64",
        "PATHWAYS_API_QUOTA_PROGRAMS": "100",
        "PATHWAYS_API_QUOTA_PRIORITY": "0",
    }
    assert quotas("api.quotas.priority=100")["PATHWAYS_API_QUOTA_PRIORITY"] == "100"


def test_tenant_policy_reaches_the_operator_as_the_operator_reads_it(helm) -> None:
    def operator_env(*args: str) -> dict[str, str | None]:
        run = helm("template", "pw", str(CHART), *args)
        assert run.returncode == 0, run.stderr
        container = run.one("Deployment", "-operator")["spec"]["template"]["spec"]
        return {item["name"]: item.get("value") for item in container["containers"][0]["env"]}

    assert "PATHWAYS_TENANTS" not in operator_env()  # none: each tenant its own namespace
    policy = {
        "vision": {"namespaces": ["vision", "vision-eval"], "maxPriority": 100},
        "*": {"maxPriority": 0, "devices": {"tpu-v5e": 8}},
    }
    env = operator_env("--set-json", f"operator.tenants={json.dumps(policy)}")
    tenants = Tenants.from_wire(json.loads(env["PATHWAYS_TENANTS"] or ""))
    assert tenants.namespaces("vision") == ("vision", "vision-eval")
    assert (tenants.capped("vision", 500), tenants.capped("other", 500)) == (100, 0)
    assert tenants.quotas(["other"]) == {("other", AcceleratorKind.TPU_V5E): 8}
    for bad, message in [
        ({"*": {"namespaces": ["a"]}}, "/operator/tenants/*"),
        ({"t": {"devices": {"tpu-v9": 1}}}, "invalid propertyName 'tpu-v9'"),
        ({"t": {"maxPriority": "high"}}, "/operator/tenants/t/maxPriority"),
        ({"t": {"namespaces": ["Bad_NS"]}}, "/operator/tenants/t/namespaces/0"),
    ]:
        run = helm(
            "template", "pw", str(CHART), "--set-json", f"operator.tenants={json.dumps(bad)}"
        )
        assert run.returncode != 0 and message in run.stderr, (bad, run.stderr)


def test_services_reach_the_pods(rendered) -> None:
    run = rendered("values-kind.yaml", *ALL_ON)
    deployments = run.of_kind("Deployment")
    for service in run.of_kind("Service"):
        selector = service["spec"]["selector"]
        targets = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, service["metadata"]["name"]
        port_names = {
            p["name"]
            for c in targets[0]["spec"]["template"]["spec"]["containers"]
            for p in c["ports"]
        }
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    for budget in run.of_kind("PodDisruptionBudget"):
        assert budget["spec"]["maxUnavailable"] == 1  # never blocks a drain with one replica
    ingress = run.one("Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "pw-pathways-api", "port": {"name": "http"}}


def rules_of(run, suffix: str) -> set[tuple[str, str, str]]:
    role = run.one("ClusterRole", suffix)
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def expand(group: str, resources: str, verbs: str) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources.split() for v in verbs.split()}


READ = "get list watch"
WRITE = "get list watch create patch update delete"
PW = "pathways.dev"
STATUS = "islands/status virtualslices/status pathwaysprograms/status"
FINALIZERS = "islands/finalizers virtualslices/finalizers pathwaysprograms/finalizers"
# As operator/pathways_operator/__init__.py lists the calls the operator makes, plus reading
# pods and the finalizers subresource (for owner references with blockOwnerDeletion).
OPERATOR_RULES = (
    expand(PW, "islands", "get list watch patch")
    | expand(PW, "virtualslices", "get list watch create patch delete")
    | expand(PW, "pathwaysprograms", "get list watch patch")
    | expand(PW, STATUS, "get patch")
    | expand(PW, FINALIZERS, "update")
    | expand("apps", "deployments statefulsets", "get list watch create patch delete")
    | expand("", "services configmaps", "get create patch delete")
    | expand("batch", "jobs", "get list watch create patch delete")
    | expand("", "pods", f"{READ} delete")  # an island's executors restart together
    | expand("", "events", "create patch")
    | expand("events.k8s.io", "events", "create patch")
    | expand("kopf.dev", "clusterkopfpeerings", "get list watch patch")
    | expand("", "namespaces", "list watch")
    | expand("apiextensions.k8s.io", "customresourcedefinitions", "list watch")
)
API_RULES = (
    expand(PW, "islands", READ)
    | expand(PW, "virtualslices pathwaysprograms", WRITE)
    | expand(PW, STATUS, "get")
    | expand("", "events", "list")  # a program's Events
    | expand("", "pods", "get list")  # and its pods' logs
    | expand("", "pods/log", "get")
    | expand("authentication.k8s.io", "tokenreviews", "create")
    | expand("authorization.k8s.io", "subjectaccessreviews", "create")
    | expand("coordination.k8s.io", "leases", "get create patch")  # tenants' admission
)


def test_rbac_is_least_privilege_and_written_out(rendered) -> None:
    run = rendered("values-gke-tpu.yaml")
    assert rules_of(run, "-operator") == OPERATOR_RULES
    assert rules_of(run, "-api") == API_RULES
    # Leases are read and taken by the admission Lease's name only (the API faces tenants).
    (lease_rule,) = [
        rule
        for rule in run.one("ClusterRole", "-api")["rules"]
        if "leases" in rule["resources"] and "patch" in rule["verbs"]
    ]
    assert lease_rule["resourceNames"] == [ADMISSION_LEASE]
    assert lease_rule["verbs"] == ["get", "patch"]
    for role in run.of_kind("ClusterRole") + run.of_kind("Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (role["metadata"]["name"], rule)
            # Pods are never written; secrets never read, and created only by the Role below.
            if role["metadata"]["name"] != "pw-pathways-operator-control-tokens":
                assert "secrets" not in rule["resources"]
    # The islands' control tokens: the operator creates Secrets in its own namespace, only.
    (tokens,) = run.installed("Role")
    assert tokens["metadata"]["namespace"] == "pathways-system"
    assert tokens["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    (binding,) = run.installed("RoleBinding")
    assert binding["roleRef"]["name"] == tokens["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "pw-pathways-operator"
    subjects = {
        binding["roleRef"]["name"]: binding["subjects"][0]
        for binding in run.of_kind("ClusterRoleBinding")
    }
    accounts = {account["metadata"]["name"] for account in run.of_kind("ServiceAccount")}
    for role in ("pw-pathways-operator", "pw-pathways-api"):
        assert subjects[role]["name"] in accounts
        assert subjects[role]["namespace"] == "pathways-system"


def test_users_roles_aggregate_pathways_kinds_into_edit_admin_and_view(rendered) -> None:
    """Without them only cluster admins could use the kinds, and the REST API in kubernetes
    mode (which asks whether a caller may create PathwaysPrograms) refused every tenant."""
    run = rendered("values.yaml")
    mine = ("pathwaysprograms virtualslices", "pathwaysprograms/status virtualslices/status")
    assert rules_of(run, "-edit") == (
        expand(PW, mine[0], WRITE) | expand(PW, f"islands {mine[1]}", READ)
    )
    assert rules_of(run, "-view") == expand(PW, f"{mine[0]} islands {mine[1]}", READ)
    labels = {
        name: run.one("ClusterRole", name)["metadata"]["labels"] for name in ("-edit", "-view")
    }
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert labels["-edit"][aggregate + "edit"] == labels["-edit"][aggregate + "admin"] == "true"
    assert labels["-view"][aggregate + "view"] == "true"
    assert aggregate + "edit" not in labels["-view"]


def test_optional_parts_are_off_by_default(rendered) -> None:
    run = rendered("values.yaml")
    assert not run.of_kind("Ingress") and not run.of_kind("ServiceMonitor")
    assert not run.of_kind("Certificate")
    without_api = rendered("values.yaml", "api.enabled=false")
    assert [d["metadata"]["name"] for d in without_api.of_kind("Deployment")] == [
        "pw-pathways-operator"
    ]
    roles = [d["metadata"]["name"] for d in without_api.installed("ClusterRole")]
    assert sorted(roles) == ["pw-pathways-edit", "pw-pathways-operator", "pw-pathways-view"]


def test_uninstall_deletes_the_releases_islands_first_with_a_role_for_only_that(rendered) -> None:
    """Deleted with the operator, the islands stayed Terminating: a pre-delete hook deletes
    them while it runs. Its four objects are hooks (helm makes them before it, in weight
    order, and deletes them once it succeeded), so nothing of it stays installed."""
    run = rendered("values-kind.yaml", "uninstallHook.timeoutSeconds=100")
    hooks = [d for d in run.documents if d["metadata"]["name"] == "pw-pathways-uninstall"]
    assert sorted(d["kind"] for d in hooks) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "ServiceAccount",
    ]
    for document in hooks:
        annotations = document["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # The account and its role exist before the Job runs.
        assert int(annotations["helm.sh/hook-weight"]) == (0 if document["kind"] == "Job" else -10)
    by_kind = {d["kind"]: d for d in hooks}
    assert by_kind["ClusterRole"]["rules"] == [
        {"apiGroups": ["pathways.dev"], "resources": ["islands"], "verbs": ["list", "delete"]}
    ]
    (subject,) = by_kind["ClusterRoleBinding"]["subjects"]
    assert (subject["name"], subject["namespace"]) == ("pw-pathways-uninstall", "pathways-system")
    job = by_kind["Job"]["spec"]
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "pw-pathways-uninstall"
    (container,) = pod["containers"]
    assert container["args"] == [
        "python",
        "-m",
        "pathways_operator.uninstall",
        "--selector=app.kubernetes.io/instance=pw",
        "--timeout=100",
    ]
    assert job["activeDeadlineSeconds"] == 160 and job["backoffLimit"] == 0
    # The selector is the one every island of the release carries.
    for island in run.of_kind("Island"):
        assert island["metadata"]["labels"]["app.kubernetes.io/instance"] == "pw"
    # After: the finalizers the operator left on tenants' programs and slices come off, once
    # its pods are gone (deleted later, each waited for good for the operator).
    after = [d for d in run.documents if d["metadata"]["name"] == "pw-pathways-uninstall-after"]
    by_kind = {d["kind"]: d for d in after}
    assert sorted(by_kind) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Job",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    assert {d["metadata"]["annotations"]["helm.sh/hook"] for d in after} == {"post-delete"}
    assert by_kind["ClusterRole"]["rules"] == [
        {
            "apiGroups": ["pathways.dev"],
            "resources": ["pathwaysprograms", "virtualslices"],
            "verbs": ["list", "get", "patch"],
        }
    ]
    assert by_kind["Role"]["metadata"]["namespace"] == "pathways-system"
    assert by_kind["Role"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    ]
    (container,) = by_kind["Job"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][3:] == [
        "--finalizers",
        "--selector=app.kubernetes.io/instance=pw,app.kubernetes.io/component=operator",
        "--namespace=pathways-system",
        "--timeout=100",
    ]
    operator_pod = run.one("Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    assert operator_pod["app.kubernetes.io/instance"] == "pw"
    assert operator_pod["app.kubernetes.io/component"] == "operator"
    off = rendered("values-kind.yaml", "uninstallHook.enabled=false")
    assert not [d for d in off.documents if "uninstall" in d["metadata"]["name"]]


# --- the IFRT proxy ----------------------------------------------------------------------------

PROXY_KINDS = ("Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget")


def proxy_objects(run) -> dict[str, dict[str, Any]]:
    """The proxy's objects by kind (``pw-pathways-proxy``)."""
    found = [doc for doc in run.documents if doc["metadata"]["name"] == "pw-pathways-proxy"]
    assert len({doc["kind"] for doc in found}) == len(found)
    return {doc["kind"]: doc for doc in found}


def proxy_container(run) -> dict[str, Any]:
    return proxy_objects(run)["Deployment"]["spec"]["template"]["spec"]["containers"][0]


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_proxy_is_absent_by_default(rendered, values_file: str) -> None:
    run = rendered(values_file, "tls.enabled=true", "tls.certManager.issuerRef.name=ca")
    assert proxy_objects(run) == {}
    # Nor a peer in the islands' policies, nor a name in the certificate.
    objects = [doc for doc in run.documents if doc["kind"] != "CustomResourceDefinition"]
    assert "proxy" not in yaml.safe_dump(objects)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_proxy_when_enabled_is_valid_hardened_and_follows_its_command(
    rendered, values_file: str
) -> None:
    run = rendered(values_file, *PROXY_ON)
    objects = proxy_objects(run)
    assert set(objects) == set(PROXY_KINDS)
    for document in objects.values():
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert_locked_down("pw-pathways-proxy", pod, container)
    assert pod["automountServiceAccountToken"] is False  # it never calls the Kubernetes API
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["tcpSocket"] == {"port": "grpc"}, probe
    args = container["args"]
    assert args[:4] == ["python", "-m", "pathways_client", "proxy"]
    assert option(args, "--host") == "0.0.0.0"
    assert option(args, "--port") == "8476"
    # Slices through this release's API Service (plain HTTP: TLS is off).
    assert option(args, "--api") == "http://pw-pathways-api.pathways-system.svc:80"
    assert option(args, "--devices") == "4"
    assert "--tls-cert" not in args and "--islands" not in args
    # The arguments are the real command's: click parses them (without running it).
    from pathways_client.proxy.command import proxy_command

    parsed = proxy_command.make_context("proxy", args[4:]).params
    assert parsed["port"] == 8476 and parsed["devices"] == 4 and parsed["weight"] == 1
    assert parsed["api"] == "http://pw-pathways-api.pathways-system.svc:80"
    # The Service reaches the container's port; the budget never blocks a drain.
    service = objects["Service"]["spec"]
    assert service["ports"][0]["targetPort"] == "grpc"
    # A session's two connections (its stream, its host buffers) reach the same replica.
    assert service["sessionAffinity"] == "ClientIP"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"grpc": 8476}
    assert service["selector"].items() <= pod_labels(objects["Deployment"]).items()
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    # More settings reach the command line.
    more = rendered(
        values_file,
        *PROXY_ON,
        "proxy.port=9000",
        "proxy.devices=8",
        "proxy.island=fake-a",
        "proxy.tenant=team-a",
        "proxy.weight=4",
        "proxy.priority=2",
        "proxy.apiUrl=https://api.example.com",
    )
    args = proxy_container(more)["args"]
    parsed = proxy_command.make_context("proxy", args[4:]).params
    assert (parsed["port"], parsed["devices"], parsed["weight"], parsed["priority"]) == (
        9000,
        8,
        4,
        2,
    )
    assert (parsed["island_name"], parsed["tenant"]) == ("fake-a", "team-a")
    assert parsed["api"] == "https://api.example.com"


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_proxy_token_comes_from_its_secret_only(rendered) -> None:
    run = rendered("values.yaml", *PROXY_ON, "proxy.tokenSecret.key=tenant-token")
    env = proxy_container(run)["env"]
    (token,) = [item for item in env if item["name"] == "PATHWAYS_TOKEN"]
    assert token == {
        "name": "PATHWAYS_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "proxy-token", "key": "tenant-token"}},
    }
    assert "--token" not in proxy_container(run)["args"]
    # No token, no proxy: the render fails naming the value to set.
    failed = render_failure("proxy.enabled=true")
    assert "proxy.tokenSecret.name" in failed


def test_a_long_name_still_gives_valid_object_names(helm) -> None:
    """Suffixes went after the 63-character cut: an 80-character Service name rendered."""
    run = chart_render("values.yaml", f"fullnameOverride={'a' * 70}", "proxy.enabled=false")
    assert run.returncode == 0, run.stderr
    for document in run.documents:
        name = document["metadata"]["name"]
        limit = 63 if document["kind"] in ("Service", "Deployment") else 253
        assert len(name) <= limit, (document["kind"], name)


def render_failure(*sets: str) -> str:
    """The error of a ``helm template`` that must fail."""
    run = chart_render("values.yaml", *sets)
    assert run.returncode != 0, run.stdout[:2000]
    return run.stderr


@pytest.mark.parametrize("serve_tls", [True, False])
def test_proxy_with_tls_mounts_the_chart_secret(rendered, serve_tls: bool) -> None:
    run = rendered(
        "values-kind.yaml",
        *PROXY_ON,
        "tls.enabled=true",
        "tls.certManager.issuerRef.name=ca",
        f"proxy.serveTls={str(serve_tls).lower()}",
    )
    container = proxy_container(run)
    pod = proxy_objects(run)["Deployment"]["spec"]["template"]["spec"]
    # Its own hops (API over HTTPS checked against the CA, mutual TLS to the islands) are TLS
    # whether or not it serves TLS to its clients.
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["PATHWAYS_TLS_CERT"] == "/var/run/pathways/tls/tls.crt"
    assert env["PATHWAYS_TLS_KEY"] == "/var/run/pathways/tls/tls.key"
    assert env["PATHWAYS_TLS_CA"] == "/var/run/pathways/tls/ca.crt"
    assert {
        "name": "pathways-tls",
        "mountPath": "/var/run/pathways/tls",
        "readOnly": True,
    } in container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "pathways-tls")
    assert volume["secret"]["secretName"] == "pw-pathways-tls"
    args = container["args"]
    assert option(args, "--api") == "https://pw-pathways-api.pathways-system.svc:80"
    if serve_tls:
        assert option(args, "--tls-cert") == "/var/run/pathways/tls/tls.crt"
        assert option(args, "--tls-key") == "/var/run/pathways/tls/tls.key"
    else:
        assert "--tls-cert" not in args and "--tls-key" not in args
    # The certificate names the proxy's Service, short and qualified.
    names = run.one("Certificate")["spec"]["dnsNames"]
    for name in (
        "pw-pathways-proxy",
        "pw-pathways-proxy.pathways-system",
        "pw-pathways-proxy.pathways-system.svc",
        "pw-pathways-proxy.pathways-system.svc.cluster.local",
    ):
        assert name in names
    for document in proxy_objects(run).values():
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[-1], strict=True)


def test_notes_render(helm) -> None:
    run = helm(
        "install",
        "pw",
        str(CHART),
        "--dry-run=client",
        "-n",
        "pathways-system",
        *values_args("values-gke-tpu.yaml"),
    )
    assert run.returncode == 0, run.stderr
    notes = run.stdout.split("NOTES:", 1)[1]
    assert "v5p-2x2x2: tpu-v5p 2x2x2, 2 host(s)" in notes
    assert "deletes the release's islands first (a pre-delete hook)" in notes
    assert "kubectl delete islands" not in notes
    # Islands taking their kind, topology and hosts from islandDefaults, and TLS: the API
    # answers HTTPS only.
    run = helm(
        "install",
        "pw",
        str(CHART),
        "--dry-run=client",
        *("--set", "islandDefaults.acceleratorKind=cpu-fake", "--set", "islandDefaults.hosts=2"),
        *("--set", "islandDefaults.topology=2x4", "--set", "islandDefaults.devicesPerHost=4"),
        *("--set", "islands[0].name=a", "--set-json", "islands[0].spec={}"),
        *("--set", "tls.enabled=true"),
        *("--set", "tls.secretName=pathways-tls"),
    )
    assert run.returncode == 0, run.stderr
    notes = run.stdout.split("NOTES:", 1)[1]
    assert "- a: cpu-fake 2x4, 2 host(s)" in notes
    # The certificate names the Service, not 127.0.0.1: curl resolves its name to the tunnel.
    api = "pw-pathways-api.default.svc"
    curl = f"curl --cacert ca.crt --resolve {api}:8080:127.0.0.1 https://{api}:8080/healthz"
    assert curl in notes
    assert "get secret pathways-tls -o jsonpath='{.data.ca\\.crt}'" in notes
    hookless = helm(
        "install", "pw", str(CHART), "--dry-run=client", "--set", "uninstallHook.enabled=false"
    )
    assert hookless.returncode == 0, hookless.stderr
    assert "kubectl delete islands -l app.kubernetes.io/instance=pw" in hookless.stdout


# --- bad values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("image.tag= ", "/image/tag"),
        ("image.tag=v1 #x", "/image/tag"),
        ("image.tag=v1:2", "/image/tag"),
        ("image.repository=my repo", "/image/repository"),
        ("image.repository=ghcr.io/Pathways/pathways", "/image/repository"),
        ("image.repository=ghcr.io/pathways:v1", "/image/repository"),
        ("operator.childImage=my image", "/operator/childImage"),
        ("islands[0].spec.image=my image", "/islands/0/spec/image"),
    ],
)
def test_a_bad_image_reference_is_refused_naming_the_value(helm, value: str, name: str) -> None:
    """A blank tag broke the API Deployment's YAML, `v1 #x` rendered `image: ...:v1` (the rest
    a YAML comment) and a repository with a space an image no registry serves."""
    run = helm(
        "template",
        "pw",
        str(CHART),
        *values_args("values.yaml", ISLAND),
        *("--set-string", value),  # as typed: helm would not make the tag a number
    )
    assert run.returncode != 0, run.stdout[:2000]
    assert f"at '{name}'" in run.stderr and "does not match pattern" in run.stderr, run.stderr


def test_image_references_are_checked_and_quoted(rendered) -> None:
    """A registry with a port, a tag of every allowed character, and a pinned child image with
    a digest pass the schema and reach the pods as written."""
    digest = "sha256:" + "0123456789abcdef" * 4
    run = rendered(
        "values-kind.yaml",
        *PROXY_ON,
        "image.repository=registry.local:5000/team/path_ways",
        "image.tag=v1.2_rc-3",
        f"operator.childImage=registry.local:5000/team/path_ways@{digest}",
    )
    image = "registry.local:5000/team/path_ways:v1.2_rc-3"
    for name, _, container in containers(run):
        assert container["image"] == image, name
    operator = run.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in operator["env"]}
    assert env["PATHWAYS_IMAGE"] == f"registry.local:5000/team/path_ways@{digest}"
    # The Deployments quote the reference: its text is YAML-safe whatever the schema lets by.
    text = chart_render("values-kind.yaml", "image.tag=v1").stdout
    assert 'image: "ghcr.io/pathways-k8s/pathways:v1"' in text


def test_an_ingress_without_hosts_is_refused(helm) -> None:
    """`api.ingress.enabled` with `hosts: null` or `[]` rendered an Ingress with no rules."""
    for hosts in ("null", "[]"):
        run = helm(
            "template",
            "pw",
            str(CHART),
            *("--set", "api.ingress.enabled=true", "--set-json", f"api.ingress.hosts={hosts}"),
        )
        assert run.returncode != 0, run.stdout[:2000]
        assert "api.ingress.hosts: api.ingress.enabled needs at least one host" in run.stderr
    # A host without paths is a rule that routes nothing: the schema asks for one.
    run = helm(
        "template",
        "pw",
        str(CHART),
        *("--set", "api.ingress.enabled=true"),
        *("--set-json", 'api.ingress.hosts=[{"host": "a", "paths": []}]'),
    )
    assert run.returncode != 0, run.stdout[:2000]
    assert "at '/api/ingress/hosts/0/paths': minItems" in run.stderr, run.stderr
    # Without an Ingress the hosts are not needed.
    run = helm("template", "pw", str(CHART), "--set-json", "api.ingress.hosts=[]")
    assert run.returncode == 0, run.stderr


ISLAND = (
    "islands[0].name=bad",
    "islands[0].spec.acceleratorKind=cpu-fake",
    "islands[0].spec.topology=2x4",
)
BAD_VALUES = [
    pytest.param(
        (*ISLAND, "islands[0].spec.hosts=0"),
        ["/islands/0/spec/hosts", "minimum: got 0, want 1"],
        id="zero-hosts",
    ),
    pytest.param(
        (
            "islands[0].name=bad",
            "islands[0].spec.acceleratorKind=tpu-v9",
            "islands[0].spec.topology=2x4",
        ),
        ["/islands/0/spec/acceleratorKind", "value must be one of", "'tpu-v5e'"],
        id="unknown-accelerator",
    ),
    pytest.param(
        (*ISLAND, "islands[0].spec.hostz=2"),
        ["/islands/0/spec", "additional properties 'hostz' not allowed"],
        id="misspelt-field",
    ),
    pytest.param(
        (*ISLAND, "islands[0].spec.topology=4by4"),
        ["/islands/0/spec/topology", "does not match pattern"],
        id="bad-topology",
    ),
    pytest.param(
        (
            "islands[0].name=Bad_Name",
            "islands[0].spec.acceleratorKind=cpu-fake",
            "islands[0].spec.topology=2x4",
        ),
        ["/islands/0/name", "does not match pattern"],
        id="bad-name",
    ),
    pytest.param(
        (
            "islands[0].name=" + "a" * 44,
            "islands[0].spec.acceleratorKind=cpu-fake",
            "islands[0].spec.topology=2x4",
        ),
        ["/islands/0/name", "maxLength: got 44, want 43"],
        id="long-name",
    ),
    pytest.param(
        (
            "islands[0].name=1abc",
            "islands[0].spec.acceleratorKind=cpu-fake",
            "islands[0].spec.topology=2x4",
        ),
        ["/islands/0/name", "does not match pattern"],
        id="name-starting-with-a-digit",
    ),
    pytest.param(
        (
            "islands[0].name=bad",
            "islands[0].spec.acceleratorKind=tpu-v4",
            "islands[0].spec.topology=2x4",
        ),
        ['islands[0] (bad).spec.topology: topology "2x4" has 2 axes, but tpu-v4 meshes have 3'],
        id="topology-rank",
    ),
    pytest.param(
        ("islands[0].name=bad", "islands[0].spec.topology=2x4"),
        ["islands[0] (bad).spec.acceleratorKind: required, in the island or in islandDefaults"],
        id="missing-required",
    ),
    pytest.param(
        ("operator.replicas=-1",), ["/operator/replicas", "minimum: got -1, want 0"], id="replicas"
    ),
    # Object names are made from these (Bad_Name rendered "pw-Bad_Name-schedulers").
    pytest.param(
        ("nameOverride=Bad_Name",), ["/nameOverride", "does not match pattern"], id="name-override"
    ),
    pytest.param(
        ("fullnameOverride=1pathways",),  # Service names start with a letter
        ["/fullnameOverride", "does not match pattern"],
        id="fullname-override",
    ),
    # A container's env takes EnvVars ("foo" rendered "- foo").
    pytest.param(
        ("operator.env[0]=foo",), ["/operator/env/0", "got string, want object"], id="env-string"
    ),
    pytest.param(
        ("api.env[0].value=x",), ["/api/env/0", "missing property 'name'"], id="env-without-name"
    ),
    pytest.param(
        ("proxy.env[0].name=X", "proxy.env[0].value=1000000"),  # helm would render "1e+06"
        ["/proxy/env/0/value", "got number, want string"],
        id="env-number",
    ),
    pytest.param(
        (
            "api.ingress.enabled=true",
            "api.ingress.hosts[0].host=a",
            "api.ingress.hosts[0].paths[0].path=api",
        ),
        ["/api/ingress/hosts/0/paths/0/path", "does not match pattern"],
        id="ingress-relative-path",
    ),
    pytest.param(
        ("api.service.type=Ingress",), ["/api/service/type", "value must be one of"], id="svc-type"
    ),
    pytest.param(
        ("proxy.enabled=true",),
        ["proxy.tokenSecret.name: the proxy needs a Secret holding the API token"],
        id="proxy-without-token",
    ),
    pytest.param(
        ("proxy.enabled=true", "proxy.tokenSecret.name=t", "api.enabled=false"),
        ["proxy.apiUrl: api.enabled is false"],
        id="proxy-without-api",
    ),
    pytest.param(
        ("proxy.apiUrl=grpc://x",), ["/proxy/apiUrl", "does not match pattern"], id="proxy-url"
    ),
    pytest.param(("proxy.devices=0",), ["/proxy/devices", "minimum: got 0, want 1"], id="devices"),
    pytest.param(
        ("serviceMonitor.interval=banana",),
        ["/serviceMonitor/interval", "does not match pattern"],
        id="scrape-interval",
    ),
    pytest.param(
        ("api.limits.rateLimit=fast",),
        ["/api/limits/rateLimit", "does not match pattern"],
        id="rate-limit",
    ),
    pytest.param(
        ("operator.podDisruptionBudget.maxUnavailable=abc",),
        ["/operator/podDisruptionBudget/maxUnavailable", "anyOf"],
        id="pdb-not-a-count",
    ),
    pytest.param(
        ("operator.healthPort=9090",),
        ["operator.healthPort and operator.metricsPort are both 9090"],
        id="one-port-for-two-servers",
    ),
    pytest.param(
        (*PROXY_ON, "proxy.priority=10"),
        ["proxy.priority: 10 is above api.quotas.priority (0)"],
        id="proxy-priority-over-quota",
    ),
    pytest.param(
        ("api.quotas.priority=2000000000",),
        ["/api/quotas/priority", "maximum"],
        id="quota-priority",
    ),
    # What a JSON Schema cannot say, the island template checks, with the model's wording.
    pytest.param(
        (*ISLAND, "islands[0].spec.hosts=2", "islands[0].spec.devicesPerHost=3"),
        [
            'islands[0] (bad).spec.devicesPerHost: topology "2x4" has 8 devices but hosts x '
            "devicesPerHost is 2 x 3 = 6"
        ],
        id="devices-mismatch",
    ),
    pytest.param(
        (*ISLAND, "islands[0].spec.hosts=3"),
        [
            'islands[0] (bad).spec.hosts: topology "2x4" has 8 devices, which 3 hosts cannot '
            "share evenly"
        ],
        id="uneven-hosts",
    ),
    pytest.param(
        (
            *ISLAND,
            "islands[1].name=bad",
            "islands[1].spec.acceleratorKind=cpu-fake",
            "islands[1].spec.topology=4x2",
        ),
        ['islands[1] (bad).name: another island is already named "bad"'],
        id="duplicate-name",
    ),
    # The chart's own label keys: a pod's own broke its Deployment's selector; an island's
    # release label hid it from the uninstall hook's selector (it stayed Terminating).
    pytest.param(
        ("operator.podLabels.app\\.kubernetes\\.io/component=x",),
        ["invalid propertyName 'app.kubernetes.io/component'"],
        id="pod-label-of-the-charts",
    ),
    pytest.param(
        (*ISLAND, "islands[0].labels.app\\.kubernetes\\.io/instance=other"),
        ["invalid propertyName 'app.kubernetes.io/instance'"],
        id="island-label-of-the-charts",
    ),
]


@pytest.mark.parametrize(("sets", "messages"), BAD_VALUES)
def test_bad_values_are_rejected_with_a_clear_message(helm, sets, messages) -> None:
    run = helm("template", "pw", str(CHART), *values_args("values.yaml", sets))
    assert run.returncode != 0, run.stdout
    for message in messages:
        assert message in run.stderr, run.stderr


def test_schema_rejects_bad_values_in_lint_too(helm) -> None:
    run = helm(
        "lint",
        "--strict",
        str(CHART),
        *values_args(
            "values.yaml",
            (
                "islands[0].name=x",
                "islands[0].spec.acceleratorKind=tpu-v9",
                "islands[0].spec.topology=2x4",
            ),
        ),
    )
    assert run.returncode != 0
    assert "/islands/0/spec/acceleratorKind" in run.stdout + run.stderr


def test_values_from_before_a_key_keep_its_default(rendered) -> None:
    """`helm upgrade --reuse-values` (or an old values file) lacks the keys added since: a
    missing switch read as false turned control tokens, the admission policy and cross-island
    transfers off without a word, and missing quotas failed the render."""
    run = rendered(
        "values-kind.yaml",
        "operator.controlTokens=null",
        "operator.admissionPolicy=null",
        "networkPolicy.crossIslandTransfers=null",
        "api.quotas=null",
    )
    operator = run.one("Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in operator["env"]}["PATHWAYS_CONTROL_TOKENS"] == "true"
    assert any(r["metadata"]["name"].endswith("-control-tokens") for r in run.of_kind("Role"))
    api = run.one("Deployment", "-api")["spec"]["template"]["spec"]["containers"][0]
    quotas = {e["name"]: e.get("value") for e in api["env"] if "_QUOTA_" in e["name"]}
    assert quotas["PATHWAYS_API_QUOTA_PRIORITY"] == "0"
    assert quotas["PATHWAYS_API_QUOTA_DEVICES"] == "64"
    fresh = rendered("values-kind.yaml")
    assert [p["spec"] for p in run.of_kind("NetworkPolicy")] == [
        p["spec"] for p in fresh.of_kind("NetworkPolicy")
    ]
