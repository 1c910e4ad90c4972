"""Public traces as their users hold them: Azure's 2024 CSV, and Azure's columns saved
by pandas (an index column first) or in another order."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.sim.trace import TraceError, read_trace

# The Azure LLM inference trace 2024's rows (AzureLLMInferenceDataset2024.md): dates with
# a zone, microseconds left out when they are 0 (as pandas writes them).
AZURE_2024 = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2024-05-10 00:00:00.009930+00:00,2162,5\n"
              "2024-05-10 00:00:01+00:00,2399,6\n"
              "2024-05-10 02:00:02.5+02:00,76,15\n")


def _times_and_lengths(path: Path) -> list[tuple[float, int, int]]:
    return [(round(r.arrival_time, 6), r.prompt_tokens, r.output_tokens)
            for r in read_trace(path)]


def test_azure_2024_dates_with_a_zone_read_as_one_clock(tmp_path: Path) -> None:
    path = tmp_path / "code_1week.csv"
    path.write_text(AZURE_2024)
    # 02:00:02.5+02:00 is 00:00:02.5 UTC: the zone is applied, not dropped.
    assert _times_and_lengths(path) == [(0.0, 2162, 5), (0.99007, 2399, 6),
                                        (2.49007, 76, 15)]


@pytest.mark.parametrize("header, rows", [
    # df.to_csv(path): pandas writes its index as an unnamed first column.
    (",TIMESTAMP,ContextTokens,GeneratedTokens",
     ["0,2024-05-10 00:00:00.009930+00:00,2162,5", "1,2024-05-10 00:00:01+00:00,2399,6"]),
    # The same columns in another order, and in another case.
    ("ContextTokens,GeneratedTokens,TIMESTAMP",
     ["2162,5,2024-05-10 00:00:00.009930+00:00", "2399,6,2024-05-10 00:00:01+00:00"]),
    ("timestamp,contexttokens,generatedtokens",
     ["2024-05-10 00:00:00.009930+00:00,2162,5", "2024-05-10 00:00:01+00:00,2399,6"]),
])
def test_azures_columns_read_in_any_order_beside_others(tmp_path: Path, header: str,
                                                        rows: list[str]) -> None:
    path = tmp_path / "sample.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    assert _times_and_lengths(path) == [(0.0, 2162, 5), (0.99007, 2399, 6)]


def test_a_bad_value_under_azures_name_is_told_by_that_name(tmp_path: Path) -> None:
    path = tmp_path / "sample.csv"
    path.write_text(",TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "0,2024-05-10 00:00:00+00:00,2162,5\n"
                    "1,2024-05-10 00:00:01+00:00,2399,0\n")
    with pytest.raises(TraceError, match=r"sample.csv:3: GeneratedTokens='0' must be a "
                       r"whole number >= 1; a request generates at least one token"):
        read_trace(path)


def test_a_short_row_is_told_against_the_header_as_written(tmp_path: Path) -> None:
    path = tmp_path / "sample.csv"
    path.write_text(",TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "0,2024-05-10 00:00:00+00:00,2162\n")
    with pytest.raises(TraceError, match=r"sample.csv:2: expected 4 columns "
                       r"\(',TIMESTAMP,ContextTokens,GeneratedTokens'\), got 3"):
        read_trace(path)
