"""The ``pathways`` command-line interface."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pathways_client.api_client import MAX_LOG_BYTES, ApiCallError, ApiClient
from pathways_client.bench import bench_command
from pathways_client.crd_files import check_crds, write_crds
from pathways_client.manifests import (
    Document,
    ManifestSyntaxError,
    defined_already,
    flag_duplicates,
    manifest_files,
    object_key,
    parse_documents,
    read_documents,
    unique_files,
)
from pathways_client.mesh_view import islands_table, slice_styles
from pathways_client.outputs import OutputPath
from pathways_client.proxy.command import proxy_command
from pathways_client.proxy.tunnel import tunnel_command
from pathways_core.allocator import Allocator, Bound, IslandInventory, Request, slice_requests
from pathways_core.control.common import printable
from pathways_core.manifests import without_system_fields
from pathways_core.resources import Island, PathwaysProgram, VirtualSlice
from pathways_core.resources.base import DNS_SUBDOMAIN_PATTERN
from pathways_core.scheduling import Policy
from pathways_core.topology import device_count, format_shape, parse_shape

if TYPE_CHECKING:
    from pathways_client.embedded import IslandSpec

# Rich assumes 80 columns when output is not a terminal; tables read better wider in logs.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
# Problems are one line each, never wrapped, so they can be grepped.
errors = Console(stderr=True, highlight=False, soft_wrap=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pathways-on-kubernetes", prog_name="pathways")
def main() -> None:
    """Pathways on Kubernetes: gang-scheduled dataflow programs of compiled JAX functions over
    islands of accelerators."""


@main.command()
@click.option(
    "--out",
    "folders",
    type=click.Path(file_okay=False, path_type=Path),
    multiple=True,
    default=[Path("crds")],
    show_default=True,
    help="Folder to write the CRDs to (repeatable).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the files differ.")
def crds(folders: tuple[Path, ...], check: bool) -> None:
    """Generate the CustomResourceDefinitions from the resource models."""
    if check:
        drifts = [drift for folder in folders for drift in check_crds(folder)]
        for drift in drifts:
            errors.print(f"[red]{escape(str(drift.path))}[/]: {escape(drift.problem)}")
        if drifts:
            errors.print(
                "The CRDs differ from the models: run [bold]pathways crds --out "
                + " --out ".join(escape(str(f)) for f in folders)
                + "[/] and commit the result."
            )
            sys.exit(1)
        console.print(f"[green]CRDs up to date[/] in {escape(', '.join(str(f) for f in folders))}")
        return
    for folder in folders:
        try:
            written = write_crds(folder)
        except OSError as error:  # --check writes nothing, so the folder is checked here
            raise click.BadParameter(
                f"cannot write {folder}: {error.strerror or error}", param_hint="'--out'"
            ) from None
        for path in written:
            console.print(f"wrote {path}", markup=False)


MANIFEST_PATHS = click.Path(exists=True, allow_dash=True, path_type=Path)
"""Files and folders of manifests, or '-' for standard input (as ``submit`` reads it)."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=MANIFEST_PATHS)
def validate(paths: tuple[Path, ...]) -> None:
    """Validate manifests of Islands, VirtualSlices and PathwaysPrograms.

    PATHS are YAML files (multi-document) or folders searched for *.yaml, *.yml and *.json;
    '-' is standard input. Documents of other API groups are skipped. Exits 1 if any problem
    is found (a file of no document is one).
    """
    documents = _read(paths)
    problems = 0
    for document in documents:
        for problem in document.checked.problems:
            problems += 1
            errors.print(f"{escape(document.label)}: [red]{escape(str(problem))}[/]")
    valid = sum(1 for d in documents if d.checked.resource is not None)
    skipped = sum(1 for d in documents if d.checked.skipped)
    summary = f"{valid} valid, {problems} problem(s)" + (f", {skipped} skipped" if skipped else "")
    if problems:
        errors.print(f"[red]✗[/] {summary}")
        sys.exit(1)
    console.print(f"[green]✓[/] {summary}")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=MANIFEST_PATHS)
@click.option("--no-preempt", is_flag=True, help="Never evict lower-priority slices.")
def place(paths: tuple[Path, ...], no_preempt: bool) -> None:
    """Bind the slices of manifests to the islands of manifests, with the global allocator.

    Islands, VirtualSlices and the inline slices of PathwaysPrograms are read from PATHS
    (files, folders, or '-' for standard input); slices are bound in the order they appear
    (higher priority ones may preempt lower), and the placements are printed with a picture
    of every island's mesh.
    """
    documents = _read(paths)
    invalid = [d for d in documents if d.checked.problems]
    for document in invalid:
        for problem in document.checked.problems:
            errors.print(f"{escape(document.label)}: [red]{escape(str(problem))}[/]")
    if invalid:
        errors.print("[red]✗[/] fix these manifests first (see [bold]pathways validate[/])")
        sys.exit(1)
    resources = [d.checked.resource for d in documents if d.checked.resource is not None]
    allocator = Allocator()
    for resource in resources:
        if isinstance(resource, Island):
            allocator.add_island(IslandInventory.from_island(resource))
    requests = [request for resource in resources for request in slice_requests(resource)]
    if not allocator.islands or not requests:
        errors.print("[yellow]nothing to place:[/] the manifests need Islands and slices")
        sys.exit(1)
    results = Table(title="Slices")
    for column in ("Slice", "Tenant", "Request", "Prio", "Phase", "Island", "Devices"):
        results.add_column(column, overflow="fold", no_wrap=column in ("Slice", "Phase"))
    outcome: dict[str, str] = {}
    notes: list[str] = []
    shared = _time_shared_keys(resources)
    holders: list[Request] = []  # time-shared slices bound to devices of their own
    joined: dict[str, Request] = {}  # a time-shared slice -> the holder whose devices it shares
    for request in requests:
        shares = request.key in shared
        holder = (
            next((h for h in holders if _may_join(allocator, h, request)), None) if shares else None
        )
        if shares and holder is not None:
            # As the cluster binds them (pathways_core.control.sharing): on the same devices.
            joined[request.key] = holder
            outcome[request.key] = "[green]Bound[/]"
            notes.append(f"{request.key}: time-shares the devices of {holder.key}")
            continue
        decision = allocator.allocate(request, preempt=not no_preempt)
        if isinstance(decision, Bound) and shares:
            holders.append(request)
        if isinstance(decision, Bound):
            outcome[request.key] = "[green]Bound[/]"
            for victim in decision.preempted:
                outcome[victim.key] = "[red]Preempted[/]"
                notes.append(
                    f"{victim.key}: [red]Preempted[/] by {request.key} "
                    f"(priority {request.priority} > {victim.request.priority})"
                )
        else:
            outcome[request.key] = "[yellow]Pending[/]"
            notes.append(f"{request.key}: [yellow]{decision.reason}[/]: {decision.message}")
    bindings = allocator.bindings()
    styles = slice_styles(bindings)
    for key, holder in joined.items():
        if allocator.binding(holder.key) is None:  # preempted since: its group goes with it
            outcome[key] = "[red]Preempted[/]"
            notes.append(f"{key}: [red]Preempted[/] with {holder.key}, whose devices it shared")
    for request in requests:
        holder = joined.get(request.key)
        binding = allocator.binding(holder.key if holder else request.key)
        wanted = format_shape(request.shape) if request.shape else f"{request.count} devices"
        kind = f" {request.kind}" if request.kind else ""
        symbol = ""
        if binding is not None:
            mark, colour = styles[holder.key if holder else request.key]
            symbol = f"[bold {colour}]{mark}[/] "
        results.add_row(
            f"{symbol}{request.key}",
            request.tenant,
            f"{wanted}{kind}",
            str(request.priority),
            outcome[request.key],
            binding.island if binding else "",
            _devices_text(binding.devices) if binding else "",
        )
    console.print(results)
    for note in notes:
        console.print(note)
    console.print(islands_table(allocator.islands, bindings, styles))
    bound = sum(
        1
        for request in requests
        if allocator.binding(joined[request.key].key if request.key in joined else request.key)
    )
    console.print(f"{bound} of {len(requests)} slices bound on {len(allocator.islands)} islands")


