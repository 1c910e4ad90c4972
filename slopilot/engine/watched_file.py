"""A file read again whenever it changes on disk, keeping the last good version.

The operator mounts a deployment's ConfigMap as a directory; the kubelet swaps a
ConfigMap volume's files in place when the ConfigMap changes, so an edit reaches a running
process without a restart of its pod (and of the model in it). The file is looked at
(``os.stat``, no read) at each ``current()``: a change of its inode, size or time is read
and parsed, and a version that cannot be read or parsed keeps the one before, with one
warning per version, so a half-written edit never stops what depends on the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

Stamp = tuple[int, int, int] | None
"""(inode, size, mtime_ns), or None for a file that is not there."""


class WatchedFile(Generic[T]):
    """``parse(path)``, again whenever the file changes; ``what`` names it in the log."""

    def __init__(self, path: Path, parse: Callable[[Path], T], what: str,
                 errors: tuple[type[Exception], ...] = (ValueError,), *,
                 fix: str = "", logger: logging.Logger = log) -> None:
        """``errors``: what ``parse`` raises for a file it cannot use; raised here, at the
        start, where there is no version before it to keep. ``fix``: what the warning of
        an unusable version tells its reader to do; ``logger``: the user's, so the warning
        is filed where its reader looks."""
        self.path, self._parse, self.what, self._errors = path, parse, what, errors
        self._fix, self._log = fix, logger
        self._seen = self._stat()
        self._value = parse(path)
        self.changes = 0
        """How many new versions were taken since the start."""

    def _stat(self) -> Stamp:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> T:
        """The file's contents now, parsed; read again only if it changed."""
        seen = self._stat()
        if seen != self._seen:
            self._seen = seen
            try:
                self._value = self._parse(self.path)
            except self._errors as exc:
                self._log.warning("the %s in %s changed and cannot be used (%s); keeping the "
                                  "one before%s", self.what, self.path, exc,
                                  f"; {self._fix}" if self._fix else "")
            else:
                self.changes += 1
                self._log.info("the %s in %s changed: using it from now on", self.what,
                               self.path)
        return self._value
