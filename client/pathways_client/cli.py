"""The ``pathways`` command-line interface."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from pathways_client.crd_files import check_crds, write_crds
from pathways_client.manifests import Document, manifest_files, read_documents
from pathways_client.mesh_view import islands_table, slice_styles
from pathways_core.allocator import Allocator, Bound, IslandInventory, slice_requests
from pathways_core.resources import Island
from pathways_core.topology import format_shape

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
            errors.print(f"[red]{drift.path}[/]: {drift.problem}")
        if drifts:
            errors.print(
                "The CRDs differ from the models: run [bold]pathways crds --out "
                + " --out ".join(str(f) for f in folders)
                + "[/] and commit the result."
            )
            sys.exit(1)
        console.print(f"[green]CRDs up to date[/] in {', '.join(str(f) for f in folders)}")
        return
    for folder in folders:
        for path in write_crds(folder):
            console.print(f"wrote {path}")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def validate(paths: tuple[Path, ...]) -> None:
    """Validate manifests of Islands, VirtualSlices and PathwaysPrograms.

    PATHS are YAML files (multi-document) or folders searched for *.yaml, *.yml and *.json.
    Documents of other API groups are skipped. Exits 1 if any problem is found.
    """
    documents = _read(paths)
    problems = 0
    for document in documents:
        for problem in document.checked.problems:
            problems += 1
            errors.print(f"{document.label}: [red]{problem}[/]")
    valid = sum(1 for d in documents if d.checked.resource is not None)
    skipped = sum(1 for d in documents if d.checked.skipped)
    summary = f"{valid} valid, {problems} problem(s)" + (f", {skipped} skipped" if skipped else "")
    if problems:
        errors.print(f"[red]✗[/] {summary}")
        sys.exit(1)
    console.print(f"[green]✓[/] {summary}")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--no-preempt", is_flag=True, help="Never evict lower-priority slices.")
def place(paths: tuple[Path, ...], no_preempt: bool) -> None:
    """Bind the slices of manifests to the islands of manifests, with the global allocator.

    Islands, VirtualSlices and the inline slices of PathwaysPrograms are read from PATHS;
    slices are bound in the order they appear (higher priority ones may preempt lower), and
    the placements are printed with a picture of every island's mesh.
    """
    documents = _read(paths)
    invalid = [d for d in documents if d.checked.problems]
    for document in invalid:
        for problem in document.checked.problems:
            errors.print(f"{document.label}: [red]{problem}[/]")
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
    for request in requests:
        decision = allocator.allocate(request, preempt=not no_preempt)
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
    for request in requests:
        binding = allocator.binding(request.key)
        wanted = format_shape(request.shape) if request.shape else f"{request.count} devices"
        kind = f" {request.kind}" if request.kind else ""
        symbol = ""
        if binding is not None:
            mark, colour = styles[request.key]
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
    bound = sum(1 for request in requests if allocator.binding(request.key) is not None)
    console.print(f"{bound} of {len(requests)} slices bound on {len(allocator.islands)} islands")


def _devices_text(devices: tuple[int, ...]) -> str:
    text = ",".join(str(device) for device in devices)
    return text if len(text) <= 40 else text[:37] + "..."


def _read(paths: tuple[Path, ...]) -> list[Document]:
    files = manifest_files(paths)
    if not files:
        errors.print(
            f"[red]no manifest files[/] (*.yaml, *.yml, *.json) in {', '.join(map(str, paths))}"
        )
        sys.exit(1)
    return [document for path in files for document in read_documents(path)]
