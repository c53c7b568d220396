"""The API's limits over real HTTP: per-tenant rate limits (429 RateLimited with Retry-After,
nothing done, separate budgets for mutating requests and reads, tenants independent), the SDK's
API client retrying what is safe to retry, and body and program spec sizes (YAML aliases
included). Every refusal is a clear JSON error, stores nothing, and the server keeps serving."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import MAX_BODY, Server, error_of, program, serve, vslice
from hostile_yaml import alias_bomb

from pathways_api.app import MAX_BODY_BYTES
from pathways_api.ratelimit import DEFAULT_BUDGETS, ApiRateLimiter, budgets_from
from pathways_client.api_client import ApiCallError, ApiClient
from pathways_core.control.rate_limit import Budgets, Limit

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A clock the test moves: the rate limiter's time, so no test depends on how fast the
    machine is."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def stored(server: Server) -> int:
    row = server.store._db().execute("SELECT COUNT(*) FROM objects").fetchone()
    return int(row[0])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limited(tmp_path: Path, clock: Clock) -> Iterator[Server]:
    """A server allowing each tenant 3 mutating requests at once then 1/s, 5 reads then 2/s,
    on the test's clock."""
    budgets = Budgets(mutating=Limit(1, 3), read=Limit(2, 5))
    running = serve(tmp_path, rate_limits=budgets)
    running.app.state.rate_limiter = ApiRateLimiter(budgets, clock=clock)
    yield running
    running.stop()


def test_a_tenant_over_its_rate_limit_gets_429_with_retry_after_and_nothing_is_done(
    limited: Server, clock: Clock
) -> None:
    with limited.client("token-a") as a, limited.client("token-b") as b:
        answers = [a.post("/v1/programs", json=program(f"p{n}")) for n in range(5)]
        assert [r.status_code for r in answers] == [201, 201, 201, 429, 429]
        refused = answers[3]
        assert refused.headers["Retry-After"] == "1"
        assert error_of(refused) == {
            "code": "RateLimited",
            "message": "tenant 'team-a' is over its rate limit for mutating requests (POST, PUT, "
            "PATCH, DELETE) of 1 requests/s (bursts of 3); nothing was done: retry after 1.00 s",
            "field": None,
        }
        # Nothing of the refused requests was stored; what was accepted is intact.
        assert stored(limited) == 3
        assert [p["metadata"]["name"] for p in a.get("/v1/programs").json()["items"]] == [
            "p0",
            "p1",
            "p2",
        ]
        # Reads have their own budget; other tenants their own buckets; probes none.
        assert b.post("/v1/programs", json=program("b0")).status_code == 201
        assert a.get("/healthz").status_code == 200
        # Waiting what Retry-After said is enough.
        clock.advance(float(refused.headers["Retry-After"]))
        assert a.post("/v1/programs", json=program("p3")).status_code == 201
        assert a.post("/v1/programs", json=program("p4")).status_code == 429


def test_reads_are_limited_apart_from_mutating_requests(limited: Server, clock: Clock) -> None:
    with limited.client("token-a") as a:
        codes = [a.get("/v1/programs").status_code for _ in range(7)]
        assert codes == [200] * 5 + [429] * 2
        refused = a.get("/v1/me")
        assert error_of(refused)["code"] == "RateLimited"
        assert "for reads of 2 requests/s (bursts of 5)" in error_of(refused)["message"]
        assert refused.headers["Retry-After"] == "1"
        # Polling that is refused does not stop submissions.
        assert a.post("/v1/programs", json=program()).status_code == 201
        clock.advance(0.5)
        assert a.get("/v1/programs").status_code == 200
        metrics = a.get("/metrics").text
        assert 'pathways_api_rate_limited_total{budget="read",tenant="team-a"} 3.0' in metrics


def test_an_unauthenticated_request_is_401_not_rate_limited(limited: Server) -> None:
    with limited.client("wrong-token") as stranger:
        codes = {stranger.get("/v1/programs").status_code for _ in range(10)}
    assert codes == {401}