def _time_shared_keys(resources: list[Any]) -> set[str]:
    """The keys of the slices that ask for time-shared devices (VirtualSlices, and inline
    slices of programs, in the order ``slice_requests`` makes their requests)."""
    keys = set()
    for resource in resources:
        specs = (
            [resource.spec]
            if isinstance(resource, VirtualSlice)
            else [s for s in resource.spec.slices if s.virtual_slice_name is None]
            if isinstance(resource, PathwaysProgram)
            else []
        )
        for request, spec in zip(slice_requests(resource), specs, strict=True):
            if spec.time_shared:
                keys.add(request.key)
    return keys


def _may_join(allocator: Allocator, holder: Request, request: Request) -> bool:
    """Whether a time-shared ``request`` joins the group of ``holder`` (still bound): the
    rule of ``pathways_core.control.sharing`` (same size, an island it admits, the same mesh
    shape if it asks for one)."""
    binding = allocator.binding(holder.key)
    if binding is None or len(binding.devices) != request.size:
        return False
    island = next(i for i in allocator.islands if i.name == binding.island)
    return request.admits(island) and (request.shape is None or request.shape == holder.shape)


def _devices_text(devices: tuple[int, ...]) -> str:
    text = ",".join(str(device) for device in devices)
    return text if len(text) <= 40 else text[:37] + "..."


def _read(paths: tuple[Path, ...]) -> list[Document]:
    files = manifest_files(paths)
    if not files:
        errors.print(
            "[red]no manifest files[/] (*.yaml, *.yml, *.json) in "
            + escape(", ".join(map(str, paths)))
        )
        sys.exit(1)
    return flag_duplicates(document for path in files for document in read_documents(path))


# -- the embedded cluster and the REST API ---------------------------------------------------

STATE_OPTION = click.option(
    "--state",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory of the embedded cluster [default: $PATHWAYS_STATE or ~/.pathways].",
)
COUNT = click.IntRange(min=1)


