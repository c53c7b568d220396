"""The operator's own Kubernetes API client: a thin aiohttp layer over kopf's credentials.

Only this module talks to the API server (kopf's watches aside). Every call names its resource
by apiVersion and kind; RBAC.md lists what the operator calls, per resource.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from pathways_core.control import Event, ObjectRef, timestamp
from pathways_core.control.common import now_utc

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
# Where Events about cluster-scoped objects live (the API server allows no other namespace).
CLUSTER_EVENTS_NAMESPACE = "default"


@dataclass(frozen=True)
class Kind:
    """How a kind is addressed in the API."""

    api_version: str
    plural: str
    namespaced: bool


KINDS: dict[tuple[str, str], Kind] = {
    (kind.api_version, name): kind
    for name, kind in {
        "Island": Kind("pathways.dev/v1alpha1", "islands", False),
        "VirtualSlice": Kind("pathways.dev/v1alpha1", "virtualslices", True),
        "PathwaysProgram": Kind("pathways.dev/v1alpha1", "pathwaysprograms", True),
        "Deployment": Kind("apps/v1", "deployments", True),
        "StatefulSet": Kind("apps/v1", "statefulsets", True),
        "Service": Kind("v1", "services", True),
        "ConfigMap": Kind("v1", "configmaps", True),
        "Secret": Kind("v1", "secrets", True),
        "Event": Kind("v1", "events", True),
        "Job": Kind("batch/v1", "jobs", True),
        "Pod": Kind("v1", "pods", True),
    }.items()
}


class ApiError(Exception):
    """The API server refused a request: ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _kind(api_version: str, kind: str) -> Kind:
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"the operator does not handle {kind} ({api_version})") from None


def path(
    api_version: str,
    kind: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The URL path of a collection or an object."""
    info = _kind(api_version, kind)
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [root]
    if info.namespaced and namespace:
        parts.append(f"namespaces/{namespace}")
    parts.append(info.plural)
    if name:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def credentials(settings: kopf.OperatorSettings, logger: Any) -> kopf.ConnectionInfo:
    """In a pod: its service account; elsewhere: $KUBECONFIG or ~/.kube/config."""
    info = kopf.login_with_service_account(
        settings=settings, logger=logger
    ) or kopf.login_with_kubeconfig(settings=settings, logger=logger)
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig to log in with")
    return info


class Kube:
    """An async client of the API server. ``login`` returns fresh credentials; it is called
    again once when the server answers 401 (service account tokens rotate). ``user_agent``
    names the caller in the API server's audit log."""

    def __init__(
        self, login: Callable[[], kopf.ConnectionInfo], user_agent: str = "pathways-operator"
    ) -> None:
        self._login = login
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None
        self._server = ""

    def _connect(self) -> aiohttp.ClientSession:
        info = self._login()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            auth = info.as_aiohttp_basic_auth()
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, ssl=info.as_ssl_context()),
            headers={**info.as_http_headers(), "User-Agent": self._user_agent},
            auth=auth,
        )
        return self._session

    async def close(self) -> None:
        """Close the connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> Any:
        """One API call; returns the decoded JSON answer, raises ``ApiError``."""
        for attempt in (1, 2):
            session = self._session or self._connect()
            async with session.request(
                method,
                self._server + url,
                json=body,
                params=params,
                headers={"Content-Type": content_type} if body is not None else None,
            ) as response:
                if response.status == 401 and attempt == 1:
                    await self.close()
                    continue
                text = await response.text()
                if response.status >= 400:
                    raise ApiError(response.status, _status_message(text)[:500])
                return await response.json(content_type=None) if text else None
        raise AssertionError("unreachable")

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """An object, or ``None`` when it does not exist."""
        try:
            return await self.request("GET", path(api_version, kind, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in a namespace, or everywhere), with apiVersion and kind
        set on each item (list answers omit them)."""
        params = {"labelSelector": label_selector} if label_selector else None
        answer = await self.request("GET", path(api_version, kind, namespace), params=params)
        items = (answer or {}).get("items") or []
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def create(self, document: dict[str, Any]) -> dict[str, Any] | None:
        """Create an object; ``None`` when one of that name exists already (so creating twice,
        as a repeated reconcile does, is harmless)."""
        meta = document["metadata"]
        url = path(document["apiVersion"], document["kind"], meta.get("namespace"))
        try:
            return await self.request("POST", url, body=document)
        except ApiError as error:
            if error.status == 409:
                return None
            raise

    async def replace_content(self, document: dict[str, Any]) -> None:
        """Replace the ``spec`` (a ConfigMap's ``data``) of the object of ``document``'s name
        by ``document``'s."""
        meta = document["metadata"]
        content = "data" if "data" in document else "spec"
        await self.patch(
            document["apiVersion"],
            document["kind"],
            meta.get("namespace"),
            meta["name"],
            [{"op": "replace", "path": f"/{content}", "value": document[content]}],
            json_patch=True,
        )

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        json_patch: bool = False,
    ) -> dict[str, Any]:
        """A merge patch, or a JSON patch (a list of operations, where a failed ``test``
        answers 422 and changes nothing)."""
        return await self.request(
            "PATCH",
            path(api_version, kind, namespace, name, subresource),
            body=body,
            content_type=JSON_PATCH if json_patch else MERGE_PATCH,
        )

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete an object and, in the background, what it owns; ``False`` if it was gone."""
        try:
            await self.request(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def delete_owned(
        self, api_version: str, kind: str, namespace: str | None, name: str, owner_uid: str
    ) -> bool:
        """Delete an object only if ``owner_uid`` owns it (a same-named object of another
        owner, or of the user, is left alone); ``False`` if it was not deleted. The deletion is
        conditional on the uid read, so an object made again meanwhile is not the one
        deleted."""
        document = await self.get(api_version, kind, namespace, name)
        metadata = (document or {}).get("metadata") or {}
        owners = metadata.get("ownerReferences") or []
        if not any(owner.get("uid") == owner_uid for owner in owners):
            return False
        try:
            await self.request(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background", "preconditions": {"uid": metadata["uid"]}},
            )
        except ApiError as error:
            if error.status in (404, 409):
                return False
            raise
        return True

    async def post_event(self, event: Event) -> None:
        """Record a Kubernetes Event (core/v1) about ``event.target``. Events of cluster-scoped
        objects (islands) go to ``default``: the API server refuses one elsewhere whose
        involvedObject has no namespace (kopf posts them there too)."""
        target: ObjectRef = event.target
        where = target.namespace or CLUSTER_EVENTS_NAMESPACE
        moment = timestamp(now_utc())
        involved = {
            "apiVersion": target.api_version,
            "kind": target.kind,
            "name": target.name,
            "namespace": target.namespace,
            "uid": target.uid,
        }
        await self.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{target.name}.", "namespace": where},
                "involvedObject": {k: v for k, v in involved.items() if v},
                "type": event.type,
                "reason": event.reason,
                "message": event.message[:1024],
                "source": {"component": "pathways-operator"},
                "reportingComponent": "pathways-operator",
                "firstTimestamp": moment,
                "lastTimestamp": moment,
                "count": 1,
            }
        )


def _status_message(text: str) -> str:
    """The ``message`` of an API server's ``Status`` answer (the words a user should read),
    else the answer as it came."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text
    message = answer.get("message") if isinstance(answer, dict) else None
    return message if isinstance(message, str) and message else text
