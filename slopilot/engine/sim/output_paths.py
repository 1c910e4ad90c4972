"""Checks of the paths a command writes once its work is done, made before it starts.

A simulation, a study or a demo runs for seconds to minutes and writes its file or
report last: a path that cannot take it would throw the finished work away with a
traceback. So the commands check their output paths up front, and a bad one is a
one-line error naming the flag, the path and what to give instead.

An output that is one of the command's inputs, or another of its outputs, is refused
too (``check_distinct``): ``simulate --trace t.csv --metrics-out t.csv`` wrote its
metrics over the trace it had read, and ``calibrate --refit s.json --out s.json`` its
profile over the only copy of the timings. Whatever the spelling: a symlink, a hard
link or ``./`` leads to the same file.

An output that exists and is no regular file (a device, a FIFO, a socket, a folder) is
refused too (``check_output_file``, ``output_target``): the files are written to a
temporary file and renamed over the path, so ``--out /dev/full`` made the machine's
/dev/full a text file, and a FIFO a reader waited on a plain file. A symlink is written
through: the file it leads to is replaced and the link stays a link (a metrics file
linked into an exporter's folder keeps feeding it); where it leads must be a regular
file or a new one in a folder that exists.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NamedFile:
    """A file a command reads or writes, and how its user named it: ``flag value``.

    ``path`` is the file itself where it is not ``value``: one a folder flag's command
    writes there (``--report-dir r``'s ``r/report.md``), or one a named thing reads (a
    checkpoint's ``config.json``, a scenario's trace). ``folder``: ``value`` names a
    folder (the fix asks for another folder). ``tree``: ``path`` is a folder the command
    writes any file into, so every input inside it is at risk."""

    flag: str
    value: str
    path: Path | None = None
    folder: bool = False
    tree: bool = False

    @property
    def file(self) -> Path:
        return Path(self.value) if self.path is None else self.path

    def said(self, verb: str) -> str:
        own = f"{self.flag} {self.value}"
        return own if self.path is None else f"{own} ({verb} {self.path})"


def check_distinct(outputs: Iterable[NamedFile], inputs: Iterable[NamedFile] = ()) -> None:
    """Refuse an output that is the same file as an input, or as an earlier output (or,
    for a ``tree`` output, holds an input). ValueError names both flags and the fix.

    An input that does not exist is no clash (a scenario given by name, a trace the
    command will refuse as missing): nothing of it can be lost."""
    written: list[NamedFile] = []
    read = [i for i in inputs if _exists(i.file)]
    for out in outputs:
        for inp in read:
            if out.tree and _inside(inp.file, out.file):
                raise ValueError(
                    f"{inp.said('reads')} lies in {out.said('writes under')}, which the "
                    f"command writes its files into; give {out.flag} another "
                    f"{_what(out)} (or move the file out)")
            if not out.tree and same_file(out.file, inp.file):
                raise ValueError(
                    f"{out.said('writes')} is the same file as {inp.said('reads')}: "
                    f"writing it would destroy that input; give {out.flag} another "
                    f"{_what(out)}")
        for earlier in written:
            if same_file(out.file, earlier.file):
                raise ValueError(
                    f"{out.said('writes')} is the same file as {earlier.said('writes')}: "
                    "one would overwrite the other; give each its own path")
        written.append(out)


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: ``os.path.samefile`` where both exist (a
    hard link is one), else their resolved paths (symlinks followed) are equal."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist yet: an output
        return _resolved(a) == _resolved(b)
    except ValueError:  # a NUL in a path: no file, refused where it is opened
        return False


def _inside(path: Path, folder: Path) -> bool:
    return Path(_resolved(path)).is_relative_to(_resolved(folder))


def _resolved(path: Path) -> str:
    try:
        return os.path.normcase(os.path.realpath(path))
    except ValueError:
        return str(path)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _what(out: NamedFile) -> str:
    return "folder" if out.folder or out.tree else "path"


REGULAR_FIX = "give a regular file's path"
REPLACED = " (writing would replace it)"


class OutputTargetError(OSError, ValueError):
    """A path an output would replace that is no regular file. Both an OSError (a write
    that failed) and a ValueError (a bad flag value), for the callers that catch
    either; the message is whole, naming the path, what it is and the fix."""

    def __str__(self) -> str:
        return str(self.args[0])


def output_target(path: Path) -> Path:
    """The file a write to ``path`` replaces: ``path``, or where its symlinks lead.
    OutputTargetError where that exists and is no regular file, or is a link into a
    folder that does not exist."""
    problem, real = _target_problem(path)
    if problem is not None:
        raise OutputTargetError(f"{path}: {problem}{REPLACED}; {REGULAR_FIX}")
    return real


def output_problem(path: Path) -> str | None:
    """What stands at ``path`` that no output may be written to ("is a FIFO (named
    pipe), not a regular file"), for a file opened in place (SQLite's); None if none."""
    return _target_problem(path)[0]


def check_output_target(out: NamedFile) -> None:
    """``output_target`` before the work: ValueError naming ``out``'s flag."""
    problem, _ = _target_problem(out.file)
    if problem is not None:
        fix = ("remove it or give another folder" if out.folder or out.tree
               else REGULAR_FIX)
        raise ValueError(f"{out.said('writes')}: {problem}{REPLACED}; {fix}")


def _target_problem(path: Path) -> tuple[str | None, Path]:
    linked = False
    try:
        real = Path(os.path.realpath(path))
        linked = path.is_symlink()
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):  # none yet, or a file for a folder:
        # nothing to replace; the folder checks after this one name it
        if linked and not real.parent.is_dir():
            return (f"is a symlink to {real}, in a folder that does not exist", real)
        return None, real
    except OSError as exc:  # a loop of links, a folder that cannot be searched
        return f"cannot be followed: {exc.strerror or exc}", path
    except ValueError:  # a NUL in a path: refused where it is opened
        return None, path
    kind = _kind(st.st_mode)
    if kind is None:
        return None, real
    said = f"is a symlink to {real}, which is {kind}" if linked else f"is {kind}"
    return f"{said}, not a regular file", real


def _kind(mode: int) -> str | None:
    for test, kind in ((stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "no regular file"


def check_output_file(path: str | Path, flag: str) -> None:
    """``path`` can be written as a file: a regular file or none yet (a symlink to
    one), in a folder that exists and takes files. ValueError names ``flag``."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name in it, e.g. "
                         f"{target / 'metrics.prom'}")
    check_output_target(NamedFile(flag, str(path)))
    folder = target.parent
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: the folder {folder} {what}; create the folder "
                         "or give a path in an existing one")
    # Through a symlink the new file is made in the folder of the file it leads to.
    written_in = Path(_resolved(target)).parent
    if not os.access(written_in, os.W_OK | os.X_OK) or (target.exists()
                                                        and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable; give a path you can write")


def check_output_dir(path: str | Path, flag: str, files: Iterable[Path] = ()) -> None:
    """``path`` is a folder or can be made one (its missing parents too), and none of
    the ``files`` the command writes in it is there as something other than a regular
    file. ValueError names ``flag``."""
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
    for file in files:
        check_output_target(NamedFile(flag, str(path), file, folder=True))


def make_output_dir(path: str | Path, flag: str) -> Path:
    """``check_output_dir``, then the folder made now, before the work: a special or
    read-only file system (/proc, whose mode the access check passes as root) refuses
    only the mkdir itself. ValueError names ``flag``."""
    check_output_dir(path, flag)
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot create it: {exc.strerror or exc}; give "
                         "a folder you can write on a disk") from None
    return target
