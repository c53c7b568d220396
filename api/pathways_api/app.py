"""The REST API: an app factory and two-line routes over :class:`~pathways_api.service.Service`.

``create_app(service, authenticator)`` builds the app; the service and the authenticator are
reached through dependencies (:func:`service`, :func:`tenant`) that tests may override.

Request bodies are JSON (``application/json``, or any ``application/*+json``), or YAML with
``Content-Type: application/yaml``; other types get 415 naming those; at most
``max_body`` bytes (1 MiB by default, ``PATHWAYS_API_MAX_BODY``): larger bodies get 413 and
are never read further. Each authenticated tenant is held to its rate limits
(:mod:`pathways_api.ratelimit`): 429 ``RateLimited`` with ``Retry-After``. Errors are JSON
``{"error": {"code", "message", "field"}}``, unexpected ones too (500 ``InternalError``, the
traceback logged, never sent).
"""

from __future__ import annotations

import asyncio
import datetime
import email.message
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import yaml
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pathways_api import metrics
from pathways_api.auth import Authenticator, Tenant, bearer_token
from pathways_api.errors import ERROR_RESPONSES, ApiError, InvalidField, UnsupportedMediaType
from pathways_api.logs import MAX_LOG_BYTES, LogWindow
from pathways_api.ratelimit import DEFAULT_BUDGETS, ApiRateLimiter
from pathways_api.service import ListQuery, Service, parse_labels
from pathways_api.store import ISLAND, PROGRAM, SLICE
from pathways_core.control.rate_limit import Budgets
from pathways_core.manifests import Problem, expanded_size, format_path, problems_of
from pathways_core.resources import Island, PathwaysProgram, VirtualSlice
from pathways_core.resources.base import DNS_SUBDOMAIN_PATTERN

MAX_BODY_BYTES = 1 << 20
# Trace records per page (about 200 bytes each): by default, and at most.
TRACE_PAGE, MAX_TRACE_PAGE = 10_000, 50_000
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
ACCEPTED_TYPES = ("application/json", "application/*+json", *YAML_TYPES)
"""Body media types the API reads: JSON as FastAPI reads it (``+json`` suffixes included,
which clients sent before 415 existed), and YAML (turned into JSON by :class:`BodyLimit`)."""

logger = logging.getLogger("pathways.api")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- response models (the OpenAPI schema) ----------------------------------------------------


class ProgramList(BaseModel):
    """A page of programs."""

    items: list[PathwaysProgram]
    continue_: str | None = Field(
        default=None, alias="continue", description="Token of the next page; null at the end."
    )


class SliceList(BaseModel):
    """A page of virtual slices."""

    items: list[VirtualSlice]
    continue_: str | None = Field(default=None, alias="continue")


class IslandList(BaseModel):
    """A page of islands."""

    items: list[Island]
    continue_: str | None = Field(default=None, alias="continue")


class EventItem(BaseModel):
    """Something that happened to an object."""

    type: str = Field(description="Normal or Warning.")
    reason: str = Field(description="One CamelCase word.")
    message: str
    time: str


class EventList(BaseModel):
    """An object's Events, oldest first."""

    items: list[EventItem]


class TraceRecord(BaseModel):
    """One computation on one executor, as the island's scheduler recorded it."""

    seq: int
    client: str
    name: str
    devices: list[int]
    executor: int
    start_ns: int
    end_ns: int
    ok: bool
    island: str


class TraceResponse(BaseModel):
    """A page of a program's trace records."""

    program: str
    records: list[TraceRecord]
    incomplete: list[str] = Field(
        description="Runs whose trace lacks records, and why: their island let go of the "
        "oldest (it keeps about 200,000 records of all its clients, the one holding the most "
        "losing its oldest first), its scheduler restarted before the run's trace was taken, "
        "or it could not be read."
    )
    continue_: str | None = Field(
        alias="continue", description="Token of the next page; null on the last one."
    )


