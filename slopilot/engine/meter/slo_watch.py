"""The SLO the meter judges by: its file, read again whenever it changes on disk.

The operator mounts the deployment's ConfigMap, whose ``slo.json`` is ``spec.slo``; the
kubelet swaps a ConfigMap volume's files in place when the ConfigMap changes, so an edit
of the SLO reaches the meter without a restart of the pod (and of the model in it). The
file is looked at (``os.stat``, no read) at each judged request: a change of its inode,
size or time is read, and a file that cannot be read or parsed keeps the objectives
before it, with one warning per version, so a half-written edit never stops judging.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from slopilot.engine.slo import SLOError, SLOSpec, read_slo_file
from slopilot.engine.verdicts import Verdicts

log = logging.getLogger(__name__)


class SLOWatch:
    """``path``'s objectives, kept in ``verdicts`` (``Verdicts.set_slo``)."""

    def __init__(self, path: Path, verdicts: Verdicts) -> None:
        """SLOError where the file cannot be read or parsed at the start."""
        self.path, self.verdicts = path, verdicts
        self._seen = self._stat()
        verdicts.set_slo(read_slo_file(path))

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def current(self) -> SLOSpec:
        """The objectives now, the file read again if it changed."""
        seen = self._stat()
        if seen != self._seen:
            self._seen = seen
            try:
                self.verdicts.set_slo(read_slo_file(self.path))
                log.info("the SLO in %s changed: judging by it from now on", self.path)
            except SLOError as exc:
                log.warning("the SLO in %s changed and cannot be used (%s); judging by the "
                            "one before", self.path, exc)
        slo = self.verdicts.slo
        assert slo is not None  # set at the start, and only ever replaced by another
        return slo
