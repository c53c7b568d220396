"""``pathways bench``: the paper's evaluation on fake devices, one harness, one output format.

Each suite runs the per-issue benchmark scripts of ``benchmarks/`` (a source checkout) as
processes, each writing JSON records ``{name, value, baseline, ratio, unit, target,
parameters}`` measured against a baseline in the same run. The harness adds the machine and
the command line, prints one table, writes all records to one JSON file, draws the plots, and
rewrites the generated part of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pathways_client.outputs import OutputPath

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
STOP_SECONDS = 20.0
"""How long a stopped suite's script has to stop what it started before it is killed."""
BEGIN = "<!-- pathways bench: generated, do not edit by hand -->"
END = "<!-- pathways bench: end -->"


@dataclass(frozen=True)
class Suite:
    """A benchmark script and the arguments of a full and a quick run."""

    name: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    description: str
    draws: bool = False  # takes --plots DIR and draws pictures of its own


SUITES = [
    Suite(
        "dispatch",
        "dispatch.py",
        ("--only", "dispatch"),
        ("--quick", "--only", "dispatch"),
        "-O, -C, -F against JAX on 8 fake devices over 2 executors, swept over size",
    ),
    Suite(
        "parallel",
        "dispatch.py",
        ("--only", "chain"),
        ("--quick", "--only", "chain"),
        "parallel against sequential asynchronous dispatch of chains",
    ),
    Suite(
        "pipeline",
        "pipeline.py",
        ("--only", "pipeline"),
        ("--quick", "--only", "pipeline"),
        "GPipe model (S stages, M microbatches) against the faster SPMD layout on the same "
        "8 devices",
    ),
    Suite(
        "islands",
        "pipeline.py",
        ("--only", "islands"),
        ("--quick", "--only", "islands"),
        "data parallel over two islands (DCN) against one island, over batch sizes",
    ),
    Suite(
        "multitenancy",
        "multitenancy.py",
        (),
        ("--quick",),
        "1-8 clients against one; shares under weights 1:1:1:1 and 1:2:4:8",
        draws=True,
    ),
    Suite(
        "transfer",
        "dispatch.py",
        ("--only", "transfer"),
        ("--quick", "--only", "transfer"),
        "executor-to-executor bytes against raw loopback TCP; sharded host inputs sent in "
        "parts against whole",
    ),
    Suite(
        "control",
        "allocator.py",
        (),
        ("--decisions", "10000"),
        "allocator decisions/s against first fit",
    ),
    Suite(
        "control",
        "operator_scale.py",
        (),
        ("--slices", "200"),
        "operator time to bind VirtualSlices against bare creates",
    ),
    Suite(
        "control", "api.py", (), ("--quick",), "API submissions/s against a bare FastAPI endpoint"
    ),
    Suite(
        "recovery",
        "recovery.py",
        (),
        ("--quick",),
        "executor killed -> program running again, against a fresh start",
    ),
]
NAMES = sorted({suite.name for suite in SUITES})


