"""An alert's advice names only the knobs its backend applies."""

from __future__ import annotations

from tests.operator.test_alert_rules import admitted, body, rule_of


def _preemption(backend: str) -> str:
    alerts = [r for g in rule_of(admitted(body(backend=backend)))["groups"]
              for r in g["rules"] if "alert" in r]
    return next(a for a in alerts if a["alert"] == "SlopilotPreemptionStorm")[
        "annotations"]["description"]


def test_a_preemption_storm_on_vllm_names_only_knobs_vllm_applies() -> None:
    vllm = _preemption("vllm")
    # vLLM takes no preemption threshold nor KV watermark (knobs.VLLM_APPLIES).
    assert "retune the preemption thresholds" not in vllm, vllm
    assert "retune max_num_seqs or token_budget" in vllm and "KV cache more GPU memory" in vllm
    assert "retune the preemption thresholds or the KV watermark" in _preemption("builtin")
