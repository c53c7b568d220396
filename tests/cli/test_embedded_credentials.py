"""Session credentials in an embedded cluster: its islands take sessions with a credential
only; the API signs a tenant's for the devices of its own slices, and the resource manager
signs each run's for the devices of the run's slices."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import jax
import numpy as np
import pytest

import pathways_client as pw
from pathways_client.api_client import ApiCallError
from pathways_client.embedded import EmbeddedError, read_info, session_key
from pathways_client.island_client import IslandClient, IslandError
from pathways_core.wire.credentials import SESSION_KEYS_FILE


def island_of(state: Path) -> tuple[str, str]:
    info = read_info(state)
    assert info is not None
    ((name, island),) = info.islands.items()
    return name, island["endpoint"]


def test_the_keys_are_the_users_alone_and_strangers_are_refused(embedded_state: Path) -> None:
    keys = embedded_state / SESSION_KEYS_FILE
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    name, endpoint = island_of(embedded_state)
    assert len(json.loads(keys.read_text())[name]) >= 32
    with pytest.raises(IslandError, match=r"signed credential only.*pw\.connect\(state=DIR\)"):
        IslandClient(endpoint, "stranger")
    # The SDK connecting straight to the island's endpoint is told at its first slice.
    with (
        pw.connect(islands={name: endpoint}) as direct,
        pytest.raises(pw.ConnectError, match="signed credential only"),
    ):
        direct.slice(devices=1)


def test_a_tenants_session_runs_on_its_slices_devices_only(embedded_state: Path) -> None:
    name, _ = island_of(embedded_state)
    with pw.connect(state=embedded_state, tenant="team-a") as cluster:
        assert cluster.client.startswith("team-a.")
        with cluster.slice(devices=2) as held:
            double = pw.function(lambda x: x * 2, slice=held, name="double")
            np.testing.assert_array_equal(double(np.arange(4.0)).result(), [0, 2, 4, 6])
            session = cluster.session(name)
            answer = cluster.api.call(
                "POST", f"/v1/islands/{name}/credentials", json={"client": cluster.client}
            )
            assert answer["devices"] == sorted(held.devices)
            outside = next(d for d in range(4) if d not in held.devices)
            artifact = jax.export.export(jax.jit(lambda x: x * 2))(
                jax.ShapeDtypeStruct((4,), np.float32)
            )
            function = session.register(bytes(artifact.serialize()), "double")
            x = session.put(np.zeros(4, np.float32), device=held.devices[0])
            refused = session.submit(function, [outside], [x], 1)
            with pytest.raises(IslandError, match=rf"names devices \[{outside}\]"):
                refused.wait(30)
            # A slice bound later, on a session already open: its devices are granted too,
            # until it is released.
            with cluster.slice(devices=1) as more:
                again = pw.function(lambda x: x + 1, slice=more, name="increment")
                np.testing.assert_array_equal(again(np.arange(4.0)).result(), [1, 2, 3, 4])
            (released,) = more.devices
            late = session.submit(function, [released], [x], 1)
            with pytest.raises(IslandError, match=rf"names devices \[{released}\]"):
                late.wait(30)


def test_the_api_signs_the_tenants_own_names_only(embedded_state: Path) -> None:
    name, _ = island_of(embedded_state)
    with pw.connect(state=embedded_state, tenant="team-a") as cluster:
        with pytest.raises(ApiCallError, match=r"named 'team-a\.<name>'") as raised:
            cluster.api.session_credential(name, "team-b.theirs")
        assert raised.value.status == 422
        with pytest.raises(ApiCallError) as missing:
            cluster.api.session_credential("no-such-island", "team-a.x")
        assert missing.value.status == 404
        with pytest.raises(ApiCallError, match=r"named 'team-a\.<name>'"):
            cluster.api.session_credential(name, "team-a.")  # no name of its own
        route = f"/v1/islands/{name}/credentials"
        for body, field in (
            ({"client": 5}, "client"),
            ({"client": "team-a.x", "devices": []}, "devices"),
        ):
            with pytest.raises(ApiCallError) as wrong:
                cluster.api.call("POST", route, json=body)
            assert (wrong.value.status, wrong.value.field) == (422, field), wrong.value


@pytest.mark.parametrize("content", ["[1]", "{not json"])
def test_a_keys_file_not_a_mapping_is_named(tmp_path: Path, content: str) -> None:
    (tmp_path / SESSION_KEYS_FILE).write_text(content)
    with pytest.raises(EmbeddedError, match="expected JSON mapping islands to keys"):
        session_key(tmp_path, "isl")


def test_an_islands_key_is_made_once_and_kept(tmp_path: Path) -> None:
    first = session_key(tmp_path, "isl")
    assert session_key(tmp_path, "isl") == first and session_key(tmp_path, "other") != first
    assert stat.S_IMODE((tmp_path / SESSION_KEYS_FILE).stat().st_mode) == 0o600