class ObjectName(click.ParamType):
    """The name of a program, slice or island: a DNS subdomain, checked before it is sent (a
    name such as ``a/../b`` names no object, and the API could only say no route has it)."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if len(value) <= 253 and re.match(DNS_SUBDOMAIN_PATTERN, value):
            return value
        self.fail(
            f"{value!r} cannot name an object: names are lowercase letters, digits, '-' and '.', "
            "at most 253 characters",
            param,
            ctx,
        )


OBJECT_NAME = ObjectName()


def _state(state: Path | None) -> Path:
    from pathways_client.embedded import default_state

    return (state or default_state()).expanduser().resolve()


def _for(command: str, state: Path | None) -> str:
    """``command`` for the state folder the user named (none named: the default's)."""
    return f"{command} --state {shlex.quote(str(state))}" if state is not None else command


def _api(
    state: Path | None,
    api: str | None,
    token: str | None,
    tenant: str,
    warn_if_broken: bool = True,
) -> ApiClient:
    """A client of the API given by flags or environment, else of the running embedded
    cluster, with the tenant's token from its tokens file. With ``warn_if_broken``, say on
    stderr when that cluster runs without a part its supervisor gave up starting again (what
    the API then shows stops changing)."""
    from pathways_client.embedded import EmbeddedError, read_info, tokens

    url = api or os.environ.get("PATHWAYS_API")
    token = token or os.environ.get("PATHWAYS_TOKEN")
    if url is None:
        info = read_info(_state(state))
        if info is None or not info.ready:
            errors.print(
                "[red]no API to talk to:[/] start one with [bold]pathways up[/], or give "
                "--api URL (or PATHWAYS_API)"
            )
            sys.exit(1)
        if info.error and warn_if_broken:
            errors.print(f"[yellow]warning:[/] {escape(_runs_without_a_part(state, info.error))}")
        url = info.api
        try:
            token = token or tokens(_state(state)).get(tenant)
        except EmbeddedError as error:
            _fail(error)
    if token is None:
        errors.print(
            f"[red]no token for tenant {tenant!r}:[/] give --token (or PATHWAYS_TOKEN), or add "
            "the tenant with [bold]pathways up --tenant NAME[/]"
        )
        sys.exit(1)
    try:
        return ApiClient(url, token)
    except ValueError as error:  # TlsConfigError: the PATHWAYS_TLS_* variables are half set
        _fail(error)


def _runs_without_a_part(state: Path | None, error: str) -> str:
    """What to tell a user of an embedded cluster whose supervisor gave up on a part."""
    return (
        f"the embedded cluster of {_state(state)} runs without a part: {error}. Run 'pathways "
        "down', then 'pathways up', to start it whole again"
    )


def _broken_cluster_check(state: Path | None, api: str | None) -> Callable[[], str | None]:
    """A look at the embedded cluster, for commands that wait on its work: what to tell the
    user if it runs without a part its supervisor gave up on (nothing waited for would ever
    come), else None. Nothing to look at for an API given by --api or PATHWAYS_API."""
    from pathways_client.embedded import read_info

    if api or os.environ.get("PATHWAYS_API"):
        return lambda: None
    folder = _state(state)

    def problem() -> str | None:
        info = read_info(folder)
        return _runs_without_a_part(state, info.error) if info and info.error else None

    return problem


class ClusterBroken(Exception):
    """The embedded cluster runs without a part: what was waited for will not come."""


class _CheckedReads:
    """An API client for ``wait_programs`` that looks, at each read of a program not yet
    finished, whether the embedded cluster can still run it (a program waits for ever for a
    resource manager its supervisor gave up on)."""

    def __init__(self, client: ApiClient, problem: Callable[[], str | None]) -> None:
        self._client, self._problem = client, problem

    def get(self, collection: str, name: str) -> dict[str, Any]:
        from pathways_client.watch import finished

        document = self._client.get(collection, name)
        if not finished(document) and (why := self._problem()) is not None:
            raise ClusterBroken(why)
        return document


def api_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The options every API command takes."""
    for option in reversed(
        [
            STATE_OPTION,
            click.option("--api", default=None, help="API URL [default: the embedded cluster's]."),
            click.option("--token", default=None, help="Bearer token [default: $PATHWAYS_TOKEN]."),
            click.option(
                "--tenant",
                default="default",
                show_default=True,
                help="Tenant whose token to use from the embedded cluster's tokens file.",
            ),
        ]
    ):
        function = option(function)
    return function


def _fail(error: Exception | str) -> NoReturn:
    errors.print(f"[red]✗[/] {escape(printable(str(error)))}")
    sys.exit(1)


PHASE_STYLE = {
    "Succeeded": "green",
    "Running": "cyan",
    "Bound": "green",
    "Ready": "green",
    "Pending": "yellow",
    "Suspended": "yellow",
    "Failed": "red",
    "Preempted": "red",
    "Released": "dim",
    "Terminating": "dim",
}


def _shown_phase(document: dict[str, Any]) -> str:
    """An object's phase as tables show it: ``Terminating`` once it is being deleted (as
    kubectl shows a pod), its status' phase else."""
    if (document.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return (document.get("status") or {}).get("phase") or "-"


def _phase(document: dict[str, Any]) -> str:
    phase = _shown_phase(document)
    return f"[{PHASE_STYLE.get(phase, 'white')}]{phase}[/]"


@main.command()
@STATE_OPTION
@click.option("--islands", type=COUNT, default=1, show_default=True, help="Number of islands.")
@click.option("--hosts", type=COUNT, default=1, show_default=True, help="Hosts per island.")
@click.option("--devices", type=COUNT, default=4, show_default=True, help="Fake devices per host.")
@click.option(
    "--topology",
    default="",
    help="Mesh shape of each island's devices, such as 2x4, for slices that ask for a shape "
    "[default: one axis of all of them, HOSTS*DEVICES].",
)
@click.option(
    "--policy",
    type=click.Choice([policy.value for policy in Policy]),
    default="proportional-share",
    show_default=True,
    help="Island scheduling policy.",
)
@click.option(
    "--tenant",
    "tenants",
    multiple=True,
    help="Tenant to create a token for (repeatable; 'default' always exists).",
)
@click.pass_context
def up(
    context: click.Context,
    state: Path | None,
    islands: int,
    hosts: int,
    devices: int,
    topology: str,
    policy: str,
    tenants: tuple[str, ...],
) -> None:
    """Start the embedded cluster (islands, resource manager, API) in the background."""
    from pathways_client.embedded import (
        DEFAULT_TENANTS,
        EmbeddedError,
        memory_problem,
        previous_islands,
        read_info,
        tenant_problem,
    )
    from pathways_client.embedded import up as start

    for tenant in tenants:
        if problem := tenant_problem(tenant):
            raise click.BadParameter(problem, param_hint="'--tenant'")
    running = read_info(_state(state))
    given = {
        name
        for name in ("islands", "hosts", "devices", "topology", "policy")
        if context.get_parameter_source(name) != click.core.ParameterSource.DEFAULT
    }
    # The state's objects were bound on the last cluster's islands: what no option changes
    # of them stays, rather than the defaults.
    previous = previous_islands(_state(state)) if running is None else []
    options = {"hosts": hosts, "devices": devices, "topology": topology, "policy": policy}
    specs = _island_specs(islands, options, given, previous)
    _check_island(specs[0])  # the islands are alike
    if previous and not given:
        described = ", ".join(
            f"{s.name} ({s.hosts} x {s.devices_per_host}, {s.mesh})" for s in specs
        )
        console.print(f"the islands of the last cluster of {_state(state)}: {described}")
    elif changes := _island_changes(previous, specs):
        console.print(
            f"[yellow]note:[/] the islands differ from the last cluster's: {'; '.join(changes)}",
            soft_wrap=True,
        )
    if running is not None and running.ready:
        differences = _differences(running.islands, specs, given)
        if differences:
            _fail(
                f"the embedded cluster of {_state(state)} is already running, and "
                f"{'; '.join(differences)}: run '{_for('pathways down', state)}' first (its "
                "state is kept), then 'pathways up' with these options"
            )
    elif problem := memory_problem(specs):
        option = "--islands" if len(specs) > specs[0].hosts else "--hosts"
        raise click.BadParameter(problem, param_hint=f"'{option}'")
    previous_api = _recorded_api(_state(state))
    try:
        info = _with_spinner(
            "starting the embedded cluster",
            lambda progress: start(
                _state(state),
                specs,
                list(dict.fromkeys([*DEFAULT_TENANTS, *tenants])),
                progress=progress,
            ),
        )
    except EmbeddedError as error:
        _fail(error)
    except OSError as error:  # the state directory cannot be made or written
        where = f" ({error.filename})" if error.filename else ""
        if error.errno in (errno.EEXIST, errno.ENOTDIR):
            _fail(f"cannot use the state directory: a file is in the way{where}")
        _fail(f"cannot use the state directory: {error.strerror or error}{where}")
    # Another 'up' of this state may have started its cluster meanwhile, with other options.
    if differences := _differences(info.islands, specs, given):
        _fail(
            f"the embedded cluster of {_state(state)} was started meanwhile by another "
            f"'pathways up', and {'; '.join(differences)}: run "
            f"'{_for('pathways down', state)}' first (its state is kept), then 'pathways up' "
            "with these options"
        )
    if previous_api and previous_api != info.api:
        console.print(
            f"[yellow]note:[/] the API moved from {previous_api} to {info.api} (its port was "
            "taken): update PATHWAYS_API where you set it"
        )
    _print_cluster(_state(state), info)


def _island_specs(
    count: int, options: dict[str, Any], given: set[str], previous: list[IslandSpec]
) -> list[IslandSpec]:
    """The islands ``up`` starts: ``count`` alike, of the ``options`` (``hosts``, ``devices``,
    ``topology``, ``policy``); after a cluster of the state ran, its islands (by name), each
    option not ``given`` keeping its value, and as many as it had unless --islands is given.
    A mesh kept that no longer has hosts x devices devices becomes one axis of them all."""
    from pathways_client.embedded import IslandSpec

    if not previous:
        return [
            IslandSpec(
                f"island-{index}",
                options["hosts"],
                options["devices"],
                options["policy"],
                topology=options["topology"],
            )
            for index in range(count)
        ]
    last = {spec.name: spec for spec in previous}
    specs = []
    names = (
        [f"island-{index}" for index in range(count)]
        if "islands" in given
        else [spec.name for spec in previous]
    )
    for name in names:
        base = last.get(name, previous[0])  # an island added: like the others
        kept = {
            "hosts": base.hosts,
            "devices": base.devices_per_host,
            "topology": base.topology,
            "policy": base.policy,
        }
        value = {option: options[option] if option in given else kept[option] for option in kept}
        hosts, devices, topology = value["hosts"], value["devices"], value["topology"]
        if "topology" not in given and topology and _devices_of(topology) != hosts * devices:
            topology = ""
        specs.append(IslandSpec(name, hosts, devices, value["policy"], topology=topology))
    return specs


def _devices_of(mesh: str) -> int | None:
    """The devices of a mesh shape such as 2x4; None for a malformed one."""
    try:
        return device_count(parse_shape(mesh))
    except ValueError:
        return None


def _island_changes(previous: list[IslandSpec], specs: list[IslandSpec]) -> list[str]:
    """How the islands ``up`` starts differ from the last cluster's, one phrase an island."""

    def described(spec: IslandSpec) -> str:
        return f"{spec.hosts} x {spec.devices_per_host}, mesh {spec.mesh}, {spec.policy}"

    if not previous:
        return []
    last = {spec.name: spec for spec in previous}
    changes = [
        f"{spec.name} {described(spec)} (was {described(last[spec.name])})"
        if spec.name in last
        else f"{spec.name} new ({described(spec)})"
        for spec in specs
        if spec.name not in last or described(spec) != described(last[spec.name])
    ]
    started = {spec.name for spec in specs}
    changes += [
        f"{spec.name} not started (was {described(spec)})"
        for spec in previous
        if spec.name not in started
    ]
    return changes


ISLAND_OPTIONS = {"hosts": "--hosts", "devicesPerHost": "--devices", "topology": "--topology"}
"""The option of ``pathways up`` that sets each field of an Island."""


def _check_island(spec: IslandSpec) -> None:
    """Refuse, naming the option, an island the resource manager would refuse to register."""
    if spec.topology:
        with contextlib.suppress(ValueError):  # a malformed shape is the model's to name
            total, count = (
                device_count(parse_shape(spec.topology)),
                spec.hosts * spec.devices_per_host,
            )
            if total != count:
                raise click.BadParameter(
                    f"{spec.topology} has {total} devices, but --hosts x --devices is "
                    f"{spec.hosts} x {spec.devices_per_host} = {count}",
                    param_hint="'--topology'",
                )
    # A count's own limit first: a topology made from the counts is wrong because they are.
    problems = sorted(spec.problems(), key=lambda problem: problem.path == "topology")
    if problems:
        option = ISLAND_OPTIONS.get(problems[0].path, "--topology")
        raise click.BadParameter(problems[0].message, param_hint=f"'{option}'")


def _recorded_api(state: Path) -> str | None:
    """The API URL the state directory's last cluster had, if one is recorded."""
    try:
        api = json.loads((state / "cluster.json").read_text()).get("api")
    except (OSError, ValueError, AttributeError):
        return None
    return api if isinstance(api, str) and api else None


def _differences(
    running: dict[str, dict[str, Any]], wanted: list[IslandSpec], given: set[str]
) -> list[str]:
    """How the running cluster's islands differ from the options given on the command line."""
    from pathways_client.embedded import IslandSpec

    found = []
    if "islands" in given and len(running) != len(wanted):
        found.append(f"it has {len(running)} islands, not --islands {len(wanted)}")
    for spec in wanted:
        island = running.get(spec.name)
        if island is None:
            continue
        have = IslandSpec(
            spec.name,
            island["hosts"],
            island["devicesPerHost"],
            island["policy"],
            topology=island.get("topology", ""),
        )
        pairs = {
            "hosts": (have.hosts, spec.hosts),
            "devices": (have.devices_per_host, spec.devices_per_host),
            "topology": (have.mesh, spec.mesh),
            "policy": (have.policy, spec.policy),
        }
        found += [
            f"{spec.name} has {option} {have}, not --{option} {asked}"
            for option, (have, asked) in pairs.items()
            if option in given and have != asked
        ]
    return found


def _with_spinner(what: str, work: Callable[[Callable[[str], None]], Any]) -> Any:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(what)
        return work(lambda stage: progress.update(task, description=f"{what}: {stage}"))


def _print_cluster(state: Path, info: Any) -> None:
    from pathways_client.embedded import tokens

    table = Table(title=f"Embedded cluster ({escape(str(state))})")
    for column in ("Island", "Devices", "Mesh", "Policy", "Scheduler"):
        table.add_column(column)
    for name, island in info.islands.items():
        table.add_row(
            name,
            f"{island['hosts']} x {island['devicesPerHost']}",
            island.get("topology", ""),
            island["policy"],
            island["endpoint"],
        )
    console.print(table)
    console.print(f"API [bold]{info.api}[/] (tenants: {', '.join(sorted(tokens(state)))})")


@main.command()
@STATE_OPTION
def down(state: Path | None) -> None:
    """Stop the embedded cluster (its state stays for the next `pathways up`)."""
    from pathways_client.embedded import EmbeddedError
    from pathways_client.embedded import down as stop

    try:
        stopped = _with_spinner("stopping the embedded cluster", lambda _: stop(_state(state)))
    except EmbeddedError as error:  # what is left running, and how to stop it
        _fail(error)
    if stopped:
        console.print("[green]✓[/] stopped")
    else:
        console.print("no embedded cluster is running")


@main.command()
@api_options
def status(state: Path | None, api: str | None, token: str | None, tenant: str) -> None:
    """The cluster's islands and the tenant's programs."""
    from pathways_client.embedded import read_info

    info = None
    if api is None and os.environ.get("PATHWAYS_API") is None:
        info = read_info(_state(state))
        if info is None:
            console.print(
                f"no embedded cluster is running ([bold]{_for('pathways up', state)}[/] starts one)"
            )
            sys.exit(1)
    with _api(state, api, token, tenant, warn_if_broken=False) as client:  # said below
        try:
            me = client.me()
            islands = client.list("islands")
            programs = client.list("programs")
        except ApiCallError as error:
            if info is not None and info.error:  # why the supervisor let the API go, say
                _fail(f"{error}\nthe embedded cluster's supervisor: {info.error}")
            _fail(error)
    console.print(
        f"API [bold]{client.url}[/] ({me['mode']}) tenant [bold]{me['tenant']}[/]: "
        f"{me['usage']['devices']}/{me['quotas']['devices']} devices, "
        f"{me['usage']['programs']}/{me['quotas']['programs']} programs"
    )
    table = Table(title="Islands")
    for column in ("Island", "Phase", "Mesh", "Devices free/total", "Scheduler"):
        table.add_column(column)
    for island in islands:
        status = island.get("status") or {}
        table.add_row(
            island["metadata"]["name"],
            _phase(island),
            (island.get("spec") or {}).get("topology", ""),
            f"{status.get('devicesFree', '?')}/{status.get('devicesTotal', '?')}",
            status.get("schedulerEndpoint") or "",
        )
    console.print(table)
    for name, island in sorted((info.islands if info is not None else {}).items()):
        urls = island.get("metrics") or []
        if urls:  # Prometheus metrics: the scheduler's (queue, usage per client), executors'
            scheduler, *executors = urls
            console.print(
                f"metrics of {escape(name)}: scheduler {scheduler}; executors "
                f"{' '.join(executors)}",
                soft_wrap=True,
            )
    if info is not None and (info.restarts or info.error):
        # The embedded supervisor starts dead components again; say how often, and why not.
        restarts = ", ".join(f"{name} {count}" for name, count in sorted(info.restarts.items()))
        console.print(f"restarts: {restarts or 'none'}")
        if info.error:
            console.print(f"[red]error[/]: {escape(info.error)}")
    _print_programs(programs)


PROGRAM_COLUMNS = ("Program", "Phase", "Runs", "Slices", "Message")
SLICE_COLUMNS = ("Name", "Phase", "Island", "Devices", "Message")
ISLAND_COLUMNS = ("Name", "Phase", "Mesh", "Devices", "Message")
COLUMNS = {"programs": PROGRAM_COLUMNS, "virtualslices": SLICE_COLUMNS, "islands": ISLAND_COLUMNS}
"""The columns of each kind's rows (what :func:`_cells` gives)."""


MESSAGE_WIDTH = 80
"""Characters of a status message a table row shows (``-o yaml`` shows it whole)."""


def _cells(document: dict[str, Any]) -> tuple[str, ...]:
    """A program's, slice's or island's row: the values of its kind's :data:`COLUMNS`, as
    text."""
    status = document.get("status") or {}
    phase = _shown_phase(document)
    message = printable(status.get("message") or "")  # (one stored before it was shown so)
    if len(message) > MESSAGE_WIDTH:  # cut, and says so
        message = message[: MESSAGE_WIDTH - 1] + "…"
    if document.get("kind") == "PathwaysProgram":
        slices = ", ".join(_slice_cell(item) for item in status.get("slices") or [])
        runs = str(status.get("runs", 0))
        return (document["metadata"]["name"], phase, runs, slices, message)
    if document.get("kind") == "Island":
        mesh = (document.get("spec") or {}).get("topology") or ""
        free = f"{status.get('devicesFree', '?')}/{status.get('devicesTotal', '?')} free"
        return (document["metadata"]["name"], phase, mesh, free, message)
    devices = status.get("devices")
    held = _devices_text(tuple(devices)) if devices else "-"  # a slice may hold none
    island = status.get("island") or ""
    return (document["metadata"]["name"], phase, island, held, message)


def _slice_cell(item: dict[str, Any]) -> str:
    """A program's slice in its row: where it is bound, else its phase (Pending, Released)."""
    if item.get("island"):
        return f"{item['name']}@{item['island']}"
    return f"{item['name']} ({item['phase']})" if item.get("phase") else item["name"]


def _print_table(title: str, columns: tuple[str, ...], documents: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for document in documents:
        name, phase, *rest = _cells(document)  # Text: what objects say is never markup
        style = PHASE_STYLE.get(phase, "white")
        table.add_row(Text(name), Text(phase, style=style), *(Text(cell) for cell in rest))
    console.print(table)


def _print_programs(programs: list[dict[str, Any]]) -> None:
    _print_table("Programs", PROGRAM_COLUMNS, programs)


class PositiveSeconds(click.FloatRange):
    """A number of seconds above 0: click's range let ``nan`` through (every comparison with
    it is false), which then meant no limit at all."""

    name = "seconds"

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


POSITIVE_SECONDS = PositiveSeconds()


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, allow_dash=True))
@api_options
@click.option("--wait", is_flag=True, help="Wait until every program finishes; print its logs.")
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="With --wait: stop waiting after this many seconds, exit 1 and say where each "
    "unfinished program stands (they stay submitted) [default: no limit].",
)
@click.option("--idempotency-key", default=None, help="Make retries of this submission safe.")
def submit(
    files: tuple[str, ...],
    state: Path | None,
    api: str | None,
    token: str | None,
    tenant: str,
    wait: bool,
    timeout: float | None,
    idempotency_key: str | None,
) -> None:
    """Submit the PathwaysPrograms and VirtualSlices of YAML or JSON FILES (folders: the
    manifests below them; '-': standard input), in order. All are read first: a file that
    cannot be read, a document of another kind, or two defining the same object, submits
    nothing; a document the API refuses stops the submission there (those before it stay
    submitted)."""
    if timeout is not None and not wait:
        raise click.UsageError("--timeout is a limit of --wait: give both, or neither")
    documents = _submittable_documents(files)
    created = []
    with _api(state, api, token, tenant) as client:
        for index, (where, document) in enumerate(documents):
            key = f"{idempotency_key}-{index}" if idempotency_key and len(documents) > 1 else None
            try:
                stored = client.submit(document, key or idempotency_key)
            except ApiCallError as error:
                _fail(f"{where}: {error}")
            created.append(stored)
            console.print(
                f"[green]✓[/] {stored['kind']} [bold]{stored['metadata']['name']}[/] submitted"
            )
        if wait:
            programs = [d["metadata"]["name"] for d in created if d["kind"] == "PathwaysProgram"]
            _wait_and_print_logs(client, programs, timeout, _broken_cluster_check(state, api))


