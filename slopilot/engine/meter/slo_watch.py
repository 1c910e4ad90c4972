"""The SLO the meter judges by: its file, read again whenever it changes on disk.

The operator mounts the deployment's ConfigMap, whose ``slo.json`` is ``spec.slo``, so an
edit of the SLO reaches the meter without a restart of the pod (``WatchedFile``: looked
at each judged request, a version that cannot be used keeps the objectives before it).
"""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.slo import SLOError, SLOSpec, read_slo_file
from slopilot.engine.verdicts import Verdicts
from slopilot.engine.watched_file import WatchedFile


class SLOWatch:
    """``path``'s objectives, kept in ``verdicts`` (``Verdicts.set_slo``)."""

    def __init__(self, path: Path, verdicts: Verdicts) -> None:
        """SLOError where the file cannot be read or parsed at the start."""
        self.verdicts = verdicts
        self._file = WatchedFile(path, read_slo_file, "SLO", (SLOError,))
        verdicts.set_slo(self._file.current())

    def current(self) -> SLOSpec:
        """The objectives now, the file read again if it changed."""
        slo = self._file.current()
        if slo is not self.verdicts.slo:
            self.verdicts.set_slo(slo)
        return slo
