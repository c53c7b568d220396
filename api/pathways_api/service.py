"""What the routes do: turn a tenant's requests into stored resources, and back.

Routes stay two lines; every rule lives here: a tenant's objects live in its namespace, the
fields only the system sets are refused, quotas are charged at submission, and idempotency
keys make a retried submission return the object the first one created.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from pathways_api.auth import Tenant
from pathways_api.credentials import IslandKeys
from pathways_api.errors import Conflict, Forbidden, InvalidField, NotFound
from pathways_api.logs import LogText, LogWindow, read_window, run_parts
from pathways_api.store import (
    ISLAND,
    PROGRAM,
    SLICE,
    Admission,
    Page,
    Store,
    check_uid,
    decode_token,
    encode_token,
)
from pathways_core.control.common import Document, now_utc
from pathways_core.manifests import SYSTEM_METADATA, metadata_problems
from pathways_core.resources import (
    GROUP_VERSION,
    IslandPhase,
    PathwaysProgram,
    ProgramPhase,
    SlicePhase,
    VirtualSlice,
)
from pathways_core.resources.base import LABEL_KEY_PATTERN, LABEL_VALUE_PATTERN, Model
from pathways_core.resources.program import MAX_WEIGHT
from pathways_core.wire.credentials import SessionGrant, sign

IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
PHASES = {PROGRAM: ProgramPhase, SLICE: SlicePhase, ISLAND: IslandPhase}
"""The phases each kind's objects can be in (what a list's ``phase`` filter may ask for)."""
SESSION_CREDENTIAL_SECONDS = 300
"""How long a session credential the API signs opens sessions (it is checked at the hello: a
session open lives on; the SDK asks for a new one when it binds or releases a slice)."""
MAX_SESSION_NAME = 256  # a scheduler's limit on client names


TRACE_READS = 2
"""Trace pages of one tenant read at once (each holds its records in memory while made)."""


@dataclass(frozen=True)
class ListQuery:
    """A list request: page size, continue token and filters."""

    limit: int = 50
    token: str | None = None
    phase: str | None = None
    labels: dict[str, str] | None = None


LABEL_KEY = re.compile(LABEL_KEY_PATTERN)
LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def parse_labels(selector: str | None) -> dict[str, str] | None:
    """``a=b,c=d`` (``==`` as ``=``) as a dict; InvalidField naming the query parameter
    otherwise: a term that is not a label key and value (Kubernetes' syntax), or one of the
    selector's other kinds (``!=``, ``in``, ``notin``, a bare key), which are not supported."""
    if not selector:
        return None
    labels = {}
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        key, value = key.strip(), value.removeprefix("=").strip()
        if not sep or not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value):
            raise InvalidField(
                f"label selector terms are key=value, each a Kubernetes label key and value "
                f"(!=, in, notin and bare keys are not supported), got {term!r}",
                field="query labelSelector",
            )
        if labels.get(key, value) != value:  # both must hold, and no object has both
            raise InvalidField(
                f"label selector names {key!r} twice, as {labels[key]!r} and {value!r}: no "
                "object has both",
                field="query labelSelector",
            )
        labels[key] = value
    return labels


def scoped(token: str | None, scope: list[Any]) -> str | None:
    """A store's continue token, given out bound to the list it continues (tenant, collection
    and filter): one of another list skipped this one's objects, without a word."""
    if token is None:
        return None
    text = json.dumps([_scope_digest(scope), token])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def unscoped(token: str | None, scope: list[Any]) -> str | None:
    """The store's token in a continue token of :func:`scoped`, or InvalidField naming it if
    it is not one or is another list's."""
    if not token:
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        digest, inner = json.loads(text)
        if not isinstance(digest, str) or not isinstance(inner, str):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidField(
            "not a continue token given by a previous page", field="query continue"
        ) from None
    if digest != _scope_digest(scope):
        raise InvalidField(
            "a continue token of another list (of another collection, filter or tenant): "
            "continue with the list it came from, or list again without it",
            field="query continue",
        )
    return inner


def _scope_digest(scope: list[Any]) -> str:
    return hashlib.sha256(json.dumps(scope).encode()).hexdigest()[:16]


