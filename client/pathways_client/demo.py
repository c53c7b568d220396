"""``pathways demo``: the whole system on one machine, through the REST API.

1. ``pathways up`` of a fresh embedded cluster: island ``train`` (2 hosts x 4 fake devices) and
   island ``shared`` (1 host x 2 devices, proportional-share scheduling, at most 2 computations
   in flight so the scheduler, not the queue, decides who runs);
2. tenant ``team-llm`` submits the pipelined model (``examples/pipeline_mlp.py``: 4 stages on 4
   slices of 2 devices, GPipe microbatches) as a driver program; it trains, compares its losses
   with plain single-process JAX, and reports its throughput;
3. four tenants with weights 1, 2, 4 and 8 each submit the multi-tenant example's chain
   (``examples/multi_tenant.py``) on a *time-shared* slice of the same 2 devices; they start
   together, and the island's trace gives each tenant's share of the computations run and
   of device time;
4. the trace of the four tenants is drawn (devices x time, coloured by tenant) and the cluster
   is stopped.

Every figure printed is measured in this run: nothing is assumed.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pathways_client.api_client import ApiCallError, ApiClient
from pathways_client.embedded import IslandSpec, down, tokens, up
from pathways_client.signals import handled, ignore, interrupt
from pathways_client.trace_export import plot_timeline, shares
from pathways_client.watch import wait_programs
from pathways_core.control.programs import island_client_name

WEIGHTS = (1, 2, 4, 8)
PIPELINE_STEPS = 6
CHAIN = 300
SIZE = 128
SHARED_DEVICES = 2
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

PIPELINE_DRIVER = """
import importlib.util, json, sys, time
import numpy as np
import pathways_client as pw

spec = importlib.util.spec_from_file_location("pipeline_mlp", {path!r})
example = importlib.util.module_from_spec(spec)
sys.modules["pipeline_mlp"] = example
spec.loader.exec_module(example)

config = example.Config(steps={steps})
with pw.connect() as cluster:
    slices = [cluster.slice(f"stage-{{s}}") for s in range(config.stages)]
    params, inputs, targets = example.init(config)
    pipeline = example.Pipeline(slices, config)
    # The first step compiles every function: time the steps after it.
    first = time.perf_counter()
    losses, params = pipeline.train(params, inputs[:1], targets[:1])
    began = time.perf_counter()
    more, _ = pipeline.train(params, inputs[1:], targets[1:])
    seconds = time.perf_counter() - began
expected, _ = example.reference(config)
ours = [*losses, *more]
steps = config.steps - 1
print("DEMO " + json.dumps({{
    "losses": ours, "plain_jax": expected,
    "max_difference": float(np.max(np.abs(np.array(ours) - np.array(expected)))),
    "steps_per_second": steps / seconds,
    "samples_per_second": steps * config.microbatches * config.batch / seconds,
    "first_step_seconds": began - first,
}}))
"""

TENANT_DRIVER = """
import importlib.util, json, os, sys, time
import numpy as np
import pathways_client as pw

spec = importlib.util.spec_from_file_location("multi_tenant", {path!r})
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

weight = int(os.environ["PATHWAYS_WEIGHT"])
with pw.connect() as cluster:
    devices = cluster.slice("main")
    step = pw.function(example.work, slice=devices, name=f"work-w{{weight}}")
    x = np.full(({size}, {size}), 0.01 * weight, np.float32)
    step(x).result()  # compile before the common start
    time.sleep(max(0.0, float(os.environ["DEMO_START_AT"]) - time.time()))
    began = time.perf_counter()
    value = x
    for _ in range({chain}):
        value = step(value)
    result = value.result()
    seconds = time.perf_counter() - began

import jax, jax.numpy as jnp
plain = jax.jit(example.work)
expected = jnp.asarray(x)
for _ in range({chain}):
    expected = plain(expected)
