"""Checkpoints for drivers that restart: resume from the last completed step.

A program with ``restartPolicy: OnFailure`` is run again after a failure (its executor died,
its island was lost, the driver crashed). Each run gets ``PATHWAYS_RUN`` (1, 2, ...) and
``PATHWAYS_CHECKPOINT_DIR``: a directory of the program's own that outlives its runs (in the
embedded mode, in its state folder; in Kubernetes, on the driver's ``checkpointClaim``). A
driver saves its state after each completed step and restores it when it starts::

    from pathways_client import checkpoint

    restored = checkpoint.restore()
    step, state = restored if restored else (0, {"params": init()})
    while step < steps:
        state = train_step(state)
        step += 1
        checkpoint.save(step, state)

``state`` is a tree of dicts (string keys), lists and tuples whose leaves are arrays (numpy,
JAX, or futures of the SDK, fetched) or numbers; it comes back with numpy arrays as leaves, of
their dtypes (bfloat16, float8 and int4 too), JAX's typed PRNG keys (``jax.random.key``) as
keys of their implementation, and namedtuples (optax's states) as their own type, imported by
name where the checkpoint is restored. ``step`` is an integer from 0 to 2**63-1.
:func:`save` refuses, before writing anything, what :func:`restore` could not give back: a
namedtuple type not importable by its name (one defined in a function), structured and other
unnamed void dtypes, masked arrays (their mask), a state that contains itself, and
subclasses of dict, list and tuple other than namedtuples (an ``OrderedDict``, a
``defaultdict``, whose ``default_factory`` is code, a ``MappingProxyType``, flax's
``FrozenDict``): they would come back as plain dicts, lists and tuples, so convert them first.

:func:`save` writes one ``.npz`` file atomically (the step and the state together, or the
previous checkpoint whole), so a run killed while saving resumes from the step before; saves
from several threads each write a temporary file of their own, and the temporary files of runs
killed midway are removed by the next save. Of saves in flight at once (from threads or
processes), the highest step is kept, whichever finishes last: a save whose step is lower than
the checkpoint's keeps nothing, logs a warning and returns ``None`` (a save of the same step
replaces it). To start over from an earlier step, delete the checkpoint file. A damaged
checkpoint file is a :class:`CheckpointError` of :func:`restore` that names it, and is replaced
by the next save.

Without a checkpoint directory (no ``PATHWAYS_CHECKPOINT_DIR``, or an empty one, and no
``directory=``, or ``directory=""``; in Kubernetes, a driver without ``checkpointClaim``),
:func:`save` warns once and keeps nothing, and :func:`restore` returns ``None``: restarts begin
from the first step.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import operator
import os
import secrets
import sys
import threading
import time
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: no stale temporary files are removed there
    fcntl = None  # type: ignore[assignment]

FILE = "checkpoint.npz"
LOCK = f".{FILE}.lock"
"""Locked by a save while it compares its step with the checkpoint's and renames; it stays."""
_STEP, _TREE = "__step__", "__tree__"
_MAX_STEP = 2**63 - 1  # the step is kept as an int64
STALE_AFTER_SECONDS = 10.0
"""Temporary files at least this old, and unlocked, are of saves killed midway."""
_warned = False
_warned_lock = False
_replace_lock = threading.Lock()
logger = logging.getLogger(__name__)


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


def _folder(directory: str | Path | None) -> Path | None:
    """``directory``, else ``PATHWAYS_CHECKPOINT_DIR``; ``""`` is none, as an empty variable."""
    if directory is None:
        return default_directory()
    return Path(directory) if os.fspath(directory) else None


