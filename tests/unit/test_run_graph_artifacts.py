"""The graph runner's artifacts: a configMapKeyRef one is read where the program's Job mounts
its ConfigMap, and one that is not there is named with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from pathways_client.errors import PathwaysError
from pathways_client.run_graph import load_artifact
from pathways_core.resources.program import FunctionArtifact


def test_configmap_artifacts_are_read_where_the_job_mounts_them(tmp_path: Path) -> None:
    function = FunctionArtifact.model_validate(
        {"name": "g", "configMapKeyRef": {"name": "weights", "key": "g.jaxexport"}}
    )
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "g.jaxexport").write_bytes(b"\x00artifact")
    assert load_artifact(function, tmp_path) == b"\x00artifact"
    with pytest.raises(PathwaysError, match=r"key 'g.jaxexport' of ConfigMap 'weights', is not"):
        load_artifact(function, tmp_path / "elsewhere")
