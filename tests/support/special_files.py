"""Things at an output's path that are no regular file, made inside a test's own folder
(never the machine's /dev): a character device (as root only, with /dev/null's numbers),
a FIFO, a socket, a folder, and symlinks to them or into a missing folder."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Seen:
    """What stands at a path, to show that a refusal left it as it was."""

    mode: int
    inode: int
    link: str | None


def seen(path: Path) -> Seen:
    st = os.lstat(path)
    return Seen(st.st_mode, st.st_ino, os.readlink(path) if path.is_symlink() else None)


def _device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root")


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
    except OSError as exc:  # a path longer than sun_path takes
        pytest.skip(f"no socket at {path}: {exc}")
    finally:
        sock.close()  # the socket file stays


def _linked(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def link(path: Path) -> None:
        real = path.with_name(path.name + ".real")
        make(real)
        path.symlink_to(real)
    return link


def _dangling_into_missing_folder(path: Path) -> None:
    path.symlink_to(path.parent / "no-such-folder" / path.name)


MAKERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "device": (_device, r"is a character device"),
    "fifo": (os.mkfifo, r"is a FIFO \(named pipe\)"),
    "socket": (_socket, r"is a socket"),
    "folder": (lambda p: p.mkdir(), r"is a (folder|directory)"),
    "link-to-device": (_linked(_device), r"is a symlink to .*, which is a character device"),
    "link-to-fifo": (_linked(os.mkfifo), r"is a symlink to .*, which is a FIFO"),
    "dangling-link-into-missing-folder": (
        _dangling_into_missing_folder,
        r"is a symlink to .*no-such-folder.*, in a folder that does not exist"),
}
"""Each case's maker and a pattern of the refusal that says what stands there."""


def make_special(kind: str, path: Path) -> str:
    """Make ``kind`` at ``path``; return the pattern its refusal matches."""
    make, said = MAKERS[kind]
    make(path)
    return said