class Logs(BaseModel):
    """A window on the output of a program's runs."""

    program: str
    logs: str = Field(description="Each run's output after a '--- run N ---' line.")
    start: int = Field(description="Where ``logs`` starts: a byte offset into all the output.")
    end: int = Field(
        description="Where ``logs`` ends: the offset to ask from for what comes next "
        "(before any character still being written)."
    )
    size: int = Field(description="How many bytes of output there were.")
    linesCut: bool = Field(
        default=False,
        description="The lines asked for (tailLines) begin before ``start``: longer than "
        "limitBytes, they are cut to their end.",
    )


class Amounts(BaseModel):
    """Devices and programs."""

    devices: int
    programs: int


class Limits(Amounts):
    """Devices and programs at most, and the highest priority the tenant may ask for."""

    priority: int


class Me(BaseModel):
    """The caller."""

    tenant: str
    namespace: str
    mode: str = Field(description="embedded or kubernetes.")
    quotas: Limits
    usage: Amounts


class SessionRequest(BaseModel):
    """Whose session a credential is for."""

    model_config = ConfigDict(extra="forbid")

    client: str = Field(
        max_length=256,
        description="The session's client name: '<tenant>.<name>' (printable, no '/').",
    )


class SessionCredential(BaseModel):
    """A credential for a session with an island's scheduler (see docs/security.md)."""

    island: str
    client: str
    credential: str | None = Field(
        description="What the session's hello carries; null when the island needs none."
    )
    devices: list[int] = Field(
        default_factory=list,
        description="The island's devices the session may run on: the tenant's slices bound there.",
    )
    priority: int | None = Field(default=None, description="The highest priority it may ask for.")
    expires: int | None = Field(
        default=None, description="Unix seconds: a hello after it is refused."
    )


class Health(BaseModel):
    """A probe's answer."""

    status: str


# -- dependencies ----------------------------------------------------------------------------

bearer = HTTPBearer(auto_error=False, description="A tenant's token.")


async def service(request: Request) -> Service:
    """The app's service (tests may override this dependency)."""
    return request.app.state.service


async def tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Tenant:
    """The caller, from its bearer token (401 otherwise), within its rate limit (429 with
    ``Retry-After`` otherwise, before anything is done)."""
    authenticator: Authenticator = request.app.state.authenticator
    caller = await authenticator.authenticate(bearer_token(request.headers.get("authorization")))
    limiter: ApiRateLimiter = request.app.state.rate_limiter
    limiter.check(caller.name, request.method)
    return caller


Caller = Annotated[Tenant, Depends(tenant)]
Api = Annotated[Service, Depends(service)]
# A holder names the object it holds: one made since under its name is another's.
Uid = Annotated[
    str | None,
    Query(
        max_length=64,
        description="Only the object of this uid: another made since under its name is 404.",
    ),
]
Name = Annotated[str, Query(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retrying a submission with the same key returns the object the first "
        "one created (200 instead of 201); the same key with another body is a 409.",
    ),
]


async def list_query(
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    continue_: Annotated[
        str | None, Query(alias="continue", max_length=200, description="Next page token.")
    ] = None,
    phase: Annotated[str | None, Query(max_length=32, description="Only this phase.")] = None,
    label_selector: Annotated[
        str | None,
        Query(alias="labelSelector", max_length=1000, description="key=value,key2=value2"),
    ] = None,
) -> ListQuery:
    """Pagination and filters of list routes."""
    return ListQuery(limit, continue_, phase, parse_labels(label_selector))


Listing = Annotated[ListQuery, Depends(list_query)]


async def log_window(
    offset: Annotated[
        int, Query(ge=0, description="Start at this byte of the output (a previous `end`).")
    ] = 0,
    tail_lines: Annotated[
        int | None, Query(alias="tailLines", ge=0, description="Only the last lines.")
    ] = None,
    limit_bytes: Annotated[
        int,
        Query(
            alias="limitBytes",
            ge=1,
            le=MAX_LOG_BYTES,
            description="At most this many bytes: the last ones.",
        ),
    ] = MAX_LOG_BYTES,
    run: Annotated[
        int | None,
        Query(ge=1, description="Only this run's output (its `--- run N ---` line and log)."),
    ] = None,
) -> LogWindow:
    """Which part of a program's output to answer with."""
    return LogWindow(offset, tail_lines, limit_bytes, run)