def machine() -> dict[str, Any]:
    """What the figures were measured on. The CPU's model and caches are part of it: fake
    devices compute in host memory, and shared cloud machines sold as one size differ in them
    from day to day (2 MiB of L2 per core and 260 MiB of L3 on one, 512 KiB and 8 MiB on
    another)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu_model() or platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "caches": cpu_caches(),
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as Linux reports it; empty elsewhere."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return ""
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(names, "")


def cpu_caches(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, str]:
    """The first CPU's data and unified caches by level, sizes as Linux reports them
    (``{"L1d": "32K", "L2": "512K", "L3": "8192K"}``); empty elsewhere."""
    caches = {}
    for index in sorted(cpu.glob("index*")):
        try:
            level, kind, size = (
                (index / name).read_text().strip() for name in ("level", "type", "size")
            )
        except OSError:
            continue
        if kind in ("Data", "Unified"):
            caches[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return caches


def normalize(raw: Any, suite: Suite) -> list[dict[str, Any]]:
    """Records in the one format: extra fields of a record go into its parameters."""
    records = raw if isinstance(raw, list) else [raw]
    keys = ("name", "value", "baseline", "ratio", "unit", "target")
    normalized = []
    for record in records:
        parameters = dict(record.get("parameters") or {})
        parameters.update({k: v for k, v in record.items() if k not in (*keys, "parameters")})
        parameters.pop("machine", None)
        item = {key: record.get(key) for key in keys}
        item["name"] = item["name"] or suite.script.removesuffix(".py")
        for key in ("value", "baseline", "ratio"):  # JSON has no NaN or infinity
            if isinstance(item[key], float) and not math.isfinite(item[key]):
                parameters[f"{key}_not_finite"] = str(item[key])
                item[key] = None
        value, baseline = item["value"], item["baseline"]
        if item["ratio"] is None and value is not None and baseline:  # (a value of 0 too)
            item["ratio"] = value / baseline
        normalized.append({"suite": suite.name, **item, "parameters": parameters})
    return normalized


def run_suite(
    suite: Suite, quick: bool, log: Any = None, plots: Path | None = None
) -> list[dict[str, Any]]:
    """Run one suite's script; its records, or one record saying why it failed."""
    script = BENCHMARKS / suite.script
    if not script.exists():
        return [_failure(suite, f"{script} is missing (pathways bench runs from a checkout)")]
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "records.json"
        command = command_line(suite, quick, output, plots)
        # A session of its own: stopped, its script is told as a terminal's Ctrl-C tells it,
        # and stops what it started (killed alone, it left an operator or an island running).
        script = subprocess.Popen(
            command,
            stdout=log or subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=BENCHMARKS.parent,
            start_new_session=True,
        )
        try:
            said, _ = script.communicate()
        except BaseException:
            _stop(script)
            raise
        measured = []
        with contextlib.suppress(OSError, ValueError):  # none, or cut short by its failure
            measured = normalize(json.loads(output.read_text()), suite)
        if script.returncode != 0 or not output.exists():
            tail = (said or "").strip().splitlines()[-3:]
            failure = f"{suite.script} exited {script.returncode}: {' '.join(tail)}"
            return [*measured, _failure(suite, failure)]  # the figures it measured are kept
        return measured


def _stop(script: subprocess.Popen[str]) -> None:
    """Stop a suite's script and what it started (its process group): SIGINT, so that its
    cleanup runs, then SIGKILL after ``STOP_SECONDS``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(script.pid, signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        script.wait(STOP_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(script.pid, signal.SIGKILL)
    script.wait()


def command_line(suite: Suite, quick: bool, output: Path, plots: Path | None) -> list[str]:
    """How a suite's script is run: its arguments, the JSON file, and the plots folder for the
    suites that draw pictures of their own."""
    script = BENCHMARKS / suite.script
    command = [sys.executable, str(script), *(suite.quick if quick else suite.full)]
    command += ["--json", str(output)]
    if suite.draws and plots is not None:
        command += ["--plots", str(plots.resolve())]  # the script runs in the checkout
    return command


def _failure(suite: Suite, message: str) -> dict[str, Any]:
    return {
        "suite": suite.name,
        "name": suite.script,
        "value": None,
        "baseline": None,
        "ratio": None,
        "unit": None,
        "target": None,
        "parameters": {},
        "error": message,
    }


def _in_own_unit(target: Any) -> bool:
    """Whether a numeric target is in the figure's own unit (e.g. 10,000 decisions/s) and
    applies to its value; smaller ones are ratios against the baseline."""
    return isinstance(target, int | float) and target > 10


def verdict(record: dict[str, Any]) -> str:
    """met / MISSED / (blank when the record has no numeric ratio target)."""
    target, ratio, value = record.get("target"), record.get("ratio"), record.get("value")
    if record.get("error"):
        return "FAILED"
    if any(key.endswith("_not_finite") for key in record.get("parameters") or {}):
        return "MISSED"  # a ratio of no number meets no target
    if isinstance(target, int | float) and ratio is not None:
        measured = value if _in_own_unit(target) else ratio
        return "met" if measured >= target else "MISSED"
    within = re.search(r"within (\d+)%", target) if isinstance(target, str) else None
    if within and ratio is not None:
        return "met" if abs(ratio - 1) <= int(within.group(1)) / 100 else "MISSED"
    return ""


# Parameters that tell a suite's figures apart, in the tables and plots (the rest stay in the
# JSON). A layout is shown by its value alone: "2 executors x 4 devices".
SHOWN_PARAMETERS = (
    "floats_per_device",
    "clients",
    "stages",
    "bytes",
    "mode",
    "hosts",
    "client",
    "weights",
    "step_ms",
    "microbatches",
    "global_batch",
    "baseline",
    "one_island_step_ms",
    "round_ratios",
)


def describe(record: dict[str, Any]) -> str:
    """A figure's distinguishing parameters, e.g. ``floats_per_device=16, 1 executor x 4
    devices``."""
    parameters = record["parameters"]
    shown = [
        f"{key}={value}"
        for key, value in parameters.items()
        if key in SHOWN_PARAMETERS and isinstance(value, int | float | str)
    ]
    if isinstance(parameters.get("layout"), str):
        shown.append(parameters["layout"])
    return ", ".join(shown)


def missed_figures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that missed their target or whose suite failed."""
    return [r for r in records if verdict(r) in ("MISSED", "FAILED")]