SUBMITTABLE = ("PathwaysProgram", "VirtualSlice")
"""The kinds a tenant submits (Islands are the cluster's, made by its administrators)."""


def _submittable_documents(files: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]]:
    """Every document of ``files`` (folders expanded), labelled ``FILE: document N``, and
    each item of a ``kind: List`` document (``FILE: document N: items[I]``), without what
    the system sets (a ``get -o yaml|json`` dump's status, uid, resourceVersion, Events, ...),
    each file once; exit naming the first file or document that cannot be submitted."""
    paths: list[str] = []
    for given in files:
        if given == "-" or not Path(given).is_dir():
            paths.append(given)
        elif below := manifest_files([Path(given)]):
            paths += map(str, below)
        else:
            _fail(f"{given}: a folder with no manifests (.yaml, .yml or .json) below it")
    documents = []
    defined: dict[tuple[str | None, str | None, str], str] = {}  # object -> its first label
    for path in unique_files(paths):
        where = "standard input" if path == "-" else path
        try:
            with click.open_file(path, encoding="utf-8") as stream:
                text = stream.read()
        except (OSError, UnicodeDecodeError) as error:
            _fail(f"{where}: cannot be read as UTF-8 text: {error}")
        found: list[Any] = []
        try:
            found.extend(parse_documents(text))
        except ManifestSyntaxError as error:
            _fail(f"{where}: document {len(found) + 1}: {error}")
        if not found:
            _fail(f"{where}: no documents")
        objects = [
            labelled
            for number, document in enumerate(found, start=1)
            for labelled in _list_items(f"{where}: document {number}", document)
        ]
        events = 0
        for label, document in objects:
            if not isinstance(document, dict):
                _fail(f"{label} is not a mapping")
            if _is_event(document):  # a dump of `get --events`: the cluster's records
                events += 1
                continue
            if document.get("kind") not in SUBMITTABLE:
                _fail(
                    f"{label} is of kind {document.get('kind')!r}: only PathwaysPrograms and "
                    "VirtualSlices are submitted (Islands are the cluster's: its "
                    "administrators apply them)"
                )
            key = object_key(document)
            if key is not None and key in defined:  # the API would refuse it, after the first
                _fail(f"{label} ({key[0]} {key[2]}): {defined_already(defined[key])}")
            if key is not None:
                defined[key] = f"{label} ({key[0]} {key[2]})"
            documents.append((label, without_system_fields(document)))
        if events:
            console.print(
                f"skipped {events} Event{'s' if events > 1 else ''} of {escape(where)} (the "
                "cluster's records of what happened: not submitted)"
            )
        if events == len(objects):  # only Events, or an empty List
            _fail(f"{where}: no PathwaysProgram or VirtualSlice to submit")
    return documents