Window = Annotated[LogWindow, Depends(log_window)]


def page(result: Any) -> JSONResponse:
    """A list response."""
    return JSONResponse({"items": result.items, "continue": result.next})


def stored(result: tuple[dict[str, Any], bool]) -> JSONResponse:
    """A created (201) or replayed (200) object."""
    document, created = result
    headers = {} if created else {"Idempotent-Replayed": "true"}
    return JSONResponse(document, status_code=201 if created else 200, headers=headers)


# -- errors and bodies -----------------------------------------------------------------------


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "field": field}}, status_code=status
    )


async def api_error(request: Request, error: Exception) -> JSONResponse:
    """An ApiError as JSON."""
    assert isinstance(error, ApiError)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def http_error(request: Request, error: Exception) -> JSONResponse:
    """Starlette's own errors (unknown route, wrong method) in the API's error format."""
    assert isinstance(error, StarletteHTTPException)
    # FastAPI answers 400 itself for a JSON body it cannot decode (one nested too deeply).
    code = {400: "MalformedBody", 404: "NotFound", 405: "MethodNotAllowed"}.get(
        error.status_code, "HttpError"
    )
    message = {
        404: f"no such route: {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    return JSONResponse(
        {"error": {"code": code, "message": message, "field": None}},
        status_code=error.status_code,
        headers=getattr(error, "headers", None),
    )


async def validation_error(request: Request, error: Exception) -> JSONResponse:
    """Invalid requests: the first problem, with the path of its field."""
    assert isinstance(error, RequestValidationError)
    details = error.errors()
    first = details[0] if details else {"loc": (), "msg": "invalid request", "type": ""}
    location = tuple(first.get("loc") or ())
    if first.get("type") == "json_invalid":
        return _error(400, "MalformedBody", f"the body is not valid JSON: {first.get('msg')}")
    if location[:1] == ("body",) and request.url.path.endswith("/credentials"):
        # Not a manifest: the request model's own first problem.
        return _error(422, "InvalidField", str(first.get("msg")), format_path(location[1:]) or None)
    if location[:1] == ("body",):
        model = PathwaysProgram if request.url.path.startswith("/v1/programs") else VirtualSlice
        body = getattr(error, "body", None)
        if not isinstance(body, dict):
            return _error(422, "InvalidField", "expected a JSON object (a resource manifest)")
        try:
            model.model_validate(body)
        except ValidationError as invalid:
            problem = _first_problem(invalid, model)
            if problem is not None:
                return _error(422, "InvalidField", problem.message, problem.path or None)
        return _error(422, "InvalidField", str(first.get("msg")), format_path(location[1:]))
    where = " ".join(str(part) for part in location[:2])
    return _error(422, "InvalidField", str(first.get("msg")), where or None)


async def internal_error(request: Request, error: Exception) -> JSONResponse:
    """Any other exception: 500 in the documented error format. The traceback goes to the
    server's log under an incident id the caller is given; the message says nothing of the
    exception itself (it may hold paths, SQL or a token)."""
    incident = uuid.uuid4().hex[:12]
    logger.error(
        "incident %s: %s %s failed", incident, request.method, request.url.path, exc_info=error
    )
    return _error(
        500,
        "InternalError",
        f"the API failed unexpectedly (incident {incident}, logged by the server); nothing "
        "may be assumed done: check before retrying, and report the incident if it recurs",
    )


