"""An HTTP client of the REST API (what the CLI and the demo use).

A request refused because the tenant is over its rate limit (429 ``RateLimited``, with
``Retry-After``) was not carried out, so idempotent requests (GET, HEAD, PUT, DELETE, and POST
with an ``Idempotency-Key``) are sent again after the wait the server asks for, at most
``max_retries`` times and ``max_retry_wait`` seconds in all; other requests, and requests that
run out of retries, raise :class:`ApiCallError` with ``code == "RateLimited"`` and
``retry_after``. Other 429s (``QuotaExceeded``) are never retried. A request the embedded store
could not take (503 ``StoreBusy``: its file stayed locked by another writer, nothing was done)
is sent again the same way, whatever its method. A collection or object name
the API would refuse (not a Kubernetes object name) is :class:`InvalidName`, before anything is
sent.
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx

from pathways_client import tls
from pathways_core.resources.base import DNS_SUBDOMAIN_PATTERN

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
COLLECTIONS = ("programs", "virtualslices", "islands")
# A Kubernetes object name (DNS subdomain, RFC 1123), as the API requires of every object.
OBJECT_NAME = re.compile(DNS_SUBDOMAIN_PATTERN)
MAX_NAME = 253


def _path(collection: str, name: str | None = None, action: str | None = None) -> str:
    """The API path of a collection, one of its objects, or an object's ``action``; an
    :class:`InvalidName` for a name the API would refuse: one is a single path segment, and
    a name such as ``p/events``, ``.`` or ``..`` reached another route (the server decodes
    ``%2F``, and ``.`` segments are dropped before sending)."""
    if collection not in COLLECTIONS:
        raise InvalidName(
            f"collection {_shown(collection)}: expected one of {', '.join(COLLECTIONS)}",
            "collection",
        )
    segments = [collection]
    if name is not None:
        if not isinstance(name, str) or len(name) > MAX_NAME or not OBJECT_NAME.fullmatch(name):
            raise InvalidName(
                f"name {_shown(name)} is not an object name: expected lowercase letters, digits, "
                "'-' and '.', starting and ending with a letter or digit, at most "
                f"{MAX_NAME} characters (a Kubernetes DNS subdomain)",
                "name",
            )
        segments.append(name)
    if action is not None:
        segments.append(action)
    return "/v1/" + "/".join(quote(segment, safe="") for segment in segments)


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: at most 100 characters of it."""
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


MAX_LOG_BYTES = 16 << 20
"""The most of a program's output one look at its logs answers (the API's limitBytes)."""


class ApiCallError(RuntimeError):
    """The API answered with an error: its status, code, message and field."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None,
        retry_after: float | None = None,
    ) -> None:
        where = f" ({field})" if field else ""
        super().__init__(f"{code}: {message}{where}")
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after = retry_after  # seconds the server asked to wait (Retry-After)


class InvalidName(ApiCallError, ValueError):
    """A collection or object name refused before anything was sent (the API would refuse
    it, or read it as another route): a ``ValueError`` naming the argument, and an
    :class:`ApiCallError` (422 ``InvalidField``), as the server's refusal would be."""

    def __init__(self, message: str, argument: str) -> None:
        super().__init__(422, "InvalidField", message, argument)


