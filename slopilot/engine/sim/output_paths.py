"""Checks of the paths a command writes once its work is done, made before it starts.

A simulation, a study or a demo runs for seconds to minutes and writes its file or
report last: a path that cannot take it would throw the finished work away with a
traceback. So the commands check their output paths up front, and a bad one is a
one-line error naming the flag, the path and what to give instead.
"""

from __future__ import annotations

import os
from pathlib import Path


def check_output_file(path: str | Path, flag: str) -> None:
    """``path`` can be written as a file: not a folder, in a folder that exists and
    takes files. ValueError names ``flag``."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name in it, e.g. "
                         f"{target / 'metrics.prom'}")
    folder = target.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: the folder {folder} {what}; create the folder "
                         "or give a path in an existing one")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists()
                                                     and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable; give a path you can write")


def check_output_dir(path: str | Path, flag: str) -> None:
    """``path`` is a folder or can be made one (its missing parents too). ValueError
    names ``flag``."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {path}: is a file, not a folder; give a folder (it is "
                         "created if missing)")
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {path}: {existing} is a file, so no folder can be made "
                         "under it; give another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {existing} is not writable; give a folder you "
                         "can write")
