"""A file a user named, read whole: a regular file only, and never more than a bound.

A profile, a scenario, a trace or a calibration recording is read whole into memory, and
each reader bounded it by ``stat().st_size``, which is no bound: ``/dev/zero``, a link to
it, and many /proc files say 0, so ``--profile /dev/zero`` read until MemoryError; a
named pipe (FIFO) says 0 too and its read waited for a writer for ever. Here what the
path resolves to (links followed) must be a regular file, checked before it is opened and
again on the open descriptor (it may have been swapped in between), and the read stops
one byte past the bound whatever the size said.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path is a device, a pipe or a socket: nothing a reader of files should read."""


class FileTooLarge(OSError):
    """The file holds more than the reader's bound; ``size`` when the file says it."""

    def __init__(self, limit: int, size: int | None) -> None:
        said = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
        super().__init__(errno.EFBIG, f"{said}, past the {limit:,} bytes read")
        self.limit, self.size = limit, size


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` if it holds at most ``limit``.

    Raises ``NotARegularFile``, ``IsADirectoryError``, ``FileTooLarge`` or the ``OSError``
    that opening it raised (``read_errors.unreadable`` words each of them)."""
    _check_kind(os.stat(path).st_mode, path)
    # Non-blocking: a FIFO put in its place since would otherwise block the open itself.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        _check_kind(st.st_mode, path)
        if st.st_size > limit:
            raise FileTooLarge(limit, st.st_size)
        # The size it says, and a byte more to see whether that was all: one buffer of
        # the file's size (read(limit + 1) allocates the whole bound, a GiB for a trace).
        data = fh.read(st.st_size + 1)
        if len(data) <= st.st_size:
            return data
        # It grew, or its size said less than it holds (/proc files say 0): read on, in
        # pieces, to one byte past the bound.
        chunks, held = [data], len(data)
        while held <= limit and (chunk := fh.read(min(_CHUNK, limit + 1 - held))):
            chunks.append(chunk)
            held += len(chunk)
    if held > limit:
        raise FileTooLarge(limit, None)
    return b"".join(chunks)


_CHUNK = 1 << 16


_KINDS = ((stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISSOCK, "a socket"))


def _check_kind(mode: int, path: Path) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise NotARegularFile(errno.EINVAL, f"is {kind}, not a regular file: name the file "
                          "itself (a copy of what it gives, if need be)", str(path))
