"""Mooncake's JSONL (kvcache-ai/Mooncake, FAST'25 traces): ``timestamp`` in milliseconds
from the first request, ``input_length``, ``output_length``, and ``hash_ids``, one id per
512-token block of the prompt, equal ids where prompts share a prefix."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from slopilot.cli import main
from slopilot.engine.sim.trace import TraceError, TraceRecord, TraceWorkload, read_trace
from slopilot.engine.sim.workload import SyntheticPrompt
from tests.support.traced_peak import read_with_peak

# The first rows of FAST25-release/traces/conversation_trace.jsonl's shape: every prompt
# opens with block 0 (a system prompt), and the third shares three more blocks with the
# first.
ROWS: list[dict[str, Any]] = [
    {"timestamp": 0, "input_length": 1100, "output_length": 500, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [0, 3]},
    {"timestamp": 3052, "input_length": 2000, "output_length": 26,
     "hash_ids": [0, 1, 2, 4]},
]


def _write(tmp_path: Path, rows: list[Any], name: str = "conversation_trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_mooncake_reads_milliseconds_as_seconds_and_keeps_the_blocks(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="slopilot.engine.sim.trace_public"):
        records = read_trace(_write(tmp_path, ROWS))
    assert records == [TraceRecord(0.0, 1100, 500, prefix_blocks=(0, 1, 2), index=0),
                       TraceRecord(0.0, 700, 3, prefix_blocks=(0, 3), index=1),
                       TraceRecord(3.052, 2000, 26, prefix_blocks=(0, 1, 2, 4), index=2)]
    # The unit is said with the span it gives, so a file in seconds shows as too long.
    assert "timestamps read as milliseconds: 3 requests over 3.052 s" in caplog.text


@pytest.mark.parametrize("name", ["trace.jsonl", "trace", "trace.json"])
def test_mooncake_is_told_by_its_keys(tmp_path: Path, name: str) -> None:
    assert [r.arrival_time for r in read_trace(_write(tmp_path, ROWS, name))] == [
        0.0, 0.0, 3.052]


def test_the_format_can_be_named_and_rows_replay_in_time_order(tmp_path: Path) -> None:
    records = read_trace(_write(tmp_path, ROWS[::-1], name="t.txt"), fmt="mooncake")
    # Equal times keep the file's order (a stable sort), as in every format.
    assert [r.prompt_tokens for r in records] == [700, 1100, 2000]
    assert [r.arrival_time for r in records] == [0.0, 0.0, 3.052]


def test_hash_ids_may_be_absent_and_epoch_milliseconds_read_relative(tmp_path: Path) -> None:
    rows = [{"timestamp": 1_715_000_000_000, "input_length": 10, "output_length": 2},
            {"timestamp": 1_715_000_000_250, "input_length": 20, "output_length": 1,
             "hash_ids": None}]
    assert read_trace(_write(tmp_path, rows)) == [TraceRecord(0.0, 10, 2, index=0),
                                                  TraceRecord(0.25, 20, 1, index=1)]


def _row(**change: Any) -> dict[str, Any]:
    return {**ROWS[0], **change}


@pytest.mark.parametrize("row, said", [
    (_row(timestamp=-1), r":2: timestamp=-1 is not a time"),
    (_row(timestamp="2024-05-01 12:00:00"), r":2: timestamp='2024-05-01 12:00:00' is a date;"
                                            r" Mooncake's timestamps are milliseconds"),
    (_row(timestamp=1.7e15), r":2: timestamp=1700000000000000.0 as milliseconds is the "
                             r"year .* epoch microseconds: divide the column by 1,000 "),
    (_row(input_length=0), r":2: input_length=0 must be a whole number >= 1"),
    (_row(output_length=-3), r":2: output_length=-3 must be a whole number >= 1"),
    (_row(output_length=float("nan")), r":2: output_length=nan must be a whole number"),
    (_row(input_length=2**30), r":2: input_length=1073741824 exceeds"),
    ({"timestamp": 5, "output_length": 5}, r":2: missing input_length"),
    (_row(hash_ids="0,1,2"), r":2: hash_ids='0,1,2' must be a list of block ids"),
    (_row(hash_ids=[0, -1, 2]), r":2: hash_ids\[1\]=-1 must be a whole number >= 0"),
    (_row(hash_ids=[0, True]), r":2: hash_ids\[1\]=true must be a whole number >= 0"),
    (_row(hash_ids=[0, 2**70]), r":2: hash_ids\[1\]=1180591620717411303424 must be"),
    # 1,100 tokens are three 512-token blocks: a fourth id is no block of this prompt (a
    # trace hashed with smaller blocks, or a hostile file's millions of ids).
    (_row(hash_ids=[0, 1, 2, 3]), r":2: 4 hash_ids for input_length=1100, which fills "
                                  r"3 blocks of 512 tokens"),
    ('{"timestamp": 5, "input_length": 100, "input_length": 9000, "output_length": 5}',
     r":2: 'input_length' given twice in one object"),
    # A generic JSONL row among Mooncake's: one format to a file.
    ({"arrival_time": 5, "prompt_tokens": 5, "output_tokens": 5},
     r":2: missing input_length; this row is a generic JSONL row \(prompt_tokens\), the "
     r"first Mooncake's: give every row in one format"),
])
def test_a_bad_row_names_the_file_line_and_field(tmp_path: Path, row: Any, said: str) -> None:
    path = _write(tmp_path, [ROWS[0], row])
    with pytest.raises(TraceError, match="conversation_trace.jsonl" + said):
        read_trace(path)


def test_a_mooncake_row_in_a_generic_jsonl_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, [{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5},
                             ROWS[0]])
    with pytest.raises(TraceError, match=r"t.jsonl:2: missing prompt_tokens; this row is "
                       r"Mooncake's \(input_length\), the first a generic JSONL row: give "
                       r"every row in one format"):
        read_trace(path.rename(path.with_name("t.jsonl")))


def _prompts(records: list[TraceRecord], seed: int = 0) -> list[list[int]]:
    specs = list(TraceWorkload(records, seed=seed).initial())
    out = []
    for spec in specs:
        assert isinstance(spec.prompt_token_ids, SyntheticPrompt)
        out.append(list(spec.prompt_token_ids))
    return out


def test_shared_hash_ids_replay_as_shared_prefixes(tmp_path: Path) -> None:
    a, b, c = _prompts(read_trace(_write(tmp_path, ROWS)))
    assert (len(a), len(b), len(c)) == (1100, 700, 2000)
    assert a[:512] == b[:512] == c[:512]  # block 0, in every prompt
    assert a[512:1024] != b[512:1024]     # blocks 1 and 3 differ
    assert a == c[:1100]                  # blocks 0, 1 and 2: all of the first prompt
    # The same trace replays the same tokens; another seed draws others, shared alike.
    assert _prompts(read_trace(_write(tmp_path, ROWS)))[2] == c
    a2, _, c2 = _prompts(read_trace(_write(tmp_path, ROWS)), seed=1)
    assert a2 != a and a2 == c2[:1100]


def test_a_prompt_past_its_blocks_draws_its_own_tokens(tmp_path: Path) -> None:
    # Fewer ids than blocks: the prompt's tail is its own (shared with no other prompt).
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [7]},
            {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [7]}]
    a, b = _prompts(read_trace(_write(tmp_path, rows)))
    assert a[:512] == b[:512] and a[512:] != b[512:]


def _prefix_hit_rate(tmp_path: Path, rows: list[dict[str, Any]], name: str,
                     capsys: pytest.CaptureFixture[str]) -> float:
    path = _write(tmp_path, rows, name)
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--json",
                 "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests_arrived"] == len(rows) == out["requests_finished"]
    return float(out["prefix_hit_rate"])


def test_simulate_replays_mooncakes_prefix_sharing_on_the_prefix_cache(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Six 2,048-token prompts a second apart, each opening with the same three blocks (a
    # long system prompt): the replay's cache hits them; with no id in common, nothing.
    shared = [{"timestamp": 1000 * i, "input_length": 2048, "output_length": 8,
               "hash_ids": [0, 1, 2, 10 + i]} for i in range(6)]
    alone = [{**row, "hash_ids": [4 * i + k + 100 for k in range(4)]}
             for i, row in enumerate(shared)]
    assert _prefix_hit_rate(tmp_path, shared, "shared.jsonl", capsys) > 0.5
    assert _prefix_hit_rate(tmp_path, alone, "alone.jsonl", capsys) == 0.0


@pytest.mark.parametrize("fmt", ["mooncake", "jsonl"])
def test_a_jsonl_trace_is_read_without_a_copy_of_it_per_line(tmp_path: Path, fmt: str) -> None:
    """Within the limits (1 GB, 5M rows) a JSONL trace was held three times over while
    parsed: its bytes, its text and the list of its lines (measured: 5M Mooncake rows,
    1.02 GB, 4.7 GB resident, where docs/traces.md says about 1.3 GB). Its lines are now
    read one at a time and its bytes let go once decoded."""
    pad = "x" * 400
    if fmt == "mooncake":
        rows = (json.dumps({"timestamp": i, "input_length": 600, "output_length": 5,
                            "hash_ids": [i], "note": pad}) for i in range(20_000))
    else:
        rows = (json.dumps({"arrival_time": i, "prompt_tokens": 600, "output_tokens": 5,
                            "note": pad}) for i in range(20_000))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows) + "\n")
    size = path.stat().st_size
    records, peak = read_with_peak(path)
    assert len(records) == 20_000
    # Its bytes and its text while decoded (2.00 x), the text and the records after: not
    # a list of its lines besides (3.4 x before).
    assert peak < 2.3 * size, f"{peak / size:.2f} x the file's size"


def test_simulates_title_says_the_span_it_replays_and_the_unit_it_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # docs/traces.md says simulate prints the span read in its title; its title said
    # only "4 s simulated" (the span, drain and all), and the INFO line naming the
    # milliseconds is not shown by default. A file converted to seconds replays 1000
    # times faster: the title is where that shows.
    rows = [{"timestamp": i * 100, "input_length": 300, "output_length": 20,
             "hash_ids": [0]} for i in range(40)]
    path = _write(tmp_path, rows, "moon.jsonl")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path),
                 "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title may wrap
    assert ("replays 40 requests over 3.9 s (Mooncake's timestamps read as milliseconds)"
            in out), out
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_time,prompt_tokens,output_tokens\n"
                   + "".join(f"{t * 0.5:.1f},300,20\n" for t in range(10)))
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(csv), "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "; the trace replays 10 requests over 4.5 s" in out and "Mooncake" not in out, out


def test_simulates_title_counts_only_what_arrives_before_duration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The title said "replays 1,783 requests over 379 s" of a --duration that let 51 in.
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_time,prompt_tokens,output_tokens\n"
                   + "".join(f"{t * 0.5:.1f},300,20\n" for t in range(10)))
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(csv), "--quiet",
                 "--duration", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "; the trace replays 4 requests over 1.5 s" in out, out


def _moon(tmp_path: Path, name: str, times: list[Any]) -> Path:
    return _write(tmp_path, [{"timestamp": t, "input_length": 300, "output_length": 20}
                             for t in times], name)


def test_a_mooncake_trace_in_seconds_is_warned_of_as_replayed_1000_times_too_fast(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A reviewer's Mooncake file converted to seconds (0.013, 0.506, 1.076) replayed 60
    # requests over 0.03 s, and tune sized 5 replicas where the same rows in whole
    # milliseconds held on 1, with nothing said.
    path = _moon(tmp_path, "sec.jsonl", [round(i * 0.5 + 0.013, 3) for i in range(40)])
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path),
                 "--quiet"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    said = (f"slopilot simulate: warning: {path}: 40 of its 40 timestamps are fractional "
            "milliseconds (line 1: timestamp=0.013), and read as Mooncake's milliseconds "
            "the replayed trace is 40 requests over 0.0195 s at 2,051 req/s")
    assert said in err, err
    assert err.count(str(path)) == 2, err  # said once: the file, then its fix
    assert "give --time-scale 1000" in err and "jq -c '.timestamp |= (. * 1000 | round)'" \
        in err, err
    # At the scale it names, 2 req/s: nothing to say.
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--quiet",
                 "--time-scale", "1000"]) == 0
    assert "fractional" not in capsys.readouterr().err


# A quiet service's Mooncake file converted to seconds: a request every ~30 s (true pace
# 0.033 req/s), read as milliseconds at 33 req/s, under the rate that said "too fast",
# and nothing was said (a reviewer's 2,000 rows: 33.7 req/s over 59.4 s).
QUIET_SECONDS = [round(i * 30.0 + (i * 7.919) % 3.0, 3) for i in range(40)]


@pytest.mark.parametrize("times, rate", [
    (QUIET_SECONDS, "34 req/s"),
    # Finer than a millisecond at 2 req/s: a user's own trace, or seconds of a service
    # at one request every 8 minutes; the file cannot tell, so both are said, softly.
    ([i * 500.25 for i in range(40)], "2 req/s"),
])
def test_mostly_fractional_milliseconds_are_said_at_any_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], times: list[float],
        rate: str) -> None:
    path = _moon(tmp_path, "quiet.jsonl", times)
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path),
                 "--quiet"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    fractional = sum(not float(t).is_integer() for t in times)
    said = (f"slopilot simulate: warning: {path}: {fractional} of its 40 timestamps are "
            "fractional milliseconds")
    assert said in err, err
    assert err.count(said) == 1, err  # once
    assert f" at {rate}, a plausible pace: " in err, err
    assert "Mooncake's timestamps are whole milliseconds" in err, err
    # Softer than a rate no fleet sees: not "1000 times too fast", both readings named.
    assert "1000 times too fast" not in err, err
    assert "if they are seconds (a pace 1000 times slower), give --time-scale 1000" in err, err
    assert "if they are milliseconds finer than Mooncake's, nothing is amiss" in err, err
    # A --time-scale given: the unit was thought of; at its pace nothing more is said.
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--quiet",
                 "--time-scale", "1000"]) == 0
    assert "fractional" not in capsys.readouterr().err


@pytest.mark.parametrize("times", [
    [i * 500 for i in range(40)],  # whole milliseconds, as Mooncake's
    [i * 0.5 for i in range(40)],  # whole at 2,000 req/s: no sign of another unit
    [i * 500 + (0.5 if i == 7 else 0) for i in range(40)],  # a few: not most
])
def test_a_legitimate_mooncake_trace_is_not_warned_of(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], times: list[float]) -> None:
    path = _moon(tmp_path, "ms.jsonl", times)
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path),
                 "--quiet"]) == 0
    assert "fractional" not in capsys.readouterr().err


def test_a_target_rate_of_a_mooncake_trace_in_seconds_is_not_warned_of(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The user's pace: whatever the unit, the gaps are scaled to it.
    path = _moon(tmp_path, "sec.jsonl", [round(i * 0.5 + 0.013, 3) for i in range(40)])
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(path), "--quiet",
                 "--target-rate", "2"]) == 0
    assert "fractional" not in capsys.readouterr().err


def test_simulates_title_rounds_the_span_and_counts_one_replica_in_the_singular(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A reviewer's title read "1 replica(s)" and "over 59.9935 s".
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_time,prompt_tokens,output_tokens\n0,300,20\n"
                   "30.5,300,20\n59.9935,300,20\n")
    assert main(["simulate", "--scenario", "tiny-cpu", "--trace", str(csv), "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "; the trace replays 3 requests over 60 s" in out, out
    assert "1 replica," in out and "replica(s)" not in out, out
