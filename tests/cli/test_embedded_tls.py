"""The embedded cluster with the ``PATHWAYS_TLS_*`` variables set: every hop encrypted and the
islands' endpoints mutually authenticated. A program submitted through the CLI (HTTPS API)
runs on the island (mutual TLS), and plain HTTP to the API is refused."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from certificates import Authority, write_files

from pathways_client.embedded import read_info

PROGRAM = textwrap.dedent(
    """
    apiVersion: pathways.dev/v1alpha1
    kind: PathwaysProgram
    metadata: {name: double}
    spec:
      slices:
        - {name: main, devices: 2}
      driver:
        source: |
          import numpy as np
          import pathways_client as pw
          with pw.connect() as cluster:
              main = cluster.slice("main")
              double = pw.function(lambda x: x * 2 + 1, slice=main, name="double")
              print("RESULT", double(np.arange(4, dtype=np.float32)).result().tolist())
    """
)


@pytest.fixture
def state(tmp_path: Path, pathways, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for variable, path in write_files(tmp_path / "tls", Authority.create("test-ca")).items():
        monkeypatch.setenv(variable, path)
    folder = tmp_path / "state"
    yield folder
    pathways("down", "--state", str(folder))


def test_a_program_runs_over_tls_end_to_end(state: Path, tmp_path: Path, pathways) -> None:
    started = pathways("up", "--state", str(state), "--hosts", "1", "--devices", "2")
    assert started.exit_code == 0, started.output
    info = read_info(state)
    assert info is not None and info.ready and info.api.startswith("https://"), info
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the HTTPS port
        httpx.get(info.api.replace("https://", "http://") + "/healthz", timeout=10)

    manifest = tmp_path / "program.yaml"
    manifest.write_text(PROGRAM)
    api = ("--state", str(state), "--tenant", "default")
    submitted = pathways("submit", str(manifest), *api, "--wait")
    assert submitted.exit_code == 0, submitted.output
    assert "double: Succeeded" in submitted.output
    assert "RESULT [1.0, 3.0, 5.0, 7.0]" in pathways("logs", "double", *api).output