def _json_body() -> Any:
    """A dependency refusing a body the route cannot read: 415 naming the Content-Type and
    those the API reads (it was 422 "expected a JSON object", for a valid manifest). YAML
    bodies reach routes as JSON (:class:`BodyLimit`); an empty body is the route's to refuse."""

    async def check(request: Request, _: Caller) -> None:  # (the caller first: 401 before)
        declared = request.headers.get("content-type")
        if not await request.body():
            return
        header = email.message.Message()
        header["content-type"] = declared or ""
        main, subtype = header.get_content_maintype(), header.get_content_subtype()
        if declared and main == "application" and (subtype == "json" or subtype.endswith("+json")):
            return
        given = repr(declared.split(";")[0].strip()[:100]) if declared else "missing"
        raise UnsupportedMediaType(
            f"the body's Content-Type is {given}: expected one of {', '.join(ACCEPTED_TYPES)}",
            field="header Content-Type",
        )

    return Depends(check)


def _first_problem(invalid: ValidationError, model: type[BaseModel]) -> Problem | None:
    # An unknown field usually explains a missing one (a typo): name it first.
    problems = problems_of(invalid, model)
    return min(problems, key=lambda p: not p.message.startswith("unknown"), default=None)


# Bodies larger than this are checked on a worker thread: one of 60,000 invalid label keys
# took 1.3 s to check, and every caller's requests, probes too, waited on the event loop.
OFF_LOOP_BYTES = 64 << 10


def _json_types(model: type[BaseModel]) -> Any:
    """A dependency refusing a body whose values are not of the JSON types the CRD's schema
    names (``"2"`` or ``true`` for an integer, ``"yes"`` for a boolean), as the Kubernetes
    API server does (FastAPI's validation alone would coerce them), or invalid otherwise."""

    async def check(request: Request, _: Caller) -> None:  # (the caller first: 401 before)
        body = await request.body()
        if len(body) > OFF_LOOP_BYTES:
            problem = await asyncio.to_thread(_body_problem, model, body)
        else:
            problem = _body_problem(model, body)
        if problem is not None:
            raise InvalidField(problem.message, field=problem.path or None)

    return Depends(check)


def _body_problem(model: type[BaseModel], body: bytes) -> Problem | None:
    """The first problem of a manifest body: a value not of its JSON type, else any other
    (answered here, FastAPI's validation and its handler each took as long again); None for a
    valid body, or one that is no JSON object (FastAPI's validation answers that)."""
    try:
        model.model_validate_json(body, strict=True)
    except ValidationError as strict:
        try:
            model.model_validate_json(body)
        except ValidationError as invalid:
            if invalid.error_count() == 1 and not invalid.errors()[0]["loc"]:
                return None  # not JSON, or not an object
            return _first_problem(invalid, model)
        except ValueError:
            return None
        return _first_problem(strict, model)
    return None


class CatchAll:
    """ASGI middleware, the outermost: an exception no handler took is answered 500 in the
    API's error format (:func:`internal_error`). Starlette's own last resort re-raises it to
    the server, which then closed the connection under the client's next request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watching(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watching)
        except Exception as error:
            if started:  # too late for an answer of its own: the server ends the response
                raise
            response = await internal_error(Request(scope), error)
            await response(scope, receive, send)


class _Refused(Exception):
    """A body refused: the answer's status and error code, and the message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader (libyaml's: four times faster) refusing a mapping that gives one key
    twice (a later one silently won: ``spec`` twice kept the second). The CLI's manifests
    loader keeps the same rule apart: pathways_core may not import yaml, and components never
    import each other."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key.value!r} is given twice", key.start_mark
                    )
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep=deep)


