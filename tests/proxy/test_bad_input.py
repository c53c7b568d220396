"""Bad requests get an error naming what was wrong; the session and the server go on."""

from __future__ import annotations

import grpc
import numpy as np
from proxy_harness import ProxyProcess, run_program
from raw_client import P, RawSession, single_device_sharding, unparsable_compile

F32 = 11  # xla.ifrt.DTypeProto.KIND_F32
INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNIMPLEMENTED = 3, 5, 9, 12


def _make_array(session: RawSession, handle: int, values: np.ndarray, buffer: int) -> object:
    session.store(buffer, values.astype(np.float32).tobytes())
    request = P.MakeArrayFromHostBufferRequest()
    request.dtype.kind = F32
    request.shape.dims.extend(values.shape)
    request.sharding.CopyFrom(single_device_sharding(0))
    request.host_buffer_handle = buffer
    request.array_handle = handle
    return session.call("make_array_from_host_buffer_request", request)


def _to_host(session: RawSession, handle: int, buffer: int) -> object:
    request = P.CopyToHostBufferRequest(array_handle=handle, host_buffer_handle=buffer)
    return session.call("copy_to_host_buffer_request", request)


def _status(reply: object) -> tuple[int, str]:
    status = reply.response_metadata.status  # type: ignore[attr-defined]
    return status.code, status.message


def test_malformed_programs_are_refused_by_name(proxy: ProxyProcess) -> None:
    with grpc.insecure_channel(proxy.address) as channel:
        session = RawSession(channel)
        session.init()
        garbage = unparsable_compile()
        code, message = _status(session.call("compile_request", garbage))
        assert code == INVALID_ARGUMENT
        assert "program: not a StableHLO portable artifact" in message
        other = P.CompileRequest()
        other.program.type_name = "xla::ifrt::CustomCallProgram"
        code, message = _status(session.call("compile_request", other))
        assert code == UNIMPLEMENTED and "xla::ifrt::CustomCallProgram" in message
        # A request kind the proxy does not do yet is named, not fatal.
        code, message = _status(session.call("remap_arrays_request"))
        assert code == UNIMPLEMENTED and "remap_arrays_request" in message
        code, message = _status(session.call("loaded_executable_metadata_request"))
        assert code == NOT_FOUND and "loaded_executable_handle" in message
        # The session still works.
        assert _make_array(
            session, 5, np.arange(3.0), buffer=50
        ).make_array_from_host_buffer_response
        session.close()


def test_strided_and_large_host_buffers_round_trip_and_bad_strides_are_named(
    proxy: ProxyProcess,
) -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    column_major = [4, 12]  # the byte strides of values laid out as Fortran does
    with grpc.insecure_channel(proxy.address) as channel:
        session = RawSession(channel)
        session.init()
        session.store(1, np.asfortranarray(values).tobytes(order="A"))
        request = P.MakeArrayFromHostBufferRequest(host_buffer_handle=1, array_handle=10)
        request.dtype.kind = F32
        request.shape.dims.extend(values.shape)
        request.sharding.CopyFrom(single_device_sharding(0))
        request.byte_strides.strides.extend(column_major)
        assert session.call("make_array_from_host_buffer_request", request).HasField(
            "make_array_from_host_buffer_response"
        )
        assert _to_host(session, 10, 2).HasField("copy_to_host_buffer_response")
        dense = np.frombuffer(b"".join(session.lookup(2)), np.float32).reshape(3, 4)
        np.testing.assert_array_equal(dense, values)
        back = P.CopyToHostBufferRequest(array_handle=10, host_buffer_handle=3)
        back.byte_strides.strides.extend(column_major)
        assert session.call("copy_to_host_buffer_request", back).HasField(
            "copy_to_host_buffer_response"
        )
        assert b"".join(session.lookup(3)) == np.asfortranarray(values).tobytes(order="A")
        # A buffer too small for the strides it names is refused by name.
        session.store(4, b"\0" * 16)
        short = P.MakeArrayFromHostBufferRequest()
        short.CopyFrom(request)
        short.host_buffer_handle, short.array_handle = 4, 11
        code, message = _status(session.call("make_array_from_host_buffer_request", short))
        assert code == INVALID_ARGUMENT and "too small for byte_strides [4, 12]" in message
        # 12 MiB: many chunks each way, in memory the devices take as it is.
        large = np.random.default_rng(0).random((1024, 3072), dtype=np.float32)
        assert _make_array(session, 12, large, buffer=5).HasField(
            "make_array_from_host_buffer_response"
        )
        assert _to_host(session, 12, 6).HasField("copy_to_host_buffer_response")
        chunks = session.lookup(6)
        assert len(chunks) == 12 and max(len(chunk) for chunk in chunks) == 1 << 20
        np.testing.assert_array_equal(
            np.frombuffer(b"".join(chunks), np.float32).reshape(large.shape), large
        )
        session.close()