def shortfalls_heading(missed: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The line above the list of shortfalls, or the one saying there are none."""
    if not records:
        return "No figures were measured."
    return (
        f"Shortfalls: {len(missed)} of {len(records)} figures."
        if missed
        else "Every target with a number was met."
    )


def shortfall(record: dict[str, Any]) -> str:
    """A figure that missed its target (or a suite that failed), said in one line: what was
    measured, where, and against which target."""
    label = f"{record['suite']}: {record['name']}"
    if record.get("error"):
        return f"{label} failed: {record['error']}"
    where = f" ({describe(record)})" if describe(record) else ""
    target, unit = record["target"], record["unit"] or ""
    if _in_own_unit(target):
        measured = f"{_number(record['value'])} {unit}, target {_number(target)} {unit}"
    else:
        measured = f"ratio {_number(record['ratio'])}, target {target}"
    return f"{label}{where}: {measured}"


def markdown(
    records: list[dict[str, Any]],
    command: str,
    info: dict[str, Any],
    plots: list[Path],
    seconds: dict[str, float] | None = None,
    folder: Path | None = None,
) -> str:
    """The generated section of RESULTS.md (``seconds``: how long each suite took); its
    pictures are linked relative to ``folder``, the one it is written in."""
    lines = [
        BEGIN,
        "## `pathways bench` (generated)",
        "",
        f"`{command}` — {time.strftime('%Y-%m-%d')}, {info['processor']}, {info['cpus']} CPUs"
        + "".join(f", {level} {size}" for level, size in info.get("caches", {}).items())
        + f", Python {info['python']}. Every ratio is against a baseline measured in the same "
        "run.",
        "",
    ]
    if seconds:
        lines += [f"Time by suite: {durations(seconds)}.", ""]
    lines += [
        "| suite | figure | parameters | value | baseline | ratio | target | |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in records:
        if r.get("error"):
            lines.append(f"| {r['suite']} | {r['name']} | | | | | | FAILED: {r['error']} |")
            continue
        lines.append(
            f"| {r['suite']} | {r['name']} | {describe(r)} | {_value(r)} | "
            f"{_number(r['baseline'])} | {_number(r['ratio'])} | "
            f"{r['target'] if r['target'] is not None else ''} | {verdict(r)} |"
        )
    missed = missed_figures(records)
    lines += ["", shortfalls_heading(missed, records), ""]
    lines += [f"- {shortfall(r)}" for r in missed]
    if missed:
        lines.append("")
    base = (folder or Path()).resolve()
    lines += [
        f"![{plot.stem}]({Path(os.path.relpath(plot.resolve(), base)).as_posix()})"
        for plot in plots
    ]
    lines.append(END)
    return "\n".join(lines) + "\n"


def _value(record: dict[str, Any]) -> str:
    """A figure's value with its unit (none without a value: not reached in the sweep)."""
    if record["value"] is None:
        return ""
    return f"{_number(record['value'])} {record['unit'] or ''}".strip()


def _number(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def durations(seconds: dict[str, float]) -> str:
    """``dispatch 5 min 02 s, parallel 41 s, ...; in all 21 min 40 s``."""

    def minutes(value: float) -> str:
        whole = round(value)
        return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"

    each = ", ".join(f"{name} {minutes(value)}" for name, value in seconds.items())
    return f"{each}; in all {minutes(sum(seconds.values()))}"


def _pictures(folder: Path | None) -> dict[Path, int]:
    """The PNG files in ``folder``, with when each was last written."""
    if folder is None or not folder.is_dir():
        return {}
    return {path: path.stat().st_mtime_ns for path in folder.glob("*.png")}


def write_results(path: Path, section: str) -> None:
    """Replace the generated section of RESULTS.md (or put it first), keeping the rest."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1].lstrip("\n")
        text = before + section + "\n" + after
    else:
        head, _, body = text.partition("\n")
        text = head + "\n\n" + section + "\n" + body.lstrip("\n")
    path.write_text(text)


def _marker_problem(path: Path) -> str | None:
    """What is wrong with the markers of ``path``'s generated section, if anything: one
    without the other (a hand edit) had a second section put in, the first left as it was."""
    text = path.read_text() if path.exists() else ""
    begins, ends = text.count(BEGIN), text.count(END)
    if (begins, ends) in ((0, 0), (1, 1)) and (not begins or text.index(BEGIN) < text.index(END)):
        return None
    return (
        f"{path} has {begins} start and {ends} end markers of the generated section, not one "
        f"of each in order: put back {BEGIN!r} before it and {END!r} after it"
    )


def plot(records: list[dict[str, Any]], directory: Path) -> list[Path]:
    """One PNG per suite: each figure's ratio against its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for suite in NAMES:
        mine = [r for r in records if r["suite"] == suite and r.get("ratio") is not None]
        if not mine:
            continue
        figure, axes = plt.subplots(figsize=(10, 0.45 * len(mine) + 1.5))
        labels = [f"{r['name']} {describe(r)}"[:100] for r in mine]
        colours = [
            "tab:green"
            if verdict(r) == "met"
            else "tab:red"
            if verdict(r) == "MISSED"
            else "tab:blue"
            for r in mine
        ]
        axes.barh(labels, [r["ratio"] for r in mine], color=colours)
        for index, r in enumerate(mine):
            if isinstance(r["target"], int | float) and not _in_own_unit(r["target"]):
                axes.plot([r["target"]] * 2, [index - 0.4, index + 0.4], "k--")
        axes.axvline(1.0, color="grey", linewidth=0.5)
        axes.tick_params(axis="y", labelsize=8)
        axes.invert_yaxis()
        axes.set_xlabel("ratio against the same run's baseline (dashed: target)")
        axes.set_title(f"{suite}")
        figure.tight_layout()
        path = directory / f"bench-{suite}.png"
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written


def summary_tables(records: list[dict[str, Any]]) -> list[Table]:
    """One table per suite, in the order they ran: figure, parameters, value with its unit,
    baseline, ratio, target and verdict."""
    tables: dict[str, Table] = {}
    for r in records:
        table = tables.get(r["suite"])
        if table is None:
            table = tables[r["suite"]] = Table(title=r["suite"], title_justify="left")
            table.add_column("figure", ratio=2)
            table.add_column("parameters", ratio=2)
            for column in ("value", "baseline", "ratio"):
                table.add_column(column, justify="right", no_wrap=True)
            table.add_column("target", ratio=1)
            table.add_column("", no_wrap=True)
        table.add_row(  # names and errors as text: brackets in them are not markup
            Text(r["name"]),
            Text(r.get("error") or describe(r)),
            _value(r),
            _number(r["baseline"]),
            _number(r["ratio"]),
            "" if r["target"] is None else str(r["target"]),
            verdict(r),
        )
    return list(tables.values())


@click.command("bench")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats: under 5 minutes.")
@click.option("--only", "only", multiple=True, type=click.Choice(NAMES), help="Suites to run.")
@click.option("--json", "json_path", type=OutputPath(), help="Write the records.")
@click.option("--plots", type=OutputPath(folder=True), help="Folder for the PNG plots.")
@click.option(
    "--results",
    type=OutputPath(suffixes=(".md",)),
    help="Rewrite the generated section of this RESULTS.md (a run of every suite).",
)
def bench_command(
    quick: bool,
    only: tuple[str, ...],
    json_path: Path | None,
    plots: Path | None,
    results: Path | None,
) -> None:
    """Run the paper's evaluation on fake devices: each figure a ratio against a baseline
    measured in the same run."""
    if results and only and set(only) != set(NAMES):
        raise click.BadParameter(
            "the generated section holds a run of every suite: --only would replace it with "
            "the suites named (write --json instead)",
            param_hint="'--results'",
        )
    if results and json_path and results.resolve() == json_path.resolve():
        raise click.BadParameter("is the --json file", param_hint="'--results'")
    if results and (broken := _marker_problem(results)):  # said now, not after the run
        raise click.BadParameter(broken, param_hint="'--results'")
    # A log or a file gets lines as wide as the figures' names need, not 80 columns.
    terminal = sys.stdout.isatty()
    console = Console() if terminal else Console(width=160)
    chosen = [suite for suite in SUITES if not only or suite.name in only]
    info = machine()
    command = "pathways bench " + " ".join(sys.argv[2:])
    records: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}  # by suite (the control suite runs three scripts)
    drawn_before = _pictures(plots)
    # SIGTERM (a CI job cancelled, `timeout`) stops the run as Ctrl-C does: it killed the
    # harness alone, and its suite's script ran on with its islands.
    stop_on_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        interrupted = _run_suites(chosen, quick, plots, console, terminal, records, seconds)
    finally:
        signal.signal(signal.SIGTERM, stop_on_term)
    for table in summary_tables(records):
        console.print(table)
    missed = missed_figures(records)
    if seconds:
        console.print(f"Time by suite: {durations(seconds)}")
    console.print(shortfalls_heading(missed, records))
    for r in missed:
        console.print(f"  {shortfall(r)}", style="red", highlight=False, markup=False)
    for r in records:
        r["machine"] = info
        r["command"] = command
    if json_path:
        json_path.write_text(json.dumps(records, indent=2, default=str, allow_nan=False))
        console.print(f"records: {json_path}", markup=False)
    written = plot(records, plots) if plots else []
    # The suites' own pictures (Figure 9), those this run drew, not older ones in the folder.
    written += sorted(
        path
        for path, stamp in _pictures(plots).items()
        if drawn_before.get(path) != stamp and path not in written
    )
    for path in written:
        console.print(f"plot: {path}", markup=False)
    if interrupted:
        console.print(
            f"Interrupted in {interrupted}: the figures above are of the suites that finished"
            + (f"; {results} was left as it was." if results else "."),
            style="red",
            markup=False,
        )
        raise SystemExit(130)
    failed = [r["suite"] for r in records if r.get("error")]
    if results and failed:  # a part of a run would replace the whole run's figures
        console.print(f"{', '.join(failed)} failed: {results} was left as it was.", markup=False)
    elif results:
        write_results(results, markdown(records, command, info, written, seconds, results.parent))
        console.print(f"results: {results}", markup=False)
    if failed:
        raise SystemExit(1)


def _run_suites(
    chosen: list[Suite],
    quick: bool,
    plots: Path | None,
    console: Console,
    terminal: bool,
    records: list[dict[str, Any]],
    seconds: dict[str, float],
) -> str:
    """Run ``chosen`` in order, adding their records and times; the suite a Ctrl-C (or
    SIGTERM) stopped, if one did (what finished is still reported and written)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("benchmarks", total=len(chosen))
        for suite in chosen:
            progress.update(task, description=f"{suite.name}: {suite.description}")
            if not terminal:  # a log gets a line a suite (the bar is drawn only at the end)
                console.print(f"{suite.name}: {suite.description} ({suite.script})", markup=False)
            started = time.monotonic()
            try:
                records += run_suite(suite, quick, plots=plots)
            except KeyboardInterrupt:
                return f"{suite.name} ({suite.script})"
            seconds[suite.name] = seconds.get(suite.name, 0.0) + time.monotonic() - started
            progress.advance(task)
    return ""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
