"""`pathways place` (what `make demo` shows): the examples' slices bound by the allocator."""

from __future__ import annotations

from pathlib import Path


def test_places_the_examples(pathways, root: Path) -> None:
    result = pathways("place", str(root / "examples"))
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "team-llm/pipeline-mlp-stage0" in out
    assert "team-vision/scratch: Preempted by team-llm/urgent-debug (priority 1000 > -10)" in out
    assert "team-vision/big-sweep: InsufficientDevices" in out
    assert "8 of 10 slices bound on 3 islands" in out


def test_refuses_invalid_manifests(pathways, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: pathways.dev/v1alpha1\nkind: VirtualSlice\nmetadata: {name: s}\n"
        "spec: {devices: 0}\n"
    )
    result = pathways("place", str(tmp_path))
    assert result.exit_code == 1
    assert "spec.devices: expected a number >= 1 (got 0)" in result.stderr


def test_no_preempt_leaves_the_urgent_slice_pending(pathways, root: Path) -> None:
    result = pathways("place", "--no-preempt", str(root / "examples"))
    assert result.exit_code == 0
    assert "team-llm/urgent-debug: InsufficientDevices" in result.stdout
    assert "Preempted" not in result.stdout
