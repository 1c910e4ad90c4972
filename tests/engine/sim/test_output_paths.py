"""``check_distinct``: an output that is an input, or another output, is refused before
any work, however the two paths are spelled (a symlink, a hard link, ``./``, ``..``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slopilot.engine.sim.output_paths import NamedFile, check_distinct


def _input(tmp_path: Path, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    return path


def test_an_output_that_is_an_input_names_both_flags_and_the_fix(tmp_path: Path) -> None:
    trace = _input(tmp_path)
    with pytest.raises(ValueError) as err:
        check_distinct([NamedFile("--metrics-out", str(trace))],
                       [NamedFile("--trace", str(trace))])
    message = str(err.value)
    assert f"--metrics-out {trace}" in message and f"--trace {trace}" in message
    assert "same file" in message and "give --metrics-out another path" in message


@pytest.mark.parametrize("spelling", ["symlink", "hardlink", "dotted"])
def test_the_same_file_under_another_name_is_the_same_file(tmp_path: Path,
                                                           spelling: str) -> None:
    trace = _input(tmp_path)
    other = tmp_path / "alias.csv"
    if spelling == "symlink":
        other.symlink_to(trace)
    elif spelling == "hardlink":
        os.link(trace, other)
    else:
        (tmp_path / "sub").mkdir()
        other = tmp_path / "sub" / ".." / "." / "t.csv"
    with pytest.raises(ValueError, match="same file"):
        check_distinct([NamedFile("--metrics-out", str(other))],
                       [NamedFile("--trace", str(trace))])


def test_a_symlinked_folder_leads_to_the_same_file(tmp_path: Path) -> None:
    trace = _input(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match="same file"):
        check_distinct([NamedFile("--out", str(tmp_path / "link" / "t.csv"))],
                       [NamedFile("--refit", str(trace))])


def test_two_outputs_that_do_not_exist_yet_are_compared_by_their_resolved_path(
        tmp_path: Path) -> None:
    out = tmp_path / "same.yaml"
    with pytest.raises(ValueError) as err:
        check_distinct([NamedFile("--out", str(out)),
                        NamedFile("--samples-out", str(tmp_path / "." / "same.yaml"))])
    message = str(err.value)
    assert "--samples-out" in message and "--out" in message and "same file" in message
    assert "own path" in message
    assert not out.exists()


def test_distinct_files_pass_and_a_missing_input_is_no_clash(tmp_path: Path) -> None:
    trace = _input(tmp_path)
    check_distinct([NamedFile("--metrics-out", str(tmp_path / "m.prom"))],
                   [NamedFile("--trace", str(trace)),
                    # A scenario given by name is no file here; the same word as the
                    # output's is no clash.
                    NamedFile("--scenario", "m.prom")])


def test_a_folders_file_is_named_by_the_folders_flag(tmp_path: Path) -> None:
    scenario = _input(tmp_path, "report.md")
    with pytest.raises(ValueError) as err:
        check_distinct([NamedFile("--report-dir", str(tmp_path), scenario, folder=True)],
                       [NamedFile("--scenario", str(scenario))])
    message = str(err.value)
    assert f"--report-dir {tmp_path} (writes {scenario})" in message
    assert "give --report-dir another folder" in message


def test_an_input_inside_a_folder_the_command_fills_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    profile = _input(run, "p.yaml")
    with pytest.raises(ValueError) as err:
        check_distinct([NamedFile("--report-dir", str(tmp_path), run, tree=True)],
                       [NamedFile("--profile", str(profile))])
    assert f"--profile {profile}" in str(err.value)
    # Beside that folder, not in it: no clash.
    check_distinct([NamedFile("--report-dir", str(tmp_path), run, tree=True)],
                   [NamedFile("--profile", str(_input(tmp_path, "p.yaml")))])
