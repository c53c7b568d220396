"""Checkpoints keep what they are given: dtypes NumPy's files store as raw bytes, and
namedtuples (optax's states) come back as they were saved. What could not come back is
refused before anything is written, and a damaged or unwritable checkpoint is a
CheckpointError that says what to do."""

from __future__ import annotations

import collections
import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pathways_client import checkpoint

Moments = collections.namedtuple("Moments", "mean variance")


def _refused(tmp_path: Path, state: Any, match: str, step: Any = 2) -> None:
    """``save`` refuses, and the checkpoint before it is kept whole."""
    checkpoint.save(1, {"x": np.arange(3)}, tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.save(step, state, tmp_path)
    step_back, back = checkpoint.restore(tmp_path)
    assert step_back == 1
    np.testing.assert_array_equal(back["x"], np.arange(3))
    assert _files(tmp_path) == {checkpoint.FILE, checkpoint.LOCK}  # no temporary left


def _files(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir()}


def test_narrow_dtypes_come_back_as_themselves(tmp_path: Path) -> None:
    """They came back as raw void arrays ('|V2'), silently."""
    state = {
        "bf16": jnp.arange(3, dtype=jnp.bfloat16),
        "fp8": np.array([1.0, 0.5], ml_dtypes.float8_e4m3fn),
        "int4": np.array([1, -2, 7], ml_dtypes.int4),
        "f32": np.ones(2, np.float32),
    }
    checkpoint.save(3, state, tmp_path)
    step, back = checkpoint.restore(tmp_path)
    assert step == 3
    for name, value in state.items():
        assert back[name].dtype == np.asarray(value).dtype, name
        np.testing.assert_array_equal(back[name], np.asarray(value), err_msg=name)


def test_namedtuples_come_back_as_their_type(tmp_path: Path) -> None:
    """They came back as plain tuples (an optimizer's state lost its type)."""
    state = {"opt": (Moments(np.zeros(2), np.ones(2)), [Moments(np.ones(1), np.zeros(1))])}
    checkpoint.save(1, state, tmp_path)
    _, back = checkpoint.restore(tmp_path)
    first, rest = back["opt"]
    assert type(first) is Moments and type(rest[0]) is Moments
    np.testing.assert_array_equal(first.variance, np.ones(2))


def test_a_namedtuple_that_cannot_be_imported_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restored where its module is missing (save refuses one missing where it is saved)."""
    module = types.ModuleType("vanishing_module")
    module.Local = collections.namedtuple("Local", "x", module="vanishing_module")
    monkeypatch.setitem(sys.modules, "vanishing_module", module)
    checkpoint.save(1, module.Local(np.zeros(1)), tmp_path)
    monkeypatch.delitem(sys.modules, "vanishing_module")
    with pytest.raises(checkpoint.CheckpointError, match=r"vanishing_module:Local .* cannot be"):
        checkpoint.restore(tmp_path)


def test_a_step_may_be_any_integer_scalar_and_nothing_else(tmp_path: Path) -> None:
    for given in (np.int64(5), jnp.int32(6), 7, 2**63 - 1):
        checkpoint.save(given, {}, tmp_path)
        step, _ = checkpoint.restore(tmp_path)
        assert step == int(given) and type(step) is int
    for bad in (-1, 2.0, True, "3", np.float32(1)):
        with pytest.raises(checkpoint.CheckpointError, match="step must be an integer from 0"):
            checkpoint.save(bad, {}, tmp_path)


def test_a_step_beyond_int64_is_refused(tmp_path: Path) -> None:
    """2**70 was saved as a pickled object, which restore() refuses to load."""
    for bad in (2**63, 2**70):
        _refused(tmp_path, {}, r"step must be an integer from 0 to 2\*\*63-1", step=bad)


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: b"",  # EOFError
        lambda raw: raw[: len(raw) // 2],  # BadZipFile: not a zip file
        lambda raw: raw[:-8000] + bytes([raw[-8000] ^ 1]) + raw[-7999:],  # Bad CRC-32
    ],
    ids=["empty", "truncated", "flipped-byte"],
)
def test_a_damaged_checkpoint_is_named_with_what_to_do(tmp_path: Path, damage: Any) -> None:
    """Raw EOFError and zipfile.BadZipFile escaped restore()."""
    target = checkpoint.save(1, {"x": np.arange(10_000, dtype=np.float64)}, tmp_path)
    assert target is not None
    target.write_bytes(damage(target.read_bytes()))
    with pytest.raises(checkpoint.CheckpointError, match=r"checkpoint\.npz.*delete it") as caught:
        checkpoint.restore(tmp_path)
    assert str(target) in str(caught.value)


def test_a_namedtuple_made_in_a_function_is_refused_at_save(tmp_path: Path) -> None:
    """It was saved over the last good checkpoint, and restore() could not import it."""
    local = collections.namedtuple("Local", "x")  # qualname 'Local', not importable by it
    assert local.__module__ == __name__
    _refused(tmp_path, {"opt": [local(np.zeros(1))]}, r"state\['opt'\]\[0\]: .*module level")

    class Nested(collections.namedtuple("Nested", "x")):  # qualname has '<locals>'
        pass

    _refused(tmp_path, Nested(1), r"<locals>.*cannot be imported back")
    shadow = collections.namedtuple("Moments", "mean variance")  # the name finds another type
    _refused(tmp_path, shadow(1, 2), rf"{__name__}:Moments cannot be imported back")


def test_structured_and_unnamed_void_dtypes_are_refused(tmp_path: Path) -> None:
    """They were saved, and restore() failed on np.dtype('void64')."""
    structured = np.zeros(2, dtype=[("a", np.float32), ("b", np.int32)])
    _refused(tmp_path, {"s": structured}, r"state\['s'\]: a structured array")
    _refused(tmp_path, {"s": structured.view(np.recarray)}, "a structured array")
    _refused(tmp_path, {"v": np.zeros(2, "V4")}, r"state\['v'\]: dtype .* 'void32'")


def test_concurrent_saves_each_write_a_file_of_their_own(tmp_path: Path) -> None:
    """They shared '.checkpoint.npz.<pid>.tmp': FileNotFoundError, and torn checkpoints."""
    errors: list[BaseException] = []
    done = threading.Event()

    def saver(first: int) -> None:
        try:
            for step in range(first, first + 15):
                checkpoint.save(step, {"x": np.full(20_000, step), "step": step}, tmp_path)
        except BaseException as error:
            errors.append(error)

    def reader() -> None:
        try:
            while not done.is_set():
                restored = checkpoint.restore(tmp_path)
                if restored is not None:  # one save's step and state, never two saves' mixed
                    step, state = restored
                    assert int(state["step"]) == step and (state["x"] == step).all(), step
        except BaseException as error:
            errors.append(error)

    savers = [threading.Thread(target=saver, args=(100 * i,)) for i in range(6)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in savers + readers:
        thread.start()
    for thread in savers:
        thread.join()
    done.set()
    for thread in readers:
        thread.join()
    assert errors == []
    step, state = checkpoint.restore(tmp_path)
    assert step % 100 == 14 and (state["x"] == step).all()
    assert _files(tmp_path) == {checkpoint.FILE, checkpoint.LOCK}  # no temporary left


def test_a_failed_write_keeps_the_previous_checkpoint_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk left the temporary file behind and raised a raw OSError."""
    checkpoint.save(1, {"x": np.zeros(2)}, tmp_path)

    def full(handle: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(checkpoint.CheckpointError, match="No space left") as caught:
        checkpoint.save(2, {"x": np.ones(2)}, tmp_path)
    assert f"checkpoint directory {tmp_path}:" in str(caught.value)
    monkeypatch.undo()
    assert _files(tmp_path) == {checkpoint.FILE, checkpoint.LOCK}  # no temporary left
    assert checkpoint.restore(tmp_path)[0] == 1


@pytest.mark.skipif(os.name == "nt", reason="stale files are told by POSIX file locks")
def test_temporaries_of_killed_runs_are_removed_and_of_live_saves_kept(tmp_path: Path) -> None:
    """A run killed while saving left its temporary file for ever; told by the pid in its
    name, a run in a container (whose pid was its predecessor's) kept them too."""
    prefix = f".{checkpoint.FILE}"
    old = time.time() - 60
    stale = [f"{prefix}.{os.getpid()}.0123abcd.tmp", f"{prefix}.1.tmp"]  # our pid: no matter
    fresh = f"{prefix}.7.fresh.tmp"  # just made: its save may not have locked it yet
    held = f"{prefix}.8.held.tmp"  # a save in progress, in another process
    for name in [*stale, fresh, held, "unrelated.tmp"]:
        (tmp_path / name).write_bytes(b"partial")
        if name != fresh:
            os.utime(tmp_path / name, (old, old))
    locker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            "handle = open(sys.argv[1], 'rb')\n"
            "fcntl.flock(handle, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(tmp_path / held),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        checkpoint.save(1, {}, tmp_path)
    finally:
        locker.kill()
        locker.wait()
    left = _files(tmp_path)
    assert left == {checkpoint.FILE, checkpoint.LOCK, "unrelated.tmp", fresh, held}


def test_the_directory_is_synced_after_the_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without it, a power loss could roll the checkpoint back past a save that returned."""
    synced: list[bool] = []
    fsync = os.fsync

    def recording(handle: int) -> None:
        if stat.S_ISDIR(os.fstat(handle).st_mode):
            synced.append((tmp_path / checkpoint.FILE).exists())  # after the replace
        fsync(handle)

    monkeypatch.setattr(os, "fsync", recording)
    checkpoint.save(1, {}, tmp_path)
    assert synced == [True]

    def refusing(handle: int) -> None:  # some platforms refuse to sync a directory
        if stat.S_ISDIR(os.fstat(handle).st_mode):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        fsync(handle)

    monkeypatch.setattr(os, "fsync", refusing)
    assert checkpoint.save(2, {}, tmp_path) == tmp_path / checkpoint.FILE
    assert checkpoint.restore(tmp_path)[0] == 2


def test_a_directory_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    """mkdir's FileExistsError and NotADirectoryError escaped save() as they were."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    with pytest.raises(checkpoint.CheckpointError, match="a file is there") as caught:
        checkpoint.save(1, {}, afile)
    assert f"checkpoint directory {afile}:" in str(caught.value)
    with pytest.raises(checkpoint.CheckpointError, match="Not a directory") as caught:
        checkpoint.save(1, {}, afile / "sub")
    assert str(afile / "sub") in str(caught.value)


@pytest.mark.skipif(os.name == "nt" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_directory_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(checkpoint.CheckpointError, match="Permission denied") as caught:
            checkpoint.save(1, {}, folder)
    finally:
        folder.chmod(0o700)
    assert f"checkpoint directory {folder}:" in str(caught.value)


def test_an_empty_directory_is_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """directory="" saved into the current directory; an empty variable means none."""
    variable, cwd = tmp_path / "variable", tmp_path / "cwd"
    cwd.mkdir()
    checkpoint.save(1, {}, variable)
    monkeypatch.setenv("PATHWAYS_CHECKPOINT_DIR", str(variable))
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(checkpoint, "_warned", False)
    with pytest.warns(UserWarning, match="no checkpoint directory"):
        assert checkpoint.save(2, {}, "") is None
    assert checkpoint.restore("") is None
    assert list(cwd.iterdir()) == []
    assert checkpoint.restore()[0] == 1  # the variable's directory is not touched either


def test_typed_prng_keys_come_back_as_keys(tmp_path: Path) -> None:
    """They were refused: 'not an array: PRNGKeyArray'."""
    state = {
        "key": jax.random.key(0),
        "keys": jax.random.split(jax.random.key(1), 3),
        "rbg": jax.random.key(2, impl="rbg"),
        "raw": jax.random.PRNGKey(3),  # the old uint32 keys stay arrays
    }
    checkpoint.save(1, state, tmp_path)
    _, back = checkpoint.restore(tmp_path)
    for name in ("key", "keys", "rbg"):
        assert jax.dtypes.issubdtype(back[name].dtype, jax.dtypes.prng_key), name
        assert jax.random.key_impl(back[name]) == jax.random.key_impl(state[name]), name
        np.testing.assert_array_equal(
            jax.random.key_data(back[name]), jax.random.key_data(state[name]), err_msg=name
        )
    np.testing.assert_array_equal(
        jax.random.normal(back["key"], (4,)), jax.random.normal(state["key"], (4,))
    )
    np.testing.assert_array_equal(
        jax.random.uniform(back["rbg"], (4,)), jax.random.uniform(state["rbg"], (4,))
    )
    np.testing.assert_array_equal(back["raw"], np.asarray(state["raw"]))


def test_string_dtype_arrays_are_refused(tmp_path: Path) -> None:
    """Saved pickled, they made a checkpoint restore() refuses."""
    strings = np.array(["a", "b"], dtype=np.dtypes.StringDType())
    with pytest.raises(checkpoint.CheckpointError, match=r"state\[.s.\]: a StringDType array"):
        checkpoint.save(1, {"s": strings}, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_masked_arrays_are_refused(tmp_path: Path) -> None:
    """They were saved without their mask, silently."""
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    _refused(tmp_path, {"m": masked}, r"state\['m'\]: a masked array.*\.data and \.mask")


def test_a_state_that_contains_itself_is_refused(tmp_path: Path) -> None:
    """It raised RecursionError."""
    cyclic: dict[str, Any] = {"a": [np.zeros(1)]}
    cyclic["a"].append(cyclic)
    _refused(tmp_path, cyclic, r"state\['a'\]\[1\]: contains itself")
    looped: list[Any] = []
    looped.append((looped,))
    _refused(tmp_path, looped, r"state\[0\]\[0\]: contains itself")


def test_a_container_shared_twice_is_not_a_cycle(tmp_path: Path) -> None:
    shared = [np.ones(2)]
    checkpoint.save(1, {"a": shared, "b": (shared, shared)}, tmp_path)
    _, back = checkpoint.restore(tmp_path)
    np.testing.assert_array_equal(back["b"][1][0], np.ones(2))


def _crafted(folder: Path, skeleton: object, step: object = 1, **leaves: np.ndarray) -> None:
    """A checkpoint file written by hand, as an attacker (or a damaged disk) would."""
    folder.mkdir(exist_ok=True)
    tree = skeleton if isinstance(skeleton, str) else json.dumps(skeleton)
    arrays = {"__step__": np.asarray(step), "__tree__": np.asarray(tree)}
    np.savez(folder / checkpoint.FILE, **leaves, **arrays)


def test_a_crafted_file_runs_nothing_and_is_refused(tmp_path: Path) -> None:
    """Its tree named pickle:loads as a namedtuple type, and restore called it on the file's
    data: code of the file's author ran in the driver."""
    payload = np.frombuffer(b"cos\nsystem\n(S'touch pwned'\ntR.", dtype=np.uint8)
    _crafted(tmp_path / "gadget", {"tuple": [0], "type": "pickle:loads"}, **{"0": payload})
    with pytest.raises(checkpoint.CheckpointError, match="names pickle:loads as a namedtuple"):
        checkpoint.restore(tmp_path / "gadget")
    assert not (Path.cwd() / "pwned").exists()
    _crafted(tmp_path / "call", {"tuple": [], "type": "os:getcwd"})
    with pytest.raises(checkpoint.CheckpointError, match="which it is not"):
        checkpoint.restore(tmp_path / "call")
    deep = '{"list": [' * 5000 + "0" + "]}" * 5000  # no save nests so deep
    _crafted(tmp_path / "deep", deep, **{"0": np.zeros(1)})
    with pytest.raises(checkpoint.CheckpointError, match="not a readable checkpoint"):
        checkpoint.restore(tmp_path / "deep")
    for step in (2.7, -5, 2**64 - 1):
        _crafted(
            tmp_path / "step",
            None,
            step=np.asarray(step, dtype=None if step != 2**64 - 1 else np.uint64),
        )
        with pytest.raises(checkpoint.CheckpointError, match="its step is"):
            checkpoint.restore(tmp_path / "step")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(checkpoint.CheckpointError, match="a file is there"):
        checkpoint.restore(tmp_path / "a-file")


def test_an_older_step_finishing_last_does_not_replace_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Of two saves in flight (step 1, large, then step 2), the one renamed last was kept:
    restore() resumed from step 1."""
    written, go_on = threading.Event(), threading.Event()
    fsync = os.fsync

    def held_for_step_1(handle: int) -> None:
        fsync(handle)
        if threading.current_thread().name == "step-1":
            written.set()  # its temporary file is written: only the rename is left
            assert go_on.wait(10)

    monkeypatch.setattr(os, "fsync", held_for_step_1)
    returned: list[Path | None] = []
    first = threading.Thread(
        target=lambda: returned.append(checkpoint.save(1, {"x": np.ones(3)}, tmp_path)),
        name="step-1",
    )
    first.start()
    assert written.wait(10)
    assert checkpoint.save(2, {"x": np.full(3, 2.0)}, tmp_path) == tmp_path / checkpoint.FILE
    go_on.set()
    first.join()
    step, state = checkpoint.restore(tmp_path)
    assert step == 2 and (state["x"] == 2).all()
    assert returned == [None]  # step 1: nothing kept, and it says so
    assert "checkpoint of step 1 not kept" in caplog.text and "holds step 2" in caplog.text
    assert _files(tmp_path) == {checkpoint.FILE, checkpoint.LOCK}  # its temporary removed


def test_a_save_of_the_same_or_a_later_step_replaces_the_checkpoint(tmp_path: Path) -> None:
    for step, value in ((3, 1.0), (3, 2.0), (4, 3.0)):
        assert checkpoint.save(step, {"x": np.full(2, value)}, tmp_path) is not None
        back_step, back = checkpoint.restore(tmp_path)
        assert back_step == step and (back["x"] == value).all()
    (tmp_path / checkpoint.FILE).write_bytes(b"damaged")  # any step replaces a damaged one
    assert checkpoint.save(0, {}, tmp_path) is not None
    assert checkpoint.restore(tmp_path)[0] == 0


@pytest.mark.skipif(os.name == "nt", reason="POSIX file locks")
def test_the_compare_and_rename_waits_for_another_process(tmp_path: Path) -> None:
    """A save in another process, between reading the checkpoint's step and its rename,
    holds the lock: this one renames after it, and reads the step it left."""
    checkpoint.save(1, {}, tmp_path)
    locker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys\n"
            "handle = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(handle, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n",  # until told
            str(tmp_path / checkpoint.LOCK),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        saver = threading.Thread(target=checkpoint.save, args=(2, {}, tmp_path))
        saver.start()
        saver.join(1.0)
        assert saver.is_alive()  # waiting for the lock
        assert checkpoint.restore(tmp_path)[0] == 1
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.flush()
        saver.join(10)
        assert not saver.is_alive()
    finally:
        locker.kill()
        locker.wait()
    assert checkpoint.restore(tmp_path)[0] == 2


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (collections.OrderedDict(b=1, a=2), r"state: a collections\.OrderedDict, .* plain dict"),
        (
            {"opt": collections.defaultdict(list, a=[np.ones(1)])},
            r"state\['opt'\]: a collections\.defaultdict, .* with dict\(\.\.\.\)",
        ),
        ({"m": [types.MappingProxyType({"a": 1})]}, r"state\['m'\]\[0\]: a mappingproxy"),
        ({"s": type("Stack", (list,), {})([1])}, r"state\['s'\]: a .*Stack, .* plain list"),
        ((type("Pair", (tuple,), {})((1, 2)),), r"state\[0\]: a .*Pair, .* plain tuple"),
    ],
    ids=["OrderedDict", "defaultdict", "mappingproxy", "list-subclass", "tuple-subclass"],
)
def test_containers_that_would_come_back_as_another_type_are_refused(
    tmp_path: Path, state: Any, match: str
) -> None:
    """An OrderedDict, a defaultdict (its default_factory lost) and a MappingProxyType came
    back as plain dicts, silently, while namedtuples come back as their type."""
    _refused(tmp_path, state, match)
