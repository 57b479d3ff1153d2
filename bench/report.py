"""docs/benchmarks.md's tables, generated from the saved RESULT lines in bench/results/.

    .venv/bin/python -m bench.report            # rewrite the page's tables from the files
    .venv/bin/python -m bench.report --check    # exit 1 when the page differs from them
    .venv/bin/python -m bench.review | tee out.txt
    .venv/bin/python -m bench.report save bench.review --machine "2 cores ..., quiet" < out.txt

The page holds one generated block per benchmark, between
`<!-- bench.report bench.<module> ... -->` and `<!-- /bench.report -->`; everything outside
the blocks is written by hand and kept as it is. `save` takes the last RESULT line of a
benchmark's output, stamps it with today's date (UTC), the checked-out commit and the
machine described, keeps the file's target (or takes `--target`), and regenerates the
page: so the page shows what was run, never a figure typed in by hand.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from bench.results import RESULTS_DIR, ResultError, Saved, last_result, read_all, read_saved

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
END = "<!-- /bench.report -->"
_BLOCK = re.compile(
    r"<!-- bench\.report (?P<name>bench\.[a-z0-9_]+)[^\n]*-->\n.*?" + re.escape(END), re.DOTALL
)
ROWS = ("target", "command", "machine", "commit", "date", "note")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(saved: Saved) -> str:
    """The generated block of one benchmark, markers included."""
    module = saved.benchmark.removeprefix("bench.")
    head = f"`{saved.result.removeprefix('RESULT ')}`" if saved.result else "none recorded"
    lines = [
        f"<!-- bench.report {saved.benchmark}: generated from bench/results/{module}.txt by "
        "`python -m bench.report`; edit that file, not this table -->",
        "",  # blank lines around the table: a comment line would otherwise read as a row
        f"| RESULT | {head} |",
        "| --- | --- |",
    ]
    for key in ROWS:
        if key in saved.facts:
            value = saved.facts[key]
            lines.append(f"| {key} | {_cell(f'`{value}`' if key == 'command' else value)} |")
    lines += ["", END]
    return "\n".join(lines)


def render(page: str, saved: Sequence[Saved]) -> str:
    """`page` with each generated block rewritten from its benchmark's saved results; a
    ResultError when a block has no results file, a file has no block, or one has two."""
    by_name = {entry.benchmark: entry for entry in saved}
    seen: list[str] = []

    def replace(found: re.Match[str]) -> str:
        name = found["name"]
        if name not in by_name:
            raise ResultError(f"the page has a block for {name}, and bench/results/ no file")
        seen.append(name)
        return table(by_name[name])

    rendered = _BLOCK.sub(replace, page)
    twice = sorted({name for name in seen if seen.count(name) > 1})
    if twice:
        raise ResultError(f"the page has more than one block for {', '.join(twice)}")
    missing = sorted(set(by_name) - set(seen))
    if missing:
        raise ResultError(f"the page has no block for {', '.join(missing)}")
    return rendered


def generated(page: Path = PAGE, results: Path = RESULTS_DIR) -> str:
    return render(page.read_text(), read_all(results))


def _commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"`{head.stdout.strip()}`" + (" with uncommitted changes" if changed else "")


def save(args: argparse.Namespace, output: str) -> Saved:
    """The results file of `args.benchmark`, written from a run's output."""
    module = args.benchmark.removeprefix("bench.")
    path = RESULTS_DIR / f"{module}.txt"
    previous = read_saved(path).facts if path.exists() else {}
    target = args.target or previous.get("target")
    if not target:
        raise ResultError(f"{path} does not exist yet: give --target")
    facts = {
        "command": args.command or f".venv/bin/python -m bench.{module}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "machine": args.machine,
        "target": target,
    }
    if args.note:
        facts["note"] = args.note
    saved = Saved(f"bench.{module}", facts, last_result(output))
    path.write_text(saved.text())
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    commands = parser.add_subparsers(dest="action")
    saving = commands.add_parser("save", help="save a run's RESULT line (output on stdin)")
    saving.add_argument("benchmark", help="the module, e.g. bench.review")
    saving.add_argument("--machine", required=True, help="the machine and how busy it was")
    saving.add_argument("--command", help="as run (default: .venv/bin/python -m <module>)")
    saving.add_argument("--target", help="the targets (default: the file's)")
    saving.add_argument("--note", help="anything a reader of the figures must know")
    args = parser.parse_args(argv)
    try:
        if args.action == "save":
            saved = save(args, sys.stdin.read())
            print(f"saved {saved.result}")
        text = generated()
    except ResultError as problem:
        print(f"bench.report: {problem}", file=sys.stderr)
        return 2
    if text == PAGE.read_text():
        print(f"{PAGE.relative_to(ROOT)} is up to date")
        return 0
    if args.check:
        print(f"{PAGE.relative_to(ROOT)} differs from bench/results/: run python -m bench.report")
        return 1
    PAGE.write_text(text)
    print(f"{PAGE.relative_to(ROOT)} regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
