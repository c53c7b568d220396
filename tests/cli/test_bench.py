"""`pathways bench`: one output format over the per-issue benchmarks, a table, JSON, plots and
the generated section of RESULTS.md."""

from __future__ import annotations

from pathlib import Path

from pathways_client.bench import (
    BEGIN,
    END,
    SUITES,
    Suite,
    command_line,
    markdown,
    normalize,
    plot,
    run_suite,
    verdict,
    write_results,
)

ALLOCATOR = Suite("control", "allocator.py", (), ("--decisions", "2000", "--islands", "8"), "")


def test_a_real_benchmark_gives_records_in_the_one_format() -> None:
    (record,) = run_suite(ALLOCATOR, quick=True)
    assert record["suite"] == "control" and record["name"] == "allocator"
    assert record["value"] > 0 and record["baseline"] > 0
    assert record["ratio"] == record["value"] / record["baseline"]
    # Fields beyond the format are kept as parameters.
    assert {"p99_us", "decisions"} <= set(record["parameters"])


def test_suites_that_draw_get_the_plots_folder(tmp_path: Path) -> None:
    """The multitenancy suite draws the paper's Figure 9 itself: it must be told where."""
    (multitenancy,) = [suite for suite in SUITES if suite.name == "multitenancy"]
    command = command_line(multitenancy, True, tmp_path / "r.json", tmp_path / "plots")
    assert command[-2:] == ["--plots", str(tmp_path / "plots")]
    assert "--plots" not in command_line(ALLOCATOR, True, tmp_path / "r.json", tmp_path)


def test_a_failing_script_becomes_a_failed_record() -> None:
    missing = Suite("control", "no_such_benchmark.py", (), (), "")
    (record,) = run_suite(missing, quick=True)
    assert verdict(record) == "FAILED" and "is missing" in record["error"]


def test_verdicts_against_targets() -> None:
    base = {"name": "x", "unit": "u", "parameters": {}, "suite": "s"}
    assert verdict({**base, "value": 2, "baseline": 1, "ratio": 2.0, "target": 0.9}) == "met"
    assert verdict({**base, "value": 1, "baseline": 2, "ratio": 0.5, "target": 0.9}) == "MISSED"
    # A target in the figure's own unit applies to the value, not the ratio.
    assert verdict({**base, "value": 12e3, "baseline": 9e3, "ratio": 1.3, "target": 1e4}) == "met"
    share = {**base, "value": 0.26, "baseline": 0.25, "target": "within 3% of its weight"}
    assert verdict({**share, "ratio": 1.02}) == "met"
    assert verdict({**share, "ratio": 1.10}) == "MISSED"
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
