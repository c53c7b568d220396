"""STABLEHLO functions in the executor: raw StableHLO with XLA compile options (what the IFRT
proxy registers), compiled for a computation's devices, described, run; bad ones refused."""

from __future__ import annotations

import hashlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import compiler
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pathways_core.wire import pb
from pathways_executor.functions import FunctionCache, FunctionError
from pathways_executor.runner import place

STABLEHLO = pb.FunctionRegistration.STABLEHLO


def _program(dump_to: str = "") -> tuple[str, bytes]:
    """A 4-device SPMD program with a collective, as the IFRT proxy registers it: portable
    StableHLO and compile options with a logical device assignment."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))

    def normalize(v: jax.Array) -> jax.Array:
        def block(b: jax.Array) -> jax.Array:
            return b / jax.lax.psum(jnp.sum(b), "x")

        return jax.shard_map(block, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(v)

    x = jax.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh, P("x")))
    module = jax.jit(normalize).lower(x).compiler_ir("stablehlo")
    portable = _jax.mlir.serialize_portable_artifact(mlir.module_to_bytecode(module), "1.0.0")
    options = compiler.get_compile_options(
        num_replicas=1, num_partitions=4, device_assignment=np.arange(4).reshape(1, 4)
    )
    if dump_to:
        options.executable_build_options.debug_options.xla_dump_to = dump_to
    artifact = pb.StableHloProgram(
        module=portable, compile_options=options.SerializeAsString()
    ).SerializeToString()
    return hashlib.sha256(artifact).hexdigest(), artifact


def test_compiled_for_the_computation_devices_described_and_run(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    function_id, artifact = _program(dump_to=str(dump))
    cache = FunctionCache()
    cache.register(function_id, artifact, "normalize", kind=STABLEHLO)
    devices = jax.devices()[4:8]  # not the devices of the options' assignment
    function = cache.callable(function_id, devices)
    info = pb.CompiledProgram.FromString(function.description)
    assert info.name == "jit_normalize"
    assert [(a.dtype, list(a.shape)) for a in info.parameters] == [("float32", [8, 4])]
    assert [(a.dtype, list(a.shape)) for a in info.results] == [("float32", [8, 4])]
    assert info.parameter_shardings and info.result_shardings
    assert info.hlo_text and info.fingerprint
    values = np.arange(32, dtype=np.float32).reshape(8, 4)
    arguments = [place(values, s) for s in function.in_shardings]
    (out,) = function.run(*arguments)
    np.testing.assert_allclose(np.asarray(out), values / values.sum(), rtol=1e-6)
    assert {d.id for d in out.sharding.device_set} == {d.id for d in devices}
    # The client's dump folder was replaced by the executor's default: nothing written.
    assert not dump.exists()
    # (The runner holds compiled functions, a bounded number: test_runner_engine.py.)


def test_bad_stablehlo_functions_are_refused_by_name() -> None:
    cache = FunctionCache()
    junk = b"not a program"
    with pytest.raises(FunctionError, match="'junk' is not a StableHloProgram"):
        cache.register(hashlib.sha256(junk).hexdigest(), junk, "junk", kind=STABLEHLO)
    empty = pb.StableHloProgram().SerializeToString()
    with pytest.raises(FunctionError, match="module is empty"):
        cache.register(hashlib.sha256(empty).hexdigest(), empty, "empty", kind=STABLEHLO)
    garbage = pb.StableHloProgram(module=b"garbage").SerializeToString()
    garbage_id = hashlib.sha256(garbage).hexdigest()
    with pytest.raises(FunctionError, match="'garbage': module is not StableHLO"):
        cache.register(garbage_id, garbage, "garbage", kind=STABLEHLO)
    # Remembered: a computation calling it fails with the same cause.
    with pytest.raises(FunctionError, match="module is not StableHLO"):
        cache.callable(garbage_id, jax.devices()[:1])
    function_id, artifact = _program()
    cache.register(function_id, artifact, "normalize", kind=STABLEHLO)
    with pytest.raises(FunctionError, match="= 4 device\\(s\\) but the computation names 2"):
        cache.callable(function_id, jax.devices()[:2])
    # A jax.export registration of the same bytes is not mistaken for one.
    other = FunctionCache()
    with pytest.raises(FunctionError, match=r"not a jax\.export artifact"):
        other.register(function_id, artifact, "normalize")
