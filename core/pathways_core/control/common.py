"""What every reconciliation decision shares: parsed objects, Events, conditions and times.

Resources come in as the JSON documents a store holds (the Kubernetes API server, or the SQLite
store of the embedded mode): plain dicts with ``metadata``, ``spec`` and ``status``. Decisions
go out as plain dicts too, so any store can apply them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pathways_core.manifests import check_document
from pathways_core.resources import Model

Document = dict[str, Any]
"""A resource as a store holds it: ``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``."""

API_GROUP_PREFIX = "pathways.dev/"
LABEL_ISLAND = "pathways.dev/island"
LABEL_COMPONENT = "pathways.dev/component"
LABEL_PROGRAM = "pathways.dev/program"
LABEL_RUN = "pathways.dev/run"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "pathways-operator"
FINALIZER = "pathways.dev/finalizer"
"""The operator's finalizer (kopf's, named in Pathways' group) on the objects it handles."""
ANNOTATION_SPEC_HASH = "pathways.dev/spec-hash"
ANNOTATION_SCHEDULER_ENDPOINT = "pathways.dev/scheduler-endpoint"
ANNOTATION_CANCELLED = "pathways.dev/cancelled"
# On a program's inline slices: when the program was made, the time they queue from (made in
# one pass of the controller, their own creation times tell programs apart no more).
ANNOTATION_QUEUED_SINCE = "pathways.dev/queued-since"
# On a slice with spec.leaseSeconds: when its holder last renewed it (through the API).
ANNOTATION_RENEWED_AT = "pathways.dev/renewed-at"
"""``"true"`` on a program the API cancelled: suspended for good."""
"""On an Island: the island runs elsewhere (outside the cluster, or on a developer's machine);
the operator creates no pods for it and publishes this ``host:port`` as its scheduler."""


@dataclass(frozen=True)
class ObjectRef:
    """Which object an Event is about."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None

    @classmethod
    def of(cls, document: Document) -> ObjectRef:
        """The reference of a stored document."""
        meta = document.get("metadata") or {}
        return cls(
            api_version=document.get("apiVersion", ""),
            kind=document.get("kind", ""),
            name=meta.get("name", ""),
            namespace=meta.get("namespace"),
            uid=meta.get("uid"),
        )


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to record: ``type`` is Normal or Warning, ``reason`` one CamelCase
    word. Decisions emit Events on transitions only, so a reconcile that runs twice records
    nothing new."""

    target: ObjectRef
    type: str
    reason: str
    message: str


def now_utc() -> datetime:
    """The current time, for callers (decisions take ``now`` as an argument)."""
    return datetime.now(UTC)


def timestamp(moment: datetime) -> str:
    """RFC 3339 with a Z, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    """A time written by Kubernetes (or by :func:`timestamp`), or ``None`` (for one without
    a time zone too: it cannot be compared with the others)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def key_of(document: Document) -> str:
    """``namespace/name`` of a namespaced document, ``name`` of a cluster-scoped one."""
    meta = document.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def seen_from(other: str, viewer: str) -> str:
    """How a status of the object keyed ``viewer`` names the object keyed ``other``: by its
    key in the same namespace (a tenant's own), else not at all (another tenant's objects are
    not its to see: the API answers them 404)."""
    same = other.rpartition("/")[0] == viewer.rpartition("/")[0]
    return other if same else "another tenant's slice"


def spec_of(document: Document) -> dict[str, Any]:
    """A document's spec as a mapping: ``{}`` when it has none, or another kind of value (an
    object the API server took without its schema, which parsing reports as invalid)."""
    spec = document.get("spec")
    return spec if isinstance(spec, dict) else {}


_CONTROL = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x20), *range(0x7F, 0xA0))
    if chr(code) not in "\t\n"
}


def printable(text: str) -> str:
    """``text`` with its control characters but tab and newline shown as ``\\xNN``: what a
    program printed, shown in a status message or a terminal, can no longer move the cursor,
    clear the screen, retitle the window or colour what follows (as kubectl shows them)."""
    return text.translate(_CONTROL)


def slice_entries(program: Document) -> list[dict[str, Any]]:
    """The entries of a program's ``spec.slices`` that are mappings: none when it is no list
    (a spec the API server took without its schema, which parsing reports as invalid)."""
    slices = spec_of(program).get("slices")
    return [item for item in slices if isinstance(item, dict)] if isinstance(slices, list) else []


def entry_name(entry: dict[str, Any], key: str) -> str | None:
    """A slice entry's ``name`` or ``virtualSliceName``: ``None`` unless a non-empty string."""
    value = entry.get(key)
    return value if isinstance(value, str) and value else None


def is_deleting(document: Document) -> bool:
    """Whether the document is being deleted (waiting for finalizers)."""
    return bool((document.get("metadata") or {}).get("deletionTimestamp"))


def generation(document: Document) -> int | None:
    return (document.get("metadata") or {}).get("generation")


def parse(document: Document) -> tuple[Model | None, str | None]:
    """The document's spec parsed with its model, or ``None`` and every problem in one line
    (``spec.devicesPerHost: ...; spec.topology: ...``). Status is not validated: it is ours."""
    checked = check_document({key: value for key, value in document.items() if key != "status"})
    if checked.resource is not None:
        return checked.resource, None
    return None, "; ".join(str(problem) for problem in checked.problems) or "invalid resource"


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with one condition set; its transition time changes only when
    its status does (so re-running a decision changes nothing)."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed_at = (
        previous.get("lastTransitionTime")
        if previous is not None and previous.get("status") == value
        else None
    ) or timestamp(now)
    condition = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": changed_at,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    if previous is None:
        return [*conditions, condition]
    # In place: the list keeps its order, so an unchanged condition leaves it equal.
    return [condition if c is previous else c for c in conditions]


def condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    """The condition of a type, if set."""
    return next((c for c in conditions if c.get("type") == type_), None)


def owner_reference(owner: Document) -> dict[str, Any]:
    """An ownerReference making ``owner`` the controller of a child (garbage-collected with
    it)."""
    meta = owner.get("metadata") or {}
    return {
        "apiVersion": owner.get("apiVersion"),
        "kind": owner.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def prune(value: Any) -> Any:
    """A status without ``None`` fields (a status is replaced whole, so absent means cleared)."""
    if isinstance(value, dict):
        return {key: prune(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [prune(item) for item in value]
    return value