def _fingerprint(resource: Model) -> str:
    """What an Idempotency-Key's body is compared by: its manifest, but for the namespace (the
    tenant's, given or not: the same body sent with it was a 409)."""
    wire = resource.to_wire()
    wire.get("metadata", {}).pop("namespace", None)
    return hashlib.sha256(json.dumps(wire, sort_keys=True).encode()).hexdigest()


def _generated_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(NAME_ALPHABET) for _ in range(5))


class Service:
    """The API's behaviour over a :class:`Store`."""

    def __init__(
        self, store: Store, mode: str = "embedded", session_keys: IslandKeys | None = None
    ) -> None:
        """``session_keys``: the islands' keys the API signs tenants' session credentials
        with (None: it signs none, and islands with a key take no session it opened)."""
        self.store = store
        self.mode = mode
        self.session_keys = session_keys
        self._trace_reads: dict[str, asyncio.Semaphore] = {}  # per tenant

    # -- shared --------------------------------------------------------------------------------

    def _document(self, tenant: Tenant, resource: PathwaysProgram | VirtualSlice) -> Document:
        """The document to store, or InvalidField naming what the caller may not set."""
        meta = resource.metadata
        given = meta.model_dump(by_alias=True, exclude_unset=True)  # extras included
        for key in SYSTEM_METADATA:
            if given.get(key) is not None:
                raise InvalidField("set by the system; omit it", field=f"metadata.{key}")
        # The rules `pathways validate` applies too, so the two agree.
        for problem in metadata_problems(resource.kind, given):
            raise InvalidField(problem.message, field=problem.path)
        if meta.namespace not in (None, tenant.name):
            raise InvalidField(
                f"objects of tenant {tenant.name!r} live in namespace {tenant.name!r}; omit "
                "metadata.namespace or set it to that",
                field="metadata.namespace",
            )
        if resource.spec.tenant not in (None, tenant.name):
            raise InvalidField(
                f"you are tenant {tenant.name!r}; omit spec.tenant or set it to that",
                field="spec.tenant",
            )
        if resource.status != type(resource.status)():
            raise InvalidField("set by the system; omit it", field="status")
        name = meta.name
        if name is None:
            prefix = meta.generate_name or ("program-" if resource.kind == PROGRAM else "slice-")
            name = _generated_name(prefix)
        metadata: dict[str, Any] = {"name": name, "namespace": tenant.name}
        if meta.labels:
            metadata["labels"] = dict(meta.labels)
        if meta.annotations:  # none of the system's (pathways.dev/cancelled): refused above
            metadata["annotations"] = dict(meta.annotations)
        return {
            "apiVersion": GROUP_VERSION,
            "kind": resource.kind,
            "metadata": metadata,
            "spec": resource.spec.to_wire(),
        }

    @staticmethod
    def _idempotency(key: str | None, resource: Model) -> tuple[str, str] | None:
        if key is None:
            return None
        if not IDEMPOTENCY_KEY.match(key):
            raise InvalidField(
                "1 to 200 printable ASCII characters, no spaces", field="header Idempotency-Key"
            )
        return key, _fingerprint(resource)

    async def _get(self, kind: str, namespace: str | None, name: str) -> Document:
        document = await self.store.get(kind, namespace, name)
        if document is None:
            # Another tenant's object is as absent as one that never existed.
            noun = {PROGRAM: "program", SLICE: "virtual slice", ISLAND: "island"}[kind]
            raise NotFound(f"no {noun} named {name!r}", field="name")
        return document

    # -- programs ------------------------------------------------------------------------------

    async def submit_program(
        self, tenant: Tenant, program: PathwaysProgram, key: str | None
    ) -> tuple[Document, bool]:
        """Store a new program if the tenant's quotas allow it (and, embedded, if its graph's
        artifacts are where the embedded mode reads them)."""
        if self.mode == "embedded" and program.spec.graph is not None:
            for index, function in enumerate(program.spec.graph.functions):
                where = f"spec.graph.functions[{index}]"
                if function.config_map_key_ref is not None:
                    raise InvalidField(
                        "the embedded mode keeps no ConfigMaps: give the artifact inline "
                        "(base64) or as a file:// uri",
                        field=f"{where}.configMapKeyRef",
                    )
                if function.uri is not None and not function.uri.startswith("file://"):
                    raise InvalidField(
                        "the embedded mode reads file:// artifacts only: give the artifact "
                        "inline (base64) or as a file:// uri",
                        field=f"{where}.uri",
                    )
        devices = sum(
            item.device_total for item in program.spec.slices if item.virtual_slice_name is None
        )
        return await self._admit(tenant, program, Admission(devices, 1), key)

    async def _admit(
        self,
        tenant: Tenant,
        resource: PathwaysProgram | VirtualSlice,
        cost: Admission,
        key: str | None,
    ) -> tuple[Document, bool]:
        if resource.spec.priority > tenant.quotas.priority:
            raise Forbidden(
                f"tenant {tenant.name!r} may ask for priority {tenant.quotas.priority} at most "
                f"(got {resource.spec.priority})",
                field="spec.priority",
            )
        idempotency = self._idempotency(key, resource)
        for attempt in range(5):
            document = self._document(tenant, resource)
            try:
                return await self.store.admit(tenant, document, cost, idempotency)
            except Conflict as error:
                # A generated name that is taken: draw another one.
                if resource.metadata.name is not None or error.field != "metadata.name":
                    raise
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    async def list(self, tenant: Tenant, kind: str, query: ListQuery) -> Page:
        """A page of the tenant's objects of a kind (islands are everyone's)."""
        phases = [phase.value for phase in PHASES[kind]]
        if query.phase is not None and query.phase not in phases:
            # A phase no object can be in is a mistake, not a filter that matches nothing.
            raise InvalidField(
                f"expected one of {', '.join(phases)} (got {query.phase!r})", field="query phase"
            )
        namespace = None if kind == ISLAND else tenant.name
        scope = [tenant.name, kind, query.phase, sorted((query.labels or {}).items())]
        page = await self.store.list(
            kind,
            namespace,
            limit=query.limit,
            token=unscoped(query.token, scope),
            phase=query.phase,
            labels=query.labels,
        )
        return Page(page.items, scoped(page.next, scope))

    async def get(self, tenant: Tenant, kind: str, name: str) -> Document:
        """One of the tenant's objects (or an island)."""
        return await self._get(kind, None if kind == ISLAND else tenant.name, name)

    async def cancel_program(self, tenant: Tenant, name: str) -> Document:
        """Stop a program for good: its run is stopped and its inline slices released."""
        return await self.store.cancel(tenant.name, name)

    async def suspend_program(self, tenant: Tenant, name: str, suspend: bool) -> Document:
        """Suspend a program (its run is stopped and its devices released, its quota kept so
        it can resume) or resume it (its next run starts, a driver from its checkpoint)."""
        return await self.store.suspend(tenant.name, name, suspend)

    async def delete(
        self, tenant: Tenant, kind: str, name: str, uid: str | None = None
    ) -> Document:
        """Delete a program, or release a virtual slice (not one a program made for itself:
        the program would only make it again, stopping its run each time); with ``uid``,
        only that object."""
        if kind == SLICE:
            document = await self._get(SLICE, tenant.name, name)
            check_uid(document, "virtual slice", name, uid)
            owners = (document["metadata"].get("ownerReferences")) or []
            program = next((o["name"] for o in owners if o.get("kind") == PROGRAM), None)
            if program is not None:
                raise Conflict(
                    f"virtual slice {name!r} was made for program {program!r} and goes with "
                    "it: delete, cancel or suspend the program instead",
                    field="name",
                )
        return await self.store.delete(kind, tenant.name, name, uid)

    async def renew_slice(self, tenant: Tenant, name: str, uid: str | None = None) -> Document:
        """Renew the lease of one of the tenant's slices (``spec.leaseSeconds``): its holder
        still uses it. The time is the API's, not the caller's (whose clock may be off). With
        ``uid``, only that slice (not one made since under its name)."""
        return await self.store.renew(tenant.name, name, now_utc(), uid)

    async def events(self, tenant: Tenant, kind: str, name: str) -> list[dict[str, Any]]:
        """The Events of one of the tenant's objects."""
        document = await self._get(kind, tenant.name, name)
        uid = document["metadata"].get("uid") or ""
        return await self.store.events(kind, tenant.name, name, uid)

    async def logs(self, tenant: Tenant, name: str, window: LogWindow) -> LogText:
        """The window's part of the output of a program's runs (of one run, if it says so)."""
        program = await self._get(PROGRAM, tenant.name, name)
        if window.run is not None:
            started = int((program.get("status") or {}).get("runs") or 0)
            if window.run > started:
                raise NotFound(
                    f"program {name!r} has no run {window.run}: {started} started so far",
                    field="query run",
                )
        # A run that has not written yet (or whose log is gone) has no output so far.
        parts = run_parts(await self.store.logs(tenant.name, name, window.run))
        return await asyncio.to_thread(read_window, parts, window)  # files: off the event loop

    async def trace(
        self, tenant: Tenant, name: str, limit: int, token: str | None
    ) -> dict[str, Any]:
        """A page of the island trace records of a program's finished runs (from ``token``,
        a previous page's ``continue``), and which runs' lack their oldest."""
        await self._get(PROGRAM, tenant.name, name)
        scope = [tenant.name, "trace", name]
        inner = unscoped(token, scope)
        start = decode_token(inner) if inner else 0
        # A few at a time per tenant (a page is megabytes to parse and hold), and one tenant's
        # many reads never queue another's.
        gate = self._trace_reads.setdefault(tenant.name, asyncio.Semaphore(TRACE_READS))
        async with gate:
            page = await self.store.trace(tenant.name, name, start, limit)
        return {
            "program": name,
            "records": page.records,
            "incomplete": page.incomplete,
            "continue": (
                scoped(encode_token(start + limit), scope) if start + limit < page.total else None
            ),
        }

    # -- virtual slices ------------------------------------------------------------------------

    async def create_slice(
        self, tenant: Tenant, item: VirtualSlice, key: str | None
    ) -> tuple[Document, bool]:
        """Store a new virtual slice if the tenant's device quota allows it."""
        return await self._admit(tenant, item, Admission(item.spec.device_total, 0), key)

    # -- sessions ------------------------------------------------------------------------------

    async def session_credential(self, tenant: Tenant, island: str, client: str) -> dict[str, Any]:
        """A credential for the tenant's session named ``client`` with ``island``'s scheduler:
        the devices of the tenant's slices bound there, its priority cap, for 5 minutes. None
        when the island needs none."""
        document = await self._get(ISLAND, None, island)
        own = client.startswith(f"{tenant.name}.") and len(client) > len(tenant.name) + 1
        if not own or not client.isprintable() or "/" in client:
            raise InvalidField(
                f"a session of tenant {tenant.name!r} is named '{tenant.name}.<name>' (printable, "
                f"no '/'), not {client[:64]!r}",
                field="client",
            )
        if len(client) > MAX_SESSION_NAME:
            raise InvalidField(f"at most {MAX_SESSION_NAME} characters", field="client")
        key = None if self.session_keys is None else self.session_keys.key(document)
        answer: dict[str, Any] = {"island": island, "client": client, "credential": None}
        if key is None:
            return answer
        devices: set[int] = set()
        token = None
        while True:  # every page: a tenant may hold many slices
            page = await self.store.list(SLICE, tenant.name, limit=500, token=token, phase="Bound")
            for item in page.items:
                status = item.get("status") or {}
                going = (item.get("metadata") or {}).get("deletionTimestamp")
                if status.get("island") == island and not going:
                    devices.update(int(d) for d in status.get("devices") or [])
            token = page.next
            if not token:
                break
        grant = SessionGrant(
            island=island,
            client=client,
            tenant=tenant.name,
            weight=MAX_WEIGHT,
            priority=tenant.quotas.priority,
            devices=frozenset(devices),
            expires=int(time.time()) + SESSION_CREDENTIAL_SECONDS,
        )
        answer.update(
            credential=sign(grant, key),
            devices=sorted(devices),
            priority=grant.priority,
            expires=grant.expires,
        )
        return answer

    # -- tenant --------------------------------------------------------------------------------

    async def me(self, tenant: Tenant) -> dict[str, Any]:
        """The tenant, its quotas and what it uses."""
        usage = await self.store.usage(tenant.name)
        return {
            "tenant": tenant.name,
            "namespace": tenant.name,
            "mode": self.mode,
            "quotas": {
                "devices": tenant.quotas.devices,
                "programs": tenant.quotas.programs,
                "priority": tenant.quotas.priority,
            },
            "usage": {"devices": usage.devices, "programs": usage.programs},
        }
