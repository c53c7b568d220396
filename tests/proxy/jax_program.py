"""An ordinary JAX program, run unmodified through the proxy or on local devices.

    python jax_program.py proxy 127.0.0.1:PORT OUT.npz [MESH]   # through a Pathways proxy
    python jax_program.py local 4 OUT.npz [MESH]                # plain JAX on 4 fake CPU devices

MESH (default 4) is how many devices the sharded parts use.

Only the lines under "register the proxy backend" differ between the two runs: the rest is
plain JAX (device_put, a jit of a sharded computation with a collective, a small training loop,
host round trips). It writes every result to OUT.npz for the test to compare.
"""

from __future__ import annotations

import os
import sys

mode, where, out = sys.argv[1], sys.argv[2], sys.argv[3]
mesh_size = int(sys.argv[4]) if len(sys.argv) > 4 else 4

if mode == "proxy":
    # --- register the proxy backend (the documented snippet of docs/proxy.md) ---
    os.environ.setdefault("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true")  # loopback only
    import jax
    from jax.extend import backend

    options = backend.ifrt_proxy.ClientConnectionOptions()
    options.connection_timeout_in_seconds = 30
    backend.register_backend_factory(
        "proxy",
        lambda: backend.ifrt_proxy.get_client(f"grpc://{where}", options),
        priority=-1,
    )
    jax.config.update("jax_platforms", "proxy")
    # --- end of the snippet ---
else:
    import jax

    jax.config.update("jax_num_cpu_devices", int(where))
    jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

results: dict[str, np.ndarray] = {}
devices = jax.devices()
results["device_ids"] = np.array([d.id for d in devices])
mesh = Mesh(np.array(devices[:mesh_size]), ("x",))

# 1. device_put to one device and back, and a jitted elementwise function.
a = jax.device_put(np.arange(12, dtype=np.float32).reshape(3, 4), devices[0])
results["roundtrip"] = np.asarray(a)
results["elementwise"] = np.asarray(jax.jit(lambda v: jnp.sin(v) * 2 + 1)(a))

# 2. A sharded computation with a collective: each device sums its block, then psum.
x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), NamedSharding(mesh, P("x")))


@jax.jit
def normalize(v):
    def block(b):
        total = jax.lax.psum(jnp.sum(b), "x")  # an all-reduce across the mesh's devices
        return b / total

    return jax.shard_map(block, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(v)


y = normalize(x)
results["sharded_collective"] = np.asarray(y)
results["sharded_sum"] = np.asarray(jnp.sum(y * 3.0))


# 3. A small training loop: linear regression, data sharded over the devices.
def loss_fn(params, xs, ys):
    w, b = params
    return jnp.mean((xs @ w + b - ys) ** 2)


@jax.jit
def step(params, xs, ys):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


rng = np.random.default_rng(0)
xs_host = rng.normal(size=(64, 3)).astype(np.float32)
ys_host = (xs_host @ np.array([1.5, -2.0, 0.5], np.float32) + 0.25).astype(np.float32)
xs = jax.device_put(xs_host, NamedSharding(mesh, P("x")))
ys = jax.device_put(ys_host, NamedSharding(mesh, P("x")))
params = (jnp.zeros(3, jnp.float32), jnp.zeros((), jnp.float32))
losses = []
for _ in range(20):
    params, loss = step(params, xs, ys)
    losses.append(loss)
results["losses"] = np.asarray(jax.device_get(losses))
results["weights"] = np.asarray(params[0])
results["bias"] = np.asarray(params[1])

# 4. Arrays deleted by the program are freed, and the program goes on.
z = jax.device_put(np.ones(5, np.float32), devices[1])
z.delete()
results["after_delete"] = np.asarray(jax.jit(lambda v: v + 1)(jnp.ones(5)))

# 5. Linear algebra: XLA calls LAPACK kernels, which the executor compiling the program (not
# the process that lowered it) must have set up (their absence crashed it).
spd = jax.device_put(np.array([[4.0, 1.0], [1.0, 3.0]], np.float32), devices[0])
results["inverse"] = np.asarray(jax.jit(jnp.linalg.inv)(spd))
results["cholesky"] = np.asarray(jax.jit(jnp.linalg.cholesky)(spd))
results["eigenvalues"] = np.asarray(jax.jit(lambda m: jnp.linalg.eigh(m)[0])(spd))

# 6. A donated argument is consumed by the run: deleted, as the runtime deletes it in JAX.
donated = jax.device_put(np.ones(4, np.float32), devices[0])
add = jax.jit(lambda a, b: a + b, donate_argnums=(0,))
results["donation"] = np.asarray(add(donated, jnp.arange(4, dtype=jnp.float32)))
results["donated_is_deleted"] = np.array(donated.is_deleted())

# 7. Every 8-bit float JAX has, computed and put.
for name in (
    *("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"),
    *("float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu"),
):
    dtype = getattr(jnp, name)
    cast = jax.jit(lambda v, dtype=dtype: v.astype(dtype))(jnp.array([1.0, 2.0, 0.5]))
    results[name] = np.asarray(cast).astype(np.float32)
    put = jax.device_put(np.array([1.0, 2.0], dtype), devices[0])
    results[f"{name}_put"] = np.asarray(put).astype(np.float32)

np.savez(out, **results)
print("done", len(results), flush=True)