def _flatten(tree: Any, leaves: list[np.ndarray], path: str, active: set[int]) -> Any:
    """The tree's skeleton as JSON, its leaves appended to ``leaves``; ``active`` holds the
    ids of the containers on the path to ``tree``."""
    if isinstance(tree, Mapping | list | tuple):
        if id(tree) in active:  # it would recurse until a RecursionError
            raise CheckpointError(
                f"state{path}: contains itself (a cycle): save a tree, each container once on "
                "any path"
            )
        active.add(id(tree))
        flat = _flatten_container(tree, leaves, path, active)
        active.remove(id(tree))
        return flat
    if tree is None:
        return None
    if hasattr(tree, "result") and callable(tree.result):  # an ArrayFuture: fetch it
        tree = tree.result()
    if isinstance(tree, np.ma.MaskedArray):  # np.asarray would drop its mask
        raise CheckpointError(
            f"state{path}: a masked array, whose mask would be lost: save its .data and .mask "
            "as two arrays"
        )
    if _is_typed_key(tree):
        return _flatten_key(tree, leaves, path)
    try:
        leaf = np.asarray(tree)
    except Exception as error:
        raise CheckpointError(f"state{path}: not an array: {type(tree).__name__}") from error
    if leaf.dtype == object:
        raise CheckpointError(f"state{path}: not an array: {type(tree).__name__}")
    if leaf.dtype.kind == "T":  # NumPy's StringDType: .npz pickles it, restore() refuses
        raise CheckpointError(
            f"state{path}: a StringDType array is not kept: convert it with .astype(str)"
        )
    if leaf.dtype.fields is not None:
        raise CheckpointError(
            f"state{path}: a structured array ({leaf.dtype}) is not kept: save each field as "
            "an array of its own"
        )
    if leaf.dtype.kind == "V" and not _named_back(leaf.dtype):
        raise CheckpointError(
            f"state{path}: dtype {leaf.dtype} cannot be restored by its name "
            f"{leaf.dtype.name!r}: save it as a NumPy or ml_dtypes dtype (e.g. .view(np.uint8))"
        )
    leaves.append(leaf)
    if leaf.dtype.kind == "V":  # bfloat16, float8, int4 (ml_dtypes): .npy keeps raw bytes
        return {"leaf": len(leaves) - 1, "dtype": leaf.dtype.name}
    return len(leaves) - 1


def _flatten_container(
    tree: Mapping | list | tuple, leaves: list[np.ndarray], path: str, active: set[int]
) -> Any:
    named = isinstance(tree, tuple) and hasattr(tree, "_fields")  # as optax's states
    if type(tree) not in (dict, list, tuple) and not named:
        # A subclass would come back as the plain type, silently (an OrderedDict as a dict, a
        # defaultdict without its default_factory, which is code and not saved in general).
        plain = (
            "dict" if isinstance(tree, Mapping) else "list" if isinstance(tree, list) else "tuple"
        )
        raise CheckpointError(
            f"state{path}: a {_type_name(type(tree))}, which restore() would give back as a "
            f"plain {plain}: convert it (and any nested like it) with {plain}(...) before saving"
        )
    if isinstance(tree, Mapping):
        for key in tree:
            if not isinstance(key, str):
                raise CheckpointError(f"state{path}: dict keys must be strings, not {key!r}")
        return {
            "dict": {
                key: _flatten(value, leaves, f"{path}[{key!r}]", active)
                for key, value in tree.items()
            }
        }
    kind = "list" if isinstance(tree, list) else "tuple"
    flat = {kind: [_flatten(value, leaves, f"{path}[{i}]", active) for i, value in enumerate(tree)]}
    if named:  # its type comes back
        spelled = f"{type(tree).__module__}:{type(tree).__qualname__}"
        try:
            found = _lookup(spelled)
        except Exception:  # any failure to import it here fails restore() as well
            found = None
        if found is not type(tree):  # e.g. made in a function: its qualname has '<locals>'
            raise CheckpointError(
                f"state{path}: its namedtuple type {spelled} cannot be imported back by that "
                "name: define it at module level, or save it as a tuple or dict"
            )
        flat["type"] = spelled
    return flat


def _type_name(kind: type) -> str:
    """``kind`` as its module and name, builtins bare (``collections.OrderedDict``)."""
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _named_back(dtype: np.dtype) -> bool:
    """Whether ``np.dtype(dtype.name)`` is ``dtype``, as :func:`_unflatten` makes it."""
    import ml_dtypes  # noqa: F401  # registers the dtypes' names with NumPy

    try:
        return np.dtype(dtype.name) == dtype
    except (TypeError, ValueError):
        return False


def _is_typed_key(tree: Any) -> bool:
    """Whether ``tree`` is an array of JAX's typed PRNG keys (``jax.random.key``)."""
    dtype = getattr(tree, "dtype", None)
    if dtype is None or isinstance(dtype, np.dtype) or "jax" not in sys.modules:
        return False  # a key's dtype is JAX's own, and there is none without JAX imported
    import jax

    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:  # another library's dtype
        return False


