"""A SQLite file that holds another application's tables is refused as study storage, and
left as it was.

Before, Optuna opened whatever file the URL named: it added its 12 tables and
``alembic_version`` to the user's database, then failed on the user's own ``trials``
table with a traceback.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.tuner.study.storage import StudyStorageError, open_study, study_names


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _other_app(path: Path) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE trials (id INTEGER PRIMARY KEY, patient TEXT)")
        db.execute("CREATE TABLE visits (id INTEGER PRIMARY KEY)")
        db.execute("INSERT INTO trials (patient) VALUES ('ada')")
    return path


def test_tune_refuses_another_applications_database_and_adds_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _other_app(tmp_path / "other.db")
    before = db.read_bytes()
    url = f"sqlite:///{db}"
    assert main(["tune", "--scenario", "tiny-cpu", "--trials", "1", "--duration", "4",
                 "--seeds", "1", "--quiet", "--storage", url]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert f"{db} is not a study database" in err, err
    assert "holds 2 tables of its own (trials, visits)" in err, err
    assert "name a new file" in err, err
    assert _tables(db) == {"trials", "visits"}
    assert db.read_bytes() == before


def test_open_study_and_the_list_refuse_it_too(tmp_path: Path) -> None:
    """The operator's studies, and its clean-up listing them, open storage the same way."""
    db = _other_app(tmp_path / "other.db")
    url = f"sqlite:///{db}"
    with pytest.raises(StudyStorageError, match="is not a study database"):
        open_study(url, "s")
    with pytest.raises(StudyStorageError, match="is not a study database"):
        study_names(url)
    assert _tables(db) == {"trials", "visits"}


def test_a_file_that_is_not_sqlite_is_refused_as_such(tmp_path: Path) -> None:
    notes = tmp_path / "notes.db"
    notes.write_text("shopping: eggs, milk\n" * 20)
    with pytest.raises(StudyStorageError, match="is not a SQLite database"):
        open_study(f"sqlite:///{notes}", "s")
    assert notes.read_text() == "shopping: eggs, milk\n" * 20


def test_an_empty_file_and_a_study_database_are_opened(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    open_study(f"sqlite:///{empty}", "s")
    assert {"studies", "trials", "version_info"} <= _tables(empty)
    again = open_study(f"sqlite:///{empty}", "t")  # now a study database: opened again
    assert again.study_name == "t"


def test_a_database_an_older_slopilot_already_added_optunas_tables_to_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Optuna's tables beside the application's own ``trials`` (what the old open left in
    the user's file): the open fails on that table, said in one line, not a traceback."""
    import optuna

    db = _other_app(tmp_path / "other.db")
    url = f"sqlite:///{db}"
    optuna.storages.RDBStorage(url)  # the old open: Optuna's tables made beside the user's
    assert main(["tune", "--scenario", "tiny-cpu", "--trials", "1", "--duration", "4",
                 "--seeds", "1", "--quiet", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"slopilot tune: cannot open study 'tune-tiny-cpu' in {url}: "), err
    assert "Traceback" not in err
