"""A program's trace through the API: pages (a large trace was one response of tens of MB,
built on the event loop while every tenant waited), and the runs whose island had let go of
their oldest records named."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_server import Server, error_of, program

from pathways_api import store


def records(run: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "seq": n,
            "client": "c",
            "name": f"r{run}-{n}",
            "devices": [0],
            "executor": 0,
            "start_ns": n,
            "end_ns": n + 1,
            "ok": True,
            "island": "isl",
        }
        for n in range(count)
    ]


def test_a_trace_comes_in_pages_and_says_which_runs_lack_records(
    server: Server, a: httpx.Client, b: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert a.post("/v1/programs", json=program("p")).status_code == 201
    # Stored in chunks of 2 (a page parses only the chunks it needs); run 1 as kept before
    # chunks were: the records in the run's own row.
    monkeypatch.setattr(store, "TRACE_CHUNK", 2)
    with server.store._transaction() as db:
        db.execute(
            "INSERT INTO traces (namespace, name, run, records) VALUES (?, ?, ?, ?)",
            ("team-a", "p", 1, json.dumps(records(1, 5))),
        )
    server.store.store_trace("team-a", "p", 2, records(2, 4), {"isl": "it let go of some"})
    chunks = server.store._db().execute("SELECT count(*) FROM trace_chunks").fetchone()[0]
    assert chunks == 2
    seen, token, pages = [], None, 0
    while True:
        page = a.get(
            "/v1/programs/p/trace", params={"limit": 3, **({"continue": token} if token else {})}
        )
        assert page.status_code == 200, page.text
        body = page.json()
        assert body["incomplete"] == ["run 2 on island 'isl': it let go of some"]
        seen += [record["name"] for record in body["records"]]
        pages += 1
        token = body["continue"]
        if token is None:
            break
    assert pages == 3
    assert seen == [f"r1-{n}" for n in range(5)] + [f"r2-{n}" for n in range(4)]
    # Bad paging names the parameter; another tenant's program is not there.
    assert error_of(a.get("/v1/programs/p/trace", params={"limit": 0}))["field"] == "query limit"
    for forged in ("x", "c2VxOi0xMDA", "c2VxOis1"):  # not a token; seq:-100; seq:+5
        refused = a.get("/v1/programs/p/trace", params={"continue": forged})
        assert error_of(refused)["field"] == "query continue"
    assert b.get("/v1/programs/p/trace").status_code == 404


def test_the_latest_runs_traces_are_kept_and_the_page_says_which_are_not(
    server: Server, a: httpx.Client
) -> None:
    """A program restarted after every preemption (counted toward no limit) kept an island's
    whole trace a run, for good."""
    assert a.post("/v1/programs", json=program("p")).status_code == 201
    latest = store.RUNS_KEPT + 2
    for run in range(1, latest + 1):
        server.store.store_trace("team-a", "p", run, records(run, 2))
    server.store.store_trace("team-a", "p", 1, records(1, 2))  # taken late: not kept either
    body = a.get("/v1/programs/p/trace", params={"limit": 500}).json()
    assert [record["name"] for record in body["records"]] == [
        f"r{run}-{n}" for run in range(3, latest + 1) for n in range(2)
    ]
    assert body["incomplete"] == [
        f"runs 1 to 2: their traces are no longer kept (those of the latest "
        f"{store.RUNS_KEPT} runs are)"
    ]
    rows = server.store._db().execute("SELECT count(*) FROM trace_chunks").fetchone()[0]
    assert rows == store.RUNS_KEPT


def test_the_output_of_a_run_older_than_the_latest_kept_is_said_to_be_gone(
    server: Server, a: httpx.Client
) -> None:
    assert a.post("/v1/programs", json=program("p")).status_code == 201
    runs = store.RUNS_KEPT + 3
    stored = server.store.read("PathwaysProgram", "team-a", "p")
    assert server.store.write_status(stored, {"runs": runs}) is not None
    for run in range(4, runs + 1):  # (the manager removed the older ones' as runs started)
        path = server.store.log_path("team-a", f"p-run-{run}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"run {run}\n")
    refused = a.get("/v1/programs/p/logs", params={"run": 3})
    assert refused.status_code == 404
    assert error_of(refused)["field"] == "query run"
    assert (
        f"no longer kept: the latest {store.RUNS_KEPT} runs' are (runs 4 to {runs})"
        in (error_of(refused)["message"])
    )
    fourth = a.get("/v1/programs/p/logs", params={"run": 4}).json()["logs"]
    assert fourth == "--- run 4 ---\nrun 4\n"
    assert "--- run 4 ---\nrun 4\n" in a.get("/v1/programs/p/logs").json()["logs"]
