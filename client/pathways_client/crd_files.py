"""The generated CRDs as YAML files: written by ``pathways crds`` and compared by ``--check``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from pathways_core.crds import all_crds

HEADER = "# Generated from the pathways_core models by `pathways crds`. Do not edit.\n"
GENERATED_SUFFIX = ".pathways.dev.yaml"


def render_crds() -> dict[str, str]:
    """File name to YAML text of every CRD."""
    return {
        name: HEADER + yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)
        for name, crd in all_crds().items()
    }


@dataclass(frozen=True)
class Drift:
    """A difference between the committed CRD files of a folder and the models."""

    path: Path
    problem: str  # "missing", "differs" or "stale"


def write_crds(folder: Path) -> list[Path]:
    """Write every CRD into ``folder`` (created if needed), removing stale generated files."""
    folder.mkdir(parents=True, exist_ok=True)
    rendered = render_crds()
    for drift in check_crds(folder):
        if drift.problem == "stale":
            drift.path.unlink()
    written = []
    for name, text in rendered.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check_crds(folder: Path) -> list[Drift]:
    """How the CRD files in ``folder`` differ from what the models generate."""
    rendered = render_crds()
    drifts = []
    for name, text in rendered.items():
        path = folder / name
        if not path.exists():
            drifts.append(Drift(path, "missing"))
        elif path.read_text(encoding="utf-8") != text:
            drifts.append(Drift(path, "differs"))
    if folder.is_dir():
        for path in sorted(folder.glob(f"*{GENERATED_SUFFIX}")):
            if path.name not in rendered:
                drifts.append(Drift(path, "stale"))
    return drifts
