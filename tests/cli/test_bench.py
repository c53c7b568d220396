"""`pathways bench`: one output format over the per-issue benchmarks, a table, JSON, plots and
the generated section of RESULTS.md."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from pathways_client import bench
from pathways_client.bench import (
    BEGIN,
    BENCHMARKS,
    END,
    SUITES,
    Suite,
    bench_command,
    command_line,
    cpu_caches,
    cpu_model,
    describe,
    durations,
    markdown,
    missed_figures,
    normalize,
    plot,
    run_suite,
    shortfall,
    summary_tables,
    verdict,
    write_results,
)
from pathways_client.launcher import free_port

ALLOCATOR = Suite("control", "allocator.py", (), ("--decisions", "2000", "--islands", "8"), "")


def test_a_real_benchmark_gives_records_in_the_one_format() -> None:
    (record,) = run_suite(ALLOCATOR, quick=True)
    assert record["suite"] == "control" and record["name"] == "allocator"
    assert record["value"] > 0 and record["baseline"] > 0
    assert record["ratio"] == record["value"] / record["baseline"]
    # Fields beyond the format are kept as parameters (not where the script wrote them).
    assert {"p99_us", "decisions"} <= set(record["parameters"])
    assert "json" not in record["parameters"]


def test_suites_that_draw_get_the_plots_folder(tmp_path: Path) -> None:
    """The multitenancy suite draws the paper's Figure 9 itself: it must be told where."""
    (multitenancy,) = [suite for suite in SUITES if suite.name == "multitenancy"]
    command = command_line(multitenancy, True, tmp_path / "r.json", tmp_path / "plots")
    assert command[-2:] == ["--plots", str(tmp_path / "plots")]
    # The script runs in the checkout: a relative folder is given as the caller meant it.
    command = command_line(multitenancy, True, tmp_path / "r.json", Path("plots"))
    assert command[-1] == str(Path.cwd() / "plots")
    assert "--plots" not in command_line(ALLOCATOR, True, tmp_path / "r.json", tmp_path)


def test_a_failing_script_becomes_a_failed_record() -> None:
    missing = Suite("control", "no_such_benchmark.py", (), (), "")
    (record,) = run_suite(missing, quick=True)
    assert verdict(record) == "FAILED" and "is missing" in record["error"]


def test_outputs_that_cannot_be_written_fail_before_any_suite_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full run takes ~20 minutes: an output path it could not write at the end is named,
    with why, before the first suite starts, and nothing is left behind."""

    def must_not_run(*args: Any, **kwargs: Any) -> list[dict]:
        raise AssertionError("a suite ran")

    monkeypatch.setattr(bench, "run_suite", must_not_run)
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n")
    folder = tmp_path / "a-folder.md"
    folder.mkdir()
    for arguments, expected in (
        (
            ["--json", f"{a_file}/deeper/records.json"],
            f"'--json': {a_file} is a file, not a folder",
        ),
        (["--json", str(tmp_path)], f"'--json': {tmp_path} is not a file"),
        (["--plots", str(a_file)], f"'--plots': {a_file} is not a folder"),
        (["--results", str(folder)], f"'--results': {folder} is not a file"),
        (["--json", "/proc/records.json"], "'--json': cannot write /proc/records.json: "),
        (["--plots", "/proc/plots"], "'--plots': cannot write /proc/plots: "),
        # One bad output among good ones: the good ones' folders may be made, nothing runs.
        (
            [
                "--results",
                str(results),
                "--json",
                str(tmp_path / "new" / "r.json"),
                "--plots",
                f"{a_file}/plots",
            ],
            f"'--plots': {a_file} is a file, not a folder",
        ),
    ):
        result = CliRunner().invoke(bench_command, ["--only", "control", *arguments])
        assert result.exit_code == 2, (arguments, result.output)
        assert expected in " ".join(result.output.split()), (arguments, result.output)
    assert a_file.read_text() == "kept" and results.read_text() == "# Benchmark results\n"
    assert not (tmp_path / "new" / "r.json").exists()


def _doubled(name: str, target: float | None = None) -> dict[str, Any]:
    """A script's record of a figure twice its baseline."""
    return {
        "name": name,
        "value": 2.0,
        "baseline": 1.0,
        "ratio": 2.0,
        "unit": "x",
        "target": target,
        "parameters": {},
    }


