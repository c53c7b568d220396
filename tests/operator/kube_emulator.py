"""A Kubernetes API server for the operator tests: kmock's stateful ``KubernetesEmulator`` with
the behaviour kopf and the operator rely on.

kmock 0.8 (pinned in pyproject.toml) stores objects and streams watch events, but lacks what a
controller's correctness depends on. This subclass adds:

- ``metadata.uid``, ``resourceVersion`` (one counter for the whole server),
  ``creationTimestamp``, ``generation`` (bumped when ``spec`` changes), ``generateName``;
- 201 on create, 409 on a name taken, 404 on patching or deleting a missing object;
- JSON patches whose ``test`` fails answer 422 (not 500) and change nothing; a merge patch
  carrying a stale ``metadata.resourceVersion`` answers 409;
- status subresource isolation for the kinds declared with one: ``PATCH .../status`` changes
  only ``status``, a patch of the object never changes it;
- a watch with ``resourceVersion`` replays only the events after it (kmock replays every
  object), a list answers the current ``resourceVersion``;
- ``labelSelector`` on lists and watches (``a=b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
  ``a notin (x)``);
- ``GET /api/v1/namespaces`` lists the namespaces objects live in;
- garbage collection: deleting an object deletes the objects whose ownerReferences name it;
- a deletion's ``preconditions.uid`` (409 when the object's uid differs);
- core/v1 Events validated as the API server does (``legacyValidateEvent``): one about an
  object of no namespace lives in ``default``, one about a namespaced object in its namespace
  (422 otherwise);
- ``hooks``: async callables run before each request, to delay or fail chosen requests;
- ``pod_logs``: what a pod's ``log`` subresource answers.
"""

from __future__ import annotations

import collections
import copy
import datetime
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import jsonpatch
import jsonpointer
import kmock
from kmock._internal import apps, enums

Hook = Callable[[kmock.Request], Awaitable[None]]


