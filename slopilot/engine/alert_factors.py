"""The multiples of each SLO target a deployment's alerts judge: its ``alerts.json``.

The rules judge each class's TTFT and TBT P99 against its target times each factor of
``spec.alerts`` (``alert_table.RuleOptions``), and read a threshold exactly only where
the histograms have an edge on it (``rules.judged_rates``). ``slopilot serve`` and
``slopilot meter`` make those thresholds edges (``latency_buckets.slo_edges``), so they
learn the factors as they learn the SLO: from the operator's ConfigMap, in a file of
their own beside ``slo.json``, never keys of it, since an image from before this file
refuses an SLO field it does not know and would not start; it ignores a file and an
environment variable it never reads, and reads the factors' thresholds judged, as before.

No file (a process started by hand, an older operator): the seeds' factors, the
``RuleOptions`` defaults, which were the only edges before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slopilot.engine.json_keys import JsonFileError, read_json_file

ALERTS_FILE_ENV = "SLOPILOT_ALERTS_FILE"
"""Where ``slopilot serve`` and ``slopilot meter`` read the alert factors; unset, the
defaults. An environment variable, not a flag: an image too old to know it ignores it
rather than refusing to start."""

ALERTS_FILE_BYTES = 1 << 12
"""The most of the file read: the operator writes three numbers."""

MAX_FACTORS = 3
"""The most factors one figure's thresholds take, the SLO itself among them: TTFT's
target, warning and retune (TBT's target and scale: two)."""

FIELDS = {"ttft_warning": "ttftWarningFactor", "ttft_retune": "ttftRetuneFactor",
          "tbt_scale": "tbtScaleFactor"}
"""``AlertFactors`` field -> its ``spec.alerts`` name (the file's key)."""


class AlertFactorsError(ValueError):
    """The alerts file cannot be read, or a factor in it is no multiple of an SLO;
    ``field`` names the factor (``ttftRetuneFactor``), None for the file as a whole."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class AlertFactors:
    """``spec.alerts``' factors, as the CR names them: the TTFT P99 warns above
    ``ttft_warning`` x its target and retunes above ``ttft_retune`` x; the TBT P99 scales
    above ``tbt_scale`` x. The defaults are ``RuleOptions``'."""

    ttft_warning: float = 1.0
    ttft_retune: float = 2.0
    tbt_scale: float = 2.0

    def __post_init__(self) -> None:
        for name, camel in FIELDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 1:
                raise AlertFactorsError(
                    f"{camel}={value!r}: expected a multiple of the SLO >= 1 (a finite "
                    "number, as spec.alerts holds it)", camel)
        if self.ttft_warning > self.ttft_retune:
            raise AlertFactorsError(
                f"ttftWarningFactor={self.ttft_warning!r} exceeds "
                f"ttftRetuneFactor={self.ttft_retune!r}: the warning comes before the "
                "retune, as spec.alerts demands", "ttftWarningFactor")

    def factors(self, *, ttft: bool) -> tuple[float, ...]:
        """The multiples of a class's TTFT (``ttft``) or TBT target that some row or
        figure judges: the target itself (a trial's verdict, the goodput, the sustained
        rows) and the alerts'; at most ``MAX_FACTORS``."""
        extra = (self.ttft_warning, self.ttft_retune) if ttft else (self.tbt_scale,)
        return tuple(sorted({1.0, *map(float, extra)}))

    def to_dict(self) -> dict[str, float]:
        """The file's content, spelled as ``spec.alerts`` spells it."""
        return {camel: float(getattr(self, name)) for name, camel in FIELDS.items()}

    @classmethod
    def from_dict(cls, data: Any) -> AlertFactors:
        """The factors in ``data``; one not there: its default. Keys it does not know
        are left alone: a newer operator's file with more factors than this image knows
        is read (those others read judged, as before they were edges)."""
        if not isinstance(data, Mapping):
            raise AlertFactorsError(f"expected a mapping of {', '.join(FIELDS.values())} "
                                    f"to numbers, got {type(data).__name__}")
        return cls(**{name: data[camel] for name, camel in FIELDS.items() if camel in data})


DEFAULT_FACTORS = AlertFactors()


def read_alert_factors(path: Path) -> AlertFactors:
    """The factors in the JSON file ``path``; AlertFactorsError naming the file (and the
    factor) where it cannot be read, is not JSON, or holds no multiples of an SLO."""
    try:
        data = read_json_file(path, ALERTS_FILE_BYTES)
    except JsonFileError as exc:
        raise AlertFactorsError(str(exc)) from None
    try:
        return AlertFactors.from_dict(data)
    except AlertFactorsError as exc:
        raise AlertFactorsError(f"{path}: {exc}", exc.field) from None


def alert_factors_from_env(environ: Mapping[str, str] = os.environ) -> AlertFactors:
    """The factors of the file ``ALERTS_FILE_ENV`` names, the defaults where it names
    none; AlertFactorsError naming the variable where the file cannot be used."""
    path = environ.get(ALERTS_FILE_ENV)
    if not path:
        return DEFAULT_FACTORS
    try:
        return read_alert_factors(Path(path))
    except AlertFactorsError as exc:
        raise AlertFactorsError(f"${ALERTS_FILE_ENV} {exc}", exc.field) from None
