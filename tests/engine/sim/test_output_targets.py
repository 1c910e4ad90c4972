"""An output path where a device, a FIFO, a socket or a folder stands is refused before
any work, naming the flag, the path, what is there and the fix, and left as it was;
a symlink is written through (the file it leads to is replaced, the link stays).

The files are written to a temporary file and renamed over the path: as root,
``calibrate --out /dev/full`` made the machine's /dev/full a text file, and a FIFO or a
symlinked metrics file became a plain file, each with rc 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slopilot.cli import main
from slopilot.engine.sim.output_paths import OutputTargetError, check_output_file
from slopilot.engine.sim.profile_file import write_bytes_atomically
from tests.support.special_files import MAKERS, make_special, seen

KINDS = sorted(MAKERS)
FIX = "give a regular file's path"


@pytest.mark.parametrize("kind", KINDS)
def test_the_check_refuses_what_is_no_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "out.prom"
    said = make_special(kind, path)
    with pytest.raises(ValueError) as err:
        check_output_file(path, "--metrics-out")
    message = str(err.value)
    assert message.startswith(f"--metrics-out {path}: "), message
    assert re.search(said, message), message


@pytest.mark.parametrize("kind", KINDS)
def test_the_writer_never_replaces_what_is_no_regular_file(tmp_path: Path,
                                                           kind: str) -> None:
    # Checked again where it writes: the path may have changed since the check.
    path = tmp_path / "out.prom"
    said = make_special(kind, path)
    before = seen(path)
    with pytest.raises(OSError) as err:
        write_bytes_atomically(path, b"x 1\n")
    assert seen(path) == before
    if kind != "folder":  # a folder's own refusal is the OS's: "Is a directory"
        assert re.search(said, str(err.value)) and FIX in str(err.value), err.value
    leftovers = [p.name for p in tmp_path.rglob("*.tmp")]
    assert leftovers == []


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "textfile" / "slopilot.prom"
    real.parent.mkdir()
    real.write_text("old\n")
    real.chmod(0o644)
    link = tmp_path / "metrics.prom"
    link.symlink_to(real)
    check_output_file(link, "--metrics-out")
    assert write_bytes_atomically(link, b"new\n") == link
    assert link.is_symlink() and link.readlink() == real
    assert real.read_text() == "new\n"
    assert real.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in real.parent.iterdir()) == ["slopilot.prom"]


def test_a_dangling_symlink_into_a_folder_makes_the_file_it_names(tmp_path: Path) -> None:
    real = tmp_path / "later.prom"
    link = tmp_path / "metrics.prom"
    link.symlink_to(real)
    check_output_file(link, "--metrics-out")
    write_bytes_atomically(link, b"new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_write_cut_short_through_a_symlink_keeps_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    link = tmp_path / "metrics.prom"
    link.symlink_to(real)

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("slopilot.engine.sim.profile_file.os.fsync", full)
    with pytest.raises(OSError, match="No space"):
        write_bytes_atomically(link, b"new\n")
    assert real.read_text() == "old\n" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.prom", "real.prom"]


def test_the_error_type_is_caught_as_either_kind() -> None:
    assert issubclass(OutputTargetError, OSError)
    assert issubclass(OutputTargetError, ValueError)


# ----------------------------------------------------------------------- the commands

def _refused(argv: list[str], flag: str, path: Path, said: str,
             capsys: pytest.CaptureFixture[str]) -> None:
    before = seen(path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag} {path}" in err and re.search(said, err), err
    assert "Traceback" not in err
    assert seen(path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_simulate_refuses_a_metrics_path_that_is_no_regular_file(
        tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("slopilot.engine.sim.simulator.simulate", never)
    path = tmp_path / "m.prom"
    said = make_special(kind, path)
    _refused(["simulate", "--scenario", "tiny-cpu", "--quiet", "--metrics-out", str(path)],
             "--metrics-out", path, said, capsys)


def test_simulate_refuses_a_replicas_metrics_file_that_is_a_fifo(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("slopilot.engine.sim.simulator.simulate", never)
    fifo = tmp_path / "m-r1.prom"
    make_special("fifo", fifo)
    before = seen(fifo)
    assert main(["simulate", "--scenario", "tiny-cpu", "--quiet", "--replicas", "2",
                 "--metrics-out", str(tmp_path / "m.prom")]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-out {tmp_path / 'm.prom'} (writes {fifo}): is a FIFO" in err, err
    assert seen(fifo) == before


def test_simulate_writes_through_a_symlinked_metrics_file(tmp_path: Path) -> None:
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    link = tmp_path / "m.prom"
    link.symlink_to(real)
    assert main(["simulate", "--scenario", "tiny-cpu", "--duration", "5", "--quiet",
                 "--metrics-out", str(link)]) == 0
    assert link.is_symlink() and "vllm:" in real.read_text()


@pytest.mark.parametrize("flag", ["--out", "--samples-out"])
@pytest.mark.parametrize("kind", KINDS)
def test_calibrate_refuses_an_output_that_is_no_regular_file(
        tmp_path: Path, kind: str, flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    said = make_special(kind, path)
    other = "--samples-out" if flag == "--out" else "--out"
    _refused(["calibrate", "--model", "tiny-random", "--quick", flag, str(path),
              other, str(tmp_path / "other.json")], flag, path, said, capsys)
