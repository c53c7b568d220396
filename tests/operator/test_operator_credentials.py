"""Session credentials in a cluster, over HTTP against the emulated API server: the operator
derives each island's session key from the release's master key and the Island's uid, puts it
in the island's control Secret for its scheduler, and signs each run's credentials; a driver
on a real island whose scheduler holds that key runs with them, through the SDK."""

from __future__ import annotations

import base64
import json
import textwrap
import time
from pathlib import Path

from kube_cluster import NAMESPACE, Cluster, running_operator, wait_for
from kube_harness import JobRunner
from kube_manifests import island, program

from pathways_client.launcher import LocalIsland
from pathways_core.wire.credentials import SESSION_KEY_ENV, island_key, verify

MASTER = "m" * 48

DRIVER = textwrap.dedent(
    """
    import numpy as np
    import pathways_client as pw

    with pw.connect() as cluster:
        main = cluster.slice("main")
        double = pw.function(lambda x: x * 2, slice=main, name="double")
        print("RESULT", double(np.arange(4.0)).result().tolist())
    """
)


def test_islands_get_derived_keys_and_runs_signed_credentials(
    cluster: Cluster, tmp_path: Path
) -> None:
    settings = {"PATHWAYS_CONTROL_TOKENS": "true", "PATHWAYS_SESSION_MASTER_KEY": MASTER}
    with running_operator(**settings):
        made = cluster.create(island("keyed", topology="4", hosts=1))
        key = island_key(MASTER.encode(), made["metadata"]["uid"])
        (secret,) = wait_for(
            lambda: cluster.list("Secret", NAMESPACE, "pathways.dev/island=keyed"),
            what="the island's control Secret",
        )
        assert base64.b64decode(secret["data"]["session-key"]).decode() == key
        deployment = wait_for(lambda: cluster.get("Deployment", "keyed-scheduler", NAMESPACE))
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        reference = {"name": secret["metadata"]["name"], "key": "session-key", "optional": True}
        assert {"name": SESSION_KEY_ENV, "valueFrom": {"secretKeyRef": reference}} in env

        # A run on an island whose scheduler holds the derived key (one outside the cluster,
        # started here): its Job carries credentials the scheduler takes.
        outside = island("far", topology="4", hosts=1)
        outside["metadata"]["annotations"] = {"pathways.dev/scheduler-endpoint": "127.0.0.1:1"}
        far = cluster.create(outside)
        far_key = island_key(MASTER.encode(), far["metadata"]["uid"])
        with LocalIsland(
            hosts=1,
            devices_per_host=4,
            name="far",
            compilation_cache=tmp_path / "xla",
            environment={SESSION_KEY_ENV: far_key},
        ) as local:
            annotations = {"pathways.dev/scheduler-endpoint": local.scheduler_endpoint}
            cluster.patch("Island", "far", {"metadata": {"annotations": annotations}})
            cluster.create(
                program(
                    "prog",
                    slices=[{"name": "main", "devices": 2, "island": "far"}],
                    driver={"source": DRIVER},
                    weight=3,
                )
            )
            with JobRunner(cluster, tmp_path) as jobs:
                done = wait_for(
                    lambda: (
                        (s := (cluster.get("PathwaysProgram", "prog", "team") or {}).get("status"))
                        and s.get("phase") in ("Succeeded", "Failed")
                        and s
                    ),
                    timeout=150,
                )
                output = jobs.outputs.get("team/prog-run-1", "")
                environment = jobs.environments["team/prog-run-1"]
    assert done["phase"] == "Succeeded", (done, output)
    assert "RESULT [0.0, 2.0, 4.0, 6.0]" in output
    (credential,) = json.loads(environment["PATHWAYS_SESSION_CREDENTIALS"]).values()
    grant = verify(credential, far_key.encode(), "far", time.time())
    devices = json.loads(environment["PATHWAYS_SLICES"])["main"]["devices"]
    assert (grant.client, grant.tenant, grant.weight, grant.priority) == ("team.prog", "team", 3, 0)
    assert grant.devices == frozenset(devices)