def _validate_event(event: dict[str, Any], namespace: str) -> None:
    """The API server's rule for core/v1 Events without ``eventTime``
    (pkg/apis/core/validation/events.go, legacyValidateEvent)."""
    involved = (event.get("involvedObject") or {}).get("namespace") or ""
    if (not involved and namespace not in ("", "default")) or (involved and namespace != involved):
        raise kmock.KubernetesError(
            422,
            "Invalid",
            f"involvedObject.namespace: Invalid value: {involved!r}: does not match "
            "event.namespace",
        )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch turning ``old`` into ``new`` (for kmock's own history)."""
    diff: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            inner = merge_diff(old[key], value)
            if inner:
                diff[key] = inner
        elif key not in old or old[key] != value:
            diff[key] = copy.deepcopy(value)
    return diff


_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)|"
    r"\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate on labels for a Kubernetes label selector string."""
    if not selector:
        return lambda labels: True
    terms = re.split(r",(?![^(]*\))", selector)
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in terms:
        match = _REQUIREMENT.match(term)
        if match is None:
            raise kmock.KubernetesError(400, "BadRequest", f"bad label selector {selector!r}")
        key, op, value = match["key"], match["op"], match["value"]
        if match["neg"]:
            checks.append(lambda labels, k=key: k not in labels)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif match["set"]:
            values = {v.strip() for v in match["values"].split(",")}
            if match["set"] == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def _labels(raw: dict[str, Any]) -> dict[str, str]:
    return (raw.get("metadata") or {}).get("labels") or {}


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """See the module docstring."""

    status_subresource: set[str] = attrs.field(factory=set)
    """Plurals of the kinds that have a status subresource."""
    hooks: list[Hook] = attrs.field(factory=list)
    pod_logs: dict[tuple[str, str], bytes] = attrs.field(factory=dict)
    """What ``GET .../pods/NAME/log`` answers (as text), by namespace and pod name."""
    _revision: int = attrs.field(default=0, init=False)
    _log: dict[Any, list[tuple[int, dict[str, Any]]]] = attrs.field(
        factory=lambda: collections.defaultdict(list), init=False
    )

    def _next(self) -> str:
        self._revision += 1
        return str(self._revision)

    async def _emit(self, resource: Any, type_: str, raw: dict[str, Any]) -> None:
        event = {"type": type_, "object": copy.deepcopy(raw)}
        revision = int((raw.get("metadata") or {}).get("resourceVersion") or self._revision)
        self._log[resource].append((revision, event))
        await self._buses[resource].put(event)

    async def _handle(self, request: kmock.Request) -> Any:
        for hook in list(self.hooks):
            await hook(request)
        if request.subresource == "log" and getattr(request.resource, "plural", None) == "pods":
            log = self.pod_logs.get((request.namespace or "", request.name or ""))
            if log is None:
                return await self._render_error(kmock.KubernetesError(404, "NotFound", "no log"))
            return await kmock.Response(payload=log, headers={"Content-Type": "text/plain"})(
                request
            )
        try:
            if request.resource is not None:
                async with self._lock:
                    await self._mutate(request)
        except kmock.KubernetesError as error:
            return await self._render_error(error)
        serve = self._serving.get(request.action) if request.resource is not None else None
        if serve is not None and request.resource.plural:
            # Straight to our handlers: kmock's DSL matches every request against the whole
            # request history, which makes a server of thousands of requests quadratic.
            return await kmock.Response(payload=serve(request))(request)
        # Discovery and the rest: kmock's reactions and fallbacks, without its own mutation.
        return await apps.RawHandler._handle(self, request)

    @property
    def _serving(self) -> dict[Any, Callable[[kmock.Request], Any]]:
        return {
            enums.action.LIST: self._serve_list,
            enums.action.WATCH: self._serve_watch,
            enums.action.FETCH: self._serve_fetch,
            enums.action.CREATE: self._serve_create,
            enums.action.UPDATE: self._serve_update,
            enums.action.DELETE: self._serve_delete,
        }

    async def _mutate(self, request: kmock.Request) -> None:
        resource = request.resource
        if request.action == enums.action.CREATE:
            data = request.data if isinstance(request.data, dict) else {}
            meta = data.setdefault("metadata", {})
            namespace = request.namespace or meta.get("namespace")
            if namespace:
                meta["namespace"] = namespace
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise kmock.KubernetesError(422, "Invalid", "metadata.name is required")
                meta["name"] = meta["generateName"] + secrets.token_hex(3)
            if resource.plural == "events" and not data.get("eventTime"):
                _validate_event(data, namespace or "")
            key = (resource, namespace, meta["name"])
            if key in self._objects and not self._objects[key].deleted:
                raise kmock.KubernetesError(409, "AlreadyExists", f"{meta['name']} exists")
            meta.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next(),
                creationTimestamp=datetime.datetime.now(datetime.UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                generation=1,
            )
            if key in self._objects:
                self._objects[key].create(data)
            else:
                self._objects[key] = data
            await self._emit(resource, "ADDED", self._objects[key].raw)
        elif request.action == enums.action.UPDATE and request.name is not None:
            key = (resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            stored = self._objects[key]
            old = copy.deepcopy(dict(stored.raw))
            # A deep copy: the merge patch shares untouched parts with ``old``, which must
            # stay as it was for the comparisons below.
            new = copy.deepcopy(self._patched(old, request.data))
            has_status = resource.plural in self.status_subresource
            if has_status and request.subresource == "status":
                new = {**old, "status": new.get("status")}
                if new["status"] is None:
                    del new["status"]
            elif has_status:
                new.pop("status", None)
                if "status" in old:
                    new["status"] = old["status"]
            meta = new.setdefault("metadata", {})
            for field in ("uid", "creationTimestamp", "name", "namespace", "generation"):
                if field in old.get("metadata", {}):
                    meta[field] = old["metadata"][field]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if new == old:
                return  # a no-op patch changes nothing, not even the resourceVersion
            if new.get("spec") != old.get("spec"):
                meta["generation"] = int(meta.get("generation") or 0) + 1
            meta["resourceVersion"] = self._next()
            stored.patch(merge_diff(old, new))
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                await self._remove(key)
            else:
                await self._emit(resource, "MODIFIED", stored.raw)
        elif request.action == enums.action.DELETE and request.name is not None:
            key = (resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            options = request.data if isinstance(request.data, dict) else {}
            wanted = (options.get("preconditions") or {}).get("uid")
            if wanted and wanted != (self._objects[key].raw.get("metadata") or {}).get("uid"):
                raise kmock.KubernetesError(409, "Conflict", "precondition failed: uid")
            await self._delete(key)

    def _patched(self, old: dict[str, Any], patch: Any) -> dict[str, Any]:
        if isinstance(patch, list):
            try:
                return jsonpatch.apply_patch(old, patch, in_place=False)
            except jsonpatch.JsonPatchTestFailed as error:
                raise kmock.KubernetesError(422, "Invalid", f"test failed: {error}") from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
                raise kmock.KubernetesError(422, "Invalid", str(error)) from None
        if not isinstance(patch, dict):
            raise kmock.KubernetesError(400, "BadRequest", "a patch is a JSON object or list")
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise kmock.KubernetesError(409, "Conflict", "the object has been modified")
        return merge_patch(old, patch)

    async def _delete(self, key: Any) -> None:
        stored = self._objects[key]
        meta = stored.raw.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return
        if meta.get("finalizers"):
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            stored.patch({"metadata": {"deletionTimestamp": now, "resourceVersion": self._next()}})
            await self._emit(key[0], "MODIFIED", stored.raw)
        else:
            await self._remove(key)

    async def _remove(self, key: Any) -> None:
        stored = self._objects[key]
        raw = copy.deepcopy(dict(stored.raw))
        raw["metadata"]["resourceVersion"] = self._next()
        stored.delete()
        await self._emit(key[0], "DELETED", raw)
        # Garbage collection of dependents, as the controller manager does.
        uid = raw["metadata"].get("uid")
        for other_key, other in list(self._objects.items()):
            if other.deleted:
                continue
            owners = (other.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(owner.get("uid") == uid for owner in owners):
                await self._delete(other_key)

    # -- reading -----------------------------------------------------------------------------

    def _matching(self, request: kmock.Request) -> list[dict[str, Any]]:
        selector = label_matcher(request.params.get("labelSelector"))
        return [
            obj.raw
            for (resource, namespace, _name), obj in self._objects.items()
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and selector(_labels(obj.raw))
        ]

    def _stored(
        self, request: kmock.Request, name: str | None = None, namespace: str | None = None
    ) -> Any:
        """The stored object a request names (kmock's own lookup scans every object)."""
        key = (request.resource, request.namespace or namespace, name or request.name)
        return self._objects[key] if key in self._objects else None  # noqa: SIM401 (no .get)

    async def _serve_create(self, request: kmock.Request) -> Any:
        meta = request.data.get("metadata") or {}
        stored = self._stored(request, meta.get("name"), meta.get("namespace"))
        return kmock.Response(status=201, payload=copy.deepcopy(dict(stored.raw)))

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        stored = self._stored(request)
        if stored is None or stored.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return copy.deepcopy(dict(stored.raw))

    async def _serve_update(self, request: kmock.Request) -> Any:
        return copy.deepcopy(dict(self._stored(request).last.raw))

    async def _serve_delete(self, request: kmock.Request) -> Any:
        return copy.deepcopy(dict(self._stored(request).last.raw))

    async def _serve_list(self, request: kmock.Request) -> Any:
        assert request.resource is not None
        if request.resource.plural == "namespaces" and request.resource.group == "":
            names = {namespace for (_, namespace, _) in self._objects if namespace}
            return {
                "apiVersion": "v1",
                "kind": "NamespaceList",
                "metadata": {"resourceVersion": str(self._revision)},
                "items": [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                    for name in sorted(names | {"default"})
                ],
            }
        if request.resource not in set(self.resources) and not self._matching(request):
            raise kmock.KubernetesResourceNotFoundError()
        async with self._lock:
            return {
                "metadata": {"resourceVersion": str(self._revision)},
                "items": copy.deepcopy(self._matching(request)),
            }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""
        assert request.resource is not None
        selector = label_matcher(request.params.get("labelSelector"))
        since = request.params.get("resourceVersion")

        def wanted(event: dict[str, Any]) -> bool:
            meta = (event.get("object") or {}).get("metadata") or {}
            return (
                request.namespace is None or meta.get("namespace") == request.namespace
            ) and selector(meta.get("labels") or {})

        async with self._lock:
            mark = await self._buses[request.resource].mark()
            if since and since != "0":
                replay = [e for rv, e in self._log[request.resource] if rv > int(since)]
            else:
                replay = [
                    {"type": "ADDED", "object": copy.deepcopy(raw)}
                    for raw in self._matching(request)
                ]
        for event in replay:
            if wanted(event):
                yield event
        async for event in mark:
            if wanted(event):
                yield event


def declare(emulator: Emulator) -> None:
    """Declare the kinds the operator and kopf use, for discovery and empty lists."""
    info = kmock.ResourceInfo
    crds = {
        "islands": info(kind="Island", namespaced=False, verbs={"list", "watch", "patch", "get"}),
        "virtualslices": info(kind="VirtualSlice", namespaced=True),
        "pathwaysprograms": info(kind="PathwaysProgram", namespaced=True),
    }
    for plural, resource in crds.items():
        resource.verbs = {"get", "list", "watch", "create", "patch", "delete"}
        resource.subresources = {"status"}
        emulator.resources[f"pathways.dev/v1alpha1/{plural}"] = resource
        emulator.status_subresource.add(plural)
    verbs = {"get", "list", "watch", "create", "patch", "delete"}
    for key, kind, namespaced in (
        ("apps/v1/deployments", "Deployment", True),
        ("apps/v1/statefulsets", "StatefulSet", True),
        ("batch/v1/jobs", "Job", True),
        ("v1/services", "Service", True),
        ("v1/configmaps", "ConfigMap", True),
        ("v1/secrets", "Secret", True),
        ("v1/events", "Event", True),
        ("v1/pods", "Pod", True),
        ("v1/namespaces", "Namespace", False),
        ("events.k8s.io/v1/events", "Event", True),
        ("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", False),
        ("coordination.k8s.io/v1/leases", "Lease", True),
    ):
        emulator.resources[key] = info(kind=kind, namespaced=namespaced, verbs=verbs)
