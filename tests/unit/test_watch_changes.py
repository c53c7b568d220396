"""What `pathways get --watch` prints again: objects new or changed since the last look (by
resourceVersion), then those gone, marked Deleted."""

from __future__ import annotations

from typing import Any

from pathways_client.watch import changes


def obj(name: str, version: str, phase: str = "Running", namespace: str = "a") -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "resourceVersion": version}
    return {"metadata": meta, "status": {"phase": phase}}


def test_new_changed_and_deleted_objects_in_order() -> None:
    before = [obj("same", "1"), obj("moved", "2"), obj("gone", "3", "Succeeded")]
    after = [obj("new", "9"), obj("same", "1"), obj("moved", "5", "Failed")]
    seen = changes(before, after)
    assert [(d["metadata"]["name"], d["status"]["phase"]) for d in seen] == [
        ("new", "Running"),
        ("moved", "Failed"),
        ("gone", "Deleted"),
    ]
    assert before[2]["status"]["phase"] == "Succeeded"  # the object looked at is not changed


def test_nothing_changed_is_nothing_and_namespaces_keep_names_apart() -> None:
    assert changes([obj("x", "1")], [obj("x", "1")]) == []
    assert changes([], []) == []
    other = changes([obj("x", "1", namespace="a")], [obj("x", "1", namespace="b")])
    assert [(d["metadata"]["namespace"], d["status"]["phase"]) for d in other] == [
        ("b", "Running"),
        ("a", "Deleted"),
    ]
