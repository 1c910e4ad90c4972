"""A latency row whose threshold no P99 can pass is said at admission (a SpecWarning)."""

from __future__ import annotations

from slopilot.operator.spec import parse_spec
from tests.operator.test_alert_rules import admitted, body


def _warnings(**spec: object) -> list[str]:
    return [w for w in parse_spec(admitted(body(**spec))).warnings if "last finite edge" in w]


def test_a_ttft_threshold_past_the_last_edge_is_warned_naming_field_value_and_fix() -> None:
    # 2 x 200 s = 400 s, past the built-in histograms' last finite edge of 300 s: the P99
    # reads at most 300 s and the critical row never fires (a review's promtool run).
    (warning,) = _warnings(slo={"profile": "standard",
                                "classes": {"p1": {"ttftP99Ms": 200000}}})
    assert warning.startswith("spec.alerts.ttftRetuneFactor=2 x "
                              "spec.slo.classes.p1.ttftP99Ms=200000 is 400 s")
    assert "300 s" in warning and "SlopilotTTFTP99High (critical)" in warning
    assert "lower spec.alerts.ttftRetuneFactor or the SLO" in warning


def test_the_warning_and_the_tbt_rows_too_and_none_below_the_edge() -> None:
    warned = _warnings(slo={"profile": "standard",
                            "classes": {"p1": {"ttftP99Ms": 300000, "tbtP99Ms": 60000}}},
                       alerts={"tbtScaleFactor": 5})
    assert [w.split("=")[0] for w in warned] == [
        "spec.alerts.ttftWarningFactor", "spec.alerts.ttftRetuneFactor",
        "spec.alerts.tbtScaleFactor"]
    assert _warnings() == []
    # Just under the edge: 2 x 149.999 s = 299.998 s can still fire.
    assert _warnings(slo={"profile": "standard",
                          "classes": {"p1": {"ttftP99Ms": 149999}}}) == []


def test_vllm_reads_its_own_histogram_up_to_2560_s() -> None:
    assert _warnings(backend="vllm", slo={"profile": "standard",
                                          "classes": {"p1": {"ttftP99Ms": 200000}}}) == []
    (warning,) = _warnings(backend="vllm", alerts={"ttftRetuneFactor": 5},
                           slo={"profile": "standard", "classes": {"p1": {"ttftP99Ms": 600000}}})
    assert "3000 s, at or past 2560 s" in warning
