"""What seeing a run costs: the report page against the sample step it follows, and the console's lines.

- report: the refreshes training made (`time/report_s` in the run's metrics.csv, median) against the
  sample steps they follow (`time/samples_s`, median), timed in the same run moments apart, so
  the ratio is what the refresh adds to a sample step; also `write_report` on the finished run
  (median of `--rounds`), as a check.
- console: the lines a `voicesmith demo` printed (stdout + stderr, captured in a pipe) against
  the epoch summaries its logs/train.log holds; pass the captured output with `--console-log`.

    python benchmarks/bench_report.py voicesmith-demo/run --console-log demo.out --results benchmarks/RESULTS_report.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Optional

from voicesmith.report import RunFiles, write_report


def time_report(run_dir: Path, rounds: int) -> tuple[float, int]:
    """Median seconds of one write_report, and the page's size in bytes."""
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        page = write_report(run_dir)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), page.stat().st_size


def median_of(run_dir: Path, column: str) -> Optional[float]:
    series = RunFiles.read(run_dir).metrics.get(column)
    return statistics.median(series.values) if series and series.values else None


def console_counts(console_log: Path, run_dir: Path) -> dict[str, int]:
    screen = console_log.read_text(encoding="utf-8", errors="replace").splitlines()
    logged = (run_dir / "logs" / "train.log").read_text(encoding="utf-8").splitlines()
    return {"lines on screen": len(screen),
            "epoch summaries on screen": sum(line.startswith("Epoch ") for line in screen),
            "epoch summaries in train.log": sum(" Epoch " in line for line in logged)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--console-log", type=Path, help="the captured output of the run (a pipe, not a terminal)")
    parser.add_argument("--results", type=Path, help="write the table as Markdown here")
    args = parser.parse_args()

    report_s, size = time_report(args.run_dir, args.rounds)
    refresh_s, samples_s = median_of(args.run_dir, "time/report_s"), median_of(args.run_dir, "time/samples_s")
    lines = [f"# Seeing a run: report page and console ({platform.machine()}, {os.cpu_count()} CPU cores, "
             f"load average {os.getloadavg()[0]:.1f} at the end)", "",
             f"Run: `{args.run_dir}`, {len(list((args.run_dir / 'samples').glob('step_*')))} sample steps.", "",
             "| what | result | peer, same run | ratio |", "|---|---|---|---|"]
    if refresh_s and samples_s:
        lines.append(f"| report.html refreshed during training | {refresh_s:.2f} s | the sample step before it "
                     f"{samples_s:.2f} s | {refresh_s / samples_s:.2f} |")
    lines.append(f"| `write_report` after the run ({size / 1e3:.0f} kB page) | {report_s:.2f} s | | |")
    if args.console_log:
        counts = console_counts(args.console_log, args.run_dir)
        lines.append(f"| console: epoch summaries on screen | {counts['epoch summaries on screen']} | in train.log "
                     f"{counts['epoch summaries in train.log']} | |")
        lines.append(f"| console: all lines on screen | {counts['lines on screen']} | | |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