def _checked_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; else ``ValueError`` saying what is wrong
    (httpx's ``InvalidURL`` was a traceback)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as error:
        raise ValueError(
            f"API URL {url!r} is not a URL ({error}): expected http(s)://HOST[:PORT]"
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"API URL {url!r}: expected http(s)://HOST[:PORT]")
    return url


def _checked_token(token: str | None) -> str | None:
    """``token`` without surrounding whitespace (a token file's newline); ``ValueError`` if
    what is left is no bearer token, naming where, never the token (it was "Unreachable")."""
    if token is None:
        return None
    token = token.strip()
    for position, character in enumerate(token):
        if not (character.isascii() and character.isprintable()) or character == " ":
            raise ValueError(
                "the bearer token (--token or PATHWAYS_TOKEN) has character "
                f"U+{ord(character):04X} at position {position}: a token is printable ASCII "
                "without spaces"
            )
    return token


class ApiClient:
    """Calls of one tenant (its bearer token) to one API server."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float = 30.0,
        *,
        max_retries: int = 3,
        max_retry_wait: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        verify: ssl.SSLContext | bool | None = None,
    ) -> None:
        token = _checked_token(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = _checked_url(url).rstrip("/")
        if verify is None:  # an https URL's certificate is checked against PATHWAYS_TLS_CA
            loaded = tls.load()  # (TlsConfigError when half set), else the system's CAs
            verify = loaded.client if loaded is not None else True
        self._settings = {"headers": headers, "timeout": timeout, "verify": verify}
        self._token, self._timeout, self._verify = token, timeout, verify
        self.http = httpx.Client(base_url=self.url, **self._settings)
        self.max_retries = max_retries
        self.max_retry_wait = max_retry_wait
        self._sleep = sleep

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def reconnect(self) -> None:
        """Start a new connection pool: a request a signal interrupted (Ctrl-C) can leave the
        old one unusable, and the clean-up after it must still reach the server."""
        old, self.http = self.http, httpx.Client(base_url=self.url, **self._settings)
        with contextlib.suppress(Exception):
            old.close()

    def another(self) -> ApiClient:
        """A client of the same tenant and server on connections of its own (for another
        thread: one thread's interrupted request cannot break the other's)."""
        return ApiClient(
            self.url,
            self._token,
            self._timeout,
            max_retries=self.max_retries,
            max_retry_wait=self.max_retry_wait,
            verify=self._verify,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, idempotent: bool = False, **arguments: Any) -> Any:
        """One request; the decoded JSON (or text) answer, or :class:`ApiCallError`.
        Requests refused for a while (rate limit, busy store) are retried (see the module)."""
        retries, waited = 0, 0.0
        while True:
            try:
                answer = self.http.request(method, path, **arguments)
            except httpx.HTTPError as error:
                raise ApiCallError(0, "Unreachable", f"{self.url}: {error}", None) from None
            if answer.status_code < 400:
                break
            failure = _error_of(answer)
            delay = failure.retry_after
            if (
                failure.code not in RETRIED
                or delay is None
                or (
                    failure.code == "RateLimited"
                    and not (idempotent or _idempotent(method, arguments.get("headers")))
                )
                or retries >= self.max_retries
                or waited + delay > self.max_retry_wait
            ):
                raise failure
            self._sleep(delay)
            retries, waited = retries + 1, waited + delay
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    # -- resources -----------------------------------------------------------------------------

    def submit(
        self, document: dict[str, Any], idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Create a PathwaysProgram or a VirtualSlice from its manifest."""
        path = "/v1/virtualslices" if document.get("kind") == "VirtualSlice" else "/v1/programs"
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.call(
            "POST",
            path,
            content=json.dumps(document),
            headers={**headers, "Content-Type": "application/json"},
        )

    def list(self, collection: str, **query: Any) -> list[dict[str, Any]]:
        """Every object of a collection (``programs``, ``virtualslices``, ``islands``), all
        pages."""
        items: list[dict[str, Any]] = []
        token = None
        while True:
            parameters = {k: v for k, v in query.items() if v is not None}
            if token:
                parameters["continue"] = token
            page = self.call("GET", _path(collection), params=parameters)
            items += page["items"]
            token = page.get("continue")
            if not token:
                return items

    def get(self, collection: str, name: str) -> dict[str, Any]:
        """One object."""
        return self.call("GET", _path(collection, name))

    def cancel(self, name: str) -> dict[str, Any]:
        """Cancel a program."""
        return self.call("POST", _path("programs", name, "cancel"))

    def suspend(self, name: str) -> dict[str, Any]:
        """Suspend a program: its run stops and its devices are released until it resumes."""
        return self.call("POST", _path("programs", name, "suspend"))

    def resume(self, name: str) -> dict[str, Any]:
        """Resume a suspended program: its next run starts once its slices are bound."""
        return self.call("POST", _path("programs", name, "resume"))

    def delete(self, collection: str, name: str, uid: str | None = None) -> dict[str, Any]:
        """Delete a program or release a virtual slice; with ``uid``, only that object (not
        one made since under its name: 404)."""
        params = {"uid": uid} if uid else {}
        return self.call("DELETE", _path(collection, name), params=params)

    def session_credential(self, island: str, client: str) -> str:
        """A credential for this tenant's session ``client`` with ``island``'s scheduler (the
        devices of its slices bound there); "" when the island needs none."""
        answer = self.call(
            "POST",
            _path("islands", island, "credentials"),
            idempotent=True,  # signs anew: twice is as once
            content=json.dumps({"client": client}),
            headers={"Content-Type": "application/json"},
        )
        return answer.get("credential") or ""

    def renew(self, name: str, uid: str | None = None) -> dict[str, Any]:
        """Renew a virtual slice's lease (``spec.leaseSeconds``): its holder still uses it;
        with ``uid``, only that slice (not one made since under its name: 404)."""
        params = {"uid": uid} if uid else {}
        # Twice is as once: retried when throttled (a tenant's burst must not cost its leases).
        return self.call(
            "POST", _path("virtualslices", name, "renew"), idempotent=True, params=params
        )

    def logs(self, name: str) -> str:
        """A program's output (its last 16 MiB, when there is more)."""
        return self.log_window(name)["logs"]

    def log_window(
        self,
        name: str,
        offset: int = 0,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
        run: int | None = None,
    ) -> dict[str, Any]:
        """Part of a program's output (of run ``run`` only, if given): from byte ``offset``, its
        last ``tail_lines`` lines, at most its last ``limit_bytes`` bytes; with ``start``,
        ``end`` (ask from there for what comes next) and ``size``, all byte offsets."""
        window = {
            "offset": offset,
            "tailLines": tail_lines,
            "limitBytes": limit_bytes,
            "run": run,
        }
        parameters = {key: value for key, value in window.items() if value is not None}
        return self.call("GET", _path("programs", name, "logs"), params=parameters)

    def events(self, name: str, collection: str = "programs") -> list[dict[str, Any]]:
        """A program's Events (or a virtual slice's, of ``virtualslices``)."""
        return self.call("GET", _path(collection, name, "events"))["items"]

    def trace(self, name: str) -> list[dict[str, Any]]:
        """A program's island trace records (all pages)."""
        return self.trace_whole(name)[0]

    def trace_whole(self, name: str) -> tuple[list[dict[str, Any]], list[str]]:
        """A program's island trace records, all pages, and which runs' lack their oldest
        (their island had let go of them)."""
        records: list[dict[str, Any]] = []
        parameters: dict[str, str] = {}
        while True:
            page = self.call("GET", _path("programs", name, "trace"), params=parameters)
            records += page["records"]
            if not page.get("continue"):
                return records, list(page.get("incomplete") or [])
            parameters["continue"] = page["continue"]

    def me(self) -> dict[str, Any]:
        """The caller's tenant, quotas and usage."""
        return self.call("GET", "/v1/me")


RETRIED = ("RateLimited", "StoreBusy")
"""Refusals sent again after their ``Retry-After`` (see the module): RateLimited only if the
request is idempotent, StoreBusy whatever it is."""


def _idempotent(method: str, headers: Any) -> bool:
    """Whether sending the request twice does what sending it once does."""
    if method.upper() in IDEMPOTENT_METHODS:
        return True
    keys = {str(name).lower() for name in (headers or {})}
    return method.upper() == "POST" and "idempotency-key" in keys


def _retry_after(answer: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (delay-seconds form), if it has one."""
    try:
        value = float(answer.headers.get("retry-after", ""))
    except ValueError:
        return None
    return value if value >= 0 else None


def _error_of(answer: httpx.Response) -> ApiCallError:
    """The error an answer of status >= 400 stands for."""
    try:
        error = answer.json()["error"]
        return ApiCallError(
            answer.status_code,
            error["code"],
            error["message"],
            error.get("field"),
            _retry_after(answer),
        )
    except (ValueError, KeyError, TypeError):
        return ApiCallError(answer.status_code, "HttpError", answer.text[:200], None)
