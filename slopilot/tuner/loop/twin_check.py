"""Is the twin right about this deployment? Checked on the last window before it is trusted.

Before a warm start or a capacity plan is taken from the simulator, ``check_twin``
compares the twin with the last measured window, through the ports:

- **step time**: the deployment's ``slopilot_iteration_*`` increases (``IterationSource``)
  against the profile's prediction for the same shapes (``engine/sim/correction.py``);
- **correction** (``ControllerSettings.twin_correction``): a rescale or a refit of the
  profile, fitted on the window's first half and judged on its second half, so the
  error that decides trust is measured on iterations the correction did not see; the
  profile the decisions then use is corrected on the whole window;
- **latency**: the corrected twin simulates the measured workload at the running config
  and replica count for one window (through ``ports.TwinSimulator``: the operator's
  simulator processes, ``twin_predict.py``); its TTFT and TBT p99 per class against the
  measured ones (the evaluator's window). A window the simulator cannot take (busy with
  other deployments, past its time limit or memory cap, its process killed:
  ``ports.NO_ANSWER``) leaves the p99s unchecked, said in the reason; the step times
  still decide.

The twin is trusted while the corrected step-time error is within ``twin_max_error``
(and, when set, the P0 p99 errors within ``twin_max_latency_error``). The p99s of one
short window carry the workload's sampling noise (the twin draws its own arrivals at
the measured rate), so by default they are reported and do not decide.
A twin on the datasheet roofline (no calibrated profile: the operator's default) is not
linear in the summed features, so it is checked in its calibrated form
(``calibrate/datasheet.py``: the roofline fitted on the calibration grid) and trusted by
the same bound. Where the form is within the bound as it is, the decisions keep the
roofline itself; where only a correction brings it within, they use the corrected form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.alert_factors import AlertFactors
from slopilot.engine.calibrate.datasheet import datasheet_profile
from slopilot.engine.sim.correction import WindowSample, describe_factors, factors, twin_error
from slopilot.engine.sim.correction import corrected as corrected_profile
from slopilot.engine.sim.profile_file import CostProfile
from slopilot.engine.sim.scenario import Scenario
from slopilot.engine.sim.twin import with_profile
from slopilot.engine.window_summary import WindowSummary
from slopilot.tuner.loop.ports import NO_ANSWER, TwinSimulator, WindowEvaluator
from slopilot.tuner.loop.settings import ControllerSettings, TwinCorrection
from slopilot.tuner.loop.twin_predict import ClassP99, InProcessTwin
from slopilot.tuner.study.evaluator import WindowRejected


@dataclass(frozen=True)
class ClassError:
    """One class's p99s over the window: the twin's prediction and the measurement."""

    priority: str
    ttft_p99_predicted_ms: float | None
    ttft_p99_measured_ms: float | None
    tbt_p99_predicted_ms: float | None
    tbt_p99_measured_ms: float | None

    @property
    def ttft_error(self) -> float | None:
        return _rel(self.ttft_p99_predicted_ms, self.ttft_p99_measured_ms)

    @property
    def tbt_error(self) -> float | None:
        return _rel(self.tbt_p99_predicted_ms, self.tbt_p99_measured_ms)


@dataclass(frozen=True)
class TwinCheck:
    """The twin against the window ``[at - window_s, at)``; see the module docstring."""

    at: float
    window_s: float
    step_error: float | None
    """(predicted - measured) / measured step time of the window, the profile as given."""
    corrected_error: float | None
    """The same after ``correction``, on iterations the correction was not fitted on."""
    correction: TwinCorrection
    classes: tuple[ClassError, ...]
    trusted: bool
    reason: str
    profile: CostProfile | None = field(default=None, compare=False)
    """The corrected profile the decisions use (None: the scenario's twin as it is)."""
    factors: Mapping[str, float] = field(default_factory=dict)
    """What the correction learned: per feature, how many times the checked profile's cost
    ``profile`` puts on it (empty when the decisions use the twin uncorrected). Shown
    because the correction carries what it learned on these windows into every load the
    twin is asked about, a busier one too."""

    def p0(self) -> ClassError | None:
        return next((c for c in self.classes if c.priority == "p0"), None)

    def latency_optimism(self) -> float:
        """How far below the measured P0 p99s (TTFT, TBT) the twin's came out, as a
        fraction of the measured (0 when it was not below)."""
        p0 = self.p0()
        errors = [] if p0 is None else [e for e in (p0.ttft_error, p0.tbt_error)
                                        if e is not None]
        return max(0.0, -min(errors, default=0.0))

    def line(self) -> str:
        parts = [f"step {_pct(self.step_error)}"]
        if self.correction is not TwinCorrection.NONE:
            parts[0] += f" -> {_pct(self.corrected_error)} after {self.correction.value}"
        if self.factors:
            parts.append(f"learned {describe_factors(self.factors)}")
        p0 = self.p0()
        if p0 is not None:
            parts.append(f"P0 TTFT p99 {_ms(p0.ttft_p99_predicted_ms)} predicted vs "
                         f"{_ms(p0.ttft_p99_measured_ms)} measured, TBT p99 "
                         f"{_ms(p0.tbt_p99_predicted_ms)} vs {_ms(p0.tbt_p99_measured_ms)}")
        return f"twin {'trusted' if self.trusted else 'untrusted'} ({self.reason}): " \
            + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, camelCase: ``status.twin`` of the LLMDeployment."""
        return {
            "checkedAt": self.at, "windowS": self.window_s, "trusted": self.trusted,
            "reason": self.reason, "correction": self.correction.value,
            "stepTimeError": _round(self.step_error),
            "correctedStepTimeError": _round(self.corrected_error),
            "correctionFactors": {f: round(v, 4) for f, v in self.factors.items()},
            "classes": {c.priority: {
                "ttftP99PredictedMs": _round(c.ttft_p99_predicted_ms),
                "ttftP99MeasuredMs": _round(c.ttft_p99_measured_ms),
                "tbtP99PredictedMs": _round(c.tbt_p99_predicted_ms),
                "tbtP99MeasuredMs": _round(c.tbt_p99_measured_ms),
                "ttftP99Error": _round(c.ttft_error), "tbtP99Error": _round(c.tbt_error)}
                for c in self.classes}}


def check_twin(settings: ControllerSettings, samples: tuple[Sequence[WindowSample],
                                                            Sequence[WindowSample]],
               scenario: Scenario, config: Mapping[str, Any], replicas: int,
               measured: WindowSummary | None, *, at: float, window_s: float,
               history: Sequence[WindowSample] = (), seed: int = 0,
               simulator: TwinSimulator | None = None) -> TwinCheck:
    """Check ``scenario``'s twin on a window given as its two halves' iteration samples
    and its measured summary (None when the window did not count). ``history``: earlier
    windows' samples, fitted on too (a quiet window says little about attention at the
    load a scale-down would bring; the busy windows before it do). ``simulator``: where
    the window is simulated (None: in this process)."""
    first, second = samples
    whole = [*first, *second]
    datasheet = scenario.profile is None
    profile = datasheet_profile(scenario) if datasheet else scenario.profile
    mode = settings.twin_correction
    step = corrected = None
    used: CostProfile | None = None
    failed = None
    if profile is not None and sum(s.seconds for s in whole) > 0:
        step = twin_error(profile, whole)
        try:
            used = _corrected(profile, [*history, *whole], mode)
            if mode is TwinCorrection.NONE:
                corrected = step
            elif sum(s.seconds for s in first) > 0 and sum(s.seconds for s in second) > 0:
                corrected = twin_error(_corrected(profile, [*history, *first], mode), second)
            else:  # one half idle: judged in sample, which flatters the correction
                corrected = twin_error(used, whole)
        except ValueError as exc:  # a refit that cannot be solved: the twin as it is
            failed, used, corrected = f"{mode.value} failed ({exc})", None, step
    if datasheet and step is not None and abs(step) <= settings.twin_max_error:
        used = None  # the roofline is right here: it, not its fitted form, decides
    twin = with_profile(scenario, used) if used is not None else scenario
    classes: tuple[ClassError, ...] = ()
    unsimulated = None
    if measured is not None:
        classes, unsimulated = _latency(simulator or InProcessTwin(), twin, config,
                                        replicas, window_s, seed, measured,
                                        settings.alert_factors)
    trusted, reason = _verdict(settings, step, corrected, classes, unsimulated)
    if datasheet:
        reason = f"datasheet roofline, checked in its calibrated form: {reason}"
    if failed is not None:
        reason = f"{failed}; {reason}"
    learned = factors(profile, used) if profile is not None and used is not None \
        and used is not profile else {}
    return TwinCheck(at, window_s, step, corrected, mode, classes, trusted, reason, used,
                     learned)


def _latency(simulator: TwinSimulator, twin: Scenario, config: Mapping[str, Any],
             replicas: int, window_s: float, seed: int, measured: WindowSummary,
             factors: AlertFactors) -> tuple[tuple[ClassError, ...], str | None]:
    """Each class's predicted p99s against the measured, or why there are none."""
    bucketed = measured.window is not None and measured.window.bucketed
    try:
        predicted = simulator.p99s(twin, config, replicas, window_s, seed=seed,
                                   bucketed=bucketed, factors=factors)
    except NO_ANSWER as exc:  # the step times still decide
        return (), f"p99s not simulated: {exc or type(exc).__name__}"
    return tuple(_class_error(p, measured) for p in predicted), None


