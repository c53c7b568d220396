"""Leases of VirtualSlices through the API: a holder renews its slice
(``POST /v1/virtualslices/NAME/renew``), and the embedded manager releases one whose holder
stopped renewing (phase Released, reason LeaseExpired), freeing its devices and quota."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from api_server import Server, error_of, vslice
from test_manager import Running, wait_for

from pathways_core.control.slices import renewal_stamp

RENEWED_AT = "pathways.dev/renewed-at"


def leased(name: str, seconds: int, devices: int = 2) -> dict[str, Any]:
    manifest = vslice(name, devices)
    manifest["spec"]["leaseSeconds"] = seconds
    return manifest


def status_of(client: httpx.Client, name: str) -> dict[str, Any]:
    return client.get(f"/v1/virtualslices/{name}").json().get("status") or {}


def test_a_renewal_is_stamped_by_the_api_and_refused_clearly_when_there_is_none_to_make(
    server: Server, a: httpx.Client, b: httpx.Client
) -> None:
    assert a.post("/v1/virtualslices", json=leased("held", 30)).status_code == 201
    before = datetime.now(UTC)
    renewed = a.post("/v1/virtualslices/held/renew")
    assert renewed.status_code == 200, renewed.text
    stamp = renewed.json()["metadata"]["annotations"][RENEWED_AT]
    assert before - timedelta(seconds=1) <= datetime.fromisoformat(stamp) <= datetime.now(UTC)
    later = a.post("/v1/virtualslices/held/renew").json()["metadata"]["annotations"][RENEWED_AT]
    assert later > stamp

    # Bad input names what is wrong; nothing accepted before changes.
    assert a.post("/v1/virtualslices", json=vslice("unleased")).status_code == 201
    refused = a.post("/v1/virtualslices/unleased/renew")
    assert refused.status_code == 409
    assert error_of(refused)["field"] == "spec.leaseSeconds"
    assert "held until deleted" in error_of(refused)["message"]
    assert error_of(b.post("/v1/virtualslices/held/renew"))["code"] == "NotFound"  # not b's
    assert a.post("/v1/virtualslices/nope/renew").status_code == 404
    short = a.post("/v1/virtualslices", json=leased("short", 2))
    assert short.status_code == 422
    assert error_of(short)["field"] == "spec.leaseSeconds"
    forged = vslice("forged")
    forged["metadata"]["annotations"] = {RENEWED_AT: "2999-01-01T00:00:00Z"}
    assert error_of(a.post("/v1/virtualslices", json=forged))["field"] == (
        f"metadata.annotations.{RENEWED_AT}"
    )

    # A lease past its length is renewed until the controller released the slice (it may
    # hold it still: for a program naming it, or for a lease after its own restart).
    stored = server.store.read("VirtualSlice", "team-a", "held")
    assert stored is not None

    def backdate(document: dict[str, Any]) -> dict[str, Any]:
        past = datetime.now(UTC) - timedelta(seconds=60)
        document["metadata"]["annotations"][RENEWED_AT] = renewal_stamp(past)
        return document

    backdated = server.store.replace(stored, backdate)
    assert backdated is not None
    late = a.post("/v1/virtualslices/held/renew")
    assert late.status_code == 200, late.text
    assert late.json()["metadata"]["annotations"][RENEWED_AT] > stamp

    # Released for its lease, it is not renewed: delete it and make a new one.
    def released(document: dict[str, Any]) -> dict[str, Any]:
        document["status"] = {"phase": "Released", "reason": "LeaseExpired"}
        return document

    stored = server.store.read("VirtualSlice", "team-a", "held")
    assert stored is not None and server.store.replace(stored, released) is not None
    gone = a.post("/v1/virtualslices/held/renew")
    assert gone.status_code == 409
    assert "ran out and its devices are released" in error_of(gone)["message"]


def test_the_manager_releases_a_slice_whose_holder_stopped_renewing(
    server: Server, a: httpx.Client, tmp_path: Path
) -> None:
    (tmp_path / "islands.json").write_text(
        json.dumps({"local": {"endpoint": "127.0.0.1:9", "hosts": 1, "devicesPerHost": 4}})
    )
    manager = Running(tmp_path)
    try:
        assert a.post("/v1/virtualslices", json=leased("kept", 5)).status_code == 201
        assert a.post("/v1/virtualslices", json=leased("dropped", 5)).status_code == 201
        wait_for(lambda: status_of(a, "kept").get("phase") == "Bound", what="kept Bound")
        wait_for(lambda: status_of(a, "dropped").get("phase") == "Bound", what="dropped Bound")
        assert a.get("/v1/me").json()["usage"]["devices"] == 4
        # "kept"'s holder renews it; "dropped"'s is gone. Nothing else happens in the store:
        # the manager acts when the lease runs out, not on a change.
        began = time.monotonic()
        while time.monotonic() - began < 8:
            assert a.post("/v1/virtualslices/kept/renew").status_code == 200
            time.sleep(1)
        dropped = status_of(a, "dropped")
        assert (dropped["phase"], dropped["reason"]) == ("Released", "LeaseExpired")
        assert not dropped.get("devices") and not dropped.get("island")
        assert status_of(a, "kept")["phase"] == "Bound"
        assert a.get("/v1/me").json()["usage"]["devices"] == 2  # its quota is free again
        # Events are recorded after the statuses of a pass are written.
        wait_for(
            lambda: (
                "LeaseExpired"
                in [e["reason"] for e in a.get("/v1/virtualslices/dropped/events").json()["items"]]
            ),
            what="the LeaseExpired Event",
        )
        # Its name is taken until it is deleted; deleted, it goes.
        assert error_of(a.post("/v1/virtualslices/dropped/renew"))["code"] == "Conflict"
        assert a.delete("/v1/virtualslices/dropped").status_code == 200
        wait_for(lambda: a.get("/v1/virtualslices/dropped").status_code == 404, what="gone")
        assert asyncio.run(server.store.usage("team-a")).devices == 2
    finally:
        manager.stop()