def yaml_as_json(body: bytes, limit: int) -> bytes:
    """A YAML body as the JSON the routes read, or :class:`_Refused`: 400 if it is not valid
    YAML or has no JSON form, 413 if, its aliases expanded, it is larger than ``limit``."""
    try:
        parsed = yaml.load(body, Loader=_YamlLoader) if body else None
        # Aliases may repeat a node any number of times: bound the document as JSON (what the
        # API reads) before writing it out, not only the YAML text.
        weight = expanded_size(parsed, limit)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(error, "problem", None) or "malformed"
        raise _Refused(400, "MalformedBody", f"the body is not valid YAML{at}: {problem}") from None
    except (RecursionError, ValueError) as error:  # too deep; a huge integer
        problem = "nested too deeply" if isinstance(error, RecursionError) else error
        raise _Refused(400, "MalformedBody", f"the body is not valid YAML: {problem}") from None
    if weight is None:
        raise _Refused(
            400, "MalformedBody", "the body is not valid YAML: an alias refers to itself"
        )
    if weight <= limit:
        try:
            body = json.dumps(_string_keys(parsed, []), default=str).encode()
        except (_KeyProblem, RecursionError) as problem:
            why = "nested too deeply" if isinstance(problem, RecursionError) else problem
            raise _Refused(400, "MalformedBody", f"the body has no JSON form: {why}") from None
    if weight > limit or len(body) > limit:
        raise _Refused(
            413,
            "BodyTooLarge",
            f"the body, with its YAML aliases expanded, is larger than the limit of {limit} bytes",
        )
    return body


class _KeyProblem(Exception):
    """A mapping key with no JSON form, or two keys that are one in JSON."""


