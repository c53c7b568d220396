"""Unmodified JAX programs through the proxy give exactly what plain JAX gives."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
from proxy_harness import HERE, PYTHON, ProxyProcess, client_env, run_client, run_program


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def test_unmodified_jax_program_matches_plain_jax(proxy: ProxyProcess, tmp_path: Path) -> None:
    local = run_client(["jax_program.py", "local", "4", str(tmp_path / "local.npz")])
    assert local.returncode == 0, local.stderr[-3000:]
    # Two copies of the program at once: two sessions, each with its own arrays.
    runs = [
        subprocess.Popen(
            [PYTHON, "jax_program.py", "proxy", proxy.address, str(tmp_path / f"proxy{i}.npz")],
            cwd=HERE,
            env=client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for run in runs:
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
        assert "done" in out
    expected = _load(tmp_path / "local.npz")
    assert set(expected) >= {"sharded_collective", "losses", "weights"}
    for i in range(2):
        got = _load(tmp_path / f"proxy{i}.npz")
        assert set(got) == set(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    # The training loop trained: the loss fell by orders of magnitude.
    assert expected["losses"][-1] < expected["losses"][0] / 10
    assert proxy.alive()


def test_a_pytree_of_thousands_of_arrays_is_put_and_read_back(proxy: ProxyProcess) -> None:
    # Every leaf is its own host buffer call, all started at once: past gRPC's default 1,000
    # calls waiting for a worker, it cancelled the rest and the client lost its session.
    leaves = run_program(
        proxy.address,
        """
import json
import numpy as np
tree = {f"leaf{i}": np.full(3, i, np.float32) for i in range(3000)}
back = jax.device_get(jax.device_put(tree))
print(json.dumps([float(back[f"leaf{i}"].sum()) for i in (0, 1, 2999)]))
""",
    )
    assert leaves == [0.0, 3.0, 8997.0]


def test_a_training_loop_donating_each_step_runs_as_in_plain_jax(proxy: ProxyProcess) -> None:
    # Each step donates the weights the step before made, while the proxy still waited for
    # them on another thread: deleting them then crashed jaxlib (segmentation fault, in ~1,500
    # steps, every time), every session with it.
    done = run_program(
        proxy.address,
        """
import json
import jax.numpy as jnp
step = jax.jit(lambda w, x: (w - 0.01 * jnp.tanh(w @ x), x), donate_argnums=0)
w, x = jnp.ones((256, 256)), jnp.ones((256, 256)) / 256
for _ in range(3000):
    w, x = step(w, x)
print(json.dumps(float(w[0, 0])))
""",
    )
    assert 0 < done < 1
    assert proxy.alive()


def test_a_program_in_x64_keeps_its_64_bit_values(proxy: ProxyProcess) -> None:
    # The proxy's JAX narrowed what clients put to 32 bits: a float64 read back failed on its
    # size ("32 vs 16"), every program on its argument types.
    got = run_program(
        proxy.address,
        """
import json
import numpy as np
jax.config.update("jax_enable_x64", True)
x = jax.device_put(np.arange(4, dtype=np.float64) + 2.0**-40)
y = jax.jit(lambda v: v * 3)(x)
n = jax.device_put(np.array([2**40], np.int64))
print(json.dumps([str(y.dtype), np.asarray(y).tolist(), np.asarray(n + 1).tolist()]))
""",
    )
    assert got == ["float64", [3 * (i + 2.0**-40) for i in range(4)], [2**40 + 1]]


def test_a_copy_onto_the_same_device_outlives_its_source(proxy: ProxyProcess) -> None:
    # The copy shared the source's buffer: deleting the source deleted the copy.
    copied = run_program(
        proxy.address,
        """
import json
import numpy as np
z = jax.device_put(np.arange(6, dtype=np.float32), jax.devices()[0])
w = jax.device_put(z, jax.devices()[0], may_alias=False)
z.delete()
print(json.dumps(np.asarray(w).tolist()))
""",
    )
    assert copied == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_devices_out_of_memory_say_so(proxy: ProxyProcess) -> None:
    # Said as INVALID_ARGUMENT, as if the request were wrong.
    said = run_program(
        proxy.address,
        """
import json
import jax.numpy as jnp
try:
    jax.block_until_ready(jax.jit(lambda: jnp.ones((2**40,), jnp.float32))())
except Exception as error:
    print(json.dumps(str(error)))
""",
    )
    assert said.startswith("RESOURCE_EXHAUSTED"), said
