"""PathwaysProgram lifecycle: from a snapshot of a program, its VirtualSlices, its current Job
and the islands, decide its status, the children to create or delete, and Events.

Phases: Pending (waiting for slices or islands) -> Running (a Job runs the driver, or the graph
runner) -> Succeeded | Failed; Suspended while ``spec.suspend`` is set. Each run is one Job
named ``<program>-run-<n>``; ``status.runs`` counts them, so a reconcile that runs twice
finds the Job the first one created. Children are created before the status that mentions
them is written: a decision interrupted half-way is completed by the next one, and a Job made
for a run its status never recorded (the next decision saw an edited program) is deleted
before that run's name is used again, as is an earlier program's of the same name.

An edit of the spec is applied, not only observed: the restart policy, the restart limit and
the deadline at once; anything a run is made from (slices, driver or graph, steps, tenant,
priority, weight) by stopping the running run and starting the next from the new spec (as a
Deployment rolls out; not counted a restart), inline slices bound again first if theirs
changed. A run's Job deleted by someone else is a failed run.

A run whose Job failed while its slices were lost under it (preempted, a host its island reports
lost, bound again elsewhere) was interrupted, not failed: counted toward no restart limit, and
the next run starts once they are bound again. A driver whose executor died fails its Job at
once, while the executor's pod is reported unready a few readiness probes later: a failed run is
judged ``failure_grace`` seconds after its Job failed, so that the island's report comes first.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pathways_core.allocator import program_slice_name
from pathways_core.control.common import (
    ANNOTATION_CANCELLED,
    ANNOTATION_QUEUED_SINCE,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_PROGRAM,
    LABEL_RUN,
    MANAGER,
    Document,
    Event,
    ObjectRef,
    generation,
    is_deleting,
    owner_reference,
    parse,
    parse_time,
    printable,
    set_condition,
    spec_of,
    timestamp,
)
from pathways_core.control.security import harden
from pathways_core.resources import GROUP_VERSION, PathwaysProgram, VirtualSliceSpec
from pathways_core.resources.program import CHECKPOINT_VARIABLE
from pathways_core.topology import parse_shape
from pathways_core.wire.credentials import SessionGrant

COMPONENT = "program"
"""``pathways.dev/component`` of program pods: NetworkPolicies let them reach islands."""
GRAPH_KEY = "program.json"
GRAPH_MOUNT = "/etc/pathways"
# Where a driver's checkpointClaim is mounted.
CHECKPOINT_MOUNT = "/var/lib/pathways/checkpoints"
# Where a graph runner finds configMapKeyRef artifacts: <ConfigMap>/<key>, each ConfigMap of
# the program's namespace mounted read-only (beside the spec's mount, not inside it).
ARTIFACTS_MOUNT = "/etc/pathways-artifacts"
TERMINAL = ("Succeeded", "Failed")
# Long enough for an executor pod's readiness probes (every 2 s, 3 failures) and the island's
# status to report a host lost under a run whose driver failed on it at once.
FAILURE_GRACE_SECONDS = 10.0
# Why a slice stops being bound when its island loses a host, reported late: the run it held
# may have failed on that loss first.
HOST_LOSSES = ("HostUnhealthy", "IslandDeleted", "IslandResized")
REBOUND = "was bound again elsewhere"
# How soon a run whose Job's name a stray Job holds is tried again (its deletion is an
# event too; this is in case it is missed).
STRAY_RECHECK_SECONDS = 2.0
# How soon a program whose child's name another object holds looks again (that object's
# deletion is no event of the program's).
NAME_TAKEN_RECHECK_SECONDS = 15.0
MAX_RESTART_BACKOFF_SECONDS = 360.0
"""The longest a restart waits after its run failed (a Job's pod backoff is capped at 6 min)."""
RUN_SPEC_ANNOTATION = "pathways.dev/run-spec"
"""On a run's Job: the digest of the spec it was made from (:func:`run_spec_digest`)."""
LIVE_FIELDS = ("suspend", "restartPolicy", "maxRestarts", "activeDeadlineSeconds")
"""Spec fields applied to a running program without a new run."""


def run_spec_digest(program: PathwaysProgram) -> str:
    """Digest of what a run is made from: the spec but for :data:`LIVE_FIELDS`."""
    wire = {k: v for k, v in program.spec.to_wire().items() if k not in LIVE_FIELDS}
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()[:16]


def restart_backoff(restarts: int, failure_grace: float) -> float:
    """Seconds the ``restarts``-th restart waits once its failed run is judged (which is
    ``failure_grace`` after it failed): none for the first, then so that the n-th starts
    ``failure_grace`` x 2^(n-1) after its run failed, as a Job's pods back off (10 s, 20 s,
    40 s...), at most :data:`MAX_RESTART_BACKOFF_SECONDS`."""
    return min(failure_grace * (2 ** max(0, restarts - 1) - 1), MAX_RESTART_BACKOFF_SECONDS)


def job_name(program: str, run: int) -> str:
    """Name of the Job of a program's ``run``-th run (1-based)."""
    return f"{program}-run-{run}"


def graph_config_map_name(program: str) -> str:
    """Name of the ConfigMap holding a graph program's spec."""
    return f"{program}-graph"


def slice_names(program: PathwaysProgram) -> dict[str, str]:
    """The VirtualSlice behind each of the program's slices: inline slices get one named
    ``<program>-<slice>`` (created by the operator), others name an existing one."""
    name = program.metadata.name or ""
    return {
        item.name: item.virtual_slice_name or program_slice_name(name, item.name)
        for item in program.spec.slices
    }


@dataclass(frozen=True)
class ChildRef:
    """A child to delete; with ``owner``, only while the object of that uid owns it (a
    same-named object of the user's or of another owner stays)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    owner: str | None = None


@dataclass(frozen=True)
class ProgramView:
    """A program and what it depends on, as read from the store.

    ``slices`` maps each VirtualSlice name of :func:`slice_names` to its document (``None``
    when it does not exist); ``job`` is the Job of run ``status.runs`` (``None`` if absent);
    ``islands`` maps island names to documents (for scheduler endpoints); ``labelled`` maps
    the names of the VirtualSlices labelled with the program's name to their documents (its
    inline slices, also those its spec no longer names). ``jobs`` maps the names of Jobs
    labelled with the program's name to their documents: at least those of runs
    ``status.runs`` and ``status.runs + 1`` that exist (one made by a decision whose status
    was never stored, or by an earlier program of the name, is deleted before its name is
    used)."""

    program: Document
    slices: dict[str, Document | None] = field(default_factory=dict)
    job: Document | None = None
    islands: dict[str, Document] = field(default_factory=dict)
    labelled: dict[str, Document] = field(default_factory=dict)
    jobs: dict[str, Document] = field(default_factory=dict)


@dataclass(frozen=True)
class JobDeadline:
    """A new ``activeDeadlineSeconds`` for the running Job (``None``: none): the program's
    deadline was edited under it (a Job's deadline may change while it runs)."""

    job: ChildRef
    seconds: int | None


@dataclass
class ProgramDecision:
    """What to do: children to create (creating one that exists is fine), children to apply
    (created, or their ``spec``, a ConfigMap's ``data``, replaced when they exist), children
    to delete, the new status (``None``: unchanged) and Events. Children are created and
    applied before the status is written, and deleted after."""

    status: dict[str, Any] | None
    create: list[Document] = field(default_factory=list)
    apply: list[Document] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    deadline: JobDeadline | None = None
    # Decide again after this many seconds, even if nothing changes (a failed run's judgement).
    recheck_after: float | None = None


def refused_child(document: Document, child: Document, message: str) -> ProgramDecision:
    """The decision once the cluster refused to create or update a child of the program (its
    Job, an inline slice: a namespace's ResourceQuota, an admission webhook, the API server's
    own validation): nothing else is done and nothing counted (no run started), the program
    says why (reason ``ChildRefused``, and a Warning Event when the refusal is new), and its
    next reconcile tries again. Before, it waited for good, saying only what it was doing."""
    meta = child.get("metadata") or {}
    text = f"the cluster refused {child.get('kind')} {meta.get('name')}: {message}"
    return _not_made(document, "ChildRefused", text)


def child_name_taken(document: Document, child: Document, existing: Document) -> ProgramDecision:
    """The decision once a child the program makes under a name of its own (a run's Job, its
    graph's ConfigMap) exists already and is not the program's (the user's, another
    program's): it is never taken over, rewritten or deleted, nothing is counted (no run
    started), and the program says so (reason ``ChildNameTaken``) until the name is free.
    Before, a user's Job of a run's name was taken for the run (which then failed as deleted)
    and a user's ConfigMap of the graph's name was rewritten, then deleted."""
    meta = child.get("metadata") or {}
    text = (
        f"{child.get('kind')} {meta.get('name')} exists and is not this program's (it belongs "
        f"to {_controller(existing)}): the program needs that name; delete or rename that "
        f"{child.get('kind')}, or rename the program"
    )
    decision = _not_made(document, "ChildNameTaken", text)
    decision.recheck_after = NAME_TAKEN_RECHECK_SECONDS  # its deletion wakes no program
    return decision


def _not_made(document: Document, reason: str, text: str) -> ProgramDecision:
    """Nothing done: the program says why (a Warning Event when it is new)."""
    old = dict(document.get("status") or {})
    decision = ProgramDecision(status=None)
    if old.get("reason") != reason or old.get("message") != text:
        phase = old.get("phase") or "Pending"
        decision.status = {**old, "phase": phase, "reason": reason, "message": text}
        decision.events.append(Event(ObjectRef.of(document), "Warning", reason, text))
    return decision


def same_child(child: Document, existing: Document) -> bool:
    """Whether ``existing`` is ``child`` as made before (by an earlier decision of the same
    program): their controllers are one object."""
    wanted = _controller_ref(child)
    found = _controller_ref(existing)
    return wanted is not None and found is not None and wanted.get("uid") == found.get("uid")


def _controller_ref(document: Document) -> dict[str, Any] | None:
    references = (document.get("metadata") or {}).get("ownerReferences") or []
    return next((ref for ref in references if ref.get("controller")), None)


def _controller(document: Document) -> str:
    """Who controls ``document``, in words."""
    ref = _controller_ref(document)
    return f"{ref.get('kind')} {ref.get('name')}" if ref else "no program"


def _job_outcome(job: Document) -> tuple[str | None, str]:
    """``"Succeeded"``, ``"Failed"`` or ``None`` (still running), and a message."""
    status = job.get("status") or {}
    for item in status.get("conditions") or []:
        if item.get("status") != "True":
            continue
        # A condition's message may quote what the program printed last.
        if item.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded", printable(item.get("message") or "the Job completed")
        if item.get("type") in ("Failed", "FailureTarget"):
            detail = printable(item.get("message") or item.get("reason") or "")
            return "Failed", f"the Job failed{': ' + detail if detail else ''}"
    if (status.get("succeeded") or 0) >= 1:
        return "Succeeded", "the Job completed"
    if (status.get("failed") or 0) >= 1:
        return "Failed", "the Job's pod failed"
    return None, ""


def _deadline_exceeded(job: Document) -> bool:
    """Whether a Job failed for running past its ``activeDeadlineSeconds``: the Job controller
    of Kubernetes 1.31 and later says so first in ``FailureTarget`` (while the pod terminates),
    then in ``Failed``."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Failed", "FailureTarget")
        and c.get("status") == "True"
        and c.get("reason") == "DeadlineExceeded"
        for c in conditions
    )


def _failed_since(job: Document) -> datetime | None:
    """When the Job's failure condition was set (``None``: it does not say)."""
    for item in (job.get("status") or {}).get("conditions") or []:
        if item.get("type") in ("Failed", "FailureTarget") and item.get("status") == "True":
            return parse_time(item.get("lastTransitionTime"))
    return None


def _interruption(
    view: ProgramView,
    names: dict[str, str],
    job: Document | None,
    settings: dict[str, str],
    failed_since: datetime | None,
    grace: float,
) -> str | None:
    """Why a run that ended failed may have been ended by its slices rather than by its
    program: a slice preempted or released before it ended, or one its island lost a host
    under (reported within ``grace`` seconds after it ended, as a lost host is reported late):
    a slice no longer bound, bound on a host its island reports lost, on an island with no
    scheduler ready, or bound again elsewhere (its island restarted). ``None``: its slices were
    as the run found them (a loss after it ended, a suspension, a preemption, did not end it)."""

    def began_in_time(conditions: Any, kind: str, reported_late: bool) -> bool:
        began = _condition_time(conditions, kind)
        if failed_since is None or began is None:
            return True
        # In the second the run ended or before (timestamps are whole seconds), or, reported
        # late, within the grace after.
        return (began - failed_since).total_seconds() <= (grace if reported_late else 0.0)

    moved = _moved_slices(job, settings) if job is not None else {}
    for item, vs in names.items():
        document = view.slices.get(vs)
        if document is None:
            continue  # deleted by someone: not the island's doing
        status = document.get("status") or {}
        if status.get("phase") != "Bound":
            why = status.get("reason") or status.get("phase") or "not bound"
            if began_in_time(status.get("conditions"), "Bound", why in HOST_LOSSES):
                return f"its slice {item!r} was lost ({why})"
            continue
        island = (view.islands.get(status.get("island")) or {}).get("status") or {}
        trouble = _island_trouble(status, view.islands)
        if trouble and began_in_time(island.get("conditions"), "Degraded", True):
            return f"{trouble}, under its slice {item!r}"
        why = moved.get(item)
        if why is None:
            continue
        # Bound again elsewhere since it ended (a suspension, a preemption) did not end it; its
        # island restarted at a new endpoint (never for a program's failure) did.
        if why != REBOUND or began_in_time(status.get("conditions"), "Bound", True):
            return f"its slice {item!r} {why}"
    return None


def _condition_time(conditions: Any, kind: str) -> datetime | None:
    """When the condition ``kind`` last changed (``None``: not said)."""
    for item in conditions or []:
        if isinstance(item, dict) and item.get("type") == kind:
            return parse_time(item.get("lastTransitionTime"))
    return None


def _island_trouble(slice_status: dict[str, Any], islands: dict[str, Document]) -> str | None:
    """What is wrong with the island a bound slice is on, for its programs' runs: a host of
    the slice it reports lost, or no scheduler ready."""
    island = slice_status.get("island")
    status = (islands.get(island) or {}).get("status") or {}
    lost = sorted(set(slice_status.get("hosts") or ()) & set(status.get("unhealthyHosts") or ()))
    if lost:
        return f"island {island!r} lost host {', '.join(str(host) for host in lost)}"
    if not status.get("schedulerEndpoint"):
        return f"island {island!r} has no scheduler ready"
    return None


def _moved_slices(job: Document, wanted: dict[str, str]) -> dict[str, str]:
    """Slices the running Job was started on that are now bound elsewhere (another island,
    other devices), or whose island's scheduler answers at another endpoint (the island was
    restarted): its driver talks to devices its slices no longer hold, or to a scheduler gone.
    Each with what changed. A Job without the settings is never stale."""
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or [{}]
    env = {item.get("name"): item.get("value") for item in containers[0].get("env") or []}
    try:
        started = json.loads(env.get("PATHWAYS_SLICES") or "null")
        now = json.loads(wanted["PATHWAYS_SLICES"])
    except ValueError:
        return {}
    if not isinstance(started, dict):
        return {}
    changed = {}
    for name, entry in sorted(now.items()):
        before = started.get(name)
        if not isinstance(before, dict):
            continue
        if any(before.get(key) != entry.get(key) for key in ("island", "devices")):
            changed[name] = REBOUND
        elif before.get("scheduler") != entry.get("scheduler"):
            changed[name] = f"is on island {entry.get('island')!r}, restarted at a new endpoint"
    return changed


def _owned(program: Document, child: Document) -> bool:
    """Whether ``child`` was made by ``program`` (this program, not an earlier one of its
    name): its controller ownerReference carries the program's uid."""
    uid = (program.get("metadata") or {}).get("uid")
    references = (child.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(ref.get("uid") == uid for ref in references)


def _foreign(program: Document, child: Document) -> bool:
    """Whether ``child``'s controller is another object than ``program`` (an earlier program
    of its name, deleted, whose children the garbage collector has not removed yet)."""
    uid = (program.get("metadata") or {}).get("uid")
    controller = _controller_ref(child)
    return uid is not None and controller is not None and controller.get("uid") != uid


def _strays(
    program: Document, name: str, runs: int, jobs: dict[str, Document], adopt: str | None
) -> list[str]:
    """The Jobs of ``jobs`` that are no run of this program's now: an earlier program's of
    its name, one of a run the status never recorded (made by a decision whose status write
    failed, and left running on released slices), or an earlier run's still running; but
    ``adopt`` (see :func:`_unrecorded_run`)."""
    strays = []
    for job_name_, job in sorted(jobs.items()):
        if job_name_ == adopt:
            continue
        run = job_name_.removeprefix(f"{name}-run-")
        if not run.isdigit() or job_name_ == job_name(name, runs):
            if _foreign(program, job):
                strays.append(job_name_)
            continue
        active = _job_outcome(job)[0] is None
        if _foreign(program, job) or int(run) > runs or (active and not is_deleting(job)):
            strays.append(job_name_)
    return strays


def _unrecorded_run(view: ProgramView, program: PathwaysProgram | None) -> str | None:
    """The Job of the run after the recorded ones, if this program made it from its spec as
    it is and it runs: its decision's status write failed (a conflict), so the run the Job is
    was never recorded. The next decision to start that run takes it as made; any other
    deletes it. Before, it was deleted and made again at once: a driver killed at its start."""
    document = view.program
    if program is None:
        return None
    name = (document.get("metadata") or {}).get("name", "")
    runs = int((document.get("status") or {}).get("runs") or 0)
    job = view.jobs.get(job_name(name, runs + 1))
    if (
        job is None
        or not _owned(document, job)
        or _foreign(document, job)
        or is_deleting(job)
        or _job_outcome(job)[0] is not None
        or _stale(job, program)
        or not ((job.get("metadata") or {}).get("annotations") or {}).get(RUN_SPEC_ANNOTATION)
    ):
        return None
    return job_name(name, runs + 1)


def _stale(job: Document, program: PathwaysProgram) -> bool:
    """Whether the running Job was made from another spec than the program's now. A Job
    without the annotation (made before it existed) is never stale."""
    made_from = ((job.get("metadata") or {}).get("annotations") or {}).get(RUN_SPEC_ANNOTATION)
    return made_from is not None and made_from != run_spec_digest(program)


def _spec_differs(existing: Document, wanted: Document) -> bool:
    """Whether an inline slice's stored spec no longer says what the program's does, compared
    parsed: the defaults the API server fills in are no difference."""
    try:
        return VirtualSliceSpec.model_validate(
            existing.get("spec") or {}
        ) != VirtualSliceSpec.model_validate(wanted["spec"])
    except ValueError:
        return True


def _deadline_left(program: PathwaysProgram, status: dict[str, Any], now: datetime) -> float | None:
    """Seconds left of the program's ``activeDeadlineSeconds``, counted from its first run's
    start (``None``: no deadline)."""
    deadline = program.spec.active_deadline_seconds
    if deadline is None:
        return None
    started = parse_time(status.get("startTime"))
    return deadline - ((now - started).total_seconds() if started is not None else 0.0)


def _job_deadline(job: Document, program: PathwaysProgram, status: dict[str, Any]) -> int | None:
    """The ``activeDeadlineSeconds`` the running Job should have: what is left of the
    program's deadline at the Job's start (a Job counts its deadline from its own start)."""
    deadline = program.spec.active_deadline_seconds
    if deadline is None:
        return None
    program_start = parse_time(status.get("startTime"))
    job_start = parse_time((job.get("status") or {}).get("startTime"))
    if program_start is None or job_start is None:
        return deadline
    return max(1, int(deadline - (job_start - program_start).total_seconds()))


def _inline_slice(document: Document, program: PathwaysProgram, slice_name: str) -> Document:
    item = next(s for s in program.spec.slices if s.name == slice_name)
    # What the manifest says, not the defaults: the slice's own defaults apply.
    spec = item.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
    for key in ("name", "virtualSliceName"):
        spec.pop(key, None)
    if program.spec.tenant:
        spec["tenant"] = program.spec.tenant
    spec["priority"] = program.spec.priority
    meta = document["metadata"]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "VirtualSlice",
        "metadata": {
            "name": program_slice_name(meta["name"], slice_name),
            "namespace": meta.get("namespace"),
            "labels": {LABEL_PROGRAM: meta["name"], LABEL_MANAGED_BY: MANAGER},
            "annotations": {ANNOTATION_QUEUED_SINCE: meta.get("creationTimestamp") or ""},
            "ownerReferences": [owner_reference(document)],
        },
        "spec": spec,
    }


def connection_settings(
    program: PathwaysProgram, view: ProgramView, namespace: str
) -> dict[str, str]:
    """The SDK's connection settings, as the environment of the program's Job (see the
    contracts: PATHWAYS_PROGRAM, _TENANT, _PRIORITY, _WEIGHT and _SLICES)."""
    slices: dict[str, Any] = {}
    for item in program.spec.slices:
        name = slice_names(program)[item.name]
        status = (view.slices.get(name) or {}).get("status") or {}
        island = status.get("island")
        endpoint = ((view.islands.get(island) or {}).get("status") or {}).get("schedulerEndpoint")
        slice_document = view.slices.get(name) or {}
        shape = item.shape or spec_of(slice_document).get("shape")
        slices[item.name] = {
            "virtualSlice": name,
            "island": island,
            "scheduler": endpoint,
            "devices": list(status.get("devices") or []),
            "shape": list(parse_shape(shape)) if shape else None,
        }
    return {
        "PATHWAYS_PROGRAM": f"{namespace}/{program.metadata.name}",
        "PATHWAYS_TENANT": program.spec.tenant or namespace,
        "PATHWAYS_PRIORITY": str(program.spec.priority),
        "PATHWAYS_WEIGHT": str(program.spec.weight),
        "PATHWAYS_STEPS": str(program.spec.steps),
        "PATHWAYS_SLICES": json.dumps(slices, sort_keys=True),
    }


RUN_CREDENTIAL_SECONDS = 30 * 24 * 3600
"""How long a run's session credentials open sessions: checked at each hello only (a session
open lives on), so a run reconnecting to a restarted island within it is let in."""


def run_grants(environment: Mapping[str, str], now: float) -> list[SessionGrant]:
    """The session grants of a run started with ``environment`` (its Job's connection
    settings, :func:`connection_settings`): per island of its slices, its client name, tenant,
    weight and priority, and the devices its slices hold there; valid for
    :data:`RUN_CREDENTIAL_SECONDS` from ``now``. None without the settings (a Job not ours)."""
    try:
        slices = json.loads(environment.get("PATHWAYS_SLICES") or "{}")
        devices: dict[str, set[int]] = {}
        for entry in slices.values():
            devices.setdefault(entry["island"], set()).update(int(d) for d in entry["devices"])
        weight = int(environment.get("PATHWAYS_WEIGHT") or 1)
        priority = int(environment.get("PATHWAYS_PRIORITY") or 0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return []
    program = environment.get("PATHWAYS_PROGRAM") or ""
    tenant = environment.get("PATHWAYS_TENANT") or program.partition("/")[0]
    return [
        SessionGrant(
            island=island,
            client=island_client_name(program),
            tenant=tenant,
            weight=weight,
            priority=priority,
            devices=frozenset(held),
            expires=int(now) + RUN_CREDENTIAL_SECONDS,
        )
        for island, held in sorted(devices.items())
        if island and program
    ]


def island_client_name(program: str) -> str:
    """The island client name of a program's runs, from its ``namespace/name``
    (``PATHWAYS_PROGRAM``). An island owns a client's ids by the prefix ``<client>/``, so the
    '/' becomes a '.', which neither a namespace nor a program name may hold: with '-', tenant
    ``team``'s program ``a-x`` and tenant ``team-a``'s ``x`` were one client, sharing a trace
    and refusing each other's sessions."""
    return program.replace("/", ".")


def program_job(
    document: Document,
    program: PathwaysProgram,
    view: ProgramView,
    run: int,
    image: str,
    *,
    tls_secret: str | None = None,
    pull_secrets: Sequence[str] = (),
    deadline_seconds: int | None = None,
) -> Document:
    """The Job of one run (at most ``deadline_seconds`` long, if given): the driver's container
    (its image and command, or ``python -c`` for inline source), or the graph runner with the
    program's spec mounted, with the SDK's connection settings and ``PATHWAYS_RUN`` (the run's
    number) in its environment. The operator restarts runs itself, so the Job never retries.

    The pod is hardened like island pods (non-root user 65532, read-only root with writable
    ``/tmp`` and cache, no service account token) and mounts ``tls_secret`` when set: the
    Secret of that name in the program's own namespace (as are ``pull_secrets``, which pull
    its image). Commands in the Pathways image are ``args`` (its tini entrypoint runs them);
    a driver's own ``command`` replaces the entrypoint of its own image, as it says."""
    meta = document["metadata"]
    name, namespace = meta["name"], meta.get("namespace") or "default"
    # PATHWAYS_RUN: which attempt this is (1-based): a driver resumes from its checkpoint
    # when it is > 1.
    env = [{"name": "PATHWAYS_RUN", "value": str(run)}] + [
        {"name": key, "value": value}
        for key, value in connection_settings(program, view, namespace).items()
    ]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    driver = program.spec.driver
    container: dict[str, Any]
    if driver is not None:
        container = {"name": "driver", "image": driver.image or image}
        if driver.command:
            container.update(command=list(driver.command), args=list(driver.args))
        elif container["image"] == image:
            container["args"] = ["python", "-c", driver.source or "", *driver.args]
        else:
            # Inline source in another image: its entrypoint is unknown, run python directly.
            container.update(command=["python", "-c", driver.source or ""], args=list(driver.args))
        # Pathways' own variables last: they win over any of the same name (refused anyway).
        env = [variable.to_wire() for variable in driver.env] + env
        if driver.resources is not None:
            container["resources"] = driver.resources.to_wire()
        if driver.checkpoint_claim is not None:
            # A folder per program object (its uid): a program made again under a deleted
            # one's name must not resume from the old one's state.
            volumes.append(
                {
                    "name": "checkpoints",
                    "persistentVolumeClaim": {"claimName": driver.checkpoint_claim},
                }
            )
            mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
            folder = f"{CHECKPOINT_MOUNT}/{name}/{meta.get('uid') or 'unknown'}"
            env.append({"name": CHECKPOINT_VARIABLE, "value": folder})
    else:
        container = {
            "name": "graph",
            "image": image,
            "args": [
                "python",
                "-m",
                "pathways_client.run_graph",
                "--spec",
                f"{GRAPH_MOUNT}/{GRAPH_KEY}",
            ],
        }
        volumes.append({"name": "program", "configMap": {"name": graph_config_map_name(name)}})
        mounts.append({"name": "program", "mountPath": GRAPH_MOUNT, "readOnly": True})
        assert program.spec.graph is not None
        referenced = sorted(
            {
                function.config_map_key_ref.name
                for function in program.spec.graph.functions
                if function.config_map_key_ref is not None
            }
        )
        for index, config_map in enumerate(referenced):
            volume = f"artifacts-{index}"
            volumes.append({"name": volume, "configMap": {"name": config_map}})
            mounts.append(
                {"name": volume, "mountPath": f"{ARTIFACTS_MOUNT}/{config_map}", "readOnly": True}
            )
    container["env"] = env
    if mounts:
        container["volumeMounts"] = mounts
    labels = {
        "app.kubernetes.io/name": "pathways",
        LABEL_COMPONENT: COMPONENT,
        LABEL_PROGRAM: name,
        LABEL_RUN: str(run),
        LABEL_MANAGED_BY: MANAGER,
    }
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if volumes:
        pod_spec["volumes"] = volumes
    harden(pod_spec, tls_secret, pull_secrets)
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        # A pod evicted by a disruption (a node drained, preempted or lost) is not the
        # program's failure: the Job starts another, counting toward no restart limit, and
        # the driver resumes from its checkpoint (the embedded mode does the same at down).
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ]
        },
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = deadline_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name, run),
            "namespace": namespace,
            "labels": labels,
            "annotations": {RUN_SPEC_ANNOTATION: run_spec_digest(program)},
            "ownerReferences": [owner_reference(document)],
        },
        "spec": spec,
    }


