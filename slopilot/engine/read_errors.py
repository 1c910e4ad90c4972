"""What keeps a file a user named from being read, in words: Python's own text
(``[Errno 21] Is a directory: 'x'``) names the file a second time and reads as a crash."""

from __future__ import annotations

from slopilot.engine.bounded_read import FileTooLarge, NotARegularFile


def unreadable(exc: OSError) -> str:
    """Why ``exc`` stopped the read, to follow ``FLAG PATH: `` in a message."""
    if isinstance(exc, (NotARegularFile, FileTooLarge)):  # our own words already
        return str(exc.strerror)
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a folder, not a file"
    if isinstance(exc, PermissionError):
        return "this user may not read it (permission denied)"
    return f"cannot read it: {exc.strerror or exc}"
