"""A proxy beside a program (``--slice``, the program's settings in its environment) on an
island with a session key: its sessions are the program's own (``<program>+proxy-...``), which
the run's credential opens; without the credential the island refuses them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from proxy_harness import run_program, start_proxy, stop_proxy

from pathways_client.launcher import LocalIsland
from pathways_core.wire.credentials import (
    SESSION_CREDENTIALS_ENV,
    SESSION_KEY_ENV,
    SessionGrant,
    credentials_text,
    sign,
)

KEY = "a-session-key-of-at-least-32-characters"


def test_a_proxy_beside_a_program_opens_sessions_with_the_runs_credential(
    tmp_path: Path,
) -> None:
    with LocalIsland(
        hosts=1,
        devices_per_host=4,
        name="keyed",
        compilation_cache=tmp_path / "xla",
        environment={SESSION_KEY_ENV: KEY},
    ) as island:
        slices = {"main": {"island": "keyed", "scheduler": island.scheduler_endpoint}}
        slices["main"] |= {"devices": [2, 3], "shape": [2]}
        program = {
            "PATHWAYS_SLICES": json.dumps(slices),
            "PATHWAYS_PROGRAM": "team/prog",
            "PATHWAYS_TENANT": "team",
        }
        grant = SessionGrant(
            "keyed", "team.prog", "team", 1, 0, frozenset({2, 3}), int(time.time()) + 600
        )
        credentials = {
            SESSION_CREDENTIALS_ENV: credentials_text({"keyed": sign(grant, KEY.encode())})
        }
        proxy = start_proxy("--slice", "main", timeout=120, env={**program, **credentials})
        try:
            seen = run_program(
                proxy.address,
                "import json, numpy as np\n"
                "y = jax.jit(lambda v: v * 3)(np.arange(4.0, dtype=np.float32))\n"
                "print(json.dumps(np.asarray(y).tolist()))\n",
            )
            assert seen == [0.0, 3.0, 6.0, 9.0]
        finally:
            stop_proxy(proxy)
        # Without the credential its start's check is refused, saying why.
        with pytest.raises(RuntimeError, match=r"refused the session: .*signed credential only"):
            start_proxy("--slice", "main", timeout=120, env=program)