def test_the_rate_limit_is_real_time_by_default(tmp_path: Path) -> None:
    running = serve(tmp_path, rate_limits=Budgets(mutating=Limit(5, 1), read=Limit(0)))
    try:
        with running.client("token-a") as a:
            assert a.post("/v1/programs", json=program("p0")).status_code == 201
            refused = a.post("/v1/programs", json=program("p1"))
            if refused.status_code == 429:  # unless 0.2 s passed between the two requests
                time.sleep(float(refused.headers["Retry-After"]))
            assert a.post("/v1/programs", json=program("p1")).status_code == 201
            assert all(a.get("/v1/programs").status_code == 200 for _ in range(50))  # 0: off
    finally:
        running.stop()


def test_the_openapi_schema_documents_429_with_retry_after(server: Server) -> None:
    schema = httpx.get(f"{server.url}/openapi.json").json()
    for path, methods in schema["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in methods.items():
            answer = operation["responses"]["429"]
            assert "RateLimited" in answer["description"], (path, method)
            assert answer["headers"]["Retry-After"]["schema"]["type"] == "integer"


# -- the SDK's API client ----------------------------------------------------------------------


def test_the_client_retries_idempotent_requests_after_retry_after(
    limited: Server, clock: Clock
) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    with ApiClient(limited.url, "token-a", sleep=sleep) as client:
        for _ in range(5):
            client.list("programs")
        assert client.list("programs") == []  # refused once, then served
        assert waits == [1.0]
        # A submission with an Idempotency-Key is safe to send again: created once.
        for n in range(3):
            client.submit(program(f"p{n}"))
        created = client.submit(program("keyed"), idempotency_key="key-1")
        assert created["metadata"]["name"] == "keyed"
        assert waits == [1.0, 1.0]
        assert stored(limited) == 4


def test_the_client_does_not_retry_a_submission_without_a_key(limited: Server) -> None:
    with ApiClient(limited.url, "token-a", sleep=pytest.fail) as client:
        for n in range(3):
            client.submit(program(f"p{n}"))
        with pytest.raises(ApiCallError) as raised:
            client.submit(program("p3"))
    error = raised.value
    assert (error.status, error.code, error.retry_after) == (429, "RateLimited", 1.0)
    assert "tenant 'team-a' is over its rate limit" in str(error)
    assert stored(limited) == 3


def test_the_client_gives_up_after_its_retries(limited: Server, clock: Clock) -> None:
    waits: list[float] = []
    with ApiClient(limited.url, "token-a", sleep=waits.append, max_retries=2) as client:
        for _ in range(5):
            client.list("programs")
        with pytest.raises(ApiCallError, match="RateLimited") as raised:
            client.list("programs")  # the clock never moves: every retry is refused
    assert waits == [1.0, 1.0]
    assert raised.value.retry_after == 1.0


def test_the_client_never_retries_a_quota_refusal(server: Server) -> None:
    with ApiClient(server.url, "token-c", sleep=pytest.fail) as client:
        for n in range(4):
            client.submit(program(f"p{n}"), idempotency_key=f"k{n}")
        with pytest.raises(ApiCallError) as raised:
            client.submit(program("p4"), idempotency_key="k4")
    assert (raised.value.code, raised.value.retry_after) == ("QuotaExceeded", None)


def test_the_client_reconnects_with_its_token_and_settings(server: Server) -> None:
    """After a request a signal interrupted, its clean-up goes on a fresh connection pool."""
    with ApiClient(server.url, "token-a", sleep=pytest.fail) as client:
        old = client.http
        client.reconnect()
        assert client.http is not old and old.is_closed
        client.submit(program("after-reconnect"), idempotency_key="r1")  # authenticated
        assert [p["metadata"]["name"] for p in client.list("programs")] == ["after-reconnect"]


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "flags", "budgets"),
    [
        ({}, (None, None), DEFAULT_BUDGETS),
        (
            {"PATHWAYS_API_RATE_LIMIT": "10,20", "PATHWAYS_API_READ_RATE_LIMIT": "0"},
            (None, None),
            Budgets(Limit(10, 20), Limit(0)),
        ),
        (
            {"PATHWAYS_API_RATE_LIMIT": "10,20"},
            ("5", None),
            Budgets(Limit(5, 5), DEFAULT_BUDGETS.read),
        ),
    ],
)
def test_budgets_come_from_flags_then_the_environment(environment, flags, budgets) -> None:
    assert budgets_from(environment, *flags) == budgets


