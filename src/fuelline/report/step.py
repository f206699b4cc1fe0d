"""The report as the last pipeline step (also `fuelline report RUN`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.io.stage_layout import STATS_FILE
from fuelline.pipeline.options import Options
from fuelline.pipeline.shards import describe_inputs
from fuelline.pipeline.stats import StepStats
from fuelline.pipeline.step import Step
from fuelline.pipeline.workdir import WorkDir
from fuelline.pipeline.workers import RunOptions
from fuelline.report.funnel import format_funnel, load_funnel
from fuelline.report.html import write_report

REPORT_DIR = "report"  # RUN/report/: funnel.json, funnel.txt, report.html, charts
REPORT_WRITES = ("funnel.json", "funnel.txt", "report.html", "*.png")  # all --restart deletes there


def build_report(run_dir: Path, directory: Path) -> dict:
    """funnel.txt, funnel.json, report.html and charts for the run, in `directory`."""
    funnel = load_funnel(run_dir)
    write_bytes_atomic(directory / "funnel.json", orjson.dumps(funnel, option=orjson.OPT_INDENT_2) + b"\n")
    write_bytes_atomic(directory / "funnel.txt", (format_funnel(funnel) + "\n").encode())
    write_report(funnel, directory)
    return funnel


@dataclass
class ReportConfig(Options):
    """The report has no options: it shows the run as it is."""


class ReportStep(Step):
    """Write the funnel report of the run so far."""

    name, Config, needs_input = "report", ReportConfig, False

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        """Into RUN/report/, where `fuelline report RUN` writes too (not into the step's own directory)."""
        return report_run(output.parent, restart=options.restart)


def report_run(run_dir: Path, restart: bool = False) -> dict:
    """RUN/report/ under the one resume contract (`WorkDir.run_once`, derived): its identity is the
    steps' stats.json files, so it is written again when a step's stats changed, and found again
    (its stats marked resumed) when none did. Returns its stats: `report` (the HTML) and `steps`."""
    directory = run_dir / REPORT_DIR
    stats_files = [p for p in sorted(run_dir.glob(f"*/{STATS_FILE}")) if p.parent != directory]
    identity = {"task": ReportStep.name, "inputs": describe_inputs(stats_files)}

    def work() -> StepStats:
        funnel = build_report(run_dir, directory)
        return StepStats(ReportStep.name, 0, 0, details={"report": str(directory / "report.html"),
                                                          "steps": len(funnel["steps"])})

    return WorkDir(directory, identity, reads=stats_files, writes=REPORT_WRITES).run_once(work, restart=restart,
                                                                                          derived=True)
