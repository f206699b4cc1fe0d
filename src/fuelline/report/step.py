"""The report as the last pipeline step (also `fuelline report RUN`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.pipeline.options import Options
from fuelline.pipeline.step import Step
from fuelline.pipeline.workers import RunOptions
from fuelline.report.funnel import format_funnel, load_funnel
from fuelline.report.html import write_report

REPORT_DIR = "report"  # RUN/report/: funnel.json, funnel.txt, report.html, charts


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
        directory = output.parent / REPORT_DIR
        funnel = build_report(output.parent, directory)
        return {"stage": self.name, "report": str(directory / "report.html"), "steps": len(funnel["steps"])}