def test_the_defaults_do_not_throttle_the_api_benchmark() -> None:
    """benchmarks/api.py sends 3000 submissions as fast as it can from one tenant."""
    assert DEFAULT_BUDGETS.mutating.burst >= 3000
    assert DEFAULT_BUDGETS.read.burst >= DEFAULT_BUDGETS.mutating.burst


@pytest.mark.parametrize(
    ("arguments", "environment", "message"),
    [
        (["--rate-limit", "lots"], {}, "--rate-limit: the rate 'lots' is not a number"),
        ([], {"PATHWAYS_API_READ_RATE_LIMIT": "5,0"}, "PATHWAYS_API_READ_RATE_LIMIT: a burst"),
        (["--max-body", "0"], {}, "--max-body (or PATHWAYS_API_MAX_BODY) must be >= 1"),
        (["--port", "70000"], {}, "argument --port: must be from 0 to 65535, not 70000"),
    ],
)
def test_the_server_refuses_bad_limits_naming_the_setting(
    tmp_path: Path, arguments: list[str], environment: dict[str, str], message: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pathways_api", "--state", str(tmp_path), "--port", "0", *arguments],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert message in run.stderr


# -- body and program spec sizes ---------------------------------------------------------------


def inline_program(characters: int) -> dict:
    """A graph program whose one function is inline, ``characters`` of base64 long."""
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": "inline"},
        "spec": {
            "slices": [{"name": "main", "devices": 1}],
            "graph": {
                "functions": [{"name": "f", "inline": "A" * characters}],
                "nodes": [{"name": "n", "function": "f", "slice": "main"}],
            },
        },
    }


@pytest.fixture
def default_sized(tmp_path: Path) -> Iterator[Server]:
    """A server with the default body limit (1 MiB)."""
    running = serve(tmp_path, max_body=MAX_BODY_BYTES)
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("characters", "status", "code", "field"),
    [
        (1_000_000, 201, None, None),
        (1_000_004, 422, "InvalidField", "spec.graph.functions[0].inline"),
        (MAX_BODY_BYTES, 413, "BodyTooLarge", "body"),
    ],
    ids=["at-the-inline-limit", "over-the-inline-limit", "over-the-body-limit"],
)
def test_inline_artifacts_are_bounded_by_the_spec_and_the_body_limit(
    default_sized: Server, characters: int, status: int, code: str | None, field: str | None
) -> None:
    with default_sized.client("token-a") as a:
        answer = a.post("/v1/programs", json=inline_program(characters))
        assert answer.status_code == status, answer.text[:300]
        if code is not None:
            assert error_of(answer)["code"] == code
            assert error_of(answer)["field"] == field
            assert stored(default_sized) == 0
        assert a.post("/v1/programs", json=program()).status_code == 201


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            alias_bomb(12),
            413,
            f"with its YAML aliases expanded, is larger than the limit of {MAX_BODY}",
        ),
        (
            'x: &s "' + "y" * 4000 + '"\nz: [' + ", ".join(["*s"] * 20) + "]",
            413,
            "with its YAML aliases expanded",
        ),
        ("a: &a [*a]", 400, "an alias refers to itself"),
        # libyaml's words ("exceeded maximum nesting depth"), or the pure parser's.
        ("[" * 20_000 + "]" * 20_000, 400, "nest"),
        ("a: " + "1" * 5000, 400, "not valid YAML"),
    ],
    ids=["billion-laughs", "repeated-string", "self-alias", "deep", "huge-integer"],
)
def test_yaml_bodies_are_bounded_once_expanded(
    server: Server, a: httpx.Client, body: str, status: int, message: str
) -> None:
    assert len(body.encode()) <= MAX_BODY
    answer = a.post("/v1/programs", content=body, headers={"Content-Type": "application/yaml"})
    assert answer.status_code == status, answer.text[:300]
    assert message in error_of(answer)["message"]
    assert stored(server) == 0
    assert a.post("/v1/programs", json=program()).status_code == 201


