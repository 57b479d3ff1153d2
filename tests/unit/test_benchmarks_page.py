"""docs/benchmarks.md shows the figures bench/results/ saved, never figures typed by hand:
its tables are what `python -m bench.report` generates from those files (pure: no
processes, only the files are read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import report, results

BENCH = Path(report.__file__).parent
# Runnable modules of bench/ that measure nothing of their own: the page's generator, and
# the wrapper bench.processor_throughput --profile-control runs the coordinator under.
NOT_BENCHMARKS = {"report", "cpu_steps"}


def test_the_benchmarks_page_is_what_bench_report_generates() -> None:
    assert report.PAGE.read_text() == report.generated(), (
        "docs/benchmarks.md differs from bench/results/: run .venv/bin/python -m bench.report"
    )


def test_every_benchmark_has_saved_results() -> None:
    benchmarks = {
        path.stem
        for path in BENCH.glob("*.py")
        if 'if __name__ == "__main__"' in path.read_text() and path.stem not in NOT_BENCHMARKS
    }
    saved = {path.stem for path in results.RESULTS_DIR.glob("*.txt")}
    assert benchmarks == saved


def test_a_table_edited_by_hand_is_found() -> None:
    page = report.PAGE.read_text()
    edited = page.replace("| RESULT | `", "| RESULT | `typed_by_hand=1 ", 1)
    assert edited != page
    assert report.render(edited, results.read_all()) == page


def test_a_results_file_without_a_page_block_is_refused() -> None:
    page = report.PAGE.read_text()
    start = page.index("<!-- bench.report bench.run_create")
    end = page.index(report.END, start) + len(report.END)
    with pytest.raises(results.ResultError, match=r"no block for bench\.run_create"):
        report.render(page[:start] + page[end:], results.read_all())


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_result_line_refuses_a_value_that_is_not_a_number(tmp_path: Path, value: str) -> None:
    with pytest.raises(results.ResultError, match="finite number"):
        results.result_line({"page_p99_ms": "42.1", "export_items_per_s": value})
    saved = tmp_path / "review.txt"
    saved.write_text(
        "command: x\ndate: d\ncommit: c\nmachine: m\ntarget: t\n"
        f"RESULT page_p99_ms=42.1 export_items_per_s={value}\n"
    )
    with pytest.raises(results.ResultError, match="finite number"):
        results.read_saved(saved)


def test_the_last_result_line_of_an_output_is_taken() -> None:
    output = "RESULT a=1\nsome figures\nRESULT a=2 codec=h264\n"
    assert results.last_result(output) == "RESULT a=2 codec=h264"
    assert results.parse_result("RESULT a=2 codec=h264") == {"a": "2", "codec": "h264"}
