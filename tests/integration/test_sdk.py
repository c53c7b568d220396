"""The client SDK against real islands: slices, compiled functions, futures, programs, the
graph runner, the in-cluster connection settings, and errors where the user can act."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import executor_infos, settled_executor_infos
from jax.sharding import PartitionSpec as P

import pathways_client as pw
from pathways_client.futures import Specialized, call, function_id_on
from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland
from pathways_client.programs import _program_slice
from pathways_client.rpc import stub
from pathways_core.resources import PathwaysProgram
from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.arrays import Assembly


@pytest.fixture
def cluster(island: LocalIsland):
    with pw.connect(island) as session:
        yield session


def test_sharded_function_on_a_slice_spanning_both_executors(cluster: pw.Cluster) -> None:
    with cluster.slice(shape=(2, 4)) as devices:
        assert devices.mesh().axis_names == ("x", "y")

        @pw.function(slice=devices, in_shardings=P("x", "y"), out_shardings=P())
        def total(x):
            return jnp.sum(x, axis=1)

        value = np.arange(32, dtype=np.float32).reshape(4, 8)
        np.testing.assert_allclose(total(value).result(), value.sum(axis=1))
        # A function of no inputs ran on one device of the slice, and refused to.
        constant = pw.function(lambda: jnp.arange(8.0), slice=devices, out_shardings=P("x"))
        np.testing.assert_array_equal(constant().result(), np.arange(8.0))
        # An axis the mesh does not have was JAX's bare ValueError.
        unknown = pw.function(lambda v: v, slice=devices, name="axes", in_shardings=P("q"))
        with pytest.raises(TypeError, match=r"'axes': sharding P\('q',\) does not fit slice"):
            unknown(value)


def test_a_host_input_sharded_over_both_executors_goes_to_each_in_parts(
    cluster: pw.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each executor is sent only the shards its devices take of a host input (before, the
    first executor was sent all of it and the second pulled all of it from there)."""
    sent: list[dict[int, int]] = []  # per upload in parts: elements sent to each executor
    put_shards = IslandClient.put_shards

    def recording(self: IslandClient, array: np.ndarray, regions: Any) -> str:
        sent.append({e: sum(array[r].size for r in held) for e, held in regions.items()})
        return put_shards(self, array, regions)

    monkeypatch.setattr(IslandClient, "put_shards", recording)
    value = np.arange(8 * 16 * 6, dtype=np.float32).reshape(8, 16, 6)
    with cluster.slice(devices=8) as line:
        for spec, parts in ((P("x"), True), (P(None, "x"), True), (P(), False)):
            double = pw.function(lambda a: a * 2 + 1, slice=line, in_shardings=spec)
            np.testing.assert_array_equal(double(value).result(), value * 2 + 1)
            assert bool(sent) == parts, spec
            if parts:
                assert sent.pop() == {0: value.size // 2, 1: value.size // 2}, spec
    with cluster.slice(shape=(2, 4)) as mesh:  # shards of both axes, whatever the binding
        for spec in (P("x", "y"), P(None, ("y", "x")), P("y")):
            double = pw.function(lambda a: a * 2 + 1, slice=mesh, in_shardings=spec)
            np.testing.assert_array_equal(double(value).result(), value * 2 + 1)
    # What an executor holds of an input uploaded in parts is its part: fetched from both, the
    # array is whole; asked of one, only its regions come.
    session = cluster.session(line.island)
    rest = (slice(0, 16), slice(0, 6))
    halves = {0: [(slice(0, 4), *rest)], 1: [(slice(4, 8), *rest)]}
    buffer_id = session.put_shards(value, halves)
    np.testing.assert_array_equal(session.get(buffer_id), value)
    # Regions as numpy takes them (open bounds) work; one that is not a block is named.
    whole = (slice(None), slice(None), slice(None))
    open_halves = {0: [(slice(None, 4), *whole[1:])], 1: [(slice(4, None), *whole[1:])]}
    np.testing.assert_array_equal(session.get(session.put_shards(value, open_halves)), value)
    with pytest.raises(IslandError, match=r"put_shards: region .*: axis 0 is not a contiguous"):
        session.put_shards(value, {0: [(slice(0, 8, 2), *whole[1:])]})
    assembly = Assembly()
    request = pb.ArrayRequest(buffer_id=buffer_id, timeout_seconds=10)
    assembly.add(stub(session._executors[1], EXECUTOR, "GetArray")(request, timeout=30))
    assert not assembly.complete and assembly.written is not None
    assert assembly.written[4:].all() and not assembly.written[:4].any()
    # Read on one device, it is assembled whole from both; read on both hosts laid out
    # otherwise, it fails saying so (the SDK sends parts only to the one computation they
    # were cut for).
    with cluster.slice(devices=1) as one:
        single = pw.function(lambda a: a * 2 + 1, slice=one).specialize(value)
        function_id = function_id_on(session, single, one.island)
        whole = session.submit(function_id, one.devices, [buffer_id], 1)
        whole.wait(60)
        np.testing.assert_array_equal(session.get(whole.outputs[0]), value * 2 + 1)
    across = pw.function(lambda a: a * 2 + 1, slice=line, in_shardings=P(None, "x"))
    function_id = function_id_on(session, across.specialize(value), line.island)
    failed = session.submit(function_id, line.devices, [buffer_id], 1).done
    with pytest.raises(IslandError, match="split for another layout"):
        failed.result(timeout=60)
    session.delete([buffer_id, whole.outputs[0]])


def test_pytrees_go_in_and_come_out(cluster: pw.Cluster) -> None:
    with cluster.slice(devices=2) as devices:
        step = pw.function(
            lambda params, x: {"y": x @ params["w"] + params["b"], "n": jnp.sum(x)},
            slice=devices,
            in_shardings=(P(), P("x")),
            out_shardings={"y": P("x"), "n": P()},
        )
        params = {"w": np.eye(3, dtype=np.float32) * 2, "b": np.ones(3, np.float32)}
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        out = step(params, x)
        np.testing.assert_allclose(out["y"].result(), x * 2 + 1)
        assert float(out["n"].result()) == x.sum()
        # put takes a pytree too, as jax.device_put does, and gives it back of futures.
        held = pw.put(params, devices)
        assert set(held) == {"w", "b"} and isinstance(held["w"], pw.ArrayFuture)
        np.testing.assert_allclose(step(held, x)["y"].result(), x * 2 + 1)
        with pytest.raises(TypeError, match=r"put: value\['b'\]\[1\]: str 'x' cannot be sent"):
            pw.put({"w": params["w"], "b": [np.ones(3), "x"]}, devices)


def test_keyword_arguments_are_passed_as_jax_jit_takes_them(cluster: pw.Cluster) -> None:
    """Keywords were a TypeError of ``__call__``; now as with ``jax.jit``: one naming a
    positional parameter is that position (the same compiled function), keyword-only ones and
    ``**kwargs`` are traced too, and misuse is named."""
    with cluster.slice(devices=2) as devices:
        ones = np.ones(4, np.float32)

        def affine(x, y=1.0, *, scale, **extra):
            return (x + y) * scale + sum(jax.tree.leaves(extra), start=0.0)

        step = pw.function(affine, slice=devices, name="affine")
        out = step(ones, y=ones, scale=np.float32(3), bias={"b": np.float32(0.5)})
        np.testing.assert_allclose(out.result(), np.full(4, 6.5))
        by_keyword = step(x=ones, scale=np.float32(2)).result()  # y stays its default
        np.testing.assert_allclose(by_keyword, np.full(4, 4.0))
        count = len(step._specialized)
        step(ones, ones, scale=np.float32(2)).wait()  # by position: compiled the same
        step(ones, y=ones, scale=np.float32(5)).wait()
        assert len(step._specialized) == count + 1
        with pytest.raises(TypeError, match=r"'affine': missing a required argument: 'x'"):
            step(y=ones, scale=np.float32(1))
        with pytest.raises(TypeError, match=r"missing 1 required keyword-only argument: 'scale'"):
            step(ones)
        with pytest.raises(TypeError, match=r"for arguments x=float32\[4\], scale=float32\[3\]"):
            step(ones, scale=np.ones(3, np.float32))
        per_argument = pw.function(affine, slice=devices, in_shardings=(P("x"),), name="per")
        with pytest.raises(TypeError, match=r"keyword arguments \(scale\) need in_shardings"):
            per_argument(ones, scale=np.float32(1))
        # One PartitionSpec is every argument's, keywords too: a scalar cannot take P("x").
        sharded = pw.function(affine, slice=devices, in_shardings=P("x"), name="sharded")
        np.testing.assert_allclose(sharded(ones, scale=ones).result(), np.full(4, 2.0))
        with pytest.raises(TypeError, match=r"'sharded' cannot be compiled .*scale=float32\[\]: "):
            sharded(ones, scale=np.float32(1))

        @pw.program
        def twice(x):
            return step(step(x, scale=np.float32(1)), y=x, scale=np.float32(1))

        np.testing.assert_allclose(twice(ones).result(), np.full(4, 3.0))


def test_static_arguments_are_python_values_compiled_in_as_jax_jit_has_them(
    cluster: pw.Cluster,
) -> None:
    with cluster.slice(devices=2) as devices:
        ones = np.ones(4, np.float32)

        def layer(x, training, rate=0.5):
            return x * rate if training else x

        with pytest.raises(TypeError, match=r"training=bool\[\]: .*must be static"):
            pw.function(layer, slice=devices)(ones, True)
        dropout = pw.function(layer, slice=devices, static_argnames="training", name="dropout")
        np.testing.assert_allclose(dropout(ones, training=True).result(), ones * 0.5)
        np.testing.assert_allclose(dropout(ones, False).result(), ones)  # by position too
        dropout(ones, training=True).wait()
        assert len(dropout._specialized) == 2  # one compiled function per static value
        tile = pw.function(lambda x, n: jnp.tile(x, n), slice=devices, static_argnums=1)
        assert tile(ones, 3).result().shape == (12,)
        with pytest.raises(TypeError, match=r"argument 'n' \(position 1\) .* must be hashable"):
            tile(ones, [3])
        with pytest.raises(TypeError, match=r"arguments x=float32\[4\], n=5: "):
            pw.function(lambda x, n: x.reshape(n), slice=devices, static_argnums=1)(ones, 5)

        @pw.program
        def twice(v):
            return dropout(dropout(v, training=True), training=False)

        np.testing.assert_allclose(twice(ones).result(), ones * 0.5)
        with pytest.raises(TypeError, match=r"input_specs or static arguments, not both"):
            pw.function(layer, slice=devices, static_argnums=1, input_specs=[ones])


def test_programs_take_static_arguments_as_jax_jit_does(cluster: pw.Cluster) -> None:
    """A step count or a flag of a program's Python could only be captured from outside it:
    as an argument it was traced as an array, and range() over it failed."""
    one = cluster.slice(devices=1)
    double = pw.function(lambda v: v * 2, slice=one)
    x = np.ones(4, np.float32)

    def repeat(x, steps, *, negate=False):
        for _ in range(steps):
            x = double(x)
        return double(double(x)) if negate else x

    with pytest.raises(TypeError, match=r"must be static: pw\.program\(static_argnames="):
        pw.program(repeat)(x, 3)
    program = pw.program(repeat, static_argnames=("steps", "negate"))
    np.testing.assert_array_equal(program(x, steps=3).result(), 8 * x)
    np.testing.assert_array_equal(program(x, 2).result(), 4 * x)  # by position too
    np.testing.assert_array_equal(program(x, 1, negate=True).result(), 8 * x)
    program(x, steps=3).wait()
    assert len(program._traces) == 3  # one trace per static value
    resource = program.to_resource(x, 2)
    assert len(resource.spec.graph.nodes) == 3  # the argument's source node and two calls
    with pytest.raises(TypeError, match=r"argument 'steps' \(position 1\) of program 'repeat' "):
        program(x, [3])
    with pytest.raises(ValueError, match=r"program 'repeat': static_argnames \['step'\] name"):
        pw.program(repeat, static_argnames="step")
    with pytest.raises(ValueError, match=r"program 'repeat': static_argnums \[2\] out of range"):
        pw.program(static_argnums=2)(repeat)


def test_typed_prng_keys_are_refused_saying_how_to_send_them(cluster: pw.Cluster) -> None:
    """Sent, a ``jax.random.key`` failed in numpy; returned, on the executor."""
    with cluster.slice(devices=1) as one:
        sample = pw.function(
            lambda data: jax.random.normal(jax.random.wrap_key_data(data), (3,)), slice=one
        )
        key = jax.random.key(0)
        with pytest.raises(TypeError, match=r"typed PRNG key.*send jax.random.key_data\(key\)"):
            pw.function(lambda k: jax.random.normal(k, (3,)), slice=one)(key)
        expected = jax.random.normal(key, (3,))
        np.testing.assert_allclose(sample(jax.random.key_data(key)).result(), expected)
        split = pw.function(
            lambda data: jax.random.split(jax.random.wrap_key_data(data)), slice=one
        )
        with pytest.raises(TypeError, match=r"returns an array of key<fry> \(typed PRNG keys\)"):
            split(jax.random.key_data(key))


def test_futures_feed_later_calls_and_programs_run_parallel_or_sequential(
    cluster: pw.Cluster,
) -> None:
    a, b = cluster.slice(devices=1), cluster.slice(devices=1)
    try:
        increment = pw.function(lambda v: v + 1, slice=a, name="increment")
        double = pw.function(lambda v: v * 2, slice=b, name="double")

        @pw.program
        def chain(v):
            for _ in range(3):
                v = double(increment(v))
            return v

        start = np.arange(4, dtype=np.float32)
        expected = start
        for _ in range(3):
            expected = (expected + 1) * 2
        parallel = chain(start)
        sequential = chain(start, sequential=True)
        np.testing.assert_array_equal(parallel.result(), expected)
        np.testing.assert_array_equal(sequential.result(), expected)
        # The program was traced once and reused; its graph has the six calls.
        assert [n.name for n in chain.trace(start).flow.nodes] == [
            "increment",
            "double",
            "increment-2",
            "double-2",
            "increment-3",
            "double-3",
        ]
    finally:
        a.release()
        b.release()


def test_programs_take_keywords_and_one_larger_than_an_island_program_goes_node_by_node(
    cluster: pw.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program of more nodes than an island program may have (4096) failed at its
    registration; now it is submitted node by node, as a program across islands is."""
    import pathways_client.programs as programs

    with cluster.slice(devices=1) as one:
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")

        @pw.program
        def steps(v, *, times):
            for _ in range(times.shape[0]):
                v = increment(v)
            return v

        island_programs = []
        on_island = programs._call_on_island
        monkeypatch.setattr(
            programs,
            "_call_on_island",
            lambda *given: island_programs.append(given) or on_island(*given),
        )
        start, times = np.zeros(2, np.float32), np.zeros(6)
        np.testing.assert_array_equal(steps(start, times=times).result(), np.full(2, 6.0))
        assert len(island_programs) == 1  # six nodes: one call of an island program
        monkeypatch.setattr(programs, "MAX_PROGRAM_NODES", 5)
        many = steps(start, times=times)
        np.testing.assert_array_equal(many.result(), np.full(2, 6.0))
        assert len(island_programs) == 1  # over the limit: node by node


def test_a_program_whose_registration_is_too_large_for_one_message_goes_node_by_node(
    cluster: pw.Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of nodes with long names made a registration the scheduler refused (over
    1 MiB), and the program failed, blaming its first node, on every run."""
    import pathways_client.island_client as island_client

    with cluster.slice(devices=1) as one:
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")

        @pw.program
        def steps(v):
            for _ in range(6):
                v = increment(v)
            return v

        registered = []
        register = island_client.IslandClient.register_program
        monkeypatch.setattr(
            island_client.IslandClient,
            "register_program",
            lambda *given, **named: registered.append(given) or register(*given, **named),
        )
        # The limit the scheduler enforces, made small enough for six nodes to exceed.
        monkeypatch.setattr(island_client, "MAX_REQUEST_BYTES", 300)
        start = np.zeros(2, np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(steps(start).result(), np.full(2, 6.0))
        assert len(registered) == 1  # tried once; the next call went node by node at once
        with pytest.raises(island_client.ProgramTooLarge, match="more than the 300 a sched"):
            register(*registered[0])


def test_a_closed_connection_refuses_work_and_its_futures_say_why(island: LocalIsland) -> None:
    """After its ``with`` block a connection opened new island sessions on use (leaking them),
    and its futures failed on the island with "unknown buffer"."""
    with pytest.raises(TypeError, match=r"islands must map island names .* \(got list\)"):
        pw.connect(islands=[island.scheduler_endpoint])  # type: ignore[arg-type]
    with pw.connect(island) as cluster:
        one = cluster.slice(devices=1)
        increment = pw.function(lambda v: v + 1, slice=one)
        value = increment(np.zeros(2, np.float32))
        unread = increment(value)
        kept = value.result()
    assert cluster.closed
    np.testing.assert_array_equal(kept, np.ones(2))
    for work in (lambda: increment(np.zeros(2)), lambda: cluster.slice(devices=1)):
        with pytest.raises(pw.ConnectError, match=r"this connection was closed"):
            work()
    # A value taken is kept with its future (as a jax.Array keeps it); one not taken is gone.
    assert value.result() is kept
    with pytest.raises(pw.DeletedError, match=r"belongs to a closed connection"):
        unread.result()
    # Closed by another thread while a result is awaited: that is what the wait says (it said
    # NodeFailed, "Stream removed").
    failures: list[BaseException] = []
    with pw.connect(island) as cluster:
        one = cluster.slice(devices=1)
        slow = pw.function(
            # Seconds even on an idle machine (300 steps took under 0.5 s on one).
            lambda v: jax.lax.fori_loop(0, 1500, lambda _, m: jnp.tanh(m @ m), v),
            slice=one,
            name="slow",
        )
        pending = slow(np.eye(512, dtype=np.float32))

        def fetch() -> None:
            try:
                pending.result()
            except BaseException as error:
                failures.append(error)

        waiting = threading.Thread(target=fetch)
        waiting.start()
        time.sleep(0.2)
        assert not pending.ready()  # still computing as the connection closes
    waiting.join(timeout=60)
    assert len(failures) == 1 and isinstance(failures[0], pw.DeletedError), failures
    assert "belongs to a closed connection" in str(failures[0])
    cluster.close()  # again: nothing happens
    with pw.connect(island) as again:
        double = pw.function(lambda v: v * 2, slice=again.slice(devices=1), name="double")
        with pytest.raises(pw.DeletedError, match=r"'double': the future .* closed connection"):
            double(value)


def test_futures_act_as_jax_arrays_do_where_it_makes_sense(cluster: pw.Cluster) -> None:
    """``float``, ``int``, ``len`` and ``block_until_ready`` were errors; arithmetic was
    Python's bare "unsupported operand"."""
    with cluster.slice(shape="1x1") as one:
        assert one.shape == (1, 1)
        total = pw.function(lambda v: (v.sum(), v.astype(np.int32)), slice=one, name="total")
        value, as_int = total(np.arange(3, dtype=np.float32))
        assert value.block_until_ready() is value and value.ready()
        assert float(value) == 3.0 and int(value) == 3 and len(as_int) == 3
        with pytest.raises(TypeError, match=r"len\(\) of a 0-d array"):
            len(value)
        with pytest.raises(TypeError, match=r"arithmetic of ArrayFuture.*in a pw.function"):
            value + 1
        with pytest.raises(TypeError, match=r"indexing of ArrayFuture.*\.result\(\) first"):
            as_int[0]
        # Comparisons were Python's identity (so `value == 3` was False); bool() was True.
        for compare in (lambda: value == 3, lambda: value != 3, lambda: as_int < 2):
            with pytest.raises(TypeError, match=r"a comparison of ArrayFuture.*pw.function"):
                compare()
        assert bool(value) and len({value, as_int}) == 2  # futures stay hashable
        with pytest.raises(ValueError, match="more than one element is ambiguous"):
            bool(as_int)
    for shape, expected in (("2by2", "expected a mesh shape"), ((2, 0), "positive integer")):
        with pytest.raises(pw.SliceError, match=expected):
            cluster.slice(shape=shape)


def test_a_program_written_as_a_resource_runs_without_its_python(
    cluster: pw.Cluster, island: LocalIsland, tmp_path: Path
) -> None:
    with cluster.slice(devices=1) as one, cluster.slice(devices=2) as two:
        add = pw.function(lambda v, w: v + w, slice=one, name="add")
        total = pw.function(lambda v: jnp.sum(v) * jnp.ones(2), slice=two, name="total")

        @pw.program(name="sum-chain")
        def program(v, *, step):  # a keyword-only argument (to_resource took none)
            return total(add(v, step))

        resource = program.to_resource(
            np.arange(4, dtype=np.float32), kwargs={"step": np.ones(4, np.float32)}, steps=2
        )
    # The resource is a valid PathwaysProgram (as kubectl would send it).
    wire = resource.to_wire()
    assert PathwaysProgram.model_validate(wire).spec.steps == 2
    spec = tmp_path / "program.json"
    spec.write_text(json.dumps(wire))
    results = tmp_path / "results.npz"
    env = dict(os.environ, PATHWAYS_ISLANDS=f"{island.name}={island.scheduler_endpoint}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathways_client.run_graph",
            "--spec",
            str(spec),
            "--results",
            str(results),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e.get("completedSteps") for e in events[:2]] == [1, 2]
    assert events[-1]["event"] == "succeeded"
    np.testing.assert_array_equal(np.load(results)["arr_0"], [10.0, 10.0])  # sum of 1..4


def test_a_graph_calling_one_function_on_two_slices_runs_each_node_on_its_own(
    cluster: pw.Cluster, island: LocalIsland, tmp_path: Path
) -> None:
    """Nodes were placed by their function: every node of a function ran on the slice of its
    last node."""
    with cluster.slice(devices=1) as a, cluster.slice(devices=1) as b:
        first = pw.function(lambda v: v + 1, slice=a, name="inc")
        second = pw.function(lambda v: v + 1, slice=b, name="inc")
        program = pw.program(lambda v: second(first(v)), name="inc-twice")
        wire = program.to_resource(np.zeros(4, np.float32)).to_wire()
    graph = wire["spec"]["graph"]
    calls = [node for node in graph["nodes"] if node["name"].startswith("inc")]
    calls[1]["function"] = calls[0]["function"]  # one function, named on two slices
    spec = tmp_path / "program.json"
    spec.write_text(json.dumps(wire))
    before = {r.computation_id for r in cluster.trace()}
    env = dict(os.environ, PATHWAYS_ISLANDS=f"{island.name}={island.scheduler_endpoint}")
    run = [sys.executable, "-m", "pathways_client.run_graph", "--spec", str(spec)]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["outputs"][0]["sum"] == 8.0
    ran = {r.name: tuple(r.devices) for r in cluster.trace() if r.computation_id not in before}
    # Two slices of one device each, bound together: two devices, one for each node.
    assert ran[calls[0]["name"]] != ran[calls[1]["name"]], ran
    # An output the function does not have is said in one line (it was a traceback).
    calls[1]["inputs"] = [{"node": calls[0]["name"], "output": 3}]
    spec.write_text(json.dumps(wire))
    refused = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1
    position = graph["nodes"].index(calls[1])
    assert refused.stderr.strip().splitlines() == [
        f"error: spec.graph.nodes[{position}].inputs[0].output: node {calls[0]['name']!r} has "
        "1 output(s), numbered from 0; 3 is not one of them"
    ]


def test_a_corrupt_artifact_fails_the_graph_runner_with_the_reason(
    island: LocalIsland, tmp_path: Path
) -> None:
    spec = {
        "slices": [{"name": "one", "devices": 1}],
        "graph": {
            "functions": [{"name": "broken", "inline": "bm90IGFuIGFydGlmYWN0"}],
            "nodes": [{"name": "n", "function": "broken", "slice": "one"}],
        },
    }
    path = tmp_path / "broken.yaml"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, PATHWAYS_ISLANDS=f"{island.name}={island.scheduler_endpoint}")
    done = subprocess.run(
        [sys.executable, "-m", "pathways_client.run_graph", "--spec", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "function 'broken': not a jax.export artifact" in done.stderr


def test_in_cluster_settings_give_the_bound_slices(
    island: LocalIsland, monkeypatch: pytest.MonkeyPatch
) -> None:
    slices = {
        "train": {
            "virtualSlice": "p-train",
            "island": island.name,
            "scheduler": island.scheduler_endpoint,
            "devices": [6, 7],
            "shape": [2],
        }
    }
    monkeypatch.setenv("PATHWAYS_SLICES", json.dumps(slices))
    monkeypatch.setenv("PATHWAYS_PROGRAM", "team-a/p")
    monkeypatch.setenv("PATHWAYS_WEIGHT", "3")
    monkeypatch.setenv("PATHWAYS_STEPS", "1000")
    with pw.connect() as cluster:
        train = cluster.slice("train")
        assert (train.island, train.devices, cluster.weight) == (island.name, (6, 7), 3)
        assert cluster.steps == 1000  # the program's spec.steps, for its driver's loop
        double = pw.function(
            lambda v: v * 2, slice=train, in_shardings=P("x"), out_shardings=P("x")
        )
        np.testing.assert_array_equal(double(np.ones(4, np.float32)).result(), 2)
        with pytest.raises(pw.SliceError, match="no bound slice named 'eval'"):
            cluster.slice("eval")


def test_wrong_shapes_raise_before_dispatch_naming_the_argument(cluster: pw.Cluster) -> None:
    with cluster.slice(devices=1) as one:
        scale = pw.function(
            lambda weights, x: x @ weights,
            slice=one,
            input_specs=[
                jax.ShapeDtypeStruct((3, 3), jnp.float32),
                jax.ShapeDtypeStruct((4, 3), jnp.float32),
            ],
        )
        before = len(cluster.trace())
        with pytest.raises(
            TypeError,
            match=r"argument 'x' \(position 1\).*is float32\[4, 4\], "
            r"expected float32\[4, 3\]",
        ):
            scale(np.eye(3, dtype=np.float32), np.zeros((4, 4), np.float32))
        with pytest.raises(TypeError, match=r"argument 'weights' .* int32\[3, 3\]"):
            scale(np.eye(3, dtype=np.int32), np.zeros((4, 3), np.float32))
        # Without fixed specs a mismatch fails when tracing, still before dispatch.
        matmul = pw.function(lambda a, b: a @ b, slice=one, name="matmul")
        with pytest.raises(
            TypeError,
            match=r"'matmul' cannot be compiled for arguments "
            r"a=float32\[2, 3\], b=float32\[2, 3\]",
        ):
            matmul(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
        # Host callbacks cannot travel in an artifact: said so, with what to do instead.
        printing = pw.function(
            lambda x: (jax.debug.print("x={x}", x=x), x + 1)[1], slice=one, name="printing"
        )
        with pytest.raises(
            TypeError, match=r"'printing' cannot be compiled .*jax.debug.print.*in the driver"
        ):
            printing(np.zeros(2, np.float32))
        assert len(cluster.trace()) == before


def test_a_slice_that_can_never_fit_fails_fast(cluster: pw.Cluster) -> None:
    with pytest.raises(pw.SliceError, match=r"cannot be bound: .*(8|island)"):
        cluster.slice(devices=64)
    with pytest.raises(pw.SliceError, match="no island matches kind tpu-v5e"):
        cluster.slice(devices=1, accelerator="tpu-v5e")
    with pytest.raises(pw.SliceError, match=r"no island matches .*the island selector"):
        cluster.slice(devices=1, island_selector={"pool": "research"})
    with pytest.raises(pw.SliceError, match=r"acceleratorKind: expected one of .*'tpu-v99'"):
        cluster.slice(devices=1, accelerator="tpu-v99")
    with cluster.slice(devices=1, accelerator="cpu-fake") as fake:
        assert fake.size == 1


def test_a_deleted_future_raises_clearly(cluster: pw.Cluster) -> None:
    with cluster.slice(devices=1) as one:
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")
        value = increment(np.zeros(2, np.float32))
        value.delete()
        with pytest.raises(pw.DeletedError, match=r"node 'increment'.*was deleted"):
            value.result()
        with pytest.raises(pw.DeletedError, match=r"argument 'v' .*was deleted"):
            increment(value)


def test_a_call_refused_for_a_deleted_argument_leaves_no_upload_behind(
    island: LocalIsland, cluster: pw.Cluster
) -> None:
    """The host values uploaded before a later argument was found deleted stayed on the
    executor for good, one array a refused call; a program's refusal names the input."""
    before = [info.buffers for info in executor_infos(island)]  # (the tests' before, going)
    one = cluster.slice(devices=1)
    add = pw.function(lambda a, b: a + b, slice=one, name="add")
    twice = pw.program(lambda a, b: add(add(a, b), b))
    gone = pw.put(np.ones(1000, np.float32), one)
    gone.delete()
    for _ in range(3):
        with pytest.raises(pw.DeletedError, match=r"argument 'b' \(position 1\)"):
            add(np.ones(1000, np.float32), gone)
        with pytest.raises(pw.DeletedError, match=r"input .* of the program: .*was deleted"):
            twice(np.ones(1000, np.float32), gone)
    settled = settled_executor_infos(island, before, within=30, at_most=True)
    after = [info.buffers for info in settled]
    assert all(now <= then for now, then in zip(after, before, strict=True)), (before, after)


def test_a_failed_node_raises_with_its_name_island_and_the_executors_message(
    cluster: pw.Cluster,
) -> None:
    with cluster.slice(devices=1) as one:
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")
        specialized: Specialized = increment.specialize(jax.ShapeDtypeStruct((4,), jnp.float32))
        # Bypass the SDK's checks, as a hand-written client could: the executor refuses.
        (bad,) = call(cluster, one, specialized, [np.zeros((2, 2), np.float32)], node="bad-node")
        with pytest.raises(
            pw.NodeFailed,
            match=r"node 'bad-node' on island 'local' failed: .*"
            r"expected float32\[4\]",
        ) as failure:
            bad.result(timeout=60)
        assert (failure.value.node, failure.value.island) == ("bad-node", "local")
        # The island keeps serving.
        np.testing.assert_array_equal(increment(np.zeros(4, np.float32)).result(), 1)


def test_misuse_is_named_where_it_happens(cluster: pw.Cluster) -> None:
    """Each of these was a bare AttributeError, an empty TimeoutError, a raw pydantic report
    or, for a released slice, work on devices that may be another's now."""
    with pytest.raises(pw.SliceError, match=r"devices must be at least 1 \(got 0\)"):
        cluster.slice(devices=0)
    with cluster.slice(devices=1) as one:
        with pytest.raises(TypeError, match=r"pw.function places a callable \(got int\)"):
            pw.function(42, slice=one)
        with pytest.raises(TypeError, match=r"slice must be a Slice .* \(got None\)"):
            pw.function(lambda v: v, slice=None)  # type: ignore[arg-type]
        increment = pw.function(lambda v: v + 1, slice=one, name="increment")

        # put takes its arguments in jax.device_put's order, and says when they are swapped.
        ones = pw.put(np.ones(3, np.float32), one)
        np.testing.assert_array_equal(increment(ones).result(), np.full(3, 2, np.float32))
        with pytest.raises(TypeError, match=r"put: slice must be a Slice"):
            pw.put(one, np.ones(3, np.float32))  # type: ignore[arg-type]

        slow = pw.function(lambda v: jnp.linalg.matrix_power(v, 64), slice=one, name="slow")
        pending = slow(np.eye(512, dtype=np.float32))
        with pytest.raises(TimeoutError, match=r"'slow' was not computed on island .* within 0 s"):
            pending.result(timeout=0)
        pending.wait()

        @pw.program
        def host_math(v):
            return increment(v) * 2

        with pytest.raises(TypeError, match=r"arithmetic of Traced\(float32\[3\].*pw.function"):
            host_math(np.zeros(3, np.float32))

        @pw.program
        def branches(v):  # took the else branch silently: Traced == 0 was False
            w = increment(v)
            return increment(w) if w == 0 else w

        with pytest.raises(TypeError, match=r"a comparison of Traced\(float32\[3\].*pw.function"):
            branches(np.zeros(3, np.float32))
        # What devices cannot hold is refused naming the argument (it was a JAX KeyError).
        for bad, kind in (("abc", "str 'abc'"), (object(), "object <object")):
            with pytest.raises(
                TypeError, match=rf"'increment': argument 'v' \(position 0\): {kind}"
            ):
                increment(bad)
        with pytest.raises(TypeError, match=r"put: str 'abc' cannot be sent to an island \(dtype"):
            pw.put("abc", one)
        with pytest.raises(TypeError, match=r"program 'twice-arg': argument 0: str 'x' cannot"):
            pw.program(lambda v: increment(v), name="twice-arg")("x")

        @pw.program
        def twice(v):
            return increment(increment(v))

        # A program called inside another adds its nodes to it (it asked for a host value).
        four_times = pw.program(lambda v: twice(twice(v)), name="four-times")
        np.testing.assert_array_equal(four_times(np.zeros(3, np.float32)).result(), 4)
        assert len(four_times.trace(np.zeros(3, np.float32)).flow.nodes) == 4

        with pytest.raises(ValueError, match=r"as a resource: spec.steps: expected a number >= 1"):
            twice.to_resource(np.zeros(3, np.float32), name="twice", steps=0)
        with pytest.raises(ValueError, match=r"metadata.name: expected a lowercase RFC 1123 la"):
            twice.to_resource(np.zeros(3, np.float32), name="t" * 55)
        # An argument too large to inline names the function it became, not a pydantic model.
        with pytest.raises(ValueError, match=r"as a resource: function '.*' \(\d+ bytes export"):
            twice.to_resource(np.random.default_rng(0).random(200_000, np.float32))
        # On one island, a resource may run on whichever island fits; across two, it stays.
        assert [s.island for s in twice.to_resource(np.zeros(3, np.float32)).spec.slices] == [None]
        assert _program_slice(one, pinned=True)["island"] == one.island
        # A long function name was cut to 55 characters, or to one ending in '-'.
        for long_name in (
            "train_step_for_the_very_large_language_model_experiment_v2",
            "a" * 53 + "_b",
        ):
            named = pw.program(lambda v: increment(v), name=long_name)
            made = named.to_resource(np.zeros(3, np.float32)).metadata.name
            assert made is not None and len(made) <= 54 and not made.endswith("-"), made
    # Released, the slice's devices may be bound to another slice: nothing more runs on it.
    with pytest.raises(pw.SliceError, match=r"slice '.*' was released"):
        increment(np.zeros(3, np.float32))
    with pytest.raises(pw.SliceError, match=r"was released"):
        pw.put(np.zeros(3, np.float32), one)
    with pytest.raises(pw.SliceError, match=r"was released"):
        twice(np.zeros(3, np.float32))
    np.testing.assert_array_equal(ones.result(), np.ones(3, np.float32))  # made before: kept


def test_results_match_jax_jit_in_dtype_structure_and_ownership(cluster: pw.Cluster) -> None:
    """Found by probing as a researcher: Python numbers lost JAX's weak typing (a bfloat16
    model scaled by 2.0 ran in float32; int8 * 200 did not wrap); static 2 and 2.0 shared one
    compiled function; checkify's error codes came back under another trace's numbering
    (KeyError); a program returning one output twice gave one future, so deleting either
    deleted both; jax_debug_nans was silently ignored."""
    from jax.experimental import checkify

    with cluster.slice(devices=1) as one:
        scale = pw.function(lambda x, s: x * s, slice=one, name="scale")
        half = np.arange(4).astype(jnp.bfloat16)
        small = np.arange(4, dtype=np.int8)
        for x, s in ((half, 2.0), (small, 200)):
            expected = jax.jit(lambda x, s: x * s)(x, s)
            got = scale(x, s).result()
            assert got.dtype == expected.dtype, (x.dtype, s)
            np.testing.assert_array_equal(got, np.asarray(expected))

        @pw.program
        def scaled(x, s):
            return scale(x, s)

        assert scaled(half, 2.0).result().dtype == jnp.bfloat16

        tile = pw.function(lambda x, n: x * n, slice=one, static_argnums=1, name="times")
        assert tile(np.arange(3, dtype=np.int32), 2).result().dtype == np.int32
        assert tile(np.arange(3, dtype=np.int32), 2.0).result().dtype == np.float32

        def positive(x):
            checkify.check(jnp.all(x > 0), "x must be positive")
            return x + 1

        checked = pw.function(checkify.checkify(positive), slice=one, name="checked")
        error, _ = checked(-np.ones(2, np.float32))
        with pytest.raises(Exception, match="x must be positive"):
            jax.tree.map(lambda leaf: leaf.result(), error).throw()

        increment = pw.function(lambda x: x + 1, slice=one, name="increment")

        @pw.program
        def twice(x):
            y = increment(x)
            return {"params": y, "ema": y}

        out = twice(np.zeros(3, np.float32))
        assert out["params"] is not out["ema"]
        out["params"].delete()
        np.testing.assert_array_equal(out["ema"].result(), 1)

        log = pw.function(jnp.log, slice=one, name="log")
        with jax.debug_nans(True), pytest.warns(UserWarning, match="checkify"):
            log(np.ones(2, np.float32)).wait()


def test_a_node_stopped_by_another_nodes_failure_did_not_run(cluster: pw.Cluster) -> None:
    with cluster.slice(devices=1) as a, cluster.slice(devices=1) as b:
        huge = pw.function(lambda x: jnp.zeros((2**40,), jnp.float32) + x, slice=a, name="huge")
        double = pw.function(lambda x: x * 2, slice=b, name="double")

        @pw.program
        def both(x):
            return huge(x), double(x)

        _, doubled = both(np.float32(1))
        with pytest.raises(
            pw.NodeFailed, match=r"node 'double' on island 'local' did not run: computation 'huge'"
        ):
            doubled.result(timeout=60)


# -- as jax.jit has it ----------------------------------------------------------------------


def test_a_python_int_too_large_for_its_dtype_is_refused_not_wrapped(cluster: pw.Cluster) -> None:
    """``x * 2**40`` gave zeros and ``pw.put(2**40)`` 0: narrowed to int32, wrapped around."""
    one = cluster.slice(devices=1)
    multiply = pw.function(lambda x, y: x * y, slice=one)
    x = np.ones(3, np.int32)
    with pytest.raises(OverflowError):
        jax.jit(lambda x, y: x * y)(x, 2**40)  # as JAX refuses it
    for value in (2**40, 2**31, -(2**33) - 5):
        with pytest.raises(OverflowError, match=rf"Python int {value} too large .* int32"):
            multiply(x, value)
        with pytest.raises(OverflowError, match=rf"Python int {value} too large .* int32"):
            pw.put(value, one)
    np.testing.assert_array_equal(multiply(x, 2**31 - 1).result(), [2**31 - 1] * 3)


def test_weak_types_promote_as_in_jax(cluster: pw.Cluster) -> None:
    """A bfloat16 model times a learning rate computed on the island, put there, or made by
    jnp.asarray(0.1) became float32 (twice the memory), where JAX keeps bfloat16."""
    one = cluster.slice(devices=1)
    schedule = pw.function(lambda step: 0.1 * 0.5**step, slice=one)
    multiply = pw.function(lambda x, s: x * s, slice=one)
    x = np.ones(3, jnp.bfloat16)
    rate = schedule(3)
    assert rate.aval.weak_type and pw.put(0.1, one).aval.weak_type
    scaled = pw.program(lambda x, s: multiply(x, s))  # (a program's arguments too)
    for scale in (rate, pw.put(0.1, one), jnp.asarray(0.1), 0.1):
        expected = jax.jit(lambda x, s: x * s)(x, jnp.asarray(0.1)).dtype
        assert multiply(x, scale).dtype == expected == jnp.bfloat16, scale
        assert scaled(x, scale).result().dtype == expected, scale
    np.testing.assert_allclose(multiply(x, rate).result().astype(np.float32), 0.0125, rtol=1e-2)


def test_shardings_and_static_arguments_are_checked_as_jax_jit_checks_them(
    cluster: pw.Cluster,
) -> None:
    two, one = cluster.slice(devices=2), cluster.slice(devices=1)
    x = np.ones(4, np.float32)

    def scale(x, n):
        return x * n

    # in_shardings, one per argument that is not static (a placeholder was needed).
    sharded = pw.function(scale, slice=two, static_argnums=1, in_shardings=(P("x"),))
    np.testing.assert_array_equal(sharded(x, 3).result(), 3 * x)
    np.testing.assert_array_equal(pw.function(scale, slice=two, static_argnums=-1)(x, 2), 2 * x)
    # On one device as on more: an axis the mesh lacks, more entries than axes (accepted).
    for spec, problem in ((P("data"), "data"), (P("x", None, None), "3 entries")):
        with pytest.raises(TypeError, match=problem):
            pw.function(lambda v: v * 2, slice=one, in_shardings=spec)(x)
    # A misspelled static name or a position past the arguments (accepted silently).
    with pytest.raises(ValueError, match=r"static_argnames \['num'\] name no argument"):
        pw.function(scale, slice=one, static_argnames="num")
    with pytest.raises(ValueError, match=r"static_argnums \[7\] out of range: it takes 2"):
        pw.function(scale, slice=one, static_argnums=7)


def test_errors_of_the_function_keep_their_type_and_say_where(cluster: pw.Cluster) -> None:
    """A KeyError or an assert in the function became a TypeError whose message was empty
    (``...: ``) or a bare ``'w2'``; a Python value from an argument in a loop or a shape got
    no advice to make it static."""
    one = cluster.slice(devices=1)
    params = {"w1": np.ones((4, 4), np.float32)}

    def forward(params, x):
        assert x.shape[-1] == params["w1"].shape[0]
        return x @ params["w1"] @ params["w2"]

    function = pw.function(forward, slice=one)
    with pytest.raises(AssertionError) as refused:
        function(params, np.ones((2, 3), np.float32))
    assert "params['w1']=float32[4, 4], x=float32[2, 3]: AssertionError" in str(
        refused.value.__notes__
    )
    with pytest.raises(KeyError, match="w2") as missing:
        function(params, np.ones((2, 4), np.float32))
    assert "x=float32[2, 4]: KeyError: 'w2'" in str(missing.value.__notes__)
    for body in (
        lambda x, n: sum(x for _ in range(n)),
        lambda x, n: jnp.zeros(n) + x.sum(),
        lambda x, n: x.reshape(n, -1),
    ):
        with pytest.raises(TypeError, match=r"must be static: pw\.function"):
            pw.function(body, slice=one)(np.ones(4, np.float32), 2)


def test_a_futures_value_is_taken_once_and_kept_read_only(cluster: pw.Cluster) -> None:
    """Each .result(), np.asarray or float() fetched the whole array again."""
    one = cluster.slice(devices=1)
    value = pw.function(lambda v: v * 2, slice=one)(np.arange(6, dtype=np.float32))
    first = value.result()
    assert value.result() is first and np.asarray(value) is first
    assert not first.flags.writeable and np.array(value).flags.writeable
    assert (value.ndim, value.size, value.item(5), value.tolist()) == (
        1,
        6,
        10.0,
        [0.0, 2.0, 4.0, 6.0, 8.0, 10.0],
    )


def test_islands_of_one_name_are_refused(island: LocalIsland) -> None:
    """Two LocalIslands of the default name: the connection silently kept only the last."""
    with pytest.raises(ValueError, match=r"islands share a name .*name='a'"):
        pw.connect([island, island])
