"""Island traces as pictures: Chrome/Perfetto trace events, and a devices x time PNG coloured
by client (like Figure 9 of the Pathways paper)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Record = Mapping[str, Any]


def computation_count(records: Iterable[Record]) -> int:
    """How many computations the records are of: one spanning executors has a record from
    each (its island's order number, ``seq``, is the same in all)."""
    return len({(r.get("island"), r.get("client"), r["seq"], r.get("name")) for r in records})


def chrome_trace(records: Iterable[Record]) -> dict[str, Any]:
    """The Trace Event Format (chrome://tracing, ui.perfetto.dev): one process per island,
    one thread per device, one complete ("X") event per computation per device."""
    records = list(records)
    events: list[dict[str, Any]] = []
    islands = sorted({record.get("island", "island") for record in records})
    origin = min((record["start_ns"] for record in records), default=0)
    for pid, island in enumerate(islands):
        events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"island {island}"}}
        )
        devices = sorted(
            {d for r in records if r.get("island", "island") == island for d in r["devices"]}
        )
        for device in devices:
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": device,
                    "args": {"name": f"device {device}"},
                }
            )
    for record in records:
        pid = islands.index(record.get("island", "island"))
        for device in record["devices"]:
            events.append(
                {
                    "ph": "X",
                    "name": record["name"] or "computation",
                    "cat": record["client"],
                    "pid": pid,
                    "tid": device,
                    "ts": (record["start_ns"] - origin) / 1000.0,
                    "dur": max(record["end_ns"] - record["start_ns"], 0) / 1000.0,
                    "args": {
                        "client": record["client"],
                        "seq": record["seq"],
                        "executor": record["executor"],
                        "ok": record["ok"],
                    },
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot_timeline(
    records: Sequence[Record],
    path: Path,
    *,
    title: str = "Device time by client",
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Draw devices (rows) x time (ms), each computation a bar coloured by its client."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not records:
        raise ValueError("no trace records to draw")
    origin = min(record["start_ns"] for record in records)
    rows = sorted({(record.get("island", ""), d) for record in records for d in record["devices"]})
    clients = sorted({record["client"] for record in records})
    palette = plt.get_cmap("tab10")
    colours = {client: palette(index % 10) for index, client in enumerate(clients)}
    figure, axes = plt.subplots(figsize=(12, 1.6 + 0.45 * len(rows)))
    for row, (island, device) in enumerate(rows):
        spans: dict[str, list[tuple[float, float]]] = {}
        for record in records:
            if record.get("island", "") == island and device in record["devices"]:
                start = (record["start_ns"] - origin) / 1e6
                width = max((record["end_ns"] - record["start_ns"]) / 1e6, 1e-3)
                spans.setdefault(record["client"], []).append((start, width))
        for client, bars in spans.items():
            axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=colours[client], linewidth=0)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([f"{island} dev {device}".strip() for island, device in rows])
    axes.set_xlabel("time (ms)")
    axes.set_title(title)
    names = labels or {}
    axes.legend(
        handles=[Patch(color=colours[c], label=names.get(c, c)) for c in clients],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        frameon=False,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def shares(records: Sequence[Record], by_time: bool = True) -> dict[str, float]:
    """Each client's share of device time (``by_time``) or of the computations run while all
    of them had work: over the stretch from the last client's first computation to the first
    client's last (in island order)."""
    by_client: dict[str, list[Record]] = {}
    for record in sorted(records, key=lambda r: r["seq"]):
        by_client.setdefault(record["client"], []).append(record)
    if not by_client:
        return {}
    start = max(items[0]["seq"] for items in by_client.values())
    stop = min(items[-1]["seq"] for items in by_client.values())
    time = {
        client: float(
            sum(
                (r["end_ns"] - r["start_ns"]) if by_time else 1
                for r in items
                if start <= r["seq"] <= stop
            )
        )
        for client, items in by_client.items()
    }
    total = sum(time.values()) or 1.0
    return {client: value / total for client, value in sorted(time.items())}
