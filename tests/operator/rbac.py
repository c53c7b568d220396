"""The operator's API calls against the chart's RBAC: every call the operator made to the
emulated API server (kopf's and its own, told apart by their User-Agent) must be one its
ClusterRole and Role allow, as a real API server would check (the emulator checks none); and
every call of the uninstall hook, one its ClusterRole allows."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import kmock
import yaml

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "pathways" / "templates"
ROLES = {
    "operator": TEMPLATES / "rbac-operator.yaml",
    "uninstall": TEMPLATES / "uninstall-hook.yaml",
}
VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


@functools.cache
def allowed(caller: str) -> frozenset[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule of the chart's roles of ``caller``."""
    text = re.sub(r"\{\{-? /\*.*?\*/ -?\}\}", "", ROLES[caller].read_text(), flags=re.DOTALL)
    text = "\n".join(line for line in text.splitlines() if "{{" not in line)
    rules = set()
    for document in yaml.safe_load_all(text):
        if document and document.get("kind") in ("ClusterRole", "Role"):
            for rule in document["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rules.update((group, resource, verb) for verb in rule["verbs"])
    return frozenset(rules)


def caller(request: kmock.Request) -> str | None:
    """Whose request it is, by its User-Agent: the operator's, the uninstall hook's, or none."""
    agent = request.headers.get("User-Agent") or request.headers.get("user-agent") or ""
    if agent.startswith("kopf/") or agent == "pathways-operator":
        return "operator"
    return "uninstall" if agent == "pathways-uninstall" else None


def asked(request: kmock.Request) -> tuple[str, str, str] | None:
    """What a request needs, or ``None`` when it is not one the chart's roles cover."""
    if request.resource is None or caller(request) is None:
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


def refused(emulator: object) -> list[tuple[str, str, str, str]]:
    """The calls the chart's RBAC would have refused: (caller, group, resource, verb)."""
    needed = {
        (who, *call)
        for request in list(emulator)  # type: ignore[call-overload]
        if (call := asked(request)) is not None and (who := caller(request)) is not None
    }
    return sorted(call for call in needed if tuple(call[1:]) not in allowed(call[0]))
