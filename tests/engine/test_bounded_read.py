"""``read_bounded``: a regular file only, never more than the bound, never a wait.

``stat().st_size`` was the bound: ``/dev/zero`` says 0 and was read to a MemoryError, a
named pipe says 0 and its read waited for a writer for ever.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slopilot.engine.bounded_read import FileTooLarge, NotARegularFile, read_bounded
from slopilot.engine.read_errors import unreadable


def test_a_regular_file_within_the_bound_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, 10) == b"x" * 10
    with pytest.raises(FileTooLarge) as err:
        read_bounded(path, 9)
    assert err.value.size == 10 and "10 bytes, past the 9 bytes read" in unreadable(err.value)


def test_a_file_whose_size_says_less_than_it_holds_is_cut_at_the_bound() -> None:
    maps = Path("/proc/self/maps")  # st_size 0, a few KiB of text
    assert maps.stat().st_size == 0
    with pytest.raises(FileTooLarge) as err:
        read_bounded(maps, 16)
    assert err.value.size is None and "more than 16 bytes" in unreadable(err.value)


@pytest.mark.timeout(30)  # the read of a pipe waited for a writer for ever
@pytest.mark.parametrize("kind", ["fifo", "zero", "link to zero", "link to fifo"])
def test_a_device_or_a_pipe_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = {"fifo": fifo, "zero": Path("/dev/zero"), "link to zero": Path("/dev/zero"),
              "link to fifo": fifo}[kind]
    path = target
    if kind.startswith("link"):
        path = tmp_path / "link.yaml"
        path.symlink_to(target)
    with pytest.raises(NotARegularFile) as err:
        read_bounded(path, 1 << 20)
    what = "named pipe (FIFO)" if "fifo" in kind else "character device"
    assert f"is a {what}, not a regular file" in unreadable(err.value)


def test_a_folder_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as err:
        read_bounded(tmp_path, 10)
    assert unreadable(err.value) == "is a folder, not a file"