def _list_items(label: str, document: Any) -> list[tuple[str, Any]]:
    """The objects of a document, labelled: a ``kind: List`` (as ``get -o json`` dumps a
    list, and kubectl) holds its objects in ``items``; any other document is one object."""
    if not (isinstance(document, dict) and document.get("kind") == "List"):
        return [(label, document)]
    items = document.get("items")
    if not isinstance(items, list):
        _fail(f"{label}: a List's 'items' must be a list of objects (got {type(items).__name__})")
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("kind") == "List":
            _fail(f"{label}: items[{index}] is a List: give its objects in the outer List")
    return [(f"{label}: items[{index}]", item) for index, item in enumerate(items)]


def _is_event(document: dict[str, Any]) -> bool:
    return document.get("kind") == "Event" and document.get("apiVersion") in EVENT_API_VERSIONS


EVENT_API_VERSIONS = ("v1", "events.k8s.io/v1")


def _wait_and_print_logs(
    client: ApiClient,
    programs: list[str],
    timeout: float | None,
    broken: Callable[[], str | None],
) -> None:
    """``submit --wait``: each program's phase as it changes, then its logs; exit 1 unless
    every one succeeded, or at once when ``broken`` says the cluster cannot run them."""
    from pathways_client.watch import WaitTimeout, phase_of, wait_programs

    stays_submitted = (
        "the programs stay submitted: see them with 'pathways get NAME', stop them with "
        "'pathways cancel NAME'"
    )
    pending: dict[Any, dict[str, Any]] = {}
    try:
        checked: Any = _CheckedReads(client, broken)  # reads as an ApiClient's
        finished = wait_programs(
            {n: (checked, n) for n in programs}, console, timeout=timeout, report=True
        )
    except WaitTimeout as error:
        finished, pending = error.finished, error.pending
    except ClusterBroken as error:
        errors.print(f"[red]✗[/] stopped waiting: {escape(str(error))}; {stays_submitted}")
        sys.exit(1)
    except KeyboardInterrupt:
        errors.print(f"stopped waiting (interrupted); {stays_submitted}")
        sys.exit(130)
    except ApiCallError as error:
        _fail(error)
    for name, document in finished.items():
        console.print(f"{name}: {_phase(document)}")
        _print_output(client.log_window(name), 0)
        click.echo()
    for name, document in pending.items():
        errors.print(f"[red]✗[/] {name}: {phase_of(document)} after {timeout:g} s")
    if pending:
        errors.print(f"stopped waiting; {stays_submitted}")
    if pending or any(phase_of(document) != "Succeeded" for document in finished.values()):
        sys.exit(1)