def test_deeply_nested_json_is_a_clear_400(server: Server, a: httpx.Client) -> None:
    answer = a.post(
        "/v1/programs",
        content="[" * 20_000 + "]" * 20_000,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert error_of(answer)["code"] == "MalformedBody"
    assert a.post("/v1/programs", json=program()).status_code == 201


@pytest.mark.parametrize(
    ("keys", "status", "stored_labels"),
    [
        ("{2020-01-01: x, 7: y, true: z}", 201, {"2020-01-01": "x", "7": "y", "true": "z"}),
        ("{1: x, '1': y}", 400, None),
        ("{!!binary aGk=: x}", 400, None),
    ],
    ids=["dates-numbers-booleans", "two-alike", "binary"],
)
def test_yaml_keys_become_text_as_kubernetes_has_them(
    server: Server, a: httpx.Client, keys: str, status: int, stored_labels: Any
) -> None:
    """A date as a key was a 500; two keys alike as text collapsed into one."""
    body = (
        "apiVersion: pathways.dev/v1alpha1\nkind: VirtualSlice\n"
        f"metadata: {{name: keyed, labels: {keys}}}\nspec: {{devices: 1}}\n"
    )
    answer = a.post("/v1/virtualslices", content=body, headers={"Content-Type": "application/yaml"})
    assert answer.status_code == status, answer.text
    if stored_labels is None:
        error = error_of(answer)
        assert error["code"] == "MalformedBody" and "metadata.labels" in error["message"]
        assert stored(server) == 0
    else:
        assert answer.json()["metadata"]["labels"] == stored_labels


def test_a_yaml_body_without_a_valid_token_is_not_parsed(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone, with no token, froze the server for seconds with a large YAML body (parsed on
    the event loop before the token was looked at); and bad bodies were 415 or 422 to them."""
    import pathways_api.app as app_module

    parsed: list[int] = []
    real = app_module.yaml_as_json
    monkeypatch.setattr(
        app_module,
        "yaml_as_json",
        lambda body, limit: parsed.append(len(body)) or real(body, limit),
    )
    body = "".join(f"k{i}: {i}\n" for i in range(2_000))
    for token in (None, "not-a-token"):
        headers = {"Content-Type": "application/yaml"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        with httpx.Client(base_url=server.url, timeout=30) as anonymous:
            answer = anonymous.post("/v1/programs", content=body, headers=headers)
            assert answer.status_code == 401, answer.text[:200]
            for content, content_type in (
                (b"x", "text/plain"),
                (b'{"spec": 1}', "application/json"),
            ):
                refused = anonymous.post(
                    "/v1/programs",
                    content=content,
                    headers={**headers, "Content-Type": content_type},
                )
                assert refused.status_code == 401, refused.text[:200]
    assert parsed == []
    with server.client("token-a") as a:
        answer = a.post("/v1/programs", content=body, headers={"Content-Type": "application/yaml"})
    assert answer.status_code == 422 and parsed == [len(body)]


@pytest.mark.parametrize(
    ("driver", "field", "words"),
    [
        ({"source": "print(1)", "env": [{"name": "X", "value": "a\0b"}]}, "env[0].value", "NUL"),
        ({"command": ["python"], "args": ["-c", "\0"]}, "args[1]", "NUL"),
        ({"source": "\0"}, "source", "NUL"),
        # Under the schema's characters, over the bytes of one process argument: it was
        # accepted, then its runs failed with "Argument list too long".
        ({"source": "#" + "é" * 70_000}, "source", "140001 bytes in UTF-8"),
    ],
    ids=["env", "args", "source", "source-bytes"],
)
def test_a_driver_no_process_could_start_is_refused_naming_the_field(
    default_sized: Server, driver: dict[str, Any], field: str, words: str
) -> None:
    """A NUL in a driver's argument was accepted, then stopped the embedded manager from
    starting any tenant's later run ("embedded null byte" at each round)."""
    with default_sized.client("token-a") as a:
        answer = a.post(
            "/v1/programs", json={**program(), "spec": {**program()["spec"], "driver": driver}}
        )
    assert answer.status_code == 422, answer.text[:300]
    assert error_of(answer)["field"] == f"spec.driver.{field}"
    assert words in error_of(answer)["message"]
    assert stored(default_sized) == 0


def test_a_large_invalid_body_is_checked_off_the_event_loop(
    default_sized: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body of 60,000 invalid label keys took 1.3 s to check, validated four times on the
    event loop: 16 of them at once held every caller's requests, /healthz too, for 11 s."""
    import pathways_api.app as app_module

    checked_on: list[str] = []
    check = app_module._body_problem

    def watched(model: Any, body: bytes) -> Any:
        checked_on.append(threading.current_thread().name)
        return check(model, body)

    monkeypatch.setattr(app_module, "_body_problem", watched)
    labels = {f"-{i}": "v" for i in range(20_000)}
    manifest = {"metadata": {"name": "many", "labels": labels}, "spec": {"devices": 1}}
    with default_sized.client("token-a") as a:
        answer = a.post("/v1/virtualslices", json=manifest)
        assert answer.status_code == 422, answer.text[:300]
        assert error_of(answer)["field"] == "metadata.labels.-0 (the key)"
        assert a.post("/v1/virtualslices", json=vslice()).status_code == 201
    large, small = checked_on  # (a small body is checked where the request is served)
    assert large != small, checked_on


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("metadata: {name: twice}\nspec: {devices: 1}\nspec: {devices: 2}\n", "line 3, column 1"),
        ("metadata: {name: twice, labels: {a: x, 'a': y}}\nspec: {devices: 1}\n", "column 40"),
    ],
    ids=["spec", "label"],
)
def test_a_yaml_key_given_twice_is_refused(
    server: Server, a: httpx.Client, body: str, where: str
) -> None:
    """YAML's loader kept the last of two keys alike (``spec`` twice: the second's devices)."""
    headers = {"Content-Type": "application/yaml"}
    answer = a.post("/v1/virtualslices", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert error_of(answer)["code"] == "MalformedBody"
    assert f"{where}: the key" in error_of(answer)["message"]
    assert "is given twice" in error_of(answer)["message"]
    assert stored(server) == 0
    # A merge key's values may be given again: that is what it is for.
    merged = "base: &b {devices: 1}\nmetadata: {name: merged}\nspec: {<<: *b, devices: 2}\n"
    answer = a.post("/v1/virtualslices", content=merged, headers=headers)
    assert (answer.status_code, error_of(answer)["field"]) == (422, "base")


@pytest.mark.parametrize(
    ("metadata", "spec", "field", "words"),
    [
        ({"annotations": {"a b/c d": "x"}}, {}, "metadata.annotations.a b/c d (the key)", ""),
        ({"annotations": {"big": "x" * 300_000}}, {}, "metadata.annotations", "300003 bytes"),
        (
            {},
            {"islandSelector": {"matchLabels": {"a b": "x"}}},
            "spec.islandSelector.matchLabels",
            "no label key",
        ),
    ],
    ids=["annotation-key", "annotations-size", "selector-key"],
)
def test_metadata_and_selectors_kubernetes_would_refuse_are_refused(
    default_sized: Server, metadata: dict[str, Any], spec: dict[str, Any], field: str, words: str
) -> None:
    """Annotations of any key and size were stored, and a selector of a key no label can
    have was taken (its slice waited for good: no island matches)."""
    manifest = {"metadata": {"name": "s", **metadata}, "spec": {"devices": 1, **spec}}
    with default_sized.client("token-a") as a:
        answer = a.post("/v1/virtualslices", json=manifest)
    assert answer.status_code == 422, answer.text[:300]
    assert error_of(answer)["field"] == field
    assert words in error_of(answer)["message"]
    assert stored(default_sized) == 0
