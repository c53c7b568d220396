"""Errors the API answers with rather than a bare 500 or a misleading 422: continue tokens out
of range, unexpected exceptions, bodies of a type the API does not read, and a store whose
lock another writer holds (which must not stop the API answering others meanwhile)."""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from api_server import Server, error_of, program, serve, vslice

from pathways_api.service import scoped
from pathways_api.store import ISLAND, MAX_POSITION, PROGRAM, SLICE
from pathways_client.api_client import ApiClient


def stored(server: Server) -> int:
    return int(server.store._db().execute("SELECT COUNT(*) FROM objects").fetchone()[0])


# Each list's continue tokens are bound to it: (tenant, collection, phase, labels).
LISTS = {
    "/v1/programs": ["team-a", PROGRAM, None, []],
    "/v1/virtualslices": ["team-a", SLICE, None, []],
    "/v1/islands": ["team-a", ISLAND, None, []],
    "/v1/programs/p/trace": ["team-a", "trace", "p"],
}


def token_of(position: int, path: str) -> str:
    """A continue token as the API makes them, for any position of a list."""
    inner = base64.urlsafe_b64encode(f"seq:{position}".encode()).decode().rstrip("=")
    token = scoped(inner, LISTS[path])
    assert token is not None
    return token


@pytest.mark.parametrize("position", [MAX_POSITION + 1, 10**19, 10**40])
@pytest.mark.parametrize("path", LISTS)
def test_a_continue_token_past_the_largest_position_is_a_clear_422(
    a: httpx.Client, path: str, position: int
) -> None:
    assert a.post("/v1/programs", json=program("p")).status_code == 201
    answer = a.get(path, params={"continue": token_of(position, path)})
    assert answer.status_code == 422, answer.text
    assert error_of(answer)["field"] == "query continue"
    # The largest is a position like any other: past every object.
    last = a.get(path, params={"continue": token_of(MAX_POSITION, path)})
    assert last.status_code == 200, last.text


def test_a_continue_token_of_another_list_is_refused_not_taken_for_this_ones(
    a: httpx.Client, b: httpx.Client
) -> None:
    """Another tenant's token (or one of another collection or filter) skipped this list's
    objects, without a word."""
    for n in range(3):
        labelled = vslice(f"s{n}")
        labelled["metadata"]["labels"] = {"set": "x"}
        assert a.post("/v1/virtualslices", json=labelled).status_code == 201
        assert b.post("/v1/programs", json=program(f"p{n}")).status_code == 201
    theirs = b.get("/v1/programs", params={"limit": 2}).json()["continue"]
    filtered = a.get("/v1/virtualslices", params={"limit": 1, "labelSelector": "set=x"}).json()
    for path, token in (
        ("/v1/virtualslices", theirs),  # another tenant's, of another collection
        ("/v1/virtualslices", filtered["continue"]),  # of another filter
    ):
        answer = a.get(path, params={"continue": token})
        assert answer.status_code == 422, answer.text
        assert error_of(answer)["field"] == "query continue"
        assert "another list" in error_of(answer)["message"]
    # Its own list's token goes on.
    mine = a.get("/v1/virtualslices", params={"limit": 1}).json()
    rest = a.get("/v1/virtualslices", params={"continue": mine["continue"]}).json()
    assert [i["metadata"]["name"] for i in mine["items"] + rest["items"]] == ["s0", "s1", "s2"]


def test_a_label_selector_naming_a_key_twice_with_two_values_is_refused(a: httpx.Client) -> None:
    answer = a.get("/v1/programs", params={"labelSelector": "team=x,team=y"})
    assert answer.status_code == 422 and error_of(answer)["field"] == "query labelSelector"
    assert a.get("/v1/programs", params={"labelSelector": "team=x,team=x"}).status_code == 200


