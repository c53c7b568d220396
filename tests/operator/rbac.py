"""The operator's API calls against the chart's RBAC: every call the operator made to the
emulated API server (kopf's and its own, told apart by their User-Agent) must be one its
ClusterRole and Role allow, as a real API server would check (the emulator checks none)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import kmock
import yaml

ROLE = (
    Path(__file__).resolve().parents[2] / "charts" / "pathways" / "templates" / "rbac-operator.yaml"
)
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


@functools.cache
def allowed() -> frozenset[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule of the chart's operator roles."""
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}", "", ROLE.read_text(), flags=re.DOTALL)
    text = "\n".join(line for line in text.splitlines() if "{{" not in line)
    rules = set()
    for document in yaml.safe_load_all(text):
        if document and document.get("kind") in ("ClusterRole", "Role"):
            for rule in document["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rules.update((group, resource, verb) for verb in rule["verbs"])
    return frozenset(rules)


def asked(request: kmock.Request) -> tuple[str, str, str] | None:
    """What an operator's request needs, or ``None`` when it is not the operator's."""
    agent = request.headers.get("User-Agent") or request.headers.get("user-agent") or ""
    if request.resource is None or not (agent.startswith("kopf/") or agent == "pathways-operator"):
        return None
    resource = request.resource.plural or ""
    if not resource:
        return None  # discovery: every authenticated caller may
    if request.subresource:
        resource = f"{resource}/{request.subresource}"
    method = str(request.method.value if request.method else "GET").upper()
    if method == "GET":
        watching = str(request.params.get("watch", "")).lower() in ("true", "1")
        verb = "watch" if watching else ("get" if request.name else "list")
    else:
        verb = VERBS.get(method, method.lower())
    return (request.resource.group or "", resource, verb)


def refused(emulator: object) -> list[tuple[str, str, str]]:
    """The operator's calls the chart's RBAC would have refused."""
    needed = {call for request in list(emulator) if (call := asked(request)) is not None}  # type: ignore[call-overload]
    return sorted(needed - allowed())