def test_output_folders_are_made_before_the_suites_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    json_path, plots = tmp_path / "out" / "records.json", tmp_path / "figures" / "png"
    results = tmp_path / "docs" / "RESULTS.md"
    seen: list[bool] = []

    def one_record(suite: Suite, quick: bool, plots: Path | None = None) -> list[dict]:
        seen.append(json_path.parent.is_dir() and plots is not None and plots.is_dir())
        if plots is not None and not seen[1:]:
            shutil.copy(plots / "figure9-old.png", plots / "figure9-new.png")  # a suite's own
        return normalize([_doubled(suite.script)], suite)

    plots.mkdir(parents=True)
    plot([normalize([_doubled("x")], ALLOCATOR)[0]], plots)
    (plots / "bench-control.png").rename(plots / "figure9-old.png")  # of an earlier run
    monkeypatch.setattr(bench, "run_suite", one_record)
    arguments = ["--json", str(json_path), "--plots", str(plots), "--results", str(results)]
    result = CliRunner().invoke(bench_command, arguments)
    assert result.exit_code == 0, result.output
    assert seen and all(seen)
    assert len(json.loads(json_path.read_text())) == len(seen)
    assert BEGIN in results.read_text() and (plots / "bench-control.png").stat().st_size > 0
    # The pictures this run drew are named and linked from where RESULTS.md is; older not.
    assert "figure9-new.png" in result.output and "figure9-old" not in result.output
    text = results.read_text()
    assert "![figure9-new](../figures/png/figure9-new.png)" in text
    assert "![bench-control](../figures/png/bench-control.png)" in text
    assert "figure9-old" not in text


