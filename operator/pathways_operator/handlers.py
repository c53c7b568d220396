"""kopf handlers: thin shells that read a snapshot, call a decision of
``pathways_core.control`` and apply it.

Every handler is idempotent and level-triggered: it reads the current objects, never trusts
the event that woke it, and writes only what differs. Children have deterministic names, so a
handler that runs twice finds what the first one created. Daemons reconcile islands and
programs again every ``PATHWAYS_RESYNC_SECONDS`` in case an event was missed, and run a
binding pass when a slice's lease runs out.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import kopf

from pathways_core.allocator import program_slice_name
from pathways_core.control import (
    LABEL_ISLAND,
    LABEL_PROGRAM,
    IslandObservation,
    ProgramDecision,
    ProgramView,
    child_name_taken,
    executor_name,
    external_endpoint,
    graph_config_map_name,
    is_deleting,
    island_children,
    island_status,
    job_name,
    parse,
    reconcile_program,
    refused_child,
    same_child,
    scheduler_name,
    slice_names,
)
from pathways_core.control.common import (
    ANNOTATION_SPEC_HASH,
    FINALIZER,
    LABEL_COMPONENT,
    Event,
    entry_name,
    now_utc,
    prune,
    slice_entries,
)
from pathways_core.control.islands import (
    control_secret_name,
    control_token_secret,
    executor_revision,
    pod_troubles,
    ready_host_indexes,
    scheduler_replicas_ready,
    stale_executor_pods,
)
from pathways_core.control.programs import run_grants
from pathways_core.control.slices import held_slices
from pathways_core.resources import Island, PathwaysProgram
from pathways_core.wire.credentials import (
    SESSION_CREDENTIALS_ENV,
    credentials_text,
    island_key,
    sign,
)
from pathways_operator import metrics
from pathways_operator.binder import Binder
from pathways_operator.config import Config
from pathways_operator.kube import ApiError, Kube, credentials

GROUP, VERSION = "pathways.dev", "v1alpha1"
GV = f"{GROUP}/{VERSION}"
# At least a second: a zero interval would spin.
MIN_RESYNC_SECONDS = 1.0
# How long a cancelled resync daemon may take to end (its reconcile's requests aborted).
CANCEL_SECONDS = 5.0
# An island's control-token Secret is created again (a 409 while it exists: the operator may
# not read Secrets) this long after it was last made or found: once a reconcile, a Secret
# create went through admission and the audit log every resync of every island.
CONTROL_SECRET_RECHECK_SECONDS = 600.0

logger = logging.getLogger(__name__)


# -- operator lifecycle ----------------------------------------------------------------------


@kopf.on.login()
def login(settings: kopf.OperatorSettings, logger: Any, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own watches use the same credentials as the operator's client."""
    return credentials(settings, logger)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    """Settings, the API client, the binding loop and the metrics endpoint."""
    # Our finalizer and bookkeeping live in our API group.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Our own Events say what happened; kopf's would repeat each handler's success.
    settings.posting.level = logging.WARNING
    try:
        config = Config.from_environment()
    except ValueError as error:  # permanent: the operator stops, saying which setting
        raise kopf.PermanentError(str(error)) from None
    if not settings.peering.standalone and not settings.peering.priority:
        # kopf freezes every replica when two share the highest priority: without --priority,
        # each replica takes a random one, so exactly one serves and the others stand by.
        settings.peering.priority = secrets.randbelow(2**30) + 1
    settings.peering.lifetime = config.peering_lifetime_seconds
    memo.config = config
    memo.kube = Kube(lambda: credentials(settings, logger))
    memo.binder = Binder(memo.kube, config)
    # Held while a reconcile holds or awaits one: deleted objects' locks go with them.
    memo.locks = weakref.WeakValueDictionary()
    memo.seen = {}
    memo.control_secrets = {}  # Secret name -> when it was last made or found (monotonic)
    memo.metrics_server = metrics.serve(config.metrics_port)
    memo.stopping = asyncio.Event()
    memo.rechecks = {}  # program -> the timer of its next look (see _recheck)
    memo.recheck_tasks = set()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the resync daemons; close connections and the metrics endpoint."""
    memo.stopping.set()
    for timer in memo.rechecks.values():
        timer.cancel()
    await memo.binder.close()
    await memo.kube.close()
    if memo.metrics_server is not None:
        memo.metrics_server.shutdown()
        memo.metrics_server.server_close()


def _lock(memo: kopf.Memo, key: str) -> asyncio.Lock:
    # One reconcile of an object at a time: events of its children, its slices and its
    # timer all funnel here.
    return memo.locks.setdefault(key, asyncio.Lock())


async def _post(memo: kopf.Memo, events: Iterable[Event]) -> None:
    for event in events:
        try:
            await memo.kube.post_event(event)
        except ApiError as error:
            logger.warning("could not record event %s: %s", event.reason, error)


async def _guard(resource: str, work: Any) -> None:
    """Run a reconcile; count and log its failure (the next event or resync retries)."""
    try:
        await work
    except Exception as error:  # a bug or an outage must not stop other reconciles
        metrics.RECONCILE_ERRORS.labels(resource).inc()
        logger.warning(
            "%s reconcile failed, retried on the next event or resync: %s",
            resource,
            error,
            exc_info=not isinstance(error, ApiError),
        )


# -- indexes ---------------------------------------------------------------------------------


@kopf.index(GROUP, VERSION, "pathwaysprograms")
def program_refs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, str]:
    """(namespace, VirtualSlice name) -> programs naming that existing slice."""
    return {
        (namespace, slice_name): name
        for item in slice_entries(body)
        if (slice_name := entry_name(item, "virtualSliceName"))
    }


@kopf.index(GROUP, VERSION, "virtualslices")
def slices_on_island(
    namespace: str, name: str, labels: Any, status: Any, **_: Any
) -> dict[str, Any] | None:
    """island -> (namespace, slice, owning program) of the slices bound on it."""
    island = status.get("island")
    return {island: (namespace, name, labels.get(LABEL_PROGRAM))} if island else None


def _programs_of_slice(
    namespace: str, name: str, owner: str | None, program_refs: kopf.Index
) -> set[str]:
    programs = set(program_refs.get((namespace, name), []))
    if owner:
        programs.add(owner)
    return programs


# -- islands ---------------------------------------------------------------------------------


async def reconcile_island(memo: kopf.Memo, name: str) -> None:
    """Create or update the island's children and write its status once."""
    kube: Kube = memo.kube
    namespace = memo.config.namespace
    async with _lock(memo, f"island/{name}"):
        document = await kube.get(GV, "Island", None, name)
        if document is None or is_deleting(document):
            return
        island, problem = parse(document)
        observed = IslandObservation()
        if isinstance(island, Island) and external_endpoint(document) is None:
            found: dict[str, dict[str, Any]] = {}
            control_secret = None
            if memo.config.control_tokens:
                # Created before the pods that read it; an existing one is kept (409), since
                # running executors hold its token. The token drawn here is never logged.
                master = memo.config.session_master_key
                uid = str((document.get("metadata") or {}).get("uid") or "")
                session_key = island_key(master, uid) if master is not None and uid else None
                secret = control_token_secret(
                    document, namespace, secrets.token_urlsafe(32), session_key
                )
                control_secret = secret["metadata"]["name"]
                made = memo.control_secrets.get(control_secret)
                if made is None or time.monotonic() - made > CONTROL_SECRET_RECHECK_SECONDS:
                    await kube.create(secret)
                    memo.control_secrets[control_secret] = time.monotonic()
            children = island_children(
                document,
                island,
                namespace,
                tls_secret=memo.config.tls_secret,
                control_secret=control_secret,
                pull_secrets=memo.config.image_pull_secrets,
                session_keys=memo.config.session_master_key is not None,
            )
            try:
                for child in children:
                    found[child["kind"]] = await _apply_child(kube, child)
            except ApiError as error:
                if error.status not in REFUSALS:
                    raise
                # Said in the island's status (the spec is at fault, retrying will not help);
                # what runs already keeps running.
                meta = child["metadata"]
                observed = IslandObservation(
                    refused=f"the API server refused {child['kind']} {meta['name']}: {error}"
                )
            else:
                observed = await _observe_island(kube, namespace, name, found)
        decision = island_status(
            document,
            island if isinstance(island, Island) else None,
            problem,
            observed,
            namespace,
            now_utc(),
        )
        old = document.get("status") or {}
        if any(old.get(key) != value for key, value in decision.status.items()):
            await kube.patch(
                GV, "Island", None, name, {"status": decision.status}, subresource="status"
            )
        await _post(memo, decision.events)