def _string_keys(node: Any, path: list[str | int]) -> Any:
    """``node`` with every mapping key a string, as JSON (and Kubernetes) has them: numbers
    and booleans as JSON writes them, dates as ISO text; two keys alike as strings, or a key
    of another type (binary, a list), are :class:`_KeyProblem` naming the mapping."""
    if isinstance(node, list):
        return [_string_keys(item, [*path, index]) for index, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    converted: dict[str, Any] = {}
    where = format_path(tuple(path)) or "the document"
    for key, value in node.items():
        if isinstance(key, str):
            text = key
        elif key is None or isinstance(key, bool | int | float):
            text = json.dumps(key)
        elif isinstance(key, datetime.date):
            text = key.isoformat()
        else:
            raise _KeyProblem(f"a key of {where} is {type(key).__name__}, not text: quote it")
        if text in converted:
            raise _KeyProblem(f"{where} has the key {text!r} twice (as text)")
        converted[text] = _string_keys(value, [*path, text])
    return converted


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already, then what ``receive`` gives."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _authenticated(scope: Scope) -> bool:
    """Whether the request's bearer token is one the app knows (checked before a YAML body
    is parsed: anyone, with no token, froze the server for seconds with a large one)."""
    authenticator: Authenticator = scope["app"].state.authenticator
    header = dict(scope.get("headers") or []).get(b"authorization")
    try:
        await authenticator.authenticate(bearer_token(header.decode("latin-1") if header else None))
    except ApiError:
        return False
    return True


# How long a request's body may go without a byte before it is answered 408: connections that
# sent headers and part of a body, even without a token, stayed open for good.
BODY_IDLE_SECONDS = 30.0
# The status counted of a request whose client went before it was answered (nginx's): it was
# counted a 500, which alerts on the server's errors took for one.
CLIENT_CLOSED = 499


class BodyLimit:
    """ASGI middleware: bodies over ``limit`` bytes get 413 before they are read further;
    YAML bodies are turned into JSON (malformed YAML gets 400); every request is counted."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status_seen: list[int] = []
        raised = True  # until the request ends without an exception (answered 500 outside)

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(message["status"])
            await send(message)

        try:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                replaced = await self._read(scope, receive, counting_send)
                if replaced is None:
                    raised = False
                    return
                scope, receive = replaced
            await self.app(scope, receive, counting_send)
            raised = False
        finally:
            route = scope.get("route")
            metrics.observe(
                scope["method"],
                getattr(route, "path", "unmatched"),
                status_seen[0] if status_seen else 500 if raised else CLIENT_CLOSED,
                time.perf_counter() - began,
            )

    async def _read(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[Scope, Receive] | None:
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(send, 413, "BodyTooLarge", self._too_large())
            return None
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), BODY_IDLE_SECONDS)
            except TimeoutError:
                await self._reject(
                    send,
                    408,
                    "RequestTimeout",
                    f"no byte of the body came for {BODY_IDLE_SECONDS:g} s: send it again",
                )
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._reject(send, 413, "BodyTooLarge", self._too_large())
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        content_type = (
            headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        )
        if content_type in YAML_TYPES:
            if not await _authenticated(scope):
                return scope, _replaying(body, receive)  # the route answers 401
            try:
                # Off the loop (a megabyte of YAML is half a second of parsing even in C).
                body = await asyncio.to_thread(yaml_as_json, body, self.limit)
            except _Refused as refused:
                await self._reject(send, refused.status, refused.code, str(refused))
                return None
            scope = {
                **scope,
                "headers": [
                    (k, v)
                    for k, v in scope["headers"]
                    if k not in (b"content-type", b"content-length")
                ]
                + [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
            }
        return scope, _replaying(body, receive)

    def _too_large(self) -> str:
        return f"the request body is larger than the limit of {self.limit} bytes"

    @staticmethod
    async def _reject(send: Send, status: int, code: str, message: str) -> None:
        payload = json.dumps({"error": {"code": code, "message": message, "field": "body"}})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload.encode()})


# -- the app ---------------------------------------------------------------------------------


def create_app(
    api: Service,
    authenticator: Authenticator,
    *,
    max_body: int = MAX_BODY_BYTES,
    rate_limits: Budgets = DEFAULT_BUDGETS,
) -> FastAPI:
    """The API over ``api`` (its store), authenticating with ``authenticator``; bodies of at
    most ``max_body`` bytes, each tenant within ``rate_limits``."""
    app = FastAPI(
        title="Pathways on Kubernetes",
        version="v1",
        description="Multi-tenant submission of Pathways programs and virtual slices. Bodies "
        f"are JSON or YAML (application/yaml), at most {max_body} bytes. Each tenant may send "
        f"{rate_limits.mutating.describe()} of mutating requests and "
        f"{rate_limits.read.describe()} of reads (per API server); beyond, 429 RateLimited "
        "with Retry-After.",
        responses=ERROR_RESPONSES,
    )
    app.state.service = api
    app.state.authenticator = authenticator
    app.state.rate_limiter = ApiRateLimiter(rate_limits)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_middleware(BodyLimit, limit=max_body)
    app.add_middleware(CatchAll)  # added last: the outermost, it sees every other exception
    app.include_router(_routes())
    return app


def _routes() -> Any:
    from fastapi import APIRouter

    r = APIRouter()
    ok = {200: {"description": "OK"}}

    @r.get("/healthz", response_model=Health, tags=["probes"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @r.get("/readyz", response_model=Health, tags=["probes"], responses={503: ok[200]})
    async def readyz(api: Api) -> JSONResponse:
        ready = await api.store.ready()
        return JSONResponse({"status": "ok" if ready else "unavailable"}, 200 if ready else 503)

    @r.get("/metrics", response_class=PlainTextResponse, tags=["probes"])
    async def metrics_text() -> Response:
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    @r.get("/v1/me", response_model=Me, tags=["tenant"])
    async def me(caller: Caller, api: Api) -> dict[str, Any]:
        return await api.me(caller)

    # programs
    created = {201: {"model": PathwaysProgram, "description": "Created"}}

    @r.post(
        "/v1/programs",
        status_code=201,
        response_model=PathwaysProgram,
        responses=created,
        dependencies=[_json_body(), _json_types(PathwaysProgram)],
    )
    async def submit_program(
        body: PathwaysProgram, caller: Caller, api: Api, key: IdempotencyKey = None
    ) -> JSONResponse:
        return stored(await api.submit_program(caller, body, key))

    @r.get("/v1/programs", response_model=ProgramList)
    async def list_programs(caller: Caller, api: Api, query: Listing) -> JSONResponse:
        return page(await api.list(caller, PROGRAM, query))

    @r.get("/v1/programs/{name}", response_model=PathwaysProgram)
    async def get_program(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.get(caller, PROGRAM, name))

    @r.post("/v1/programs/{name}/cancel", response_model=PathwaysProgram)
    async def cancel_program(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.cancel_program(caller, name))

    @r.post("/v1/programs/{name}/suspend", response_model=PathwaysProgram)
    async def suspend_program(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.suspend_program(caller, name, True))

    @r.post("/v1/programs/{name}/resume", response_model=PathwaysProgram)
    async def resume_program(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.suspend_program(caller, name, False))

    @r.delete("/v1/programs/{name}", response_model=PathwaysProgram)
    async def delete_program(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.delete(caller, PROGRAM, name))

    @r.get("/v1/programs/{name}/events", response_model=EventList)
    async def program_events(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse({"items": await api.events(caller, PROGRAM, name)})

    @r.get("/v1/programs/{name}/logs", response_model=Logs)
    async def program_logs(name: str, caller: Caller, api: Api, window: Window) -> JSONResponse:
        text = await api.logs(caller, name, window)
        body = {
            "logs": text.text,
            "start": text.start,
            "end": text.end,
            "size": text.size,
            "linesCut": text.lines_cut,
        }
        return JSONResponse({"program": name, **body})

    @r.get("/v1/programs/{name}/trace", response_model=TraceResponse)
    async def program_trace(
        name: str,
        caller: Caller,
        api: Api,
        limit: Annotated[
            int, Query(ge=1, le=MAX_TRACE_PAGE, description="Records per page.")
        ] = TRACE_PAGE,
        continue_: Annotated[
            str | None, Query(alias="continue", max_length=200, description="Next page token.")
        ] = None,
    ) -> Response:
        page = await api.trace(caller, name, limit, continue_)
        # Encoded in a thread: a page of a large trace is megabytes, and others wait meanwhile.
        return Response(await asyncio.to_thread(json.dumps, page), media_type="application/json")

    # virtual slices
    created_slice = {201: {"model": VirtualSlice, "description": "Created"}}

    @r.post(
        "/v1/virtualslices",
        status_code=201,
        response_model=VirtualSlice,
        responses=created_slice,
        dependencies=[_json_body(), _json_types(VirtualSlice)],
    )
    async def create_slice(
        body: VirtualSlice, caller: Caller, api: Api, key: IdempotencyKey = None
    ) -> JSONResponse:
        return stored(await api.create_slice(caller, body, key))

    @r.get("/v1/virtualslices", response_model=SliceList)
    async def list_slices(caller: Caller, api: Api, query: Listing) -> JSONResponse:
        return page(await api.list(caller, SLICE, query))

    @r.get("/v1/virtualslices/{name}", response_model=VirtualSlice)
    async def get_slice(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.get(caller, SLICE, name))

    @r.get("/v1/virtualslices/{name}/events", response_model=EventList)
    async def slice_events(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse({"items": await api.events(caller, SLICE, name)})

    @r.post("/v1/virtualslices/{name}/renew", response_model=VirtualSlice)
    async def renew_slice(name: str, caller: Caller, api: Api, uid: Uid = None) -> JSONResponse:
        return JSONResponse(await api.renew_slice(caller, name, uid))

    @r.delete("/v1/virtualslices/{name}", response_model=VirtualSlice)
    async def release_slice(name: str, caller: Caller, api: Api, uid: Uid = None) -> JSONResponse:
        return JSONResponse(await api.delete(caller, SLICE, name, uid))

    # islands
    @r.get("/v1/islands", response_model=IslandList)
    async def list_islands(caller: Caller, api: Api, query: Listing) -> JSONResponse:
        return page(await api.list(caller, ISLAND, query))

    @r.get("/v1/islands/{name}", response_model=Island)
    async def get_island(name: str, caller: Caller, api: Api) -> JSONResponse:
        return JSONResponse(await api.get(caller, ISLAND, name))

    @r.post(
        "/v1/islands/{name}/credentials",
        response_model=SessionCredential,
        tags=["tenant"],
        dependencies=[_json_body()],
    )
    async def session_credential(
        name: str, body: SessionRequest, caller: Caller, api: Api
    ) -> JSONResponse:
        return JSONResponse(await api.session_credential(caller, name, body.client))

    return r