def test_an_interrupted_run_reports_and_writes_the_suites_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the third suite: the first two suites' figures are printed, written to the
    JSON and drawn; the hand-kept RESULTS.md is not replaced by a part of a run."""
    ran: list[str] = []

    def interrupted_third(suite: Suite, quick: bool, plots: Path | None = None) -> list[dict]:
        ran.append(suite.name)
        if len(ran) == 3:
            raise KeyboardInterrupt
        return normalize([_doubled(f"figure-{len(ran)}", target=1.5)], suite)

    monkeypatch.setattr(bench, "run_suite", interrupted_third)
    json_path, plots, results = tmp_path / "r.json", tmp_path / "plots", tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n")
    arguments = ["--json", str(json_path), "--plots", str(plots), "--results", str(results)]
    result = CliRunner().invoke(bench_command, arguments)
    assert result.exit_code == 130, result.output
    output = " ".join(result.output.split())
    assert "figure-1" in output and "figure-2" in output
    assert f"Interrupted in {SUITES[2].name} ({SUITES[2].script})" in output
    assert f"{results} was left as it was" in output
    assert [r["name"] for r in json.loads(json_path.read_text())] == ["figure-1", "figure-2"]
    assert list(plots.glob("bench-*.png")) and results.read_text() == "# Benchmark results\n"
    # Stopped before a suite finished: no figure, and no word that every target was met.
    ran.clear()
    ran.extend(["", ""])
    result = CliRunner().invoke(bench_command, ["--json", str(json_path)])
    assert result.exit_code == 130, result.output
    assert "No figures were measured." in result.output and "was met" not in result.output
    assert "Time by suite" not in result.output


def test_verdicts_against_targets() -> None:
    base = {"name": "x", "unit": "u", "parameters": {}, "suite": "s"}
    assert verdict({**base, "value": 2, "baseline": 1, "ratio": 2.0, "target": 0.9}) == "met"
    assert verdict({**base, "value": 1, "baseline": 2, "ratio": 0.5, "target": 0.9}) == "MISSED"
    # A target in the figure's own unit applies to the value, not the ratio.
    assert verdict({**base, "value": 12e3, "baseline": 9e3, "ratio": 1.3, "target": 1e4}) == "met"
    share = {**base, "value": 0.26, "baseline": 0.25, "target": "within 3% of its weight"}
    assert verdict({**share, "ratio": 1.02}) == "met"
    assert verdict({**share, "ratio": 1.10}) == "MISSED"
    assert verdict({**share, "ratio": 1.08, "target": "within 10% of its weight"}) == "met"
    assert verdict({**share, "ratio": 0.88, "target": "within 10% of its weight"}) == "MISSED"
    # The dispatch claim: within 95% of JAX at every size of the floor or more.
    sizes = {**base, "unit": "sizes", "target": 1.0}
    assert verdict({**sizes, "value": 8, "baseline": 8, "ratio": 1.0}) == "met"
    assert verdict({**sizes, "value": 5, "baseline": 8, "ratio": 0.625}) == "MISSED"


def test_results_section_is_rewritten_in_place(tmp_path: Path) -> None:
    records = normalize(
        [
            {
                "name": "chain-16",
                "value": 9.0,
                "baseline": 1.0,
                "ratio": 9.0,
                "unit": "x",
                "target": 8,
                "parameters": {"stages": 16},
            }
        ],
        Suite("parallel", "dispatch.py", (), (), ""),
    )
    plots = plot(records, tmp_path / "plots")
    assert [p.name for p in plots] == ["bench-parallel.png"] and plots[0].stat().st_size > 0
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Hand-written analysis\nkept\n")
    info = {"processor": "cpu", "cpus": 2, "python": "3.11"}
    write_results(results, markdown(records, "pathways bench", info, plots))
    write_results(results, markdown(records, "pathways bench --quick", info, plots))
    text = results.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert "pathways bench --quick" in text and "| parallel | chain-16 | stages=16 |" in text
    assert text.index(END) < text.index("## Hand-written analysis") and "kept" in text


def _figure(**fields: Any) -> dict[str, Any]:
    base = {"suite": "dispatch", "name": "dispatch-C", "unit": "steps/s", "target": 0.95}
    return {**base, **fields}


def test_figures_of_two_layouts_read_apart_and_shortfalls_are_named() -> None:
    """The dispatch suite measures each size on two layouts: the table, the plots and the
    list of shortfalls say which layout a figure is of, and what it measured against what."""
    records = [
        _figure(
            value=241.0,
            baseline=314.0,
            ratio=0.77,
            parameters={"floats_per_device": 16, "layout": "2 executors x 4 devices"},
        ),
        _figure(
            value=3637.0,
            baseline=3500.0,
            ratio=1.04,
            parameters={"floats_per_device": 16, "layout": "1 executor x 4 devices"},
        ),
        _figure(
            suite="control",
            name="allocator",
            value=9000.0,
            baseline=8000.0,
            ratio=1.125,
            unit="decisions/s",
            target=10000,
            parameters={"seed": 7},
        ),
    ]
    assert [describe(r) for r in records] == [
        "floats_per_device=16, 2 executors x 4 devices",
        "floats_per_device=16, 1 executor x 4 devices",
        "",
    ]
    assert [shortfall(r) for r in missed_figures(records)] == [
        "dispatch: dispatch-C (floats_per_device=16, 2 executors x 4 devices): ratio 0.770, "
        "target 0.95",
        "control: allocator: 9,000 decisions/s, target 10,000 decisions/s",
    ]
    records.append(
        _figure(name="smallest", value=None, baseline=None, ratio=None, unit="ms", target=None)
    )
    records[-1]["parameters"] = {}
    section = markdown(records, "pathways bench", {"processor": "x", "cpus": 2, "python": "3"}, [])
    assert "| dispatch | smallest |  |  |  |  |  |  |" in section  # not reached: no bare unit
    assert "Shortfalls: 2 of 4 figures." in section
    assert "- control: allocator: 9,000 decisions/s, target 10,000 decisions/s" in section


def test_the_generated_section_says_how_long_each_suite_took() -> None:
    seconds = {"dispatch": 302.4, "parallel": 41.0, "control": 59.6}
    assert (
        durations(seconds)
        == "dispatch 5 min 02 s, parallel 41 s, control 1 min 00 s; in all 6 min 43 s"
    )
    info = {"processor": "x", "cpus": 2, "python": "3"}
    assert "Time by suite: dispatch 5 min 02 s," in markdown([], "b", info, [], seconds)
    assert "Time by suite" not in markdown([], "b", info, [])


def test_the_machine_line_names_the_cpu_model_and_its_caches(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nprocessor\t: 1\n")
    cache = tmp_path / "cache"
    for index, (level, kind, size) in enumerate(
        [
            (1, "Data", "32K"),
            (1, "Instruction", "64K"),
            (2, "Unified", "512K"),
            (3, "Unified", "8192K"),
        ]
    ):
        folder = cache / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{value}\n")
    (cache / "index4").mkdir()  # unreadable: left out
    assert cpu_model(cpuinfo) == "AMD EPYC" and cpu_model(tmp_path / "none") == ""
    caches = cpu_caches(cache)
    assert caches == {"L1d": "32K", "L2": "512K", "L3": "8192K"}
    assert cpu_caches(tmp_path / "none") == {}
    info = {"processor": "AMD EPYC", "cpus": 2, "python": "3.11", "caches": caches}
    section = markdown([], "pathways bench", info, [])
    assert "AMD EPYC, 2 CPUs, L1d 32K, L2 512K, L3 8192K, Python 3.11." in section


def test_the_terminal_gets_one_table_per_suite_with_whole_names_and_units() -> None:
    records = [
        _figure(
            name="sizes of 1 ms or more at which -C is within 95% of JAX",
            value=4,
            baseline=8,
            ratio=0.5,
            unit="sizes",
            target=1.0,
            parameters={"layout": "2 executors x 4 devices"},
        ),
        _figure(
            suite="transfer",
            name="transfer-64MiB",
            value=2.5e9,
            baseline=3e9,
            ratio=0.83,
            unit="bytes/s",
            target=0.7,
            parameters={"bytes": 67108864},
        ),
    ]
    console = Console(width=100, record=True)
    tables = summary_tables(records)
    assert [table.title for table in tables] == ["dispatch", "transfer"]
    for table in tables:
        console.print(table)
    text = console.export_text()
    assert "…" not in text and "4 sizes" in text and "2,500,000,000 bytes/s" in text
    assert "MISSED" in text and "met" in text


def _plain_jax_chain(hosts: int) -> list[subprocess.Popen]:
    script = Path(__file__).parents[2] / "benchmarks" / "jax_stage_chain.py"
    port = free_port()
    return [
        subprocess.Popen(
            [sys.executable, str(script), str(i), str(hosts), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(hosts)
    ]


def test_the_plain_jax_chain_runs_each_length_across_two_processes() -> None:
    """The parallel suite's reference: stages 0-3 on the first process, 4-7 on the second,
    and so on; the last stage's process checks the result, the first answers the rate."""
    processes = _plain_jax_chain(2)
    try:
        for stages in (2, 8, 16, 12):  # 12 ends on the first process, 16 on the second
            for process in processes:
                process.stdin.write(f"CHAIN {stages}\n")
                process.stdin.flush()
            answers = [process.stdout.readline().strip() for process in processes]
            assert float(answers[0]) > 0 and answers[1] == "ok", answers
        processes[0].stdin.write("RUN 3\n")
        processes[0].stdin.flush()
        assert processes[0].wait(timeout=30) != 0
        assert "unknown command 'RUN': expected CHAIN STAGES" in processes[0].stderr.read()
    finally:
        for process in processes:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("dispatch.py --sizes -5", "argument --sizes: must be >= 1, not -5"),
        ("dispatch.py --hosts 3", "argument --hosts: invalid choice: 3 (choose from 1, 2)"),
        ("allocator.py --decisions 0", "argument --decisions: must be >= 1, not 0"),
        ("api.py --connections many", "argument --connections: expected a whole number, not"),
        ("load_sensitivity.py --loads 1.5", "argument --loads: must be above 0 and below 1"),
        ("operator_scale.py --slices 0", "argument --slices: must be >= 1, not 0"),
        ("recovery.py --repeats 0", "argument --repeats: must be >= 1, not 0"),
        ("session_memory.py --sessions -1", "argument --sessions: must be >= 1, not -1"),
    ],
)
def test_each_script_refuses_a_number_out_of_range_before_starting_anything(
    command: str, message: str
) -> None:
    script, *arguments = command.split()
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and message in run.stderr, run.stderr