def _graph_config_map(document: Document, program: PathwaysProgram) -> Document:
    meta = document["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": graph_config_map_name(meta["name"]),
            "namespace": meta.get("namespace"),
            "labels": {LABEL_PROGRAM: meta["name"], LABEL_MANAGED_BY: MANAGER},
            "ownerReferences": [owner_reference(document)],
        },
        "data": {GRAPH_KEY: json.dumps(program.spec.to_wire(), sort_keys=True)},
    }


def reconcile_program(
    view: ProgramView,
    now: datetime,
    image: str,
    *,
    tls_secret: str | None = None,
    pull_secrets: Sequence[str] = (),
    failure_grace: float = FAILURE_GRACE_SECONDS,
) -> ProgramDecision:
    """The next step of a program's lifecycle; see the module docstring. ``tls_secret`` and
    ``pull_secrets``: see :func:`program_job`; ``failure_grace``: seconds after its Job failed
    that a run is judged failed (if its Job says when it failed)."""
    parsed = parse(view.program)  # once (the spec validated), for both
    program = parsed[0] if isinstance(parsed[0], PathwaysProgram) else None
    adopt = _unrecorded_run(view, program)
    decision = _next_step(view, parsed, now, image, tls_secret, pull_secrets, failure_grace, adopt)
    if adopt is not None and not any(
        child.get("kind") == "Job" and child["metadata"]["name"] == adopt
        for child in decision.create
    ):
        namespace = (view.program.get("metadata") or {}).get("namespace") or "default"
        decision.delete.append(ChildRef("batch/v1", "Job", namespace, adopt))
    return decision


