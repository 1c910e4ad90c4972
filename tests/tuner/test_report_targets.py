"""``tune --report-dir`` and ``demo --report-dir`` write report.md, the plots and (the
demo) the timeline into the folder at the end, each by a temporary file renamed over
its path: a device, FIFO, socket, folder or a symlink to one there was replaced (or
the report lost after the whole study). Refused before any work, left as it was."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from slopilot.cli import main
from tests.support.special_files import MAKERS, make_special, seen

KINDS = sorted(MAKERS)


def _refused(argv: list[str], folder: Path, path: Path, said: str,
             capsys: pytest.CaptureFixture[str]) -> None:
    before = seen(path)
    with contextlib.suppress(SystemExit):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--report-dir {folder} (writes {path}): " in err and re.search(said, err), err
    assert "remove it or give another folder" in err and "Traceback" not in err
    assert seen(path) == before


@pytest.mark.parametrize("name", ["report.md", "history.png"])
@pytest.mark.parametrize("kind", KINDS)
def test_tune_refuses_a_report_file_that_is_no_regular_file(
        tmp_path: Path, kind: str, name: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran before its report files were checked")

    monkeypatch.setattr("slopilot.tuner.tune.run.run", never)
    path = tmp_path / name
    said = make_special(kind, path)
    _refused(["tune", "--scenario", "tiny-cpu", "--report-dir", str(tmp_path)],
             tmp_path, path, said, capsys)


@pytest.mark.parametrize("name", ["report.md", "timeline.json"])
@pytest.mark.parametrize("kind", KINDS)
def test_demo_refuses_a_report_file_that_is_no_regular_file(
        tmp_path: Path, kind: str, name: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.tuner.local import demo

    def must_not_run(*_: object) -> demo.DemoResult:
        raise AssertionError("the demo started")

    monkeypatch.setattr(demo, "run_demo", must_not_run)
    path = tmp_path / name
    said = make_special(kind, path)
    _refused(["demo", "--report-dir", str(tmp_path)], tmp_path, path, said, capsys)


@pytest.mark.parametrize("kind", KINDS)
def test_tune_refuses_a_sqlite_storage_that_is_no_regular_file(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite opens the path in place (no rename): nothing was replaced, but a FIFO or a
    # device gave "disk I/O error" and a link into a missing folder "unable to open".
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the study ran before its storage was checked")

    monkeypatch.setattr("slopilot.tuner.tune.run.run", never)
    path = tmp_path / "study.db"
    said = make_special(kind, path)
    before = seen(path)
    assert main(["tune", "--scenario", "tiny-cpu", "--storage", f"sqlite:///{path}"]) == 2
    err = capsys.readouterr().err
    assert f"--storage sqlite:///{path}" in err and re.search(said, err), err
    assert ("name a database file in it" if kind == "folder" else "give a database file") \
        in err, err
    assert "Traceback" not in err
    assert seen(path) == before