def test_a_deleted_array_used_again_is_a_clear_error(proxy: ProxyProcess) -> None:
    with grpc.insecure_channel(proxy.address) as channel:
        session = RawSession(channel)
        session.init()
        values = np.arange(6.0).reshape(2, 3)
        reply = _make_array(session, 100, values, buffer=1)
        assert reply.make_array_from_host_buffer_response.array_handle == 100
        assert _to_host(session, 100, 2).HasField("copy_to_host_buffer_response")
        np.testing.assert_array_equal(
            np.frombuffer(b"".join(session.lookup(2)), np.float32).reshape(2, 3), values
        )
        deleted = session.call("delete_array_request", P.DeleteArrayRequest(array_handle=[100]))
        future = deleted.delete_array_response.deletion_future_handle
        done = session.call("check_future_request", P.CheckFutureRequest(future_handle=future))
        assert done.HasField("check_future_response")
        is_deleted = session.call(
            "is_array_deleted_request", P.IsArrayDeletedRequest(array_handle=100)
        )
        assert is_deleted.is_array_deleted_response.deleted
        code, message = _status(_to_host(session, 100, 3))
        assert code == FAILED_PRECONDITION
        assert "array_handle: array 100 has been deleted" in message
        code, message = _status(_to_host(session, 12345, 4))
        assert code == NOT_FOUND and "array handle 12345 is unknown" in message
        # A bad shape for the bytes sent: the array named by the client carries the error.
        session.store(5, b"\0" * 8)
        bad = P.MakeArrayFromHostBufferRequest(host_buffer_handle=5, array_handle=101)
        bad.dtype.kind = F32
        bad.shape.dims.extend([4, 4])
        bad.sharding.CopyFrom(single_device_sharding(0))
        code, message = _status(session.call("make_array_from_host_buffer_request", bad))
        assert code == INVALID_ARGUMENT and "needs 64" in message
        code, message = _status(_to_host(session, 101, 6))
        assert code == INVALID_ARGUMENT and "array 101 failed" in message
        bad_device = P.MakeArrayFromHostBufferRequest(host_buffer_handle=7, array_handle=102)
        bad_device.dtype.kind = F32
        bad_device.sharding.CopyFrom(single_device_sharding(99))
        session.store(7, b"\0" * 4)
        code, message = _status(session.call("make_array_from_host_buffer_request", bad_device))
        assert code == INVALID_ARGUMENT and "device id 99" in message
        # The session goes on: a new array round-trips.
        _make_array(session, 103, values * 2, buffer=8)
        assert _to_host(session, 103, 9).HasField("copy_to_host_buffer_response")
        np.testing.assert_array_equal(
            np.frombuffer(b"".join(session.lookup(9)), np.float32).reshape(2, 3), values * 2
        )
        session.close()
    # And other sessions are served: a stock JAX client computes.
    seen = run_program(
        proxy.address,
        "import json, numpy as np\n"
        "x = jax.device_put(np.arange(4.0, dtype=np.float32))\n"
        "x.delete()\n"
        "try:\n"
        "    x + 1\n"
        "except RuntimeError as e:\n"
        "    deleted = str(e)\n"
        "y = jax.jit(lambda v: v * 2)(np.arange(4.0, dtype=np.float32))\n"
        "print(json.dumps({'deleted': deleted, 'y': np.asarray(y).tolist()}))\n",
    )
    assert "deleted" in seen["deleted"].lower()
    assert seen["y"] == [0.0, 2.0, 4.0, 6.0]
    assert proxy.alive()


def _compile_double() -> object:
    """A CompileRequest of ``x * 2`` on a float32[4], on device 0."""
    import jax
    import jax.numpy as jnp
    from jax._src import compiler
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    lowered = jax.jit(lambda x: x * 2).lower(jax.ShapeDtypeStruct((4,), jnp.float32))
    module = lowered.compiler_ir("stablehlo")
    portable = _jax.mlir.serialize_portable_artifact(mlir.module_to_bytecode(module), "1.0.0")
    options = compiler.get_compile_options(
        num_replicas=1, num_partitions=1, device_assignment=np.zeros((1, 1), int)
    )
    request = P.CompileRequest()
    request.program.type_name = "xla::ifrt::XlaProgram"
    request.program.data = portable
    xla_options = P.XlaCompileOptionsProto()
    xla_options.compile_options.ParseFromString(options.SerializeAsString())
    request.compile_options.type_name = "xla::ifrt::XlaCompileOptions"
    request.compile_options.data = xla_options.SerializeToString()
    return request


def test_arguments_of_another_dtype_or_shape_are_refused_by_name(proxy: ProxyProcess) -> None:
    # XLA compares byte sizes alone: an int32[4] ran as the float32[4] the program takes, and
    # gave garbage back (the island backend refused it already).
    with grpc.insecure_channel(proxy.address) as channel:
        session = RawSession(channel)
        session.init()
        compiled = session.call("compile_request", _compile_double(), timeout=120)
        executable = compiled.compile_response.loaded_executable_handle
        _make_array(session, 1, np.arange(4.0), buffer=11)
        session.store(12, np.arange(4, dtype=np.int32).tobytes())
        wrong = P.MakeArrayFromHostBufferRequest(host_buffer_handle=12, array_handle=2)
        wrong.dtype.kind = 4  # KIND_S32
        wrong.shape.dims.extend([4])
        wrong.sharding.CopyFrom(single_device_sharding(0))
        session.call("make_array_from_host_buffer_request", wrong)
        _make_array(session, 3, np.arange(8.0), buffer=13)

        def run(argument: int, result: int) -> tuple[int, str]:
            request = P.LoadedExecutableExecuteRequest(
                loaded_executable_handle=executable,
                args_handles=[argument],
                result_array_handle=[result],
            )
            return _status(session.call("loaded_executable_execute_request", request))

        assert run(1, 21) == (0, "")
        code, message = run(2, 22)
        assert code == INVALID_ARGUMENT
        assert "args_handles[0] is int32[4]; the executable takes float32[4]" in message
        code, message = run(3, 23)
        assert code == INVALID_ARGUMENT and "is float32[8]" in message
        assert _to_host(session, 21, 31).HasField("copy_to_host_buffer_response")
        np.testing.assert_array_equal(
            np.frombuffer(b"".join(session.lookup(31)), np.float32), np.arange(4.0) * 2
        )
        session.close()