KINDS = ["programs", "virtualslices", "islands"]
"""What ``pathways get --kind`` lists."""


FILTER_OPTIONS = {"query phase": "'--phase'", "query labelSelector": "'-l' / '--selector'"}
"""The option of ``get`` behind each list filter the API names in its errors."""


@main.command()
@click.argument("name", required=False, type=OBJECT_NAME)
@api_options
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default="programs",
    show_default=True,
)
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table")
@click.option(
    "--events",
    is_flag=True,
    help="Also print the Events of the program or virtual slice NAME (with -o json|yaml: as "
    "Event objects after it, in a List or as YAML documents).",
)
@click.option(
    "-l",
    "--selector",
    default=None,
    help="List only objects with these labels: key=value,key2=value2.",
)
@click.option("--phase", default=None, help="List only objects in this phase (Running, ...).")
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="After listing, print each object again when it changes (a row, or a document), "
    "until interrupted or, for one NAME, until it is deleted.",
)
def get(
    name: str | None,
    state: Path | None,
    api: str | None,
    token: str | None,
    tenant: str,
    kind: str,
    output: str,
    events: bool,
    selector: str | None,
    phase: str | None,
    watch: bool,
) -> None:
    """List objects, or show one (NAME).

    A list with -o yaml is one YAML document per object, with -o json a kubectl List
    ({"apiVersion": "v1", "kind": "List", "items": [...]}): both submit again as manifests,
    as one object's dump does. Without -o, one object is shown as YAML, a list as a table
    (with --watch, as rows from the first listing on)."""
    if name and (selector or phase):
        raise click.UsageError("--selector and --phase filter a list: give them without NAME")
    if events and not name:
        raise click.UsageError(
            "--events shows the Events of one object: give its NAME (pathways get NAME --events)"
        )
    if events and kind not in EVENTED_KINDS:  # an Island's Events are the cluster's
        raise click.UsageError(
            f"--events: {kind} have no Events to show, only programs and virtualslices: drop "
            "--events, or give --kind programs or --kind virtualslices"
        )
    filters = {"labelSelector": selector, "phase": phase}
    with _api(state, api, token, tenant) as client:
        try:
            found = client.get(kind, name) if name else client.list(kind, **filters)
            happened = client.events(name, kind) if name and events else []
        except ApiCallError as error:
            option = FILTER_OPTIONS.get(error.field or "")
            if option is not None:  # a filter the API refused: name the option given
                raise click.BadParameter(error.message, param_hint=option) from None
            plural = f"{name}s" if f"{name}s" in KINDS else name
            if error.code == "NotFound" and plural in KINDS:
                # kubectl's habit: ``get islands`` means the kind, which --kind names here.
                listing = "pathways get" + ("" if plural == "programs" else f" --kind {plural}")
                _fail(f"{error}; to list {plural}: {listing}")
            _fail(error)
        shown = [found] if name else found
        # Documents and lines as written, for files and pipes: the console would wrap them.
        if output == "table" and (watch or not name):
            _print_rows(kind, shown, as_table=not watch)
        elif output == "table":  # one object, for a person: its YAML, then its Events
            click.echo(yaml.safe_dump(found, sort_keys=False), nl=False)
        else:  # objects then their Events: the objects submit again, the Events are skipped
            documents = [*shown, *(_event_object(event, found) for event in happened)]
            _print_documents(documents, output, one_object=bool(name and not events), lines=watch)
        if output == "table":
            for event in happened:
                line = f"{event['time']} {event['type']} {event['reason']}: {event['message']}"
                click.echo(printable(line))
        if watch:
            _watch(client, kind, name, filters, shown, output)


EVENTED_KINDS = ("programs", "virtualslices")
"""The kinds whose Events ``get --events`` shows (an Island's are the cluster's)."""


def _print_rows(kind: str, documents: list[dict[str, Any]], as_table: bool) -> None:
    """A table of objects, or (``get --watch``) the header and rows its changes follow."""
    if as_table:
        _print_table("Programs" if kind == "programs" else kind, COLUMNS[kind], documents)
        return
    click.echo(_watch_line(tuple(column.upper() for column in COLUMNS[kind])))
    for document in documents:
        click.echo(_watch_line(_cells(document)))


