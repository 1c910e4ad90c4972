"""``--json``'s rule, the same for ``simulate``, ``tune`` and ``calibrate``: stdout holds
one JSON object where the command finished (exit 0, a verdict that nothing holds
included); a refusal, of its input or of a calibration's fit, is one line on stderr,
exit 2, and nothing on stdout. A script reads the exit status first."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main


def _refused_fit(tmp_path: Path) -> list[str]:
    from slopilot.engine.calibrate.runner import CalibrationOptions, measure
    from slopilot.engine.calibrate.samples import write_samples
    from tests.engine.calibrate.synthetic import SyntheticExecutor
    from tests.engine.calibrate.test_samples import QUICK, _target

    rec = measure(_target(SyntheticExecutor(noise=0.3, seed=4)),
                  CalibrationOptions(grid=QUICK, repeats=1))
    samples = write_samples(rec, tmp_path / "s.json")
    return ["calibrate", "--refit", str(samples), "--out", str(tmp_path / "p.yaml"),
            "--tolerance", "0.000001"]


@pytest.mark.parametrize("case", ["simulate", "tune", "calibrate-input", "calibrate-fit"])
def test_a_refusal_under_json_is_one_line_on_stderr_and_exit_2(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = {
        "simulate": ["simulate", "--scenario", "tiny-cpu", "--set", "token_budget=-1"],
        "tune": ["tune", "--scenario", "tiny-cpu", "--set", "token_budget=512",
                 "--bound", "token_budget=128:256"],
        "calibrate-input": ["calibrate", "--out", str(tmp_path / "p.yaml")],
    }.get(case) or _refused_fit(tmp_path)
    assert main([*argv, "--json"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "", printed.out
    assert printed.err.count("\n") == 1 and printed.err.startswith(
        f"slopilot {argv[0]}: "), printed.err
    if case == "calibrate-fit":
        assert "above --tolerance" in printed.err, printed.err
        assert not (tmp_path / "p.yaml").exists()