def _next_step(
    view: ProgramView,
    parsed: tuple[Any, str | None],
    now: datetime,
    image: str,
    tls_secret: str | None,
    pull_secrets: Sequence[str],
    failure_grace: float,
    adopt: str | None,
) -> ProgramDecision:
    """:func:`reconcile_program`'s decision (``parsed``: the program as :func:`parse` read
    it), the Job ``adopt`` left alone."""
    document = view.program
    meta = document.get("metadata") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace") or "default"
    old: dict[str, Any] = dict(document.get("status") or {})
    gen = generation(document)
    ref = ObjectRef.of(document)
    status: dict[str, Any] = {**old, "observedGeneration": gen}
    conditions = list(old.get("conditions") or [])
    decision = ProgramDecision(status=None)

    def finish(phase: str, reason: str | None, message: str, event_type: str = "Normal") -> None:
        status.update(phase=phase, reason=reason, message=message, conditions=conditions)
        if old.get("phase") != phase or old.get("reason") != reason:
            decision.events.append(Event(ref, event_type, reason or phase, message))
        comparable = ("phase", "reason", "message", "runs", "restarts", "slices")
        if any(status.get(k) != old.get(k) for k in comparable) or status.get(
            "conditions"
        ) != old.get("conditions"):
            decision.status = status

    program, problem = parsed
    if not isinstance(program, PathwaysProgram):
        # An edit the API server let through (only the model refuses it) makes a running
        # program invalid too: what it runs and holds goes (its Job went on, on devices
        # given to others).
        runs = int(old.get("runs") or 0)
        if view.job is not None and _job_outcome(view.job)[0] is None:
            decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
        for vs, child in sorted(view.labelled.items()):
            if _owned(document, child) and not is_deleting(child):
                decision.delete.append(ChildRef(GROUP_VERSION, "VirtualSlice", namespace, vs))
        conditions = set_condition(
            conditions, "Valid", False, "InvalidSpec", problem or "", now, gen
        )
        if old.get("phase") == "Running" or runs:
            conditions = set_condition(conditions, "Running", False, "InvalidSpec", "", now, gen)
        finish("Failed", "InvalidSpec", problem or "invalid spec", "Warning")
        return decision
    names = slice_names(program)
    inline = {names[s.name] for s in program.spec.slices if s.virtual_slice_name is None}
    runs, restarts = int(old.get("runs") or 0), int(old.get("restarts") or 0)
    status.update(runs=runs, restarts=restarts)
    status["slices"] = [
        {
            "name": item,
            "virtualSliceName": vs,
            **{
                key: value
                for key, value in (
                    ("phase", ((view.slices.get(vs) or {}).get("status") or {}).get("phase")),
                    ("island", ((view.slices.get(vs) or {}).get("status") or {}).get("island")),
                )
                if value
            },
        }
        for item, vs in names.items()
    ]

    def release_inline() -> None:
        # Inline slices live as long as the program needs devices; finished and suspended
        # programs give them back, and say so (they went on showing them Bound).
        nonlocal conditions
        held = {vs: view.slices.get(vs) for vs in inline} | view.labelled
        for vs, child in sorted(held.items()):
            if child is not None and _owned(document, child):
                decision.delete.append(ChildRef(GROUP_VERSION, "VirtualSlice", namespace, vs))
        status["slices"] = [
            {
                "name": item["name"],
                "virtualSliceName": item["virtualSliceName"],
                "phase": "Released",
            }
            if item["virtualSliceName"] in inline
            else item
            for item in status["slices"]
        ]
        conditions = set_condition(
            conditions, "SlicesReady", False, "Released", "the program holds no slices", now, gen
        )

    strays = _strays(document, name, runs, view.jobs, adopt)
    for stray in strays:
        if not is_deleting(view.jobs[stray]):
            decision.delete.append(ChildRef("batch/v1", "Job", namespace, stray))
    job = None if view.job is None or _foreign(document, view.job) else view.job
    outcome, outcome_message = _job_outcome(job) if job is not None else (None, "")
    if job is None and runs and old.get("phase") == "Running":
        # The status says the run runs but its Job is gone: deleted by someone else (a run
        # this function stops is recorded Pending, Suspended or Failed before its Job goes).
        outcome, outcome_message = "Failed", f"its Job {job_name(name, runs)} was deleted"
    failure = "JobFailed" if job is not None else "JobDeleted"
    job_active = job is not None and outcome is None

    if old.get("reason") == "InvalidSpec" and old.get("phase") == "Failed" and not runs:
        # It never ran, and its spec is valid now (it was edited): it starts as a new one
        # would. It stayed Failed for good, its status naming the old spec's problem.
        for key in ("phase", "reason", "message", "completionTime"):
            old.pop(key, None)
            status.pop(key, None)
        conditions = set_condition(conditions, "Valid", True, "Valid", "", now, gen)

    if old.get("phase") in TERMINAL:
        release_inline()
        finish(old["phase"], old.get("reason"), old.get("message") or "")
        return decision

    # Cancelled is suspended for good: whoever clears spec.suspend (kubectl edit, a client
    # other than the API, which refuses to resume it) does not start it again.
    cancelled = (meta.get("annotations") or {}).get(ANNOTATION_CANCELLED) == "true"

    def suspend() -> ProgramDecision:
        nonlocal conditions
        if job_active and job is not None:
            decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
        release_inline()
        if cancelled:
            reason = "Cancelled"
            message = (
                "cancelled: the program's slices are released for good (delete it to submit "
                "it again under its name)"
            )
        else:
            reason, message = "Suspended", "suspended: the program's slices are released"
        # As a suspended Job's: the deadline counts again from the next start.
        status.pop("startTime", None)
        conditions = set_condition(conditions, "Running", False, reason, message, now, gen)
        finish("Suspended", reason, message)
        return decision

    # A run that failed is judged before a suspension releases its slices (released, they
    # would make its failure look like their loss).
    unjudged = outcome == "Failed" and int(old.get("restartedRun") or 0) != runs
    if (program.spec.suspend or cancelled) and not unjudged:
        return suspend()

    def past_deadline() -> bool:
        left = _deadline_left(program, old, now)
        return left is not None and left <= 0

    def fail_past_deadline() -> ProgramDecision:
        nonlocal conditions
        status["completionTime"] = timestamp(now)
        release_inline()
        deadline = program.spec.active_deadline_seconds
        message = f"the program ran past its activeDeadlineSeconds ({deadline})"
        conditions = set_condition(conditions, "Running", False, "Failed", "", now, gen)
        conditions = set_condition(
            conditions, "Failed", True, "DeadlineExceeded", message, now, gen
        )
        finish("Failed", "DeadlineExceeded", message, "Warning")
        return decision

    # Runs that ended.
    if outcome == "Succeeded":
        status.update(completedSteps=program.spec.steps, completionTime=timestamp(now))
        release_inline()
        conditions = set_condition(conditions, "Running", False, "Succeeded", "", now, gen)
        conditions = set_condition(
            conditions, "Succeeded", True, "JobSucceeded", outcome_message, now, gen
        )
        finish("Succeeded", "JobSucceeded", f"run {runs}: {outcome_message}")
        return decision
    retry = False
    if outcome == "Failed" and not unjudged:
        # Judged when it was first seen (a restart counted, or an interruption): the next run
        # waits for its slices.
        retry = True
    elif unjudged:
        if job is not None and _deadline_exceeded(job):
            # The program's deadline, not a run's: the same ending whoever saw it first.
            return fail_past_deadline()
        failed_since = _failed_since(job) if job is not None else None
        interrupted = _interruption(
            view,
            names,
            job,
            connection_settings(program, view, namespace),
            failed_since,
            failure_grace,
        )
        judged_in = (
            0.0 if failed_since is None else failure_grace - (now - failed_since).total_seconds()
        )
        if interrupted is not None:
            # As a pod evicted by a disruption: not the program's failure, and no restart.
            status.update(restartedRun=runs)
            retry = True
            decision.events.append(
                Event(
                    ref,
                    "Warning",
                    "RunInterrupted",
                    f"run {runs} ended as {interrupted}: not counted a failure; the next run "
                    "starts once its slices are bound again",
                )
            )
        elif judged_in > 0:
            # Its islands may not have reported yet a host lost under it: judged later.
            decision.recheck_after = judged_in
            finish(
                "Running",
                "RunEnded",
                f"run {runs} ended ({outcome_message}); judged in {math.ceil(judged_in)} s, "
                "once its islands have reported on their hosts",
            )
            return decision
        elif past_deadline():
            return fail_past_deadline()  # no restart said, nor counted, for a run that cannot be
        elif (
            program.spec.restart_policy.value == "OnFailure"
            and restarts < program.spec.max_restarts
        ):
            restarts += 1
            backoff = restart_backoff(restarts, failure_grace)
            status.update(restarts=restarts, restartedRun=runs)
            if backoff:
                status["nextRunTime"] = timestamp(now + timedelta(seconds=backoff))
            retry = True
            decision.events.append(
                Event(
                    ref,
                    "Warning",
                    "Restarting",
                    f"run {runs} failed ({outcome_message}); restart {restarts} of "
                    f"{program.spec.max_restarts}" + (f", in {backoff:g} s" if backoff else ""),
                )
            )
        else:
            status["completionTime"] = timestamp(now)
            release_inline()
            conditions = set_condition(conditions, "Running", False, "Failed", "", now, gen)
            conditions = set_condition(
                conditions, "Failed", True, failure, outcome_message, now, gen
            )
            limit = (
                f", after {restarts} restarts"
                if program.spec.restart_policy.value == "OnFailure"
                else ""
            )
            finish("Failed", failure, f"run {runs}{limit}: {outcome_message}", "Warning")
            return decision

    if program.spec.suspend or cancelled:
        return suspend()
    deadline_left = _deadline_left(program, old, now)
    if job_active and not retry and deadline_left is not None and deadline_left <= 0:
        # A deadline shortened under the running run: its Job's own is longer.
        decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
        return fail_past_deadline()
    if job_active and not retry and job is not None:
        # Edited (extended, removed, shortened): the Job's own deadline follows. Timestamps
        # are whole seconds: a second or two apart is the same deadline.
        have = (job.get("spec") or {}).get("activeDeadlineSeconds")
        want = _job_deadline(job, program, old)
        if (have is None) != (want is None) or (
            have is not None and want is not None and abs(have - want) > 2
        ):
            ref = ChildRef("batch/v1", "Job", namespace, job_name(name, runs))
            decision.deadline = JobDeadline(ref, want)

    # Inline slices the spec no longer names (renamed, removed) go.
    for vs, child in sorted(view.labelled.items()):
        if vs not in inline and _owned(document, child) and not is_deleting(child):
            decision.delete.append(ChildRef(GROUP_VERSION, "VirtualSlice", namespace, vs))

    # Slices: create the inline ones, check the others exist and every one is bound.
    waiting: list[str] = []
    missing: list[str] = []
    taken: list[str] = []
    for item, vs in names.items():
        slice_document = view.slices.get(vs)
        if slice_document is None:
            if vs in inline:
                decision.create.append(_inline_slice(document, program, item))
                waiting.append(f"{item}: creating VirtualSlice {vs}")
            else:
                missing.append(f"{item}: VirtualSlice {vs!r} not found in namespace {namespace}")
            continue
        if vs in inline and not _owned(document, slice_document):
            # Another program's inline slice of the same name (program a's b-main is program
            # a-b's main), or a user's: never taken over, rewritten or deleted.
            taken.append(
                f"{item}: VirtualSlice {vs} exists and is not this program's (it belongs to "
                f"{_controller(slice_document)}): rename the slice, or use it with "
                "virtualSliceName"
            )
            continue
        if vs in inline and not is_deleting(slice_document):
            wanted = _inline_slice(document, program, item)
            if _spec_differs(slice_document, wanted):
                decision.apply.append(wanted)
                waiting.append(f"{item}: VirtualSlice {vs} is bound again for the new spec")
                continue
        slice_status = slice_document.get("status") or {}
        if slice_status.get("observedGeneration") not in (None, generation(slice_document)):
            waiting.append(f"{item}: VirtualSlice {vs}'s new spec is not bound yet")
            continue
        if slice_status.get("phase") != "Bound":
            why = slice_status.get("reason") or slice_status.get("phase") or "not bound yet"
            detail = slice_status.get("message")
            waiting.append(f"{item}: {why}{' (' + detail + ')' if detail else ''}")
            continue
        trouble = _island_trouble(slice_status, view.islands)
        if trouble:
            waiting.append(f"{item}: {trouble}")
    missing += taken
    ready = not waiting and not missing

    if job_active and not retry and job is not None and _stale(job, program):
        decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
        message = (
            f"run {runs} stopped: the spec changed (generation {gen}); the next run starts from it"
        )
        conditions = set_condition(conditions, "Running", False, "SpecChanged", message, now, gen)
        finish("Pending", "SpecChanged", message)
        return decision

    if job_active and not retry and ready and job is not None:
        moved = _moved_slices(job, connection_settings(program, view, namespace))
        if moved:
            # Released and bound again elsewhere between two looks (a lost host or island):
            # the run is stopped and the next one starts on the new binding at once.
            decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
            said = "; ".join(f"slice {slice_name!r} {why}" for slice_name, why in moved.items())
            message = f"run {runs} stopped: {said}; the next run starts on its slices as they are"
            conditions = set_condition(
                conditions, "Running", False, "SlicesMoved", message, now, gen
            )
            finish("Pending", "SlicesMoved", message, "Warning")
            return decision

    if job_active and not retry:
        if ready:
            conditions = set_condition(conditions, "SlicesReady", True, "Bound", "", now, gen)
            finish("Running", "Running", f"run {runs} runs as Job {job_name(name, runs)}")
            return decision
        # A slice was preempted or released under the running program: stop the run and wait.
        decision.delete.append(ChildRef("batch/v1", "Job", namespace, job_name(name, runs)))
        message = "; ".join(missing + waiting)
        conditions = set_condition(
            conditions, "SlicesReady", False, "SlicesLost", message, now, gen
        )
        conditions = set_condition(conditions, "Running", False, "SlicesLost", message, now, gen)
        finish("Pending", "SlicesLost", f"run {runs} stopped: {message}", "Warning")
        return decision

    if (missing or waiting) and old.get("startTime") and deadline_left is not None:
        # The deadline counts while a started program waits for its slices, as a Job's counts
        # while its pods are pending: it waited past it for ever, Pending, with no recheck.
        if deadline_left <= 0:
            return fail_past_deadline()
        decision.recheck_after = min(decision.recheck_after or deadline_left, deadline_left)
    if missing:
        message = "; ".join(missing)
        reason = "SliceNameTaken" if taken else "VirtualSliceNotFound"
        conditions = set_condition(conditions, "SlicesReady", False, reason, message, now, gen)
        finish("Pending", reason, message, "Warning")
        return decision
    if waiting:
        message = "; ".join(waiting)
        conditions = set_condition(
            conditions, "SlicesReady", False, "WaitingForSlices", message, now, gen
        )
        finish("Pending", "WaitingForSlices", message)
        return decision

    # Every slice is bound on an island whose scheduler answers: start the next run, with what
    # is left of the program's deadline.
    if deadline_left is not None and deadline_left <= 0:
        return fail_past_deadline()
    run = runs + 1
    next_run = parse_time(status.get("nextRunTime"))
    if next_run is not None and next_run > now:
        # A restart backs off, as a Job's pods do: a crash-looping driver was started again
        # every failure grace for as many restarts as it was allowed.
        wait = (next_run - now).total_seconds()
        if deadline_left is not None:
            wait = min(wait, deadline_left)
        decision.recheck_after = wait
        message = (
            f"run {run} starts at {timestamp(next_run)}: restart {restarts} backs off after "
            f"run {runs} failed"
        )
        conditions = set_condition(conditions, "Running", False, "BackOff", message, now, gen)
        finish("Pending", "BackOff", message)
        return decision
    status.pop("nextRunTime", None)
    if job_name(name, run) in strays:
        # Created now, it would be that Job: the next decision, once it is gone, makes it.
        message = (
            f"Job {job_name(name, run)} of no run of this program (an earlier program of its "
            f"name, or a run never recorded) is being deleted; run {run} starts once it is gone"
        )
        decision.recheck_after = STRAY_RECHECK_SECONDS
        finish("Pending", "StaleJob", message)
        return decision
    if program.spec.graph is not None:
        decision.apply.append(_graph_config_map(document, program))
    elif runs:  # edited from a graph to a driver: its graph goes (if it made it)
        config_map = graph_config_map_name(name)
        uid = (document.get("metadata") or {}).get("uid")
        decision.delete.append(ChildRef("v1", "ConfigMap", namespace, config_map, owner=uid))
    decision.create.append(
        program_job(
            document,
            program,
            view,
            run,
            image,
            tls_secret=tls_secret,
            pull_secrets=pull_secrets,
            deadline_seconds=None if deadline_left is None else max(1, int(deadline_left)),
        )
    )
    status.update(runs=run)
    status.setdefault("startTime", timestamp(now))
    if not status.get("startTime"):
        status["startTime"] = timestamp(now)
    conditions = set_condition(conditions, "SlicesReady", True, "Bound", "", now, gen)
    conditions = set_condition(
        conditions, "Running", True, "JobCreated", f"Job {job_name(name, run)}", now, gen
    )
    recorded = len(decision.events)
    finish("Running", "Running", f"run {run} runs as Job {job_name(name, run)}")
    if len(decision.events) == recorded:  # a restart: finish() saw no transition
        decision.events.append(Event(ref, "Normal", "Running", f"run {run} started"))
    return decision
