"""Idempotency keys, one rule for both stores: a key replays the object it made while that
object is there (the same body; another body is 409), keys are per tenant and kind, and a key
whose object is gone is free again, even if another object was made since under its name."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
from api_server import error_of, program, vslice
from backends import Backend

from pathways_api.store import PROGRAM, SqliteStore


def submit(
    store: Backend, manifest: dict[str, Any], key: str | None = None, token: str = "token-a"
) -> httpx.Response:
    path = "/v1/virtualslices" if manifest["kind"] == "VirtualSlice" else "/v1/programs"
    headers = {"Idempotency-Key": key} if key else {}
    return store.call(token, "POST", path, json=manifest, headers=headers)


def gone(store: Backend, name: str) -> None:
    """Delete program ``name`` and let it be removed."""
    assert store.call("token-a", "DELETE", f"/v1/programs/{name}").status_code == 200
    store.finalize(PROGRAM, "team-a", name)
    assert store.call("token-a", "GET", f"/v1/programs/{name}").status_code == 404


def test_a_key_replays_its_own_object_never_a_later_one_of_its_name(
    either_store: Backend,
) -> None:
    first = submit(either_store, program("p"), "release-1")
    assert first.status_code == 201, first.text
    again = submit(either_store, program("p"), "release-1")
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["metadata"]["uid"] == first.json()["metadata"]["uid"]
    gone(either_store, "p")
    other = submit(either_store, program("p", devices=4))  # someone else's, no key
    assert other.status_code == 201, other.text
    # The retry is not answered with the other object as if it were the one it made: its
    # object is gone, so it is a new submission, and the name is taken.
    retried = submit(either_store, program("p"), "release-1")
    assert retried.status_code == 409, retried.text
    assert "Idempotent-Replayed" not in retried.headers
    assert error_of(retried)["field"] == "metadata.name"
    now = either_store.call("token-a", "GET", "/v1/programs/p").json()
    assert now["metadata"]["uid"] == other.json()["metadata"]["uid"]
    assert now["spec"]["slices"][0]["devices"] == 4


def test_keys_are_per_kind(either_store: Backend) -> None:
    made = submit(either_store, program("p"), "shared-key")
    assert made.status_code == 201, made.text
    sliced = submit(either_store, vslice("s"), "shared-key")
    assert sliced.status_code == 201, sliced.text
    # Each replays its own.
    for manifest, original in ((program("p"), made), (vslice("s"), sliced)):
        again = submit(either_store, manifest, "shared-key")
        assert again.status_code == 200, again.text
        assert again.json()["metadata"]["uid"] == original.json()["metadata"]["uid"]


def test_a_key_is_per_tenant(either_store: Backend) -> None:
    assert submit(either_store, program("p"), "k").status_code == 201
    theirs = submit(either_store, program("q"), "k", token="token-b")
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["metadata"]["namespace"] == "team-b"


def test_a_key_whose_object_is_gone_is_free_for_another_body(either_store: Backend) -> None:
    assert submit(either_store, program("q"), "release-2").status_code == 201
    # While q is there, the key is q's: another body is refused and stores nothing.
    refused = submit(either_store, program("q2", devices=2), "release-2")
    assert refused.status_code == 409, refused.text
    assert error_of(refused)["field"] == "header Idempotency-Key"
    assert either_store.call("token-a", "GET", "/v1/programs/q2").status_code == 404
    gone(either_store, "q")
    made = submit(either_store, program("q2", devices=2), "release-2")
    assert made.status_code == 201, made.text
    again = submit(either_store, program("q2", devices=2), "release-2")
    assert again.status_code == 200
    assert again.json()["metadata"]["uid"] == made.json()["metadata"]["uid"]


def key_rows(store: SqliteStore) -> int:
    return store._db().execute("SELECT COUNT(*) FROM idempotency_keys").fetchone()[0]


def test_key_rows_go_with_their_objects(tmp_path: Path) -> None:
    from backends import backend

    with backend("sqlite", tmp_path) as running:
        assert isinstance(running.store, SqliteStore)
        for n in range(20):  # a careful client: a new key for each submission
            assert submit(running, program("job"), f"key-{n}").status_code == 201
            assert key_rows(running.store) == 1
            gone(running, "job")
            assert key_rows(running.store) == 0


def test_keys_of_a_store_from_before_uids_are_kept_for_their_objects(tmp_path: Path) -> None:
    from backends import backend

    with backend("sqlite", tmp_path) as running:
        kept = submit(running, program("kept"), "old-key")
        assert kept.status_code == 201
        assert submit(running, program("gone-one"), "gone-key").status_code == 201
        gone(running, "gone-one")
    # The table as the store kept it before: keys named their object by name alone.
    db = sqlite3.connect(tmp_path / "pathways.db", isolation_level=None)
    fingerprint = db.execute(
        "SELECT fingerprint FROM idempotency_keys WHERE key = 'old-key'"
    ).fetchone()[0]
    db.executescript(
        "DROP TABLE idempotency_keys; CREATE TABLE idempotency (namespace TEXT NOT NULL, "
        "key TEXT NOT NULL, fingerprint TEXT NOT NULL, name TEXT NOT NULL, "
        "PRIMARY KEY (namespace, key));"
    )
    db.executemany(
        "INSERT INTO idempotency VALUES ('team-a', ?, ?, ?)",
        [("old-key", fingerprint, "kept"), ("gone-key", "f", "gone-one")],
    )
    db.close()
    with backend("sqlite", tmp_path) as reopened:
        assert isinstance(reopened.store, SqliteStore)
        assert key_rows(reopened.store) == 1  # the key of the object gone is dropped
        tables = {
            row[0]
            for row in reopened.store._db().execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        assert "idempotency" not in tables
        again = submit(reopened, program("kept"), "old-key")
        assert again.status_code == 200, again.text
        assert again.json()["metadata"]["uid"] == kept.json()["metadata"]["uid"]