def test_a_failure_is_printed_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite's error text is not the console's markup: a closing tag in it (``[/x]``) made
    the end of a whole run a traceback."""
    original = bench.run_suite

    def failing(suite: Suite, quick: bool, plots: Path | None = None) -> list[dict]:
        return original(Suite(suite.name, "no_such[/x].py", (), (), ""), quick=True)

    monkeypatch.setattr(bench, "run_suite", failing)
    result = CliRunner().invoke(bench_command, ["--quick", "--only", "control"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "no_such[/x].py is missing" in " ".join(result.output.split())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pipeline", "islands"])
def test_the_suites_whose_models_use_the_sdk_run_to_their_records(name: str) -> None:
    """Their models use slices, functions and programs: an SDK change they rely on breaks
    here, not 20 minutes into `make bench` (the pipeline suite used slices it had released)."""
    (suite,) = [suite for suite in SUITES if suite.name == name]
    records = run_suite(suite, quick=True)
    assert records and not any(record.get("error") for record in records), records
    assert all(record["ratio"] > 0 for record in records)


def test_a_stopped_suite_stops_what_its_script_started(tmp_path: Path) -> None:
    """Stopped (Ctrl-C to the harness alone, SIGTERM), a suite's script was killed alone: its
    own cleanup never ran and what it started (an operator, an island) ran on."""
    started = tmp_path / "started"
    script = (
        "import signal, subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "open(sys.argv[1], 'w').write(str(child.pid))\n"
        "try:\n"
        "    time.sleep(300)\n"
        "except KeyboardInterrupt:\n"
        "    open(sys.argv[1] + '.clean', 'w').write('cleaned up')\n"
        "    child.terminate()\n"
    )
    suite = subprocess.Popen(
        [sys.executable, "-c", script, str(started)], start_new_session=True, text=True
    )
    deadline = time.monotonic() + 30
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline, "the script did not start its child"
        time.sleep(0.05)
    child = int(started.read_text())
    bench._stop(suite)
    assert (tmp_path / "started.clean").read_text() == "cleaned up"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the script's child runs on"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_sigterm_stops_a_run_as_ctrl_c_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def terminated(suite: Suite, quick: bool, plots: Path | None = None) -> list[dict]:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(bench, "run_suite", terminated)
    json_path = tmp_path / "r.json"
    result = CliRunner().invoke(bench_command, ["--only", "control", "--json", str(json_path)])
    assert result.exit_code == 130, result.output
    assert "Interrupted in control" in " ".join(result.output.split())
    assert json.loads(json_path.read_text()) == []
    assert signal.getsignal(signal.SIGTERM) is not bench._interrupt  # put back


def test_results_are_written_by_whole_runs_of_every_suite_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of one suite replaced the whole run's 131 figures with its 3; a run with a
    failed suite replaced them too; --results took any file (the --json file, /etc/passwd)."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n")
    cut = tmp_path / "CUT.md"
    cut.write_text(f"# Benchmark results\n\n{BEGIN}\n| a table |\n\n## Hand-written\n")
    for arguments, expected in (
        (["--results", str(cut)], "has 1 start and 0 end markers"),
        (["--only", "control", "--results", str(results)], "--only would replace it"),
        (["--json", str(results), "--results", str(results)], "is the --json file"),
        (["--results", str(tmp_path / "passwd")], "must end in .md"),
    ):
        result = CliRunner().invoke(bench_command, arguments)
        assert result.exit_code == 2, (arguments, result.output)
        assert expected in " ".join(result.output.split()), (arguments, result.output)

    def one_fails(suite: Suite, quick: bool, plots: Path | None = None) -> list[dict]:
        if suite.name == "transfer":
            return [bench._failure(suite, "transfer.py exited 1: a port was taken")]
        return normalize([_doubled(suite.script)], suite)

    monkeypatch.setattr(bench, "run_suite", one_fails)
    result = CliRunner().invoke(bench_command, ["--results", str(results)])
    assert result.exit_code == 1, result.output
    assert f"transfer failed: {results} was left as it was" in " ".join(result.output.split())
    assert results.read_text() == "# Benchmark results\n"
    # A log is told of each suite as it starts (rich draws its bar only at the end there).
    assert "control: " in result.output and "(allocator.py)" in result.output


def test_figures_of_no_number_or_of_zero_are_judged() -> None:
    """A NaN or infinite ratio was written as JSON no strict parser reads (and an infinite one
    met its target); a value of 0 got no ratio, and no verdict."""
    nan, inf = float("nan"), float("inf")
    raw = [
        {"name": "a", "value": 1.0, "baseline": 0.0, "ratio": inf, "target": 0.7},
        {"name": "b", "value": nan, "baseline": 1.0, "target": 0.7},
        {"name": "c", "value": 0.0, "baseline": 5.0, "target": 0.7},
    ]
    records = normalize(raw, ALLOCATOR)
    json.dumps(records, allow_nan=False)  # strict JSON
    assert [r["ratio"] for r in records] == [None, None, 0.0]
    assert [verdict(r) for r in records] == ["MISSED", "MISSED", "MISSED"]
    assert records[0]["parameters"] == {"ratio_not_finite": "inf"}


def test_a_suite_that_fails_keeps_the_figures_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An executor killed in the transfer suite's fourth size threw away the three sizes it
    had measured: one FAILED record was kept."""
    (tmp_path / "benchmarks").mkdir()
    script = tmp_path / "benchmarks" / "half.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--json') + 1]\n"
        "record = {'name': 'first', 'value': 2.0, 'baseline': 1.0, 'unit': 'x', 'target': 0.7}\n"
        "open(path, 'w').write(json.dumps([record]))\n"
        "sys.exit('the second figure failed: an executor was lost')\n"
    )
    monkeypatch.setattr(bench, "BENCHMARKS", tmp_path / "benchmarks")
    first, failed = run_suite(Suite("transfer", "half.py", (), (), ""), quick=True)
    assert (first["name"], first["ratio"], verdict(first)) == ("first", 2.0, "met")
    assert verdict(failed) == "FAILED" and "an executor was lost" in failed["error"]