@pytest.fixture
def unexpected(server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make reading a tenant's usage fail as no one planned, with words that must not leave
    the server (a file's path)."""
    secret = f"{server.store.path} is on fire"

    def broken(namespace: str) -> None:
        raise RuntimeError(secret)

    monkeypatch.setattr(server.store, "_usage", broken)
    return secret


def test_an_unexpected_exception_is_a_json_500_logged_with_its_traceback(
    a: httpx.Client, unexpected: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="pathways.api"):
        answer = a.get("/v1/me")
    assert answer.status_code == 500, answer.text
    error = error_of(answer)
    assert error["code"] == "InternalError" and error["field"] is None
    assert unexpected not in answer.text and "RuntimeError" not in answer.text
    incident = error["message"].split("incident ")[1].split(",")[0]
    logged = [r for r in caplog.records if r.name == "pathways.api" and incident in r.message]
    assert logged and logged[0].exc_info is not None
    assert str(logged[0].exc_info[1]) == unexpected
    # The server goes on serving.
    assert a.get("/v1/programs").status_code == 200


NOT_READ = [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]


@pytest.mark.parametrize("content_type", NOT_READ, ids=[str(t) for t in NOT_READ])
@pytest.mark.parametrize(
    ("path", "manifest"), [("/v1/programs", program()), ("/v1/virtualslices", vslice())]
)
def test_a_body_of_a_type_the_api_does_not_read_is_415(
    server: Server, a: httpx.Client, path: str, manifest: dict, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    answer = a.post(path, content=json.dumps(manifest).encode(), headers=headers)
    assert answer.status_code == 415, answer.text
    error = error_of(answer)
    assert (error["code"], error["field"]) == ("UnsupportedMediaType", "header Content-Type")
    for accepted in ("application/json", "application/yaml"):
        assert accepted in error["message"]
    assert (content_type or "missing") in error["message"]
    assert stored(server) == 0


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "application/merge-patch+json"],
)
def test_json_bodies_are_read_whatever_their_json_type(a: httpx.Client, content_type: str) -> None:
    answer = a.post(
        "/v1/programs",
        content=json.dumps(program()).encode(),
        headers={"Content-Type": content_type},
    )
    assert answer.status_code == 201, answer.text


def test_posts_without_a_body_need_no_content_type(a: httpx.Client) -> None:
    assert a.post("/v1/programs", json=program("p")).status_code == 201
    answer = a.post("/v1/programs/p/suspend")
    assert answer.status_code == 200, answer.text


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[Server]:
    """A server whose store waits a tenth of a second for another writer's lock."""
    running = serve(tmp_path, busy_timeout=0.1)
    yield running
    running.stop()


def test_a_store_locked_past_its_busy_timeout_is_503_store_busy(impatient: Server) -> None:
    other = sqlite3.connect(impatient.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with impatient.client("token-a") as a:
        answer = a.post("/v1/programs", json=program("p"))
        assert answer.status_code == 503, answer.text
        error = error_of(answer)
        assert error["code"] == "StoreBusy" and "retry" in error["message"]
        assert int(answer.headers["Retry-After"]) >= 1
        other.execute("COMMIT")
        other.close()
        assert stored(impatient) == 0
        # Once the other writer let go, the same request goes through.
        assert a.post("/v1/programs", json=program("p")).status_code == 201


def test_writes_queued_on_a_busy_store_are_answered_within_the_busy_timeout(
    tmp_path: Path,
) -> None:
    """Each queued write waited a whole busy timeout of its own once its turn came: the fifth
    of five was answered after five, and one was done after its client had given up."""
    running = serve(tmp_path, busy_timeout=1)
    other = sqlite3.connect(running.store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        began = time.monotonic()

        def submit(n: int) -> tuple[int, float]:
            with running.client("token-a") as a:
                answer = a.post("/v1/programs", json=program(f"p{n}"))
            return answer.status_code, time.monotonic() - began

        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(submit, range(5)))
        assert [status for status, _ in answers] == [503] * 5
        assert max(after for _, after in answers) < 3, answers
        other.execute("COMMIT")
        assert stored(running) == 0
    finally:
        other.close()
        running.stop()


def test_the_sdk_sends_a_request_the_busy_store_refused_again(impatient: Server) -> None:
    """StoreBusy did nothing, so even a submission without an Idempotency-Key is sent again
    after Retry-After (the SDK raised it: a driver's submission failed on a busy moment)."""
    other = sqlite3.connect(impatient.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    waits: list[float] = []

    def let_go(seconds: float) -> None:
        waits.append(seconds)
        if other.in_transaction:
            other.execute("COMMIT")

    with ApiClient(impatient.url, "token-a", sleep=let_go) as client:
        created = client.submit(program("p"))
    other.close()
    assert created["metadata"]["name"] == "p" and len(waits) == 1 and waits[0] >= 1
    assert stored(impatient) == 1


def test_a_write_waiting_for_the_lock_leaves_the_api_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = serve(tmp_path, busy_timeout=20)
    try:
        other = sqlite3.connect(running.store.path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        waiting = threading.Event()
        admit = running.store._admit

        def noted(*arguments: object) -> object:
            waiting.set()
            return admit(*arguments)  # type: ignore[arg-type]

        monkeypatch.setattr(running.store, "_admit", noted)
        answers: list[httpx.Response] = []

        def submit() -> None:
            with running.client("token-a") as a:
                answers.append(a.post("/v1/programs", json=program("p")))

        writer = threading.Thread(target=submit)
        writer.start()
        assert waiting.wait(timeout=20)
        # A blocked event loop would answer nothing until the write gave up (20 s).
        with running.client("token-a") as a:
            assert httpx.get(f"{running.url}/healthz", timeout=10).status_code == 200
            assert a.get("/v1/islands", timeout=10).status_code == 200
        assert writer.is_alive() and not answers  # still waiting for the lock
        other.execute("COMMIT")
        other.close()
        writer.join(timeout=20)
        assert [answer.status_code for answer in answers] == [201]
        assert running.store.read(PROGRAM, "team-a", "p") is not None
    finally:
        running.stop()


@pytest.mark.parametrize(
    ("artifact", "field"),
    [
        ({"configMapKeyRef": {"name": "fns", "key": "f.jaxexport"}}, "configMapKeyRef"),
        ({"uri": "gs://bucket/f.jaxexport"}, "uri"),
    ],
)
def test_an_embedded_graph_whose_artifact_it_cannot_read_is_refused_at_submission(
    a: httpx.Client, server: Server, artifact: dict, field: str
) -> None:
    """It was accepted, then every run failed (and was retried) on the missing artifact."""
    graph = {
        "functions": [{"name": "f", **artifact}],
        "nodes": [{"name": "n", "function": "f", "slice": "main"}],
    }
    document = program("g")
    document["spec"].pop("driver", None)
    document["spec"]["graph"] = graph
    before = stored(server)
    refused = a.post("/v1/programs", json=document)
    assert refused.status_code == 422, refused.text
    assert error_of(refused)["field"] == f"spec.graph.functions[0].{field}"
    assert "the embedded mode" in error_of(refused)["message"]
    assert stored(server) == before
    inline = {"name": "f", "inline": base64.b64encode(b"artifact").decode()}
    document["spec"]["graph"]["functions"] = [inline]
    assert a.post("/v1/programs", json=document).status_code == 201
