"""The chart's ValidatingAdmissionPolicy of the tenant policy, evaluated offline with CEL as the
API server evaluates it (match conditions, variables in order, validations, message
expressions): it refuses exactly what the operator's binder refuses, with the same words."""

from __future__ import annotations

import json
from typing import Any

import celpy
import pytest
from celpy import celtypes
from chart_helpers import CHART

from pathways_core.control.tenants import Tenants

POLICY = {
    "vision": {"namespaces": ["vision", "vision-eval"], "maxPriority": 100},
    "speech": {"devices": {"tpu-v5e": 8}},
    "*": {"maxPriority": 0},
}
ENVIRONMENT = celpy.Environment()


def join(items: celtypes.ListType, separator: celtypes.StringType) -> celtypes.StringType:
    """Kubernetes' ``list.join(separator)`` (its CEL strings library)."""
    return celtypes.StringType(separator.join(items))


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    program = ENVIRONMENT.program(ENVIRONMENT.compile(expression), functions={"join": join})
    return program.evaluate(activation)


OPERATOR = "system:serviceaccount:default:pw-pathways-operator"


def admission(
    policy: dict[str, Any],
    document: dict[str, Any],
    old: dict[str, Any] | None = None,
    user: str = "system:serviceaccount:team:trainer",
) -> str | None:
    """What the API server answers ``user``'s create of ``document`` (or update from
    ``old``): ``None`` when admitted, else the message of the first validation that fails."""
    spec = policy["spec"]
    request = {
        "operation": "CREATE" if old is None else "UPDATE",
        "namespace": document["metadata"]["namespace"],
        "userInfo": {"username": user},
    }
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(document),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
    }
    if not all(evaluate(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables = celtypes.MapType({})
    for variable in spec["variables"]:
        activation["variables"] = variables
        variables[celtypes.StringType(variable["name"])] = evaluate(
            variable["expression"], activation
        )
    activation["variables"] = variables
    for validation in spec["validations"]:
        if not evaluate(validation["expression"], activation):
            return str(evaluate(validation["messageExpression"], activation))
    return None


def rendered_policy(helm, *args: str) -> dict[str, Any] | None:
    run = helm("template", "pw", str(CHART), *args)
    assert run.returncode == 0, run.stderr
    policies = run.of_kind("ValidatingAdmissionPolicy")
    bindings = run.of_kind("ValidatingAdmissionPolicyBinding")
    assert len(policies) == len(bindings) <= 1
    if not policies:
        return None
    assert bindings[0]["spec"] == {
        "policyName": policies[0]["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    return policies[0]


def tenants_args(policy: dict[str, Any]) -> tuple[str, ...]:
    return (
        "--set",
        "operator.admissionPolicy=true",
        "--set-json",
        f"operator.tenants={json.dumps(policy)}",
    )


def manifest(kind: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": namespace},
        "spec": spec,
    }


CASES = [
    ("vision", {}),
    ("vision-eval", {"tenant": "vision", "priority": 100}),
    ("intruder", {"tenant": "vision"}),
    ("vision", {"priority": 101}),
    ("speech", {"priority": 1_000_000}),
    ("speech-eval", {"tenant": "speech"}),
    ("scratch", {"priority": 0}),
    ("scratch", {"priority": 1}),
    ("scratch", {"priority": -5}),
    ("vision", {"tenant": "scratch"}),
]


@pytest.mark.parametrize("kind", ["VirtualSlice", "PathwaysProgram"])
@pytest.mark.parametrize(("namespace", "spec"), CASES)
def test_admission_refuses_what_binding_refuses_in_the_same_words(
    helm, kind: str, namespace: str, spec: dict[str, Any]
) -> None:
    policy = rendered_policy(helm, *tenants_args(POLICY))
    assert policy is not None
    tenants = Tenants.from_wire(POLICY)
    refusal = tenants.refusal(namespace, spec.get("tenant", namespace), spec.get("priority", 0))
    expected = refusal.message if refusal else None
    assert admission(policy, manifest(kind, namespace, **spec)) == expected


def test_without_a_policy_each_tenant_is_its_namespace_and_priorities_are_free(helm) -> None:
    policy = rendered_policy(helm, "--set", "operator.admissionPolicy=true")
    assert policy is not None
    assert admission(policy, manifest("VirtualSlice", "a", priority=1_000_000_000)) is None
    refused = admission(policy, manifest("VirtualSlice", "a", tenant="b"))
    assert refused == Tenants().refusal("a", "b", 0).message  # type: ignore[union-attr]


def test_edits_that_let_go_pass_so_a_stricter_policy_never_blocks_a_release(helm) -> None:
    policy = rendered_policy(helm, *tenants_args(POLICY))
    assert policy is not None
    old = manifest("PathwaysProgram", "vision", priority=500)  # admitted before the policy
    finalizers_removed = {**old, "metadata": {**old["metadata"], "finalizers": []}}
    assert admission(policy, finalizers_removed, old) is None
    suspended = manifest("PathwaysProgram", "vision", priority=500, suspend=True)
    assert admission(policy, suspended, old) is None  # suspend and cancel
    assert admission(policy, manifest("PathwaysProgram", "vision", priority=200), old) is None
    raised = manifest("PathwaysProgram", "vision", priority=501)
    assert admission(policy, raised, old) is not None
    moved = manifest("PathwaysProgram", "vision", priority=500, tenant="speech")
    assert admission(policy, moved, old) is not None


def test_the_operators_inline_slices_pass_and_the_binder_holds_them(helm) -> None:
    policy = rendered_policy(helm, *tenants_args(POLICY))
    assert policy is not None
    inline = manifest("VirtualSlice", "vision", priority=500)  # its program's, admitted before
    assert admission(policy, inline, user=OPERATOR) is None
    assert admission(policy, inline) is not None  # anyone else: refused


def test_any_tenant_name_renders_and_is_named_as_the_binder_names_it(helm) -> None:
    names = {"o'brien": {"maxPriority": 10}, 'a"b\\c': {"maxPriority": 10}}
    policy = rendered_policy(helm, *tenants_args(names))
    assert policy is not None
    tenants = Tenants.from_wire(names)
    for tenant in names:
        for spec in ({"tenant": tenant}, {"tenant": tenant, "priority": 11}):
            namespace = "team" if "priority" not in spec else tenant
            document = manifest("VirtualSlice", namespace, **spec)
            refusal = tenants.refusal(namespace, tenant, spec.get("priority", 0))
            assert refusal is not None
            assert admission(policy, document) == refusal.message


def test_rendered_where_the_cluster_serves_the_kind_or_when_asked(helm) -> None:
    served = ("--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
    assert rendered_policy(helm) is None  # auto, and helm template's default API versions
    assert rendered_policy(helm, *served) is not None
    assert rendered_policy(helm, *served, "--set", "operator.admissionPolicy=false") is None
    run = helm("template", "pw", str(CHART), "--set", "operator.admissionPolicy=maybe")
    assert run.returncode != 0 and "/operator/admissionPolicy" in run.stderr, run.stderr
