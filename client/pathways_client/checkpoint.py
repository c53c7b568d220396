"""Checkpoints for drivers that restart: resume from the last completed step.

A program with ``restartPolicy: OnFailure`` is run again after a failure (its executor died,
its island was lost, the driver crashed). Each run gets ``PATHWAYS_RUN`` (1, 2, ...) and, in
the embedded mode, ``PATHWAYS_CHECKPOINT_DIR``: a directory of the program's own that outlives
its runs. A driver saves its state after each completed step and restores it when it starts::

    from pathways_client import checkpoint

    restored = checkpoint.restore()
    step, state = restored if restored else (0, {"params": init()})
    while step < steps:
        state = train_step(state)
        step += 1
        checkpoint.save(step, state)

``state`` is a tree of dicts (string keys), lists and tuples whose leaves are arrays (numpy,
JAX, or futures of the SDK, fetched) or numbers; it comes back with numpy arrays as leaves, of
their dtypes (bfloat16, float8 and int4 too), and namedtuples (optax's states) as their own
type, imported by name where the checkpoint is restored.
:func:`save` writes one ``.npz`` file atomically (the step and the state together, or the
previous checkpoint whole), so a run killed while saving resumes from the step before.

Without a checkpoint directory (no ``PATHWAYS_CHECKPOINT_DIR`` and no ``directory=``; in
Kubernetes, unless a volume is mounted and the variable set in the driver's ``env``),
:func:`save` warns once and keeps nothing, and :func:`restore` returns ``None``: restarts begin
from the first step.
"""

from __future__ import annotations

import importlib
import io
import json
import operator
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FILE = "checkpoint.npz"
_STEP, _TREE = "__step__", "__tree__"
_warned = False


class CheckpointError(ValueError):
    """A state that cannot be saved, or a checkpoint that cannot be read."""


def default_directory() -> Path | None:
    """The checkpoint directory of this program (``PATHWAYS_CHECKPOINT_DIR``), if any."""
    value = os.environ.get("PATHWAYS_CHECKPOINT_DIR")
    return Path(value) if value else None


def run_number() -> int:
    """Which run of the program this is (``PATHWAYS_RUN``, 1-based; 1 outside a program)."""
    try:
        return max(1, int(os.environ.get("PATHWAYS_RUN", "1")))
    except ValueError:
        return 1


def _flatten(tree: Any, leaves: list[np.ndarray], path: str) -> Any:
    """The tree's skeleton as JSON, its leaves appended to ``leaves``."""
    if isinstance(tree, Mapping):
        for key in tree:
            if not isinstance(key, str):
                raise CheckpointError(f"state{path}: dict keys must be strings, not {key!r}")
        return {
            "dict": {
                key: _flatten(value, leaves, f"{path}[{key!r}]") for key, value in tree.items()
            }
        }
    if isinstance(tree, list | tuple):
        kind = "list" if isinstance(tree, list) else "tuple"
        flat = {kind: [_flatten(value, leaves, f"{path}[{i}]") for i, value in enumerate(tree)]}
        if hasattr(tree, "_fields"):  # a namedtuple (optax's states are): its type comes back
            flat["type"] = f"{type(tree).__module__}:{type(tree).__qualname__}"
        return flat
    if tree is None:
        return None
    if hasattr(tree, "result") and callable(tree.result):  # an ArrayFuture: fetch it
        tree = tree.result()
    try:
        leaf = np.asarray(tree)
    except Exception as error:
        raise CheckpointError(f"state{path}: not an array: {type(tree).__name__}") from error
    if leaf.dtype == object:
        raise CheckpointError(f"state{path}: not an array: {type(tree).__name__}")
    leaves.append(leaf)
    if leaf.dtype.kind == "V":  # bfloat16, float8, int4 (ml_dtypes): .npy keeps raw bytes
        return {"leaf": len(leaves) - 1, "dtype": leaf.dtype.name}
    return len(leaves) - 1


def _unflatten(skeleton: Any, leaves: Mapping[str, np.ndarray]) -> Any:
    if skeleton is None:
        return None
    if isinstance(skeleton, int):
        return leaves[str(skeleton)]
    if "leaf" in skeleton:
        import ml_dtypes  # noqa: F401  # registers the dtypes' names with NumPy

        return leaves[str(skeleton["leaf"])].view(np.dtype(skeleton["dtype"]))
    if "dict" in skeleton:
        return {key: _unflatten(value, leaves) for key, value in skeleton["dict"].items()}
    if "list" in skeleton:
        return [_unflatten(value, leaves) for value in skeleton["list"]]
    values = [_unflatten(value, leaves) for value in skeleton["tuple"]]
    if "type" in skeleton:
        return _named_tuple(skeleton["type"])(*values)
    return tuple(values)


def _named_tuple(spelled: str) -> Any:
    """The namedtuple type ``module:qualname``, imported as it was saved."""
    module, _, qualname = spelled.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as error:
        raise CheckpointError(
            f"the checkpoint holds a {spelled} (a namedtuple), which cannot be imported here "
            f"({error}): restore where it is defined, or save it as a tuple or dict"
        ) from None
    return found


def save(step: int, state: Any, directory: str | Path | None = None) -> Path | None:
    """Keep ``state`` as the checkpoint of completed step ``step``; the file written, or
    ``None`` when there is no checkpoint directory (see the module)."""
    global _warned
    folder = Path(directory) if directory is not None else default_directory()
    try:  # NumPy's and JAX's integer scalars too: a step read back from an array is one
        whole = operator.index(step) if not isinstance(step, bool) else -1
    except TypeError:
        whole = -1
    if whole < 0:
        raise CheckpointError(f"step must be an integer >= 0, not {step!r}")
    step = whole
    leaves: list[np.ndarray] = []
    skeleton = _flatten(state, leaves, "")
    if folder is None:
        if not _warned:
            warnings.warn(
                "no checkpoint directory (PATHWAYS_CHECKPOINT_DIR is not set): checkpoints are "
                "not kept, and a restarted run begins from the first step",
                stacklevel=2,
            )
            _warned = True
        return None
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        **{str(i): leaf for i, leaf in enumerate(leaves)},
        **{_STEP: np.asarray(step), _TREE: np.asarray(json.dumps(skeleton))},
    )
    target = folder / FILE
    temporary = folder / f".{FILE}.{os.getpid()}.tmp"
    with temporary.open("wb") as handle:
        handle.write(buffer.getvalue())
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)  # atomic: the previous checkpoint, or this one, never half
    return target


def restore(directory: str | Path | None = None) -> tuple[int, Any] | None:
    """``(step, state)`` of the last checkpoint saved, or ``None`` if there is none."""
    folder = Path(directory) if directory is not None else default_directory()
    if folder is None or not (folder / FILE).exists():
        return None
    try:
        with np.load(folder / FILE, allow_pickle=False) as data:
            leaves = {key: data[key] for key in data.files}
        step = int(leaves.pop(_STEP))
        skeleton = json.loads(str(leaves.pop(_TREE)))
        return step, _unflatten(skeleton, leaves)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{folder / FILE}: not a readable checkpoint: {error}") from error