def _print_documents(
    documents: list[dict[str, Any]], output: str, one_object: bool, lines: bool
) -> None:
    """Print ``documents`` as JSON or YAML that submits again: one object as itself, more
    (or none) as YAML documents or a kubectl List; with ``lines``, JSON lines (as ``get
    --watch`` goes on)."""
    if output == "json" and lines:
        for document in documents:
            click.echo(json.dumps(document))
    elif output == "json":
        listed = {"apiVersion": "v1", "kind": "List", "items": documents}
        click.echo(json.dumps(documents[0] if one_object else listed, indent=2))
    else:
        click.echo(yaml.safe_dump_all(documents, sort_keys=False), nl=False)


def _event_object(event: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """An Event as the API gives it (time, type, reason, message), as a Kubernetes Event
    object about ``target``: what ``kubectl get events -o yaml`` shows."""
    metadata = target.get("metadata") or {}
    involved = {
        "apiVersion": target.get("apiVersion"),
        "kind": target.get("kind"),
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "uid": metadata.get("uid"),
    }
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "involvedObject": {key: value for key, value in involved.items() if value},
        "type": event.get("type"),
        "reason": event.get("reason"),
        "message": event.get("message"),
        "lastTimestamp": event.get("time"),
    }


def _watch(
    client: ApiClient,
    kind: str,
    name: str | None,
    filters: dict[str, str | None],
    shown: list[dict[str, Any]],
    output: str,
) -> None:
    """``get --watch``: look again every WATCH_POLL seconds and print each object changed
    since (a new resourceVersion) as a row, a JSON line or a YAML document; a deleted one with
    phase Deleted. Ends at Ctrl-C (exit 130), or when the one object watched is deleted."""
    from pathways_client.watch import changes, phase_of

    known = shown
    try:
        while True:
            time.sleep(WATCH_POLL)
            try:
                current = [client.get(kind, name)] if name else client.list(kind, **filters)
            except ApiCallError as error:
                if not (name and error.code == "NotFound"):
                    _fail(error)
                current = []
            for document in changes(known, current):
                if any(filters.values()) and phase_of(document) == "Deleted":
                    # Gone from a filtered list: deleted, or no longer matching the filter.
                    document = _get_or_none(client, kind, document["metadata"]["name"]) or document
                if output == "table":
                    click.echo(_watch_line(_cells(document)))
                elif output == "json":
                    click.echo(json.dumps(document))  # one document a line
                else:
                    click.echo("---\n" + yaml.safe_dump(document, sort_keys=False), nl=False)
            known = current
            if name and not current:
                return
    except KeyboardInterrupt:
        sys.exit(130)


def _watch_line(cells: tuple[str, ...]) -> str:
    """A row of ``get --watch``: the columns at fixed widths, the message last, as written."""
    widths = (24, 10, 12, 20)
    padded = (cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=True))
    return " ".join(padded) + " " + cells[-1]


WATCH_POLL = 1.0
"""Seconds between two looks of ``get --watch``."""


@main.command()
@click.argument("names", nargs=-1, required=True, type=OBJECT_NAME)
@api_options
def cancel(
    names: tuple[str, ...], state: Path | None, api: str | None, token: str | None, tenant: str
) -> None:
    """Cancel programs: their runs stop and their slices are released, for good. Each NAME is
    tried; exit 1 if one could not be cancelled."""
    _for_each_program(names, _api(state, api, token, tenant), ApiClient.cancel, "cancelled")


@main.command()
@click.argument("names", nargs=-1, required=True, type=OBJECT_NAME)
@api_options
def suspend(
    names: tuple[str, ...], state: Path | None, api: str | None, token: str | None, tenant: str
) -> None:
    """Suspend programs: their runs stop and their devices are released until 'pathways
    resume' (they keep their place in the tenant's quota). Each NAME is tried; exit 1 if one
    could not be suspended."""
    _for_each_program(names, _api(state, api, token, tenant), ApiClient.suspend, "suspended")


@main.command()
@click.argument("names", nargs=-1, required=True, type=OBJECT_NAME)
@api_options
def resume(
    names: tuple[str, ...], state: Path | None, api: str | None, token: str | None, tenant: str
) -> None:
    """Resume suspended programs: each starts its next run once its slices are bound again (a
    driver that saves checkpoints continues from its last step). Each NAME is tried; exit 1
    if one could not be resumed."""
    _for_each_program(names, _api(state, api, token, tenant), ApiClient.resume, "resumed")


def _for_each_program(
    names: tuple[str, ...], client: ApiClient, action: Callable[[ApiClient, str], Any], done: str
) -> None:
    """Do ``action`` to each named program once, saying how it went; exit 1 if one failed."""
    failed = False
    with client:
        for name in dict.fromkeys(names):
            try:
                action(client, name)
            except ApiCallError as error:
                errors.print(f"[red]✗[/] {escape(name)}: {escape(str(error))}")
                failed = True
                continue
            console.print(f"[green]✓[/] program [bold]{escape(name)}[/] {done}")
    if failed:
        sys.exit(1)


@main.command()
@click.argument("names", nargs=-1, required=True, type=OBJECT_NAME)
@api_options
@click.option(
    "--kind",
    type=click.Choice(["programs", "virtualslices"]),
    default="programs",
    show_default=True,
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the objects are gone: what they held released (runs stopped, slices freed).",
)
def delete(
    names: tuple[str, ...],
    state: Path | None,
    api: str | None,
    token: str | None,
    tenant: str,
    kind: str,
    wait: bool,
) -> None:
    """Delete programs (their runs stop, their slices go) or VirtualSlices; a name is free
    again once its object is gone. Each NAME is tried; exit 1 if one could not be deleted."""
    noun = kind.rstrip("s")
    failed = False
    with _api(state, api, token, tenant) as client:
        deleting: dict[str, str] = {}  # name -> uid: another object may take the name
        for name in dict.fromkeys(names):  # all asked for first: they are released together
            try:
                deleted = client.delete(kind, name)
                deleting[name] = (deleted.get("metadata") or {}).get("uid") or ""
            except ApiCallError as error:
                errors.print(f"[red]✗[/] {escape(name)}: {escape(str(error))}")
                failed = True
        deadline = time.monotonic() + DELETE_TIMEOUT
        broken = _broken_cluster_check(state, api)
        try:
            with console.status(f"deleting {', '.join(deleting)}"):
                for name, uid in deleting.items():
                    while wait and _exists(client, kind, name, uid):
                        if (why := broken()) is not None:  # nothing would release it
                            _fail(f"{name}: stopped waiting for it to be deleted: {why}")
                        if time.monotonic() > deadline:
                            _fail(
                                f"{name} is still being deleted after {DELETE_TIMEOUT:g} s "
                                "(what it holds is being released); see it with 'pathways get'"
                            )
                        time.sleep(0.2)
                    console.print(f"[green]✓[/] {noun} [bold]{escape(name)}[/] deleted")
        except ApiCallError as error:
            _fail(error)
    if failed:
        sys.exit(1)


DELETE_TIMEOUT = 120.0
"""Seconds ``pathways delete`` waits for an object to be gone."""


def _exists(client: ApiClient, kind: str, name: str, uid: str) -> bool:
    """Whether the API still has the object (one being deleted is still there); with
    ``uid``, that very object, not another made since under its name."""
    found = _get_or_none(client, kind, name)
    return found is not None and (not uid or found["metadata"].get("uid") == uid)


