"""The files ``slopilot demo`` reads and writes, checked before anything starts: no
output may be an input.

The report goes into ``--report-dir`` as ``report.md``, the study's plots and the
timeline, all written at the end; the run's own files (replica logs, the SLO and target
files, Prometheus' config, rules and data) go anywhere under its ``run`` folder. A
``--profile`` kept under one of those names, or in that folder, was overwritten.
"""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.models import checkpoint_files
from slopilot.engine.sim.output_paths import NamedFile, check_distinct
from slopilot.tuner.local.demo_report import demo_report_files

RUN_FOLDER = "run"
"""Under ``--report-dir``: where the run's files go (``make_report_dir``)."""


def check_demo_files(report_dir: Path, *, profile: Path | None, model: str | None,
                     scenario: str | None) -> None:
    """ValueError naming both flags where a file the demo writes is one it reads."""
    shown = str(report_dir)
    outputs = [NamedFile("--report-dir", shown, f, folder=True)
               for f in demo_report_files(report_dir)]
    outputs.append(NamedFile("--report-dir", shown, report_dir / RUN_FOLDER, tree=True))
    inputs = [NamedFile(flag, str(value)) for flag, value in (
        ("--profile", profile), ("--scenario", scenario)) if value is not None]
    if model is not None:
        inputs += [NamedFile("--model", model, f) for f in checkpoint_files(model)]
    check_distinct(outputs, inputs)
