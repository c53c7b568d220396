"""Pictures of islands' meshes: which slice holds which device, for the terminal."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from pathways_core.allocator import Binding, IslandInventory
from pathways_core.topology import format_shape

PALETTE = [
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "red",
    "bright_cyan",
    "bright_magenta",
    "bright_green",
    "bright_yellow",
    "bright_blue",
    "bright_red",
]
SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def slice_styles(bindings: list[Binding]) -> dict[str, tuple[str, str]]:
    """A (symbol, colour) for each bound slice key, stable in the order given."""
    return {
        binding.key: (SYMBOLS[i % len(SYMBOLS)], PALETTE[i % len(PALETTE)])
        for i, binding in enumerate(bindings)
    }


def mesh_picture(
    island: IslandInventory, bindings: list[Binding], styles: dict[str, tuple[str, str]]
) -> Text:
    """The island's devices as a grid (one grid per plane of a 3-D mesh): a slice's symbol on
    its devices, ``.`` on free ones and ``x`` on unhealthy ones."""
    owner = {device: binding.key for binding in bindings for device in binding.devices}
    shape = island.shape
    rows, columns = (shape[-2] if len(shape) >= 2 else 1), shape[-1]
    planes = shape[0] if len(shape) == 3 else 1
    text = Text()
    for row in range(rows):
        for plane in range(planes):
            if plane:
                text.append("   ")
            for column in range(columns):
                device = (plane * rows + row) * columns + column
                if device in island.unhealthy:
                    text.append("x ", style="bold red")
                elif device in owner:
                    symbol, colour = styles[owner[device]]
                    text.append(f"{symbol} ", style=f"bold {colour}")
                else:
                    text.append(". ", style="dim")
        text.append("\n")
    return text


def islands_table(
    islands: list[IslandInventory], bindings: list[Binding], styles: dict[str, tuple[str, str]]
) -> Table:
    """One row per island: kind, mesh, free devices and the picture of its mesh."""
    table = Table(title="Islands", show_lines=True)
    for column in ("Island", "Accelerator", "Mesh", "Free", "Devices"):
        table.add_column(column)
    for island in islands:
        held = [b for b in bindings if b.island == island.name]
        used = sum(len(b.devices) for b in held)
        table.add_row(
            island.name,
            str(island.kind),
            f"{format_shape(island.shape)}\n{island.size // island.devices_per_host} hosts",
            f"{island.size - used - len(island.unhealthy)}/{island.size}",
            mesh_picture(island, held, styles),
        )
    return table