def _corrected(profile: CostProfile, samples: Sequence[WindowSample],
               mode: TwinCorrection) -> CostProfile:
    if mode is TwinCorrection.NONE:
        return profile
    return corrected_profile(profile, samples, refit_first=mode is TwinCorrection.REFIT)


def _verdict(settings: ControllerSettings, step: float | None, corrected: float | None,
             classes: Sequence[ClassError], unsimulated: str | None) -> tuple[bool, str]:
    trusted, reason = _step_verdict(settings, corrected, classes, unsimulated)
    return trusted, reason if unsimulated is None else f"{reason}; {unsimulated}"


def _step_verdict(settings: ControllerSettings, corrected: float | None,
                  classes: Sequence[ClassError], unsimulated: str | None
                  ) -> tuple[bool, str]:
    if corrected is None:
        return True, "no iterations in the window: nothing to check"
    bound = settings.twin_max_error
    if abs(corrected) > bound:
        how = "uncorrected" if settings.twin_correction is TwinCorrection.NONE \
            else f"after {settings.twin_correction.value}"
        return False, f"step-time error {_pct(corrected)} {how} exceeds {bound:.0%}"
    latency_bound = settings.twin_max_latency_error
    if latency_bound is not None and unsimulated is not None:
        # Asked for, the p99s' agreement is no given: unchecked, they do not agree.
        return False, f"P0 p99s not checked against the bound {latency_bound:.0%}"
    p0 = next((c for c in classes if c.priority == "p0"), None)
    if latency_bound is not None and p0 is not None:
        for name, err in (("TTFT", p0.ttft_error), ("TBT", p0.tbt_error)):
            if err is not None and abs(err) > latency_bound:
                return False, f"P0 {name} p99 error {_pct(err)} exceeds {latency_bound:.0%}"
    return True, f"step-time error {_pct(corrected)} within {bound:.0%}"


def _class_error(predicted: ClassP99, measured: WindowSummary) -> ClassError:
    m = measured.classes[predicted.priority]
    return ClassError(predicted.priority.label, predicted.ttft_ms, m.ttft_p99_ms,
                      predicted.tbt_ms, m.tbt_p99_ms)


def measured_window(evaluator: WindowEvaluator, start: float, end: float
                    ) -> WindowSummary | None:
    """The evaluator's figures of the window; None when it does not count."""
    try:
        return evaluator.measure(start, end, canary=False)
    except WindowRejected:
        return None


def _rel(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured <= 0:
        return None
    return (predicted - measured) / measured


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.0%}"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f} ms"