def _flatten_key(tree: Any, leaves: list[np.ndarray], path: str) -> Any:
    """A typed PRNG key as its key data, and its implementation's name to wrap it back."""
    import jax

    impl = jax.random.key_impl(tree)
    if not isinstance(impl, str):  # an unregistered implementation: no name to restore by
        raise CheckpointError(
            f"state{path}: a PRNG key of an unregistered implementation ({impl}): save "
            "jax.random.key_data(key) and wrap it back after restoring"
        )
    leaves.append(np.asarray(jax.random.key_data(tree)))
    return {"leaf": len(leaves) - 1, "key": impl}


def _unflatten(skeleton: Any, leaves: Mapping[str, np.ndarray]) -> Any:
    if skeleton is None:
        return None
    if isinstance(skeleton, int):
        return leaves[str(skeleton)]
    if "leaf" in skeleton:
        data = leaves[str(skeleton["leaf"])]
        if "key" in skeleton:
            import jax

            return jax.random.wrap_key_data(data, impl=skeleton["key"])
        import ml_dtypes  # noqa: F401  # registers the dtypes' names with NumPy

        return data.view(np.dtype(skeleton["dtype"]))
    if "dict" in skeleton:
        return {key: _unflatten(value, leaves) for key, value in skeleton["dict"].items()}
    if "list" in skeleton:
        return [_unflatten(value, leaves) for value in skeleton["list"]]
    values = [_unflatten(value, leaves) for value in skeleton["tuple"]]
    if "type" in skeleton:
        return _named_tuple(skeleton["type"])(*values)
    return tuple(values)


def _lookup(spelled: str) -> Any:
    """The object ``module:qualname``, imported."""
    module, _, qualname = spelled.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _named_tuple(spelled: str) -> Any:
    """The namedtuple type ``module:qualname``, imported as it was saved; anything else it
    names is refused: a checkpoint file naming ``pickle:loads`` had it called on its data."""
    try:
        found = _lookup(spelled)
    except (ImportError, AttributeError) as error:
        raise CheckpointError(
            f"the checkpoint holds a {spelled} (a namedtuple), which cannot be imported here "
            f"({error}): restore where it is defined, or save it as a tuple or dict"
        ) from None
    if not (isinstance(found, type) and issubclass(found, tuple) and hasattr(found, "_fields")):
        raise CheckpointError(
            f"the checkpoint names {spelled} as a namedtuple type, which it is not: the file "
            "was not written by checkpoint.save (or was altered); it is not restored"
        )
    return found


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove the temporary files of saves killed midway. A save holds an exclusive lock on
    its file until the file is renamed: one that can be locked is no save's any more. (Told
    by the pid in its name, a run in a container, whose pid is its predecessor's, kept them.)"""
    if fcntl is None:
        return
    for temporary in folder.glob(f".{FILE}.*.tmp"):
        try:
            # A file just made may not be locked yet by its save.
            if time.time() - temporary.stat().st_mtime < STALE_AFTER_SECONDS:
                continue
            handle = os.open(temporary, os.O_RDONLY)
        except OSError:  # gone meanwhile
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a save in progress
            continue
        else:
            with contextlib.suppress(OSError):
                temporary.unlink()
        finally:
            os.close(handle)