def _get_or_none(client: ApiClient, kind: str, name: str) -> dict[str, Any] | None:
    """The object as the API has it now; None once it is gone."""
    try:
        return client.get(kind, name)
    except ApiCallError as error:
        if error.code == "NotFound":
            return None
        raise


@main.command()
@click.argument("name", type=OBJECT_NAME)
@api_options
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing the output as it comes, until the program succeeds, fails or is cancelled.",
)
@click.option(
    "--tail",
    type=click.IntRange(min=0),
    default=None,
    help="Only the last N lines (then what comes, with --follow) [default: all].",
)
@click.option(
    "--limit-bytes",
    type=click.IntRange(min=1, max=MAX_LOG_BYTES),
    default=None,
    help="At most the last N bytes of the output, each look [default: the API's most, 16 MiB].",
)
@click.option(
    "--run",
    type=click.IntRange(min=1),
    default=None,
    help="Only run N's output (with --follow, until that run ends) [default: every run's].",
)
@click.option(
    "-p",
    "--previous",
    is_flag=True,
    help="Only the output of the run before the latest (as kubectl logs --previous).",
)
def logs(
    name: str,
    state: Path | None,
    api: str | None,
    token: str | None,
    tenant: str,
    follow: bool,
    tail: int | None,
    limit_bytes: int | None,
    run: int | None,
    previous: bool,
) -> None:
    """Print a program's output (each run's after a '--- run N ---' line)."""
    from pathways_client.watch import finished, phase_of, standing

    if previous and run is not None:
        raise click.UsageError("--previous and --run: give one")

    def runs_of(program: dict[str, Any]) -> int:
        return (program.get("status") or {}).get("runs") or 0

    def ended(program: dict[str, Any]) -> bool:
        """Whether what is followed has ended: the program, or run ``run`` (a later one
        started, or it was stopped: suspended, preempted, ...)."""
        return finished(program) or (
            run is not None and (runs_of(program) > run or phase_of(program) != "Running")
        )

    with _api(state, api, token, tenant) as client:
        try:
            if previous:
                started = runs_of(client.get("programs", name))
                if started < 2:
                    _fail(f"{name} has no previous run: {started} started so far")
                run = started - 1
            window = client.log_window(name, tail_lines=tail, limit_bytes=limit_bytes, run=run)
            if window.get("linesCut"):  # where the lines begin was not looked for
                errors.print(
                    f"… the last {tail} lines begin before the last --limit-bytes: their "
                    "beginning is not shown",
                    markup=False,
                )
                click.echo(window["logs"], nl=False)
            else:  # with --tail, what comes before the lines is not asked for
                _print_output(window, 0 if tail is None else window["start"])
            if not window["size"]:  # say why, before following what comes
                program = client.get("programs", name)
                errors.print(f"{name} has no output yet: {standing(program)}", markup=False)
            written = window["logs"]
            broken = _broken_cluster_check(state, api)
            while follow:
                done = ended(client.get("programs", name))
                offset = window["end"]
                window = client.log_window(name, offset, limit_bytes=limit_bytes, run=run)
                if window["size"] < offset:  # not the output followed: a program made anew
                    offset = 0
                    window = client.log_window(name, limit_bytes=limit_bytes, run=run)
                _print_output(window, offset)
                written = window["logs"] or written
                follow = not done  # the output written before the end was read after it
                if follow and (why := broken()) is not None:  # it would stand still for ever
                    _fail(f"stopped following {name}: {why}")
                if follow:
                    time.sleep(LOG_POLL)
        except ApiCallError as error:
            _fail(error)
        except KeyboardInterrupt:
            sys.exit(130)
    if written and not written.endswith("\n"):
        click.echo()


def _print_output(window: dict[str, Any], asked_from: int) -> None:
    """Print a window on a program's output as written (not wrapped, no markup), after saying
    how much of the output from ``asked_from`` on it leaves out."""
    if window["start"] > asked_from:
        errors.print(
            f"… {window['start'] - asked_from} bytes of output not shown: one look reads at most "
            "the last --limit-bytes",
            markup=False,
        )
    click.echo(window["logs"], nl=False)


LOG_POLL = 0.5
"""Seconds between two looks at a followed program's output."""


@main.command()
@click.argument("name", type=OBJECT_NAME)
@api_options
@click.option(
    "--out",
    type=OutputPath(suffixes=(".json", ".png")),
    required=True,
    help="trace.json (Chrome/Perfetto trace events) or trace.png (devices x time).",
)
def trace(
    name: str, state: Path | None, api: str | None, token: str | None, tenant: str, out: Path
) -> None:
    """Write a program's island trace as Chrome trace events (.json) or a picture (.png)."""
    with _api(state, api, token, tenant) as client:
        try:
            records, incomplete = client.trace_whole(name)
            program = {} if records else client.get("programs", name)
        except ApiCallError as error:
            _fail(error)
    if not records:
        from pathways_client.watch import finished, phase_of

        lost = f"; {'; '.join(incomplete)}" if incomplete else ""
        phase = phase_of(program)
        if finished(program):  # succeeded, failed or cancelled: nothing more will come
            ended = "Cancelled" if phase == "Suspended" else phase
            _fail(f"program {name!r} ({ended}) ran no computation on an island{lost}")
        if phase == "Suspended":  # its runs were stopped: their traces are kept
            _fail(f"program {name!r} (Suspended): its runs so far ran no computation{lost}")
        _fail(
            f"program {name!r} has no trace yet (a run's trace is kept when it ends or is "
            f"stopped){lost}"
        )
    write_trace(records, out, title=f"program {name}")
    from pathways_client.trace_export import computation_count

    console.print(
        f"[green]✓[/] {computation_count(records)} computations written to {escape(str(out))}"
    )
    for note in incomplete:
        console.print(f"[yellow]![/] incomplete: {escape(note)}")


def write_trace(records: list[dict[str, Any]], out: Path, title: str) -> None:
    """Write records as .json (Chrome trace events) or .png (timeline)."""
    from pathways_client.trace_export import chrome_trace, plot_timeline

    if out.suffix == ".png":
        plot_timeline(records, out, title=title)
    else:  # .json: OutputPath took no other ending
        out.write_text(json.dumps(chrome_trace(records)))


@main.command()
@click.option(
    "--state",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State directory of the demo's cluster [default: a new temporary one, removed "
    "afterwards unless --keep]; a previous demo's programs in it are replaced.",
)
@click.option(
    "--out",
    type=OutputPath(),
    default=Path("trace.png"),
    show_default=True,
    help="Where to write the multi-tenant trace picture.",
)
@click.option("--keep", is_flag=True, help="Leave the cluster running afterwards.")
def demo(state: Path | None, out: Path, keep: bool) -> None:
    """Run the demo: the pipelined model and four weighted tenants, through the API."""
    from pathways_client.demo import run_demo

    try:
        run_demo(state.expanduser().resolve() if state else None, out, keep, console)
    except Exception as error:  # the demo says what failed, then exits non-zero
        _fail(error)


main.add_command(bench_command)
main.add_command(proxy_command)
main.add_command(tunnel_command)
