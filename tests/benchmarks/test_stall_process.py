"""benchmarks/stall_process.py: the command runs to its end, stopped and resumed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from stall_process import main, process_tree


def test_the_command_runs_through_the_stops_and_its_status_is_returned() -> None:
    code = "import sys; sys.stdout.write('ran'); sys.exit(3)"
    assert main(["--stop-s", "0.01", "--run-s", "0.01", "--", sys.executable, "-c",
                 code]) == 3


def test_a_process_s_tree_starts_with_it() -> None:
    assert process_tree(1)[0] == 1


@pytest.mark.parametrize("args", [["--stop-s", "0", "--run-s", "1", "--", "true"],
                                  ["--stop-s", "1", "--run-s", "1"]])
def test_bad_arguments_are_refused(args: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2