async def _observe_island(
    kube: Kube, namespace: str, name: str, found: dict[str, dict[str, Any]]
) -> IslandObservation:
    """The island's readiness from its children and pods, counting only executor pods of
    their latest template (pods of an older one are deleted, all together, so the hosts start
    again as one JAX group), and why pods are stuck, if they are."""
    statefulset = found["StatefulSet"]
    revision = executor_revision(statefulset)
    every = await kube.list("v1", "Pod", namespace, label_selector=f"{LABEL_ISLAND}={name}")
    pods = [
        p for p in every if (p["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == "executor"
    ]
    stale = stale_executor_pods(pods, revision)
    if stale:
        logger.info("island %s: restarting executors %s on their new template", name, stale)
        for pod in stale:
            await kube.delete("v1", "Pod", namespace, pod)
    return IslandObservation(
        scheduler_ready=scheduler_replicas_ready(found["Deployment"]),
        executors_ready=int((statefulset.get("status") or {}).get("readyReplicas") or 0),
        ready_hosts=ready_host_indexes(pods, revision),
        troubles=pod_troubles(every),
    )


def _drifted(existing: dict[str, Any], child: dict[str, Any]) -> bool:
    """Whether someone edited what the operator owns of a child since it wrote it (``kubectl
    scale``, ``kubectl set image``): its replicas, or its containers' images and commands.
    (The rest of a stored spec differs anyway: the API server fills in defaults.)"""

    def owned(document: dict[str, Any]) -> tuple[Any, ...]:
        spec = document.get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        containers = tuple(
            (c.get("name"), c.get("image"), c.get("command"), c.get("args"))
            for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
        )
        return spec.get("replicas"), containers

    return owned(existing) != owned(child)


async def _apply_child(kube: Kube, child: dict[str, Any]) -> dict[str, Any]:
    """Create a child, or replace its spec when its content hash differs."""
    meta = child["metadata"]
    api_version, kind, namespace, name = (
        child["apiVersion"],
        child["kind"],
        meta["namespace"],
        meta["name"],
    )
    existing = await kube.get(api_version, kind, namespace, name)
    if existing is None:
        return (
            await kube.create(child) or await kube.get(api_version, kind, namespace, name) or child
        )
    wanted = meta["annotations"][ANNOTATION_SPEC_HASH]
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
    if have == wanted and not _drifted(existing, child):
        return existing
    operations = [
        {"op": "replace", "path": "/spec", "value": child["spec"]},
        {"op": "add", "path": "/metadata/labels", "value": meta["labels"]},
        {"op": "add", "path": "/metadata/ownerReferences", "value": meta["ownerReferences"]},
    ]
    if not (existing.get("metadata") or {}).get("annotations"):
        operations.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    operations.append(
        {
            "op": "add",
            "path": "/metadata/annotations/" + ANNOTATION_SPEC_HASH.replace("/", "~1"),
            "value": wanted,
        }
    )
    return await kube.patch(api_version, kind, namespace, name, operations, json_patch=True)


@kopf.on.event(GROUP, VERSION, "islands")
async def island_event(
    type: str | None,
    body: kopf.Body,
    name: str,
    memo: kopf.Memo,
    slices_on_island: kopf.Index,
    program_refs: kopf.Index,
    **_: Any,
) -> None:
    """Reconcile the island; rebind when its devices may have changed; wake the programs on
    it when its scheduler endpoint changes."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    if type != "DELETED":
        await _guard("island", reconcile_island(memo, name))
    shape = (
        meta.get("generation"),
        dict(meta.get("labels") or {}),
        meta.get("deletionTimestamp"),
        tuple(status.get("unhealthyHosts") or ()),
    )
    if type == "DELETED" or memo.seen.get(f"island/{name}") != shape:
        memo.seen[f"island/{name}"] = shape
        await _guard("binding", memo.binder.sync())
    endpoint = status.get("schedulerEndpoint")
    if memo.seen.get(f"island-endpoint/{name}") != endpoint:
        memo.seen[f"island-endpoint/{name}"] = endpoint
        for namespace, slice_name, owner in list(slices_on_island.get(name, [])):
            for program in _programs_of_slice(namespace, slice_name, owner, program_refs):
                await _guard("program", reconcile(memo, namespace, program))


@kopf.on.event("apps", "v1", "deployments", labels={LABEL_ISLAND: kopf.PRESENT})
async def scheduler_event(labels: Any, memo: kopf.Memo, **_: Any) -> None:
    """The scheduler's readiness changes the island's status."""
    await _guard("island", reconcile_island(memo, labels[LABEL_ISLAND]))


@kopf.on.event("apps", "v1", "statefulsets", labels={LABEL_ISLAND: kopf.PRESENT})
async def executors_event(labels: Any, memo: kopf.Memo, **_: Any) -> None:
    """Executor readiness changes the island's status."""
    await _guard("island", reconcile_island(memo, labels[LABEL_ISLAND]))


def _resync_interval(memo: kopf.Memo) -> float:
    # The operator's settings of this start (not of import time: the module may be imported
    # long before the operator runs).
    return max(memo.config.resync_seconds, MIN_RESYNC_SECONDS)


async def _resync_due(memo: kopf.Memo) -> bool:
    """Wait one resync interval; ``False`` once the operator is stopping."""
    try:
        await asyncio.wait_for(memo.stopping.wait(), _resync_interval(memo))
    except TimeoutError:
        return True
    return False


async def _resync(memo: kopf.Memo, work: Callable[[], Awaitable[None]]) -> None:
    """``work`` every resync interval until the operator stops or kopf cancels the daemon."""
    try:
        while await _resync_due(memo):
            await work()
    except asyncio.CancelledError:
        # How kopf stops a daemon: its object was deleted, a peer took over, or the operator
        # stops. Ended here, it is not logged as a warning for every object.
        return


# Resyncs are daemons rather than kopf timers: a daemon is cancelled when its object is
# deleted or the operator pauses for a peer. (With a cancellation timeout of 0 kopf would not
# cancel a deleted object's daemon but leave it running, orphaned, for as long as the operator
# runs.)
@kopf.daemon(GROUP, VERSION, "islands", cancellation_timeout=CANCEL_SECONDS)
async def island_resync(name: str, memo: kopf.Memo, **_: Any) -> None:
    """Periodic reconcile and binding pass, in case an event was missed: one pass per interval
    for the whole cluster, not one per island (a pass reads every island, slice and program)."""

    async def work() -> None:
        await _guard("island", reconcile_island(memo, name))
        # A pass less than half an interval old will do: islands' resyncs are spread over
        # the interval, and each would otherwise run a pass of its own.
        await _guard("binding", memo.binder.sync(fresher_than=_resync_interval(memo) / 2))

    await _resync(memo, work)


@kopf.daemon(GROUP, VERSION, "islands", cancellation_timeout=CANCEL_SECONDS)
async def lease_expiries(memo: kopf.Memo, **_: Any) -> None:
    """A binding pass at each lease's expiry, which the binder's last plan gives: in daemons,
    so that a replica paused for a peer runs none (kopf cancels them; a loop timer ran on,
    releasing and binding beside the leader). One per island, their passes coalesce; a
    failed pass is tried again with a backoff, not left to the resync."""
    failures = 0
    try:
        while not memo.stopping.is_set():
            await memo.binder.expiry_due()
            try:
                await memo.binder.sync()
            except Exception:
                failures += 1
                logger.exception("binding pass at a lease's expiry failed; trying again")
                await asyncio.sleep(min(2.0**failures, _resync_interval(memo)))
            else:
                failures = 0
    except asyncio.CancelledError:
        return  # the island went, the operator pauses for a peer or stops


@kopf.on.delete(GROUP, VERSION, "islands")
async def island_deleted(name: str, memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    """Delete the island's pods (also owned by it, for clusters that garbage-collect) and
    rebind its slices elsewhere (they are preempted with reason IslandDeleted)."""
    kube: Kube = memo.kube
    namespace = memo.config.namespace
    for api_version, kind, child in (
        ("apps/v1", "Deployment", scheduler_name(name)),
        ("v1", "Service", scheduler_name(name)),
        ("apps/v1", "StatefulSet", executor_name(name)),
        ("v1", "Service", executor_name(name)),
    ):
        await kube.delete(api_version, kind, namespace, child)
    memo.control_secrets.pop(control_secret_name(body), None)  # (the Secret goes with it)
    await memo.binder.sync()


# -- virtual slices --------------------------------------------------------------------------


@kopf.on.event(GROUP, VERSION, "virtualslices")
async def slice_event(
    type: str | None,
    body: kopf.Body,
    namespace: str,
    name: str,
    labels: Any,
    memo: kopf.Memo,
    program_refs: kopf.Index,
    **_: Any,
) -> None:
    """Bind new, changed and deleted slices; wake the programs that use the slice."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    if (
        type == "DELETED"
        or meta.get("deletionTimestamp")
        or not status.get("phase")
        or status.get("observedGeneration") != meta.get("generation")
    ):
        await _guard("binding", memo.binder.sync())
    for program in _programs_of_slice(namespace, name, labels.get(LABEL_PROGRAM), program_refs):
        await _guard("program", reconcile(memo, namespace, program))


@kopf.on.delete(GROUP, VERSION, "virtualslices")
async def slice_deleted(memo: kopf.Memo, **_: Any) -> None:
    """The finalizer: the slice's devices are released (status Released) before it goes."""
    await memo.binder.sync()


# -- programs --------------------------------------------------------------------------------


async def reconcile(memo: kopf.Memo, namespace: str, name: str) -> None:
    """Read a program and what it depends on, decide, apply: children first, then status."""
    kube: Kube = memo.kube
    async with _lock(memo, f"program/{namespace}/{name}"):
        for _attempt in range(3):
            document = await kube.get(GV, "PathwaysProgram", namespace, name)
            if document is None or is_deleting(document):
                return
            program, _ = parse(document)
            slices: dict[str, Any] = {}
            islands: dict[str, Any] = {}
            if isinstance(program, PathwaysProgram):
                for vs in slice_names(program).values():
                    slices[vs] = await kube.get(GV, "VirtualSlice", namespace, vs)
                    island = ((slices[vs] or {}).get("status") or {}).get("island")
                    if island and island not in islands:
                        islands[island] = await kube.get(GV, "Island", None, island)
            runs = int((document.get("status") or {}).get("runs") or 0)
            mine = f"{LABEL_PROGRAM}={name}"
            jobs = {
                job["metadata"]["name"]: job
                for job in await kube.list("batch/v1", "Job", namespace, label_selector=mine)
            }
            labelled = await kube.list(GV, "VirtualSlice", namespace, label_selector=mine)
            view = ProgramView(
                document,
                slices,
                jobs.get(job_name(name, runs)) if runs else None,
                {k: v for k, v in islands.items() if v is not None},
                {item["metadata"]["name"]: item for item in labelled},
                jobs,
            )
            decision = reconcile_program(
                view,
                now_utc(),
                memo.config.image,
                tls_secret=memo.config.tls_secret,
                pull_secrets=memo.config.image_pull_secrets,
                failure_grace=memo.config.failure_grace_seconds,
            )
            trouble = await _make_children(kube, document, decision, memo.config)
            if trouble is not None:
                decision = trouble
            if decision.deadline is not None:  # merge patch: None removes it
                ref = decision.deadline.job
                deadline = {"spec": {"activeDeadlineSeconds": decision.deadline.seconds}}
                try:
                    await kube.patch(ref.api_version, ref.kind, ref.namespace, ref.name, deadline)
                except ApiError as error:
                    if error.status != 404:  # gone meanwhile is fine; refused is not
                        raise
            if decision.status is not None:
                operations = [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": document["metadata"].get("resourceVersion"),
                    },
                    {"op": "add", "path": "/status", "value": prune(decision.status)},
                ]
                try:
                    await kube.patch(
                        GV,
                        "PathwaysProgram",
                        namespace,
                        name,
                        operations,
                        subresource="status",
                        json_patch=True,
                    )
                except ApiError as error:
                    if error.status in (409, 422):
                        continue  # changed since read: decide again from the new state
                    raise
            # Deletions only once the status recording why is stored: had a run's Job gone
            # before a conflicting status write, the next decision would no longer see the run
            # it stopped, and its reason (SlicesLost, SlicesMoved, ...) would be lost.
            for ref in decision.delete:
                if ref.owner is None:
                    await kube.delete(ref.api_version, ref.kind, ref.namespace, ref.name)
                else:
                    await kube.delete_owned(
                        ref.api_version, ref.kind, ref.namespace, ref.name, ref.owner
                    )
            await _post(memo, decision.events)
            if decision.recheck_after is not None:
                _recheck(memo, namespace, name, decision.recheck_after)
            return


REFUSALS = (400, 403, 422)
"""What the API server answers a child it will not take (bad request, forbidden by a quota or
an admission webhook, invalid): the program's to say, not the operator's to retry blindly."""


async def _make_children(
    kube: Kube, document: dict[str, Any], decision: ProgramDecision, config: Config
) -> ProgramDecision | None:
    """Apply, then create, the decision's children (a run's Job mounts its graph's ConfigMap,
    applied first; with session credentials on, it carries its run's); the decision instead
    if one could not be made: the cluster refused it, or its name is another object's
    (``child_name_taken``: never taken over or rewritten)."""
    for replace, children in ((True, decision.apply), (False, decision.create)):
        for child in children:
            if config.session_master_key is not None and child.get("kind") == "Job":
                child = await _with_credentials(kube, child, config)
            try:
                if await kube.create(child) is not None:
                    continue
                meta = child["metadata"]
                existing = await kube.get(
                    child["apiVersion"], child["kind"], meta.get("namespace"), meta["name"]
                )
                if existing is None:  # deleted meanwhile: made again at the next decision
                    continue
                if not same_child(child, existing):
                    return child_name_taken(document, child, existing)
                if replace:
                    await kube.replace_content(child)
            except ApiError as error:
                if error.status not in REFUSALS:
                    raise
                return refused_child(document, child, str(error))
    return None


async def _with_credentials(kube: Kube, job: dict[str, Any], config: Config) -> dict[str, Any]:
    """A run's Job with its session credentials (``PATHWAYS_SESSION_CREDENTIALS``): per island
    of its slices, its program's name, tenant and priority (as the tenant policy allows its
    namespace), weight and devices, signed with the island's key (derived from the master key
    and the Island's uid). In the pod spec, as its other connection settings: they grant no
    more than the run itself holds."""
    master = config.session_master_key
    assert master is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    environment = {item["name"]: item.get("value", "") for item in container.get("env") or []}
    namespace = job["metadata"]["namespace"]
    signed = {}
    for asked in run_grants(environment, time.time()):
        grant = config.tenants.held_to(asked, namespace)
        island = await kube.get(GV, "Island", None, grant.island)
        uid = str(((island or {}).get("metadata") or {}).get("uid") or "")
        if uid:  # gone meanwhile: the run finds its slice moved, and the next one is signed
            signed[grant.island] = sign(grant, island_key(master, uid).encode())
    if not signed:
        return job
    job = copy.deepcopy(job)
    container = job["spec"]["template"]["spec"]["containers"][0]
    credentials = {"name": SESSION_CREDENTIALS_ENV, "value": credentials_text(signed)}
    container["env"] = [*(container.get("env") or []), credentials]
    return job


def _recheck(memo: kopf.Memo, namespace: str, name: str, delay: float) -> None:
    """Reconcile the program again in ``delay`` seconds: its decision waits for time to pass,
    not for an event (the resync would come, but much later)."""
    key = f"{namespace}/{name}"
    loop = asyncio.get_running_loop()
    if (earlier := memo.rechecks.pop(key, None)) is not None:
        earlier.cancel()

    def due() -> None:
        memo.rechecks.pop(key, None)
        if not memo.stopping.is_set():
            task = loop.create_task(_guard("program", reconcile(memo, namespace, name)))
            memo.recheck_tasks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(memo.recheck_tasks.discard)

    memo.rechecks[key] = loop.call_later(max(delay, MIN_RESYNC_SECONDS), due)


@kopf.on.event(GROUP, VERSION, "pathwaysprograms")
async def program_event(
    type: str | None, body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """Any change of a program: reconcile it. A program that lets go of a VirtualSlice it
    named (it finished, went, or no longer names it) gets a pass, which times the slice's
    lease again (held by the program, it had none)."""
    if type != "DELETED":
        await _guard("program", reconcile(memo, namespace, name))
    held = frozenset() if type == "DELETED" else held_slices(body)
    key = f"program-holds/{namespace}/{name}"
    before = memo.seen.pop(key, None) if type == "DELETED" else memo.seen.get(key)
    if type != "DELETED":
        memo.seen[key] = held
    if before and before - held:
        await _guard("binding", memo.binder.sync())


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_PROGRAM: kopf.PRESENT})
async def job_event(namespace: str, labels: Any, memo: kopf.Memo, **_: Any) -> None:
    """A run's Job progressed: reconcile its program."""
    await _guard("program", reconcile(memo, namespace, labels[LABEL_PROGRAM]))


@kopf.daemon(GROUP, VERSION, "pathwaysprograms", cancellation_timeout=CANCEL_SECONDS)
async def program_resync(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Periodic reconcile, in case an event was missed."""
    await _resync(memo, lambda: _guard("program", reconcile(memo, namespace, name)))


@kopf.on.delete(GROUP, VERSION, "pathwaysprograms")
async def program_deleted(
    namespace: str, name: str, uid: str, body: kopf.Body, status: Any, memo: kopf.Memo, **_: Any
) -> None:
    """Clean up: the program's Jobs, its graph ConfigMap and its inline slices (all owned by
    it too, for clusters that garbage-collect), each only if it owns it: a same-named
    VirtualSlice of the user's or of another program stays (it was deleted)."""
    kube: Kube = memo.kube
    # Every Job of its name it owns, also one of a run its status never recorded.
    mine = f"{LABEL_PROGRAM}={name}"
    labelled = {
        job["metadata"]["name"]
        for job in await kube.list("batch/v1", "Job", namespace, label_selector=mine)
    }
    runs = {job_name(name, run) for run in range(1, int(status.get("runs") or 0) + 1)}
    for job in sorted(runs | labelled):
        await kube.delete_owned("batch/v1", "Job", namespace, job, uid)
    await kube.delete_owned("v1", "ConfigMap", namespace, graph_config_map_name(name), uid)
    for item in slice_entries(body):
        if (inline := entry_name(item, "name")) and not item.get("virtualSliceName"):
            child = program_slice_name(name, inline)
            await kube.delete_owned(GV, "VirtualSlice", namespace, child, uid)