print("DEMO " + json.dumps({{
    "weight": weight, "seconds": seconds, "computations_per_second": {chain} / seconds,
    "equal_to_jax": bool(np.allclose(result, np.asarray(expected), rtol=1e-5)),
}}))
"""


def _program(name: str, slices: list[dict[str, Any]], source: str, **spec: Any) -> dict:
    return {
        "apiVersion": "pathways.dev/v1alpha1",
        "kind": "PathwaysProgram",
        "metadata": {"name": name},
        "spec": {"slices": slices, "driver": {"source": textwrap.dedent(source)}, **spec},
    }


def submit_fresh(client: ApiClient, document: dict[str, Any], run: str) -> str:
    """Submit a demo program, deleting first one of its name a previous demo in this state
    left (else its result was shown again, or the submission refused); returns its name."""
    name = document["metadata"]["name"]
    with contextlib.suppress(ApiCallError):
        client.delete("programs", name)
    deadline = time.monotonic() + 120
    while True:
        try:
            client.get("programs", name)
        except ApiCallError as error:
            if error.status == 404:
                break
            raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"program {name} of an earlier demo is still being deleted")
        time.sleep(0.2)
    # One idempotency key per run: a retried submission of this run is one program.
    return client.submit(document, f"demo-{run}-{name}")["metadata"]["name"]


def _report(client: ApiClient, name: str) -> dict[str, Any]:
    """The DEMO line a driver printed, or an error with the end of its output."""
    output = client.logs(name)
    for line in output.splitlines():
        if line.startswith("DEMO "):
            return json.loads(line[5:])
    tail = "\n".join(output.splitlines()[-20:])
    raise RuntimeError(f"program {name} printed no result; its output ends with:\n{tail}")


def _wait(programs: dict[str, tuple[ApiClient, str]], console: Console, what: str) -> None:
    """Wait for programs (tenant -> its client and program name); fail on failure."""
    finished = wait_programs(programs, console, what, timeout=900)
    for tenant, document in finished.items():
        if document["status"]["phase"] != "Succeeded":
            client, name = programs[tenant]
            tail = client.log_window(name, tail_lines=20)["logs"]
            raise RuntimeError(f"program {tenant}/{name} failed; its output ends with:\n{tail}")


def run_demo(state: Path | None, out: Path, keep: bool, console: Console) -> None:
    """Run the demo (see the module docstring)."""
    if not (EXAMPLES / "pipeline_mlp.py").exists():
        raise RuntimeError(f"the demo runs the examples of a clone of the repository: {EXAMPLES}")
    temporary = state is None
    state = state or Path(tempfile.mkdtemp(prefix="pathways-demo-"))
    run = secrets.token_hex(4)
    tenants = ["team-llm", *(f"tenant-w{w}" for w in WEIGHTS)]
    islands = [
        IslandSpec("train", hosts=2, devices_per_host=4, policy="fifo"),
        IslandSpec(
            "shared",
            hosts=1,
            devices_per_host=SHARED_DEVICES,
            policy="proportional-share",
            max_in_flight=2,
        ),
    ]
    began = time.monotonic()
    console.rule("[bold]Pathways demo[/]: an embedded cluster, driven through its REST API")
    clients: dict[str, ApiClient] = {}
    # Stopped (Ctrl-C, or SIGTERM as `timeout` and CI runners send) at any point, even while
    # the cluster starts, the demo still stops it: its ~15 processes outlived it.
    with handled((signal.SIGTERM,), interrupt):
        try:
            with console.status("starting the embedded cluster") as status:
                info = up(state, islands, tenants, progress=lambda stage: status.update(stage))
            console.print(
                f"[green]✓[/] cluster up in {time.monotonic() - began:.0f} s: API {info.api}, "
                "islands "
                + ", ".join(
                    f"{n} ({i['hosts']}x{i['devicesPerHost']})" for n, i in info.islands.items()
                )
                + f", state in {escape(str(state))}"
            )
            keys = tokens(state)
            clients = {tenant: ApiClient(info.api, keys[tenant]) for tenant in tenants}
            _pipeline(clients["team-llm"], console, run)
            weighted = {f"tenant-w{w}": clients[f"tenant-w{w}"] for w in WEIGHTS}
            _tenants(weighted, out, console, run)
        finally:
            _stop(state, clients, keep, temporary, console)
    console.print(f"demo finished in {time.monotonic() - began:.0f} s")


def _stop(
    state: Path, clients: dict[str, ApiClient], keep: bool, temporary: bool, console: Console
) -> None:
    """Close the API clients and, unless ``keep``, stop the cluster (and remove a temporary
    state folder); a second interrupt meanwhile is ignored, so the stop ends."""
    for client in clients.values():
        client.close()
    if not keep:
        stops = (signal.SIGINT, signal.SIGTERM)
        with handled(stops, ignore), console.status("stopping the embedded cluster"):
            down(state)
            if temporary:
                shutil.rmtree(state, ignore_errors=True)
        console.print("[green]✓[/] cluster stopped")


def _pipeline(client: ApiClient, console: Console, run: str) -> None:
    console.print(
        "\n[bold]1. Pipelined model[/] (tenant team-llm): 4 stages x 2 devices on island train"
    )
    source = PIPELINE_DRIVER.format(path=str(EXAMPLES / "pipeline_mlp.py"), steps=PIPELINE_STEPS)
    slices = [{"name": f"stage-{s}", "devices": 2, "island": "train"} for s in range(4)]
    name = submit_fresh(client, _program("pipeline-mlp", slices, source), run)
    _wait({"team-llm": (client, name)}, console, "training")
    result = _report(client, name)
    table = Table(title="Pipeline (GPipe, 4 microbatches of 32)")
    for column in ("step", "loss (Pathways)", "loss (plain JAX)"):
        table.add_column(column, justify="right")
    for step, (ours, theirs) in enumerate(zip(result["losses"], result["plain_jax"], strict=True)):
        table.add_row(str(step), f"{ours:.6f}", f"{theirs:.6f}")
    console.print(table)
    console.print(
        f"throughput: [bold]{result['steps_per_second']:.2f} steps/s[/] "
        f"({result['samples_per_second']:.0f} samples/s) after a first step of "
        f"{result['first_step_seconds']:.1f} s (compilation); largest loss difference with "
        f"plain JAX {result['max_difference']:.1e}"
    )


def tenant_of_client(programs: dict[str, str]) -> dict[str, str]:
    """The tenant of each program's island client (as its trace records name it), from tenant
    -> its program's name (tenants' namespaces are their names)."""
    return {island_client_name(f"{tenant}/{name}"): tenant for tenant, name in programs.items()}


def _tenants(clients: dict[str, ApiClient], out: Path, console: Console, run: str) -> None:
    console.print(
        f"\n[bold]2. Four tenants[/], weights {':'.join(map(str, WEIGHTS))}, on a time-shared "
        f"slice of the same {SHARED_DEVICES} devices of island shared"
    )
    source = TENANT_DRIVER.format(path=str(EXAMPLES / "multi_tenant.py"), size=SIZE, chain=CHAIN)
    start_at = time.time() + 25  # every driver has connected and compiled by then
    names = {}
    for tenant, client in clients.items():
        weight = int(tenant.removeprefix("tenant-w"))
        document = _program(
            "chain",
            [{"name": "main", "devices": SHARED_DEVICES, "timeShared": True, "island": "shared"}],
            source,
            weight=weight,
        )
        document["spec"]["driver"]["env"] = [{"name": "DEMO_START_AT", "value": str(start_at)}]
        names[tenant] = submit_fresh(client, document, run)
    _wait({t: (c, names[t]) for t, c in clients.items()}, console, "tenants")
    records = []
    results = {}
    for tenant, client in clients.items():
        results[tenant] = _report(client, names[tenant])
        records += client.trace(names[tenant])
    measured = shares(records)
    granted = shares(records, by_time=False)
    table = Table(title="Shares while all four tenants had work queued")
    columns = ("tenant", "weight", "target", "computations", "device time", "computations/s")
    for column in (*columns, "equal to JAX"):
        table.add_column(column, justify="right")
    by_client = tenant_of_client(names)
    total = sum(WEIGHTS)
    for client_name, share in sorted(measured.items(), key=lambda item: by_client[item[0]]):
        tenant = by_client[client_name]
        weight = results[tenant]["weight"]
        table.add_row(
            tenant,
            str(weight),
            f"{weight / total:.3f}",
            f"{granted[client_name]:.3f}",
            f"{share:.3f}",
            f"{results[tenant]['computations_per_second']:.0f}",
            "yes" if results[tenant]["equal_to_jax"] else "[red]no[/]",
        )
    console.print(table)
    # Each tenant's first computation compiled its function before the common start.
    firsts = {}
    for record in sorted(records, key=lambda r: r["seq"]):
        firsts.setdefault(record["client"], record["seq"])
    plot_timeline(
        [r for r in records if r["seq"] != firsts[r["client"]]],
        out,
        title="Island 'shared': device time of four tenants, weights 1:2:4:8",
        labels={client: by_client[client] for client in by_client},
    )
    console.print(f"trace of {len(records)} computations drawn in [bold]{escape(str(out))}[/]")
