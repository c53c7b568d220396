"""The API in a cluster: objects are custom resources, callers are Kubernetes identities.

- **Authentication**: a bearer token is checked with a TokenReview; the caller must be a
  service account, whose namespace is its tenant; a SubjectAccessReview then checks that it may
  ``create pathwaysprograms.pathways.dev`` there (answers are cached for a minute).
- **Objects** are PathwaysPrograms and VirtualSlices in the tenant's namespace, and the
  cluster's Islands; the operator reconciles them as if they had been applied with kubectl.
- **Quotas** (``PATHWAYS_API_QUOTA_DEVICES``, ``_PROGRAMS``, ``_PRIORITY``, every tenant's
  alike; the priority cap defaults to 0, so no tenant preempts another unless allowed) are
  checked against what the namespace holds and the create is made while holding the tenant's
  admission Lease (``coordination.k8s.io``, ``pathways-admission`` in its namespace, taken
  with the API server's optimistic concurrency): concurrent submissions are never
  over-admitted, to one replica or to several (the chart runs two). One replica's own callers
  queue on a lock first, so a replica asks for the Lease once at a time per tenant. A hold
  outlasts any create sent under it (sent within ``CREATE_BY_SECONDS`` of taking it, stored
  within the API server's request timeout, or never).
- **Idempotency keys** are kept on the object (annotations ``pathways.dev/idempotency-key``
  and ``-fingerprint``, never shown to callers): scoped by kind, and free again once their
  object is gone, as in the embedded store.
- **Logs** are the logs of the pods of the program's Jobs; **traces** are kept only by the
  embedded mode (an empty list here).

The API server is reached with httpx: in a pod with its service account, elsewhere with the
current context of ``$KUBECONFIG`` (token, or client certificate, users).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import functools
import json
import logging
import math
import os
import random
import re
import socket
import tempfile
import time
import urllib.parse
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from pathways_api.auth import Tenant, quotas_from_environment
from pathways_api.errors import (
    ApiError,
    Conflict,
    Forbidden,
    InvalidField,
    NotFound,
    QuotaExceeded,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from pathways_api.logs import LogBytes, Part
from pathways_api.store import (
    ANNOTATION_CANCELLED,
    ISLAND,
    PROGRAM,
    SLICE,
    Admission,
    Page,
    TracePage,
    Usage,
    check_changeable,
    check_quota,
    check_renewable,
    check_replay,
    check_uid,
    is_active,
    renewed,
)
from pathways_core.control.common import Document
from pathways_core.control.rate_limit import Limit, TokenBuckets
from pathways_core.topology import device_count, parse_shape

log = logging.getLogger(__name__)

GV = "pathways.dev/v1alpha1"
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # a DNS subdomain
PLURALS = {PROGRAM: "pathwaysprograms", SLICE: "virtualslices", ISLAND: "islands"}
ANNOTATION_KEY = "pathways.dev/idempotency-key"
ANNOTATION_FINGERPRINT = "pathways.dev/idempotency-fingerprint"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REVIEW_TTL_SECONDS = 60.0
ADMISSION_LEASE = "pathways-admission"
APISERVER_REQUEST_SECONDS = 60
"""The longest an API server works on one request (its ``--request-timeout``, 1 min by
default): a create sent is stored within this, or never."""
CREATE_BY_SECONDS = 10
"""How soon after taking a tenant's admission Lease its create must be sent (the two lists
before it take milliseconds); later, nothing is sent and the caller is answered 503."""
LEASE_SECONDS = CREATE_BY_SECONDS + APISERVER_REQUEST_SECONDS + 5
"""How long a replica's hold on a tenant's admission Lease lasts unless let go: past the end
of any create sent under it, so no other replica admits beside one still being stored (with
a 10 s hold, a create the API server took 11 s over let a second replica admit past the
quota). A replica that died holding it delays that tenant this long."""
ACQUIRE_SECONDS = 30.0
"""How long an admission waits for the Lease other replicas hold before answering 503."""
LEASE_POLL_SECONDS = (0.01, 0.5)
"""The first and longest pause between two looks at a Lease another replica holds."""


class KubernetesStore:
    """The :class:`~pathways_api.store.Store` of a cluster."""

    def __init__(
        self, server: str, token: str | Path | None, verify: Any = True, cert: Any = None
    ) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self.http = httpx.AsyncClient(base_url=self.server, verify=verify, cert=cert, timeout=30)
        self._locks: dict[str, asyncio.Lock] = {}
        self.identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"  # in the Leases
        self.quotas = quotas_from_environment(os.environ)

    @classmethod
    def from_environment(cls) -> KubernetesStore:
        """In a pod: its service account; elsewhere: ``$KUBECONFIG`` or ``~/.kube/config``."""
        host, port = (
            os.environ.get("KUBERNETES_SERVICE_HOST"),
            os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
        )
        if host and (SERVICE_ACCOUNT / "token").exists():
            server = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
            return cls(server, SERVICE_ACCOUNT / "token", verify=str(SERVICE_ACCOUNT / "ca.crt"))
        path = Path(os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
        try:
            config = yaml.safe_load(path.read_text())
            context = next(
                c["context"] for c in config["contexts"] if c["name"] == config["current-context"]
            )
            cluster = next(
                c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]
            )
            user = next(
                (u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")),
                {},
            )
        except (OSError, KeyError, StopIteration, TypeError, yaml.YAMLError) as error:
            raise SystemExit(
                f"kubernetes mode: no service account and no usable {path}: {error}"
            ) from None
        verify: Any = not cluster.get("insecure-skip-tls-verify", False)
        if cluster.get("certificate-authority"):
            verify = cluster["certificate-authority"]
        elif cluster.get("certificate-authority-data"):
            verify = _data_file(cluster["certificate-authority-data"], "ca.crt")
        cert = None
        if user.get("client-certificate-data") and user.get("client-key-data"):
            cert = (
                _data_file(user["client-certificate-data"], "client.crt"),
                _data_file(user["client-key-data"], "client.key"),
            )
        elif user.get("client-certificate") and user.get("client-key"):
            cert = (user["client-certificate"], user["client-key"])
        return cls(cluster["server"], user.get("token"), verify=verify, cert=cert)

    # -- HTTP ----------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        token = self._token
        if isinstance(token, Path):  # projected tokens rotate: read it each time
            token = token.read_text().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(self, method: str, path: str, **arguments: Any) -> Any:
        headers = {**self._headers(), **arguments.pop("headers", {})}
        try:
            answer = await self.http.request(method, path, headers=headers, **arguments)
        except httpx.HTTPError as error:
            raise Unavailable(f"the Kubernetes API server did not answer: {_said(error)}") from None
        if answer.status_code == 404 and method != "POST":
            return None  # (a create's 404 is its namespace missing: the cluster's, below)
        if answer.status_code < 400:
            return answer.json() if answer.content else None
        try:
            message = answer.json().get("message") or answer.text
        except ValueError:
            message = answer.text
        if answer.status_code == 409 and method == "POST":
            name = (arguments.get("json") or {}).get("metadata", {}).get("name")
            existing = await self._call("GET", f"{path}/{urllib.parse.quote(str(name), safe='')}")
            deleting = ((existing or {}).get("metadata") or {}).get("deletionTimestamp")
            raise Conflict(
                f"an object named {name!r} "
                + (
                    "is still being deleted; submit it again once it is gone"
                    if deleting
                    else "already exists"
                ),
                field="metadata.name",
            )
        if answer.status_code == 409:
            raise Conflict(f"the object changed or is being deleted; try again ({message})")
        refusal = _admission_refusal(answer.status_code, message)
        if refusal is not None:
            raise refusal
        if answer.status_code == 422:  # the API server's own validation: the caller's to fix
            raise InvalidField(f"the cluster refused it: {message}")
        if answer.status_code == 403 and method == "POST":
            # The tenant's namespace refuses the object (an outage, 503, to the caller before).
            if "exceeded quota" in message:
                raise QuotaExceeded(f"the namespace's ResourceQuota refused it: {message}")
            if "being terminated" in message:
                raise Forbidden(f"the tenant's namespace is being deleted: {message}")
        if answer.status_code == 429:  # the API server throttles: wait as it says
            wait = answer.headers.get("Retry-After") or "1"
            raise RateLimited(
                f"the Kubernetes API server is throttling requests: {message}",
                headers={"Retry-After": wait if wait.isdigit() else "1"},
            )
        raise Unavailable(f"the Kubernetes API server answered {answer.status_code}: {message}")

    async def _merge_patch(self, path: str, body: Document) -> Any:
        """A JSON merge patch of the object at ``path`` (one carrying a resourceVersion is
        refused, 409, if the object changed since)."""
        return await self._call(
            "PATCH",
            path,
            content=json.dumps(body),
            headers={"Content-Type": "application/merge-patch+json"},
        )

    @staticmethod
    def _path(kind: str, namespace: str | None, name: str | None = None) -> str:
        parts = [f"/apis/{GV}"]
        if namespace is not None and kind != ISLAND:
            parts.append(f"namespaces/{namespace}")
        parts.append(PLURALS[kind])
        if name:
            # A name is one path segment, never a query, a '..' or more path: no object of
            # the cluster has another.
            if len(name) > 253 or not OBJECT_NAME.fullmatch(name):  # (a 400, answered 503)
                raise NotFound(f"no {kind} named {name!r}", field="name")
            parts.append(urllib.parse.quote(name, safe=""))
        return "/".join(parts)

    async def _all(self, kind: str, namespace: str | None) -> list[Document]:
        body = await self._call("GET", self._path(kind, namespace))
        items = (body or {}).get("items") or []
        for item in items:  # list items omit these
            item.setdefault("apiVersion", GV)
            item.setdefault("kind", kind)
        return sorted(
            items,
            key=lambda d: (
                d["metadata"].get("creationTimestamp") or "",
                d["metadata"].get("name") or "",
            ),
        )

    # -- authentication ------------------------------------------------------------------------

    async def review(self, token: str) -> Tenant:
        """TokenReview, then SubjectAccessReview of the service account's namespace."""
        answer = await self._call(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = (answer or {}).get("status") or {}
        if not status.get("authenticated"):
            raise Unauthorized("invalid bearer token (TokenReview)")
        user = status.get("user") or {}
        parts = (user.get("username") or "").split(":")
        if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"]:
            raise Unauthorized(
                "only service-account tokens map to a tenant (the service account's namespace)"
            )
        namespace = parts[2]
        access = await self._call(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            json={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.get("username"),
                    "groups": user.get("groups") or [],
                    "uid": user.get("uid"),
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "create",
                        "group": "pathways.dev",
                        "resource": "pathwaysprograms",
                    },
                },
            },
        )
        if not ((access or {}).get("status") or {}).get("allowed"):
            raise Unauthorized(
                f"{user.get('username')} may not create pathwaysprograms in namespace "
                f"{namespace!r} (SubjectAccessReview)"
            )
        return Tenant(namespace, self.quotas)

    # -- the Store interface -------------------------------------------------------------------

    async def admit(
        self,
        tenant: Tenant,
        document: Document,
        cost: Admission,
        idempotency: tuple[str, str] | None,
    ) -> tuple[Document, bool]:
        """See :meth:`~pathways_api.store.Store.admit`."""
        namespace = tenant.name
        async with self._admission(namespace) as create_by:
            programs = await self._all(PROGRAM, namespace)
            slices = await self._all(SLICE, namespace)
            if idempotency is not None:
                key, fingerprint = idempotency
                for existing in programs if document["kind"] == PROGRAM else slices:
                    annotations = existing["metadata"].get("annotations") or {}
                    if annotations.get(ANNOTATION_KEY) == key:
                        check_replay(annotations.get(ANNOTATION_FINGERPRINT), fingerprint)
                        return _shown(existing), False
                annotations = document["metadata"].setdefault("annotations", {})
                annotations.update({ANNOTATION_KEY: key, ANNOTATION_FINGERPRINT: fingerprint})
            check_quota(tenant, _usage(programs, slices), cost)
            if time.monotonic() > create_by:
                raise Unavailable(
                    f"tenant {namespace!r}'s admission took over {CREATE_BY_SECONDS} s (the "
                    "Kubernetes API server answers slowly): nothing was created; try again"
                )
            created = await self._call(
                "POST", self._path(document["kind"], namespace), json=document
            )
            return _shown(created), True

    @contextlib.asynccontextmanager
    async def _admission(self, namespace: str) -> AsyncIterator[float]:
        """Admit one object of ``namespace`` at a time, over every replica: this replica's
        callers queue on a lock, then the replica holds the tenant's admission Lease; yields
        when (``time.monotonic``) its create must be sent by."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            version = await self._take_lease(namespace)
            try:
                yield time.monotonic() + CREATE_BY_SECONDS
            finally:
                await self._let_go(namespace, version)

    async def _take_lease(self, namespace: str) -> str:
        """Hold ``namespace``'s admission Lease (made if missing, taken if free or expired);
        returns its resourceVersion as held."""
        leases = _leases(namespace)
        path = f"{leases}/{ADMISSION_LEASE}"
        deadline = time.monotonic() + ACQUIRE_SECONDS
        pause, longest = LEASE_POLL_SECONDS
        while True:
            now = datetime.datetime.now(datetime.UTC)
            stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            spec = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": LEASE_SECONDS,
                "acquireTime": stamp,
                "renewTime": stamp,
            }
            lease = await self._call("GET", path)
            try:
                if lease is None:
                    made = await self._call(
                        "POST",
                        leases,
                        json={
                            "apiVersion": "coordination.k8s.io/v1",
                            "kind": "Lease",
                            "metadata": {"name": ADMISSION_LEASE},
                            "spec": spec,
                        },
                    )
                    return str(made["metadata"]["resourceVersion"])
                # A hold of this replica's own is stale (its callers take turns on a lock): its
                # release failed. It held up this tenant's next admission for the whole hold.
                if _lease_free(lease, now) or _holder(lease) == self.identity:
                    version = lease["metadata"]["resourceVersion"]
                    taken = await self._merge_patch(
                        path, {"metadata": {"resourceVersion": version}, "spec": spec}
                    )
                    if taken is not None:
                        return str(taken["metadata"]["resourceVersion"])
            except Conflict:
                pass  # another replica made or took it first
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"tenant {namespace!r}'s admission Lease ({ADMISSION_LEASE}) stayed held "
                    f"by {_holder(lease or {})!r} for {ACQUIRE_SECONDS:.0f} s; try again"
                )
            # Backing off: each tenant waiting on a dead replica's hold looked ~40 times a second.
            await asyncio.sleep(random.uniform(pause / 2, pause))
            pause = min(pause * 2, longest)

    async def _let_go(self, namespace: str, version: str) -> None:
        """Free the Lease held at ``version`` (if it expired and another replica took it,
        that one's hold stands). A release that fails is logged, never the caller's answer:
        the admission is done (a 429 here answered a stored create 'nothing done', and the
        caller's retry made a second program); the hold ends with its duration."""
        path = f"{_leases(namespace)}/{ADMISSION_LEASE}"
        try:
            await self._merge_patch(
                path, {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": ""}}
            )
        except Conflict:
            pass  # it expired and another replica holds it now
        except ApiError as error:
            log.warning("tenant %r's admission Lease was not let go: %s", namespace, error)

    async def get(self, kind: str, namespace: str | None, name: str) -> Document | None:
        """See :meth:`~pathways_api.store.Store.get`."""
        document = await self._call("GET", self._path(kind, namespace, name))
        return None if document is None else _shown(document)

    async def list(
        self,
        kind: str,
        namespace: str | None,
        *,
        limit: int,
        token: str | None,
        phase: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> Page:
        """See :meth:`~pathways_api.store.Store.list`: pages in creation order (then name);
        the token is the last item's place in it, so objects deleted while paging move no
        other (a position skipped one), and those created later come later (the API server
        times creations to the second: one made in the second of the page's last item, with
        a name before its, is not seen)."""
        after = _decode_place(token) if token else None
        items = [
            item
            for item in await self._all(kind, namespace)
            if (phase is None or (item.get("status") or {}).get("phase") == phase)
            and all(
                (item["metadata"].get("labels") or {}).get(k) == v
                for k, v in (labels or {}).items()
            )
            and (after is None or _place(item) > after)
        ]
        page = items[:limit]
        more = len(items) > limit
        return Page(
            [_shown(item) for item in page], _encode_place(_place(page[-1])) if more else None
        )

    async def cancel(self, namespace: str, name: str) -> Document:
        """See :meth:`~pathways_api.store.Store.cancel`."""
        return await self._patch_program(
            namespace,
            name,
            "cancel",
            {
                "metadata": {"annotations": {ANNOTATION_CANCELLED: "true"}},
                "spec": {"suspend": True},
            },
        )

    async def suspend(self, namespace: str, name: str, suspend: bool) -> Document:
        """See :meth:`~pathways_api.store.Store.suspend`."""
        action = "be suspended" if suspend else "resume"
        return await self._patch_program(namespace, name, action, {"spec": {"suspend": suspend}})

    async def _patch_program(
        self, namespace: str, name: str, action: str, patch: dict[str, Any]
    ) -> Document:
        """Merge ``patch`` into a program whose state allows ``action`` (see
        :func:`check_changeable`)."""
        return await self._patch_checked(
            PROGRAM,
            namespace,
            name,
            lambda document: check_changeable(document, name, action),
            patch,
        )

    async def renew(
        self, namespace: str, name: str, now: datetime.datetime, uid: str | None = None
    ) -> Document:
        """See :meth:`~pathways_api.store.Store.renew`."""
        return await self._patch_checked(
            SLICE,
            namespace,
            name,
            lambda document: check_renewable(document, name, now, uid),
            renewed({"metadata": {}}, now),
        )

    async def _patch_checked(
        self,
        kind: str,
        namespace: str,
        name: str,
        check: Callable[[Document | None], Document],
        patch: dict[str, Any],
    ) -> Document:
        """Merge ``patch`` into an object ``check`` passes, on the version checked: the API
        server refuses it if the object changed since, and it is checked again."""
        path = self._path(kind, namespace, name)
        for _ in range(10):
            document = check(await self.get(kind, namespace, name))
            version = {"resourceVersion": document["metadata"]["resourceVersion"]}
            body = {**patch, "metadata": {**patch.get("metadata", {}), **version}}
            try:
                patched = await self._merge_patch(path, body)
            except Conflict:  # changed since it was read
                continue
            if patched is None:
                check(None)  # gone since: its NotFound
            return _shown(patched)
        noun = {PROGRAM: "program", SLICE: "virtual slice"}[kind]
        raise Conflict(f"{noun} {name!r} keeps changing; try again", field="name")

    async def delete(
        self, kind: str, namespace: str, name: str, uid: str | None = None
    ) -> Document:
        """See :meth:`~pathways_api.store.Store.delete`: the API server checks ``uid`` again
        as it deletes (a precondition)."""
        document = await self.get(kind, namespace, name)
        if document is None:
            raise NotFound(f"no {kind} named {name!r}", field="name")
        check_uid(document, kind, name, uid)
        options = {"json": {"preconditions": {"uid": uid}}} if uid else {}
        answer = await self._call("DELETE", self._path(kind, namespace, name), **options)
        # The object as deleted (marked, while finalizers run), as the embedded store answers.
        return _shown(answer) if (answer or {}).get("kind") == document.get("kind") else document

    async def usage(self, namespace: str) -> Usage:
        """See :meth:`~pathways_api.store.Store.usage`."""
        return _usage(await self._all(PROGRAM, namespace), await self._all(SLICE, namespace))

    async def events(self, kind: str, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """See :meth:`~pathways_api.store.Store.events`: the Events whose involvedObject is
        the object (selected by the API server; checked again, uid included, here)."""
        body = await self._call(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            params={"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
        )
        wanted = {"kind": kind, "name": name, **({"uid": uid} if uid else {})}
        return [
            {
                "type": event.get("type") or "Normal",
                "reason": event.get("reason") or "",
                "message": event.get("message") or "",
                "time": event.get("lastTimestamp") or event.get("eventTime") or "",
            }
            for event in (body or {}).get("items") or []
            if all(
                (event.get("involvedObject") or {}).get(field, value) == value
                for field, value in wanted.items()
            )
        ]

    async def logs(
        self, namespace: str, name: str, run: int | None = None
    ) -> list[tuple[int, Part]]:
        """See :meth:`~pathways_api.store.Store.logs`: the logs of its Jobs' pods (the
        kubelet bounds each, rotating it), by run; only run ``run``'s pod is asked for it."""
        selector = f"pathways.dev/program={name}"
        if run is not None:
            selector += f",pathways.dev/run={run}"
        body = await self._call(
            "GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}
        )
        parts: list[tuple[int, Part]] = []
        for pod in (body or {}).get("items") or []:
            labels = pod["metadata"].get("labels") or {}
            if labels.get("pathways.dev/program") != name or (
                run is not None and labels.get("pathways.dev/run") != str(run)
            ):
                continue  # a server that ignores the selector
            pod_name = pod["metadata"]["name"]
            try:
                answer = await self.http.get(
                    f"/api/v1/namespaces/{namespace}/pods/{pod_name}/log", headers=self._headers()
                )
            except httpx.HTTPError as error:
                raise Unavailable(
                    f"the Kubernetes API server did not answer: {_said(error)}"
                ) from None
            number = labels.get("pathways.dev/run", "")
            if answer.status_code == 200 and number.isdigit():
                parts.append((int(number), LogBytes(answer.content)))
            elif answer.status_code != 404:  # gone is no log; a failing kubelet is no silence
                raise Unavailable(
                    f"the log of pod {pod_name} could not be read ({answer.status_code}: "
                    f"{answer.text[:300]})"
                )
        return sorted(parts, key=lambda part: part[0])

    async def trace(self, namespace: str, name: str, start: int, limit: int) -> TracePage:
        """See :meth:`~pathways_api.store.Store.trace`: not kept in a cluster."""
        return TracePage([], [], 0)

    async def ready(self) -> bool:
        """See :meth:`~pathways_api.store.Store.ready`: the API server lists Islands."""
        try:
            await self._call("GET", self._path(ISLAND, None))
        except Unavailable:
            return False
        return True


class TokenReviewer:
    """The authenticator of the kubernetes mode, caching answers for a minute: the tokens it
    took and those it refused apart, each the ``MAX_CACHED`` most recently used (a flood of
    made-up tokens cleared the whole cache, every tenant's review with it). Tokens it has no
    answer for are reviewed at most ``NEW_TOKENS`` a second (bursts of ``NEW_TOKEN_BURST``),
    over every caller: beyond, 429 before the API server is asked (each made-up token cost a
    TokenReview, and callers not yet authenticated have no tenant's rate limit).

    A token it took before is reviewed again, once its answer is a minute old, outside that
    budget: a flood of made-up tokens took every tenant's renewal with it (429 for all). That
    costs at most one review a minute per token taken (no more than ``MAX_CACHED``: only
    tokens the API server accepted), and concurrent requests of one token share one review."""

    def __init__(self, store: KubernetesStore, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self._clock = clock
        self._taken: OrderedDict[str, tuple[float, Tenant]] = OrderedDict()
        self._refused: OrderedDict[str, tuple[float, Unauthorized]] = OrderedDict()
        self._reviews = TokenBuckets(Limit(NEW_TOKENS, NEW_TOKEN_BURST))
        self._pending: dict[str, asyncio.Future[Tenant]] = {}  # reviews under way, by token

    async def authenticate(self, token: str) -> Tenant:
        """The tenant of a token (TokenReview + SubjectAccessReview)."""
        now = self._clock()
        for cache in (self._taken, self._refused):
            cached = cache.get(token)
            if cached is not None and now - cached[0] <= REVIEW_TTL_SECONDS:
                cache.move_to_end(token)
                if isinstance(cached[1], Unauthorized):
                    raise cached[1]
                return cached[1]
        pending = self._pending.get(token)
        if pending is not None and not pending.done():
            # Shielded: one caller giving up cancels no other's review.
            return await asyncio.shield(pending)
        if token not in self._taken:
            decision = self._reviews.take("new tokens", now)
            if not decision.allowed:
                raise RateLimited(
                    f"more new bearer tokens to check than {NEW_TOKENS} a second; retry after "
                    f"{decision.retry_after:.2f} s",
                    headers={"Retry-After": str(max(1, math.ceil(decision.retry_after)))},
                )
        review = asyncio.ensure_future(self._review(token))
        self._pending[token] = review
        review.add_done_callback(functools.partial(self._reviewed, token))
        return await asyncio.shield(review)

    def _reviewed(self, token: str, review: asyncio.Future[Tenant]) -> None:
        if self._pending.get(token) is review:
            del self._pending[token]
        if not review.cancelled():
            review.exception()  # retrieved: every caller may have given up waiting

    async def _review(self, token: str) -> Tenant:
        try:
            tenant = await self.store.review(token)
        except Unauthorized as error:
            _remember(self._refused, token, (self._clock(), error))
            self._taken.pop(token, None)
            raise
        _remember(self._taken, token, (self._clock(), tenant))
        self._refused.pop(token, None)
        return tenant


MAX_CACHED = 10_000
NEW_TOKENS = 50
NEW_TOKEN_BURST = 500


def _remember(cache: OrderedDict[str, Any], token: str, answer: Any) -> None:
    cache[token] = answer
    cache.move_to_end(token)
    while len(cache) > MAX_CACHED:
        cache.popitem(last=False)


def _usage(programs: list[Document], slices: list[Document]) -> Usage:
    devices = 0
    active_programs = 0
    for program in programs:
        if not is_active(program):
            continue
        active_programs += 1
        for item in (program.get("spec") or {}).get("slices") or []:
            if item.get("virtualSliceName"):
                continue
            devices += _size(item)
    for item in slices:
        # Inline slices of programs are counted with their program: those the operator made,
        # owned by a program (a tenant's label alone made a slice free of the quota).
        owned = any(
            reference.get("kind") == "PathwaysProgram"
            for reference in item["metadata"].get("ownerReferences") or []
        )
        if is_active(item) and not owned:
            devices += _size(item.get("spec") or {})
    return Usage(devices, active_programs)


def _size(spec: dict[str, Any]) -> int:
    if spec.get("shape"):
        return device_count(parse_shape(str(spec["shape"])))
    return int(spec.get("devices") or 0)


def _data_file(data: str, name: str) -> str:
    folder = Path(tempfile.mkdtemp(prefix="pathways-api-"))
    path = folder / name
    path.write_bytes(base64.b64decode(data))
    path.chmod(0o600)
    return str(path)


_DENIED = re.compile(r"denied (?:the )?request: (?P<reason>.*)", re.DOTALL)
_FIELD = re.compile(r"^(?P<field>(?:spec|metadata)(?:\.[A-Za-z0-9_\[\]]+)*): ")


def _admission_refusal(status: int, message: str) -> ApiError | None:
    """The tenant's error when the API server's admission refused an object (the cluster's
    ValidatingAdmissionPolicies, such as the chart's tenant policy, or webhooks): 403 or 422
    with the policy's words and the field they name. ``None`` for any other refusal (our own
    service account lacking a permission is the cluster's problem, not the caller's)."""
    denied = _DENIED.search(message) if status in (403, 422) else None
    if denied is None:
        return None
    reason = denied["reason"].strip()
    field = _FIELD.match(reason)
    error = Forbidden if status == 403 else InvalidField
    return error(
        f"refused by the cluster's admission policy: {reason}", field=field and field["field"]
    )


def _place(document: Document) -> tuple[str, str]:
    """A listed object's place in creation order: its creation time, then its name."""
    meta = document["metadata"]
    return (meta.get("creationTimestamp") or "", meta.get("name") or "")


def _encode_place(place: tuple[str, str]) -> str:
    """An opaque continue token: the place of the last object given."""
    return base64.urlsafe_b64encode(json.dumps(["after", *place]).encode()).decode().rstrip("=")


def _decode_place(token: str) -> tuple[str, str]:
    """The place a continue token stands for, or InvalidField."""
    try:
        padded = token + "=" * (-len(token) % 4)
        tag, created, name = json.loads(base64.urlsafe_b64decode(padded).decode())
        if tag != "after" or not isinstance(created, str) or not isinstance(name, str):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidField(
            "not a continue token given by a previous page", field="query continue"
        ) from None
    return created, name


def _leases(namespace: str) -> str:
    namespace = urllib.parse.quote(namespace, safe="")
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def _shown(document: Document) -> Document:
    """An object as callers see it: without the idempotency key it was created with (the
    client's own value, which the embedded store never shows) and its fingerprint."""
    annotations = (document.get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_KEY not in annotations and ANNOTATION_FINGERPRINT not in annotations:
        return document
    kept = {
        k: v for k, v in annotations.items() if k not in (ANNOTATION_KEY, ANNOTATION_FINGERPRINT)
    }
    metadata = {k: v for k, v in document["metadata"].items() if k != "annotations"}
    return {**document, "metadata": {**metadata, **({"annotations": kept} if kept else {})}}


def _holder(lease: Document) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _lease_free(lease: Document, now: datetime.datetime) -> bool:
    """Whether no one holds a Lease: no holder, or a hold past its duration."""
    spec = lease.get("spec") or {}
    if not spec.get("holderIdentity"):
        return True
    try:
        renewed = datetime.datetime.fromisoformat(str(spec["renewTime"]).replace("Z", "+00:00"))
        duration = float(spec.get("leaseDurationSeconds") or LEASE_SECONDS)
    except (KeyError, ValueError):
        return True  # a hold that says nothing of its time holds nothing
    return now > renewed + datetime.timedelta(seconds=duration)


def _said(error: Exception) -> str:
    """What an HTTP error says: its words, or its kind (httpx's timeouts carry none)."""
    return str(error) or f"{type(error).__name__} (after its timeout)"
