"""The committed protobuf module is what the .proto generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_generated_messages_are_up_to_date(root: Path, tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{root / 'core'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
         str(root / "core/pathways_core/wire/pathways.proto")],
        check=True,
    )  # fmt: skip
    for name in ("pathways_pb2.py", "pathways_pb2.pyi"):
        generated = (tmp_path / "pathways_core/wire" / name).read_text()
        committed = (root / "core/pathways_core/wire" / name).read_text()
        assert generated == committed, f"{name} is stale: run `make proto` and commit it"
