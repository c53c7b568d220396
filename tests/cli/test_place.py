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


TIME_SHARED = """\
apiVersion: pathways.dev/v1alpha1
kind: Island
metadata: {name: i1}
spec: {acceleratorKind: cpu-fake, topology: "4", hosts: 1, devicesPerHost: 4}
---
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata: {name: t1, namespace: t}
spec: {devices: 2, timeShared: true}
---
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata: {name: t2, namespace: u}
spec: {devices: 2, timeShared: true}
---
apiVersion: pathways.dev/v1alpha1
kind: PathwaysProgram
metadata: {name: p, namespace: t}
spec:
  slices: [{name: main, devices: 2, timeShared: true}]
  driver: {source: "print(1)"}
---
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata: {name: alone, namespace: t}
spec: {devices: 2, priority: 10}
---
apiVersion: pathways.dev/v1alpha1
kind: VirtualSlice
metadata: {name: urgent, namespace: v}
spec: {devices: 1, priority: 5}
"""


def test_time_shared_slices_share_the_devices_as_the_cluster_binds_them(
    pathways, tmp_path: Path
) -> None:
    """place bound each time-shared slice to devices of its own (or left it pending) where
    the cluster binds them to the devices of the first of their size."""
    (tmp_path / "shared.yaml").write_text(TIME_SHARED.rsplit("---", 1)[0])
    out = pathways("place", str(tmp_path)).stdout
    assert "u/t2: time-shares the devices of t/t1" in out
    assert "t/p-main: time-shares the devices of t/t1" in out
    rows = {line.split()[2]: line for line in out.splitlines() if line.startswith("│ ")}
    for key in ("t/t1", "u/t2", "t/p-main"):
        assert "Bound" in rows[key] and "0,1" in rows[key], rows[key]
    assert "Bound" in rows["t/alone"] and "2,3" in rows["t/alone"]
    assert "4 of 4 slices bound on 1 islands" in out
    # A holder preempted takes its group with it, as in the cluster.
    (tmp_path / "shared.yaml").write_text(TIME_SHARED)
    out = pathways("place", str(tmp_path)).stdout
    assert "u/t2: Preempted with t/t1, whose devices it shared" in out


def test_reads_standard_input_for_a_dash(root: Path) -> None:
    """`pathways place -` said "Path '-' does not exist", where `submit -` reads it."""
    from click.testing import CliRunner

    from pathways_client.cli import main

    island = (root / "examples" / "islands" / "cpu-fake.yaml").read_text()
    slice_ = (
        "apiVersion: pathways.dev/v1alpha1\nkind: VirtualSlice\n"
        "metadata: {name: s, namespace: team}\nspec: {devices: 2}\n"
    )
    result = CliRunner().invoke(main, ["place", "-"], input=island + "\n---\n" + slice_)
    assert result.exit_code == 0, result.output
    assert "1 of 1 slices bound" in result.stdout
