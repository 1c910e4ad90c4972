"""serving_report's arithmetic on made-up rounds: the bfloat16 worker is judged against
a roofline in its own dtype, and its text against float32's."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from slopilot.engine.executors.llama import LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serving_report as sr

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def _ceilings(dtype: str, rate: float) -> dict[str, object]:
    shapes = [{"name": g.name, "m": g.m, "k": g.k, "n": g.n, "count": g.count,
               "streamed": rate, "in_cache": rate, "kernel": "k"}
              for g in sr.decode_step_cost(CFG, 2, 10.0).gemms]
    return {"dtype": dtype, "threads": 2, "stream_bytes_per_s": 1e12, "shapes": shapes}


def _run(tok_s: float, step_ms: float, text: list[int]) -> dict[str, object]:
    return {"tokens_per_s": tok_s, "decode_step_ms": step_ms, "ttft_p99_ms": 1.0,
            "tbt_p99_ms": 1.0, "token_ids": {"r0": text, "r1": [1, 2]}}


def test_the_bf16_row_has_its_own_roofline_and_is_read_against_float32_text() -> None:
    report = sr.Report(requests=2, max_tokens=4, cpu="c", flags=(), load_at_start=0.0,
                       config=CFG, context=10.0)
    report.add_round(sr.OURS, 0, _run(100.0, 2.0, [5, 6]))
    report.add_round(sr.BF16, 0, _run(150.0, 1.0, [5, 7]))
    report.add_round(sr.PEER, 0, _run(80.0, 2.5, [5, 6]))
    report.ceilings.append(_ceilings("float32", 1e9))
    report.round_ceilings[sr.OURS] = [_ceilings("float32", 1e9)]
    # bfloat16 kernels twice as fast: the same step time is half as good a fraction.
    report.round_ceilings[sr.BF16] = [_ceilings("bfloat16", 2e9)]
    fields = report.fields()
    flops = sr.decode_step_cost(CFG, 2, 10.0).flops
    assert fields["decode_roofline_frac"] == pytest.approx(flops / 1e9 / 2e-3)
    assert fields["bf16_decode_roofline_frac"] == pytest.approx(flops / 2e9 / 1e-3)
    assert fields["bf16_gain"] == pytest.approx(1.5)
    assert fields["bf16_vs_vllm_ratio"] == pytest.approx(150 / 80)
    assert fields["bf16_same_text_ratio"] == 0.5
    assert fields["vllm_same_text_ratio"] == 1.0


def _table_row(text: str, name: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def _result(text: str) -> dict[str, float]:
    line = next(line for line in text.splitlines() if line.startswith("RESULT "))
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


def test_the_table_and_result_agree_on_the_median_of_an_even_number_of_rounds() -> None:
    # Two rounds have no middle one: the median is the mean of both, in the table's row
    # as on the RESULT line (the table once showed the upper round's figures).
    report = sr.Report(requests=2, max_tokens=4, cpu="c", flags=(), load_at_start=0.0)
    report.add_round(sr.OURS, 0, _run(100.0, 2.0, [5, 6]))
    report.add_round(sr.OURS, 1, _run(120.0, 3.0, [5, 7]))
    out = io.StringIO()
    report.print(out)
    row, result = _table_row(out.getvalue(), sr.OURS), _result(out.getvalue())
    assert result["slopilot_tok_s"] == pytest.approx(110.0)
    assert float(row[1]) == pytest.approx(result["slopilot_tok_s"])
    assert result["decode_step_ms"] == pytest.approx(2.5)
    assert float(row[5]) == pytest.approx(result["decode_step_ms"])
    assert row[6] == "50%"  # the worst round's text, as RESULT's *_same_text_ratio