def _sync_directory(folder: Path) -> None:
    """Make the rename into ``folder`` durable: after a power loss the checkpoint is the one
    saved, not an older one. Best effort: some platforms and file systems refuse it."""
    try:
        handle = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def save(step: int, state: Any, directory: str | Path | None = None) -> Path | None:
    """Keep ``state`` as the checkpoint of completed step ``step`` in ``directory`` (by
    default ``PATHWAYS_CHECKPOINT_DIR``; ``""`` is no directory, as an empty variable); the
    file written, or ``None`` when nothing was kept: there is no checkpoint directory, or the
    checkpoint there is of a later step than ``step`` (a warning is logged; see the
    module)."""
    global _warned
    folder = _folder(directory)
    try:  # NumPy's and JAX's integer scalars too: a step read back from an array is one
        whole = operator.index(step) if not isinstance(step, bool) else -1
    except TypeError:
        whole = -1
    if not 0 <= whole <= _MAX_STEP:
        raise CheckpointError(f"step must be an integer from 0 to 2**63-1, not {step!r}")
    step = whole
    leaves: list[np.ndarray] = []
    skeleton = _flatten(state, leaves, "", set())
    if folder is None:
        if not _warned:
            warnings.warn(
                "no checkpoint directory (PATHWAYS_CHECKPOINT_DIR is not set, or empty): "
                "checkpoints are not kept, and a restarted run begins from the first step",
                stacklevel=2,
            )
            _warned = True
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # exist_ok: a FileExistsError is a file in the way
        reason = "a file is there" if isinstance(error, FileExistsError) else _reason(error)
        raise CheckpointError(
            f"checkpoint directory {folder}: cannot be made ({reason}): give a directory this "
            "program can create and write to"
        ) from error
    buffer = io.BytesIO()
    np.savez(
        buffer,
        **{str(i): leaf for i, leaf in enumerate(leaves)},
        **{_STEP: np.asarray(step), _TREE: np.asarray(json.dumps(skeleton))},
    )
    _remove_stale_temporaries(folder)
    target = folder / FILE
    # A name of this call's own: saves from several threads must not write the same file.
    # The pid lets the next run remove it if this one is killed midway.
    temporary = folder / f".{FILE}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    try:
        with temporary.open("xb") as handle:  # the umask's permissions, as the checkpoint's
            if fcntl is not None:  # held until renamed: the next save's clean-up leaves it
                fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(buffer.getvalue())
            handle.flush()
            os.fsync(handle.fileno())
            # Saves in flight at once finish in any order: the step, not the last rename,
            # decides which is kept.
            with _replacing(folder):
                kept = _saved_step(target)
                if kept is not None and kept > step:
                    temporary.unlink()
                else:
                    temporary.replace(target)  # atomic: the previous checkpoint, or this one
                    kept = None
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise CheckpointError(
            f"checkpoint directory {folder}: cannot write the checkpoint ({_reason(error)}); "
            "the previous one is kept: free space, or make the directory writable"
        ) from error
    if kept is not None:
        logger.warning(
            "checkpoint of step %d not kept: %s holds step %d, a later one (saved meanwhile, "
            "e.g. by another thread or process); to start over from an earlier step, delete it",
            step,
            target,
            kept,
        )
        return None
    _sync_directory(folder)
    return target


def _saved_step(target: Path) -> int | None:
    """The step of the checkpoint ``target``, or ``None`` if there is none, or it cannot be
    read (a damaged checkpoint is replaced by any step)."""
    try:
        with np.load(target, allow_pickle=False) as data:
            step = data[_STEP]  # one member of the archive: the state is not read
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
        return None
    if step.shape != () or step.dtype.kind not in "iu":
        return None
    return int(step)


@contextlib.contextmanager
def _replacing(folder: Path) -> Iterator[None]:
    """Held across a save's compare-and-rename: by one thread of this process at a time, and
    by one process at a time (an exclusive lock on ``folder/LOCK``, released by the kernel
    if the process is killed). Without file locks (Windows, a file system refusing them)
    saves from several processes may still keep an older step."""
    global _warned_lock
    with _replace_lock:
        if fcntl is None:
            yield
            return
        handle = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX)
            except OSError as error:
                if not _warned_lock:
                    logger.warning(
                        "checkpoint directory %s: file locks are refused (%s): saves from "
                        "several processes at once may keep an older step",
                        folder,
                        _reason(error),
                    )
                    _warned_lock = True
            yield
        finally:
            os.close(handle)  # releases the lock


def restore(directory: str | Path | None = None) -> tuple[int, Any] | None:
    """``(step, state)`` of the last checkpoint saved in ``directory`` (as :func:`save`), or
    ``None`` if there is none."""
    folder = _folder(directory)
    if folder is not None and folder.exists() and not folder.is_dir():
        raise CheckpointError(
            f"checkpoint directory {folder}: a file is there, not a directory of checkpoints"
        )
    if folder is None or not (folder / FILE).exists():
        return None
    try:
        with np.load(folder / FILE, allow_pickle=False) as data:
            leaves = {key: data[key] for key in data.files}
        step = leaves.pop(_STEP)
        if step.shape != () or step.dtype.kind not in "iu" or not 0 <= int(step) <= _MAX_STEP:
            raise ValueError(f"its step is {step!r}, not an integer from 0 to 2**63-1")
        skeleton = json.loads(str(leaves.pop(_TREE)))
        return int(step), _unflatten(skeleton, leaves)
    except CheckpointError:  # the file is whole; what it names is missing here
        raise
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        EOFError,
        RecursionError,  # a skeleton nested past Python's limit: no save makes one
        zipfile.BadZipFile,
    ) as error:
        # Empty, truncated or corrupted (e.g. a disk error): a checkpoint cannot be made of it.
        raise CheckpointError(
            f"{folder / FILE}: not a readable checkpoint ({error}): delete it to begin from the "
            "first step, or put back a good copy"
        ) from error
