"""The runnable examples of a source checkout (``examples/*.py``), loaded as modules by the
tests, the benchmarks and anything else that reuses their models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (named ``example_<name>``)."""
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    if spec is None or spec.loader is None or not path.exists():
        raise FileNotFoundError(f"{path} is missing: the examples come with a source checkout")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
