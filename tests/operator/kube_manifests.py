"""Manifests of the operator tests."""

from __future__ import annotations

from typing import Any

GV = "pathways.dev/v1alpha1"


def island(
    name: str, topology: str = "2x4", hosts: int = 2, kind: str = "cpu-fake", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": GV,
        "kind": "Island",
        "metadata": {"name": name},
        "spec": {"acceleratorKind": kind, "topology": topology, "hosts": hosts, **spec},
    }


def vslice(
    name: str, namespace: str = "team", devices: int | None = None, priority: int = 0, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"priority": priority, **spec}
    if devices is not None:
        body["devices"] = devices
    return {
        "apiVersion": GV,
        "kind": "VirtualSlice",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def program(name: str, namespace: str = "team", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": GV,
        "kind": "PathwaysProgram",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
