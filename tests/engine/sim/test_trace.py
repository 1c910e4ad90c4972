"""Trace replay: the shipped Azure trace, JSONL, windows, time scaling, malformed rows."""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.prefix_reuse import fresh_tokens
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.engine.sim.trace import (
    TraceError,
    TraceRecord,
    TraceWorkload,
    mean_rate,
    read_trace,
    rescale,
    window,
)
from slopilot.engine.sim.trace_scenario import TraceOptions, replay_measure, with_trace
from slopilot.engine.sim.workload import RESERVED_TOKEN_IDS, ClassMix, TokenSampler
from tests.support.traced_peak import read_with_peak


@pytest.fixture(scope="module")
def azure() -> list[TraceRecord]:
    return read_trace("azure-llm-2023-conv")


def test_shipped_azure_trace_is_the_real_hour(azure: list[TraceRecord]) -> None:
    assert len(azure) == 19366
    assert azure[0].arrival_time == 0.0
    assert azure[-1].arrival_time == pytest.approx(3501.72, abs=0.01)  # 18:15:46 -> 19:14:08
    assert all(a.arrival_time <= b.arrival_time for a, b in itertools.pairwise(azure))
    assert (azure[0].prompt_tokens, azure[0].output_tokens) == (374, 44)
    assert mean_rate(azure) == pytest.approx(5.53, abs=0.01)


def test_the_licence_travels_with_the_trace() -> None:
    readme = Path(__file__).parents[3] / "slopilot" / "data" / "traces" / "README.md"
    text = readme.read_text()
    assert "CC-BY 4.0" in text and "Splitwise" in text


def test_time_scale_and_target_rate(azure: list[TraceRecord]) -> None:
    twice = rescale(azure, time_scale=0.5)
    assert mean_rate(twice) == pytest.approx(2 * mean_rate(azure))
    assert mean_rate(rescale(azure, target_rate=12.5)) == pytest.approx(12.5)
    assert [r.prompt_tokens for r in twice] == [r.prompt_tokens for r in azure]
    with pytest.raises(TraceError, match="not both"):
        rescale(azure, time_scale=0.5, target_rate=3)
    with pytest.raises(TraceError, match="time_scale=0"):
        rescale(azure, time_scale=0)


def test_window_cuts_and_rebases(azure: list[TraceRecord]) -> None:
    part = window(azure, start_s=600, end_s=900)
    assert part[0].arrival_time >= 0 and part[-1].arrival_time < 300
    assert len(part) == sum(600 <= r.arrival_time < 900 for r in azure)
    assert len(window(azure, max_requests=10)) == 10
    with pytest.raises(TraceError, match="widen it"):
        window(azure, start_s=10_000)


def test_replay_follows_the_trace(azure: list[TraceRecord]) -> None:
    records = window(azure, max_requests=200)
    specs = list(TraceWorkload(records, seed=1).initial())
    assert [s.arrival_time for s in specs] == [r.arrival_time for r in records]
    assert [s.num_prompt_tokens for s in specs] == [r.prompt_tokens for r in records]
    assert [s.max_tokens for s in specs] == [r.output_tokens for r in records]
    assert {s.priority for s in specs} == {Priority.P1}
    assert min(min(s.prompt_token_ids) for s in specs) >= RESERVED_TOKEN_IDS
    assert specs == list(TraceWorkload(records, seed=1).initial())


def test_replay_stops_at_the_duration(azure: list[TraceRecord]) -> None:
    specs = list(TraceWorkload(azure, duration_s=60).initial())
    assert specs and all(s.arrival_time < 60 for s in specs)


def test_class_mix_fills_in_missing_priorities(azure: list[TraceRecord]) -> None:
    specs = list(TraceWorkload(azure[:5000], classes=ClassMix((0.2, 0.8, 0.0))).initial())
    share = sum(s.priority == Priority.P0 for s in specs) / len(specs)
    assert share == pytest.approx(0.2, abs=0.02)


def test_a_cut_of_the_trace_replays_its_requests_as_the_whole_replay_does(
        tmp_path: Path) -> None:
    # --trace-window 600:900 on a classless trace with --classes: each request keeps the
    # class and the prompt the whole replay gives it (they were drawn afresh from the
    # cut's first request), so a minute of the cut reads as that minute of the whole.
    rows = "".join(f"{i * 0.7:.1f},{20 + i % 30},{1 + i % 3}\n" for i in range(2000))
    path = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens\n" + rows)
    scenario = load_scenario("azure-conv-2023")
    mix = ClassMix((0.5, 0.5, 0.0))
    whole = with_trace(scenario, TraceOptions(path=str(path), classes=mix))
    cut = with_trace(scenario, TraceOptions(path=str(path), classes=mix, start_s=600.0,
                                            end_s=900.0))
    every = list(whole.build_workload().initial())
    part = list(cut.build_workload().initial())
    same = [s for s in every if 600.0 <= s.arrival_time < 900.0]
    assert len(part) == len(same) > 400
    assert [(s.priority, list(s.prompt_token_ids)) for s in part] == [
        (s.priority, list(s.prompt_token_ids)) for s in same]
    assert {s.priority for s in part} == {Priority.P0, Priority.P1}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_jsonl_with_priorities_and_sessions(tmp_path: Path) -> None:
    rows = [
        {"timestamp": "2024-01-01T00:00:10", "prompt_tokens": 100, "output_tokens": 5,
         "session_id": "alice", "priority": "p0", "extra": "ignored"},
        {"timestamp": "2024-01-01T00:00:12.5", "prompt_tokens": 150, "output_tokens": 6,
         "session_id": "alice"},
        {"timestamp": "2024-01-01T00:00:11", "prompt_tokens": 30, "output_tokens": 1},
    ]
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    records = read_trace(path)
    assert [r.arrival_time for r in records] == [0.0, 1.0, 2.5]
    assert records[0].priority == Priority.P0 and records[0].session_id == 0
    specs = list(TraceWorkload(records).initial())
    first, other, second = specs
    # A later turn of one session starts with the earlier turn's prompt.
    assert second.prompt_token_ids[:100] == first.prompt_token_ids
    assert other.session_id is None and other.max_tokens == 1


def test_a_shorter_later_turn_is_a_new_conversation_not_a_cache_hit(tmp_path: Path) -> None:
    """A turn shorter than its session's last is no continuation of it (its client cut
    or edited the history): replayed as the first turn's prefix it was served whole from
    the prefix cache, which a real server would not do. It starts a conversation of its
    own, which the session's next, longer turn continues."""
    rows = [{"arrival_time": t, "prompt_tokens": n, "output_tokens": 4, "session_id": "s"}
            for t, n in ((0, 100), (1, 150), (2, 80), (3, 120), (4, 120))]
    path = write(tmp_path, "t.jsonl", "\n".join(json.dumps(r) for r in rows))
    records = read_trace(path)
    first, second, cut, after, same = (list(s.prompt_token_ids)
                                       for s in TraceWorkload(records).initial())
    assert second[:100] == first
    assert cut != second[:80] and cut[:10] != first[:10]
    assert after[:80] == cut and same == after  # a turn as long: the same prompt again
    assert records[0].session_id == records[1].session_id != records[2].session_id
    assert records[2].session_id == records[3].session_id == records[4].session_id
    # What the busiest-window ranking counts as prefill agrees with the replay.
    assert fresh_tokens(records).tolist() == [104, 54, 84, 44, 4]


@pytest.mark.parametrize("line, match", [
    ("{not json", r"t\.jsonl:2: not valid JSON"),
    ('[1, 2]', r"t\.jsonl:2: expected a JSON object"),
    ('{"prompt_tokens": 5, "output_tokens": 5}', r"t\.jsonl:2: missing arrival_time"),
    ('{"arrival_time": 1, "output_tokens": 5}', r"t\.jsonl:2: missing prompt_tokens"),
    ('{"arrival_time": 1, "prompt_tokens": 0, "output_tokens": 5}',
     r"t\.jsonl:2: prompt_tokens=0 must be a whole number >= 1"),
    ('{"arrival_time": 1, "prompt_tokens": 2.5, "output_tokens": 5}', r"prompt_tokens=2\.5"),
    ('{"arrival_time": -3, "prompt_tokens": 5, "output_tokens": 5}',
     r"t\.jsonl:2: arrival_time=-3 is not a time"),
    ('{"arrival_time": "soon", "prompt_tokens": 5, "output_tokens": 5}', r"'soon' is not"),
    ('{"arrival_time": 1, "prompt_tokens": 5, "output_tokens": 5, "priority": "urgent"}',
     r"t\.jsonl:2: priority 'urgent' is not a class"),
    # JSON keeps the last of a key given twice: a 5,000-token prompt replayed as 100,
    # or the other way, where a CSV giving a column twice is refused.
    ('{"arrival_time": 0, "prompt_tokens": 100, "prompt_tokens": 5000, "output_tokens": 10}',
     r"t\.jsonl:2: 'prompt_tokens' given twice in one object; JSON keeps only the last: "
     r"keep the one you mean"),
    ('{"arrival_time": 0, "prompt_tokens": 1, "output_tokens": 1, "x": {"a": 1, "a": 2}}',
     r"t\.jsonl:2: 'a' given twice"),
])
def test_malformed_jsonl_rows_name_file_and_line(tmp_path: Path, line: str, match: str) -> None:
    good = '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}'
    path = write(tmp_path, "t.jsonl", f"{good}\n{line}\n")
    with pytest.raises(TraceError, match=match):
        read_trace(path)


@pytest.mark.parametrize("text, match", [
    ("time,prompt,output\n", r"c\.csv:1: the header 'time,prompt,output' lacks "
     r"arrival_time, prompt_tokens, output_tokens; a CSV trace starts with "
     r"arrival_time,prompt_tokens,output_tokens\[,class\] \(or Azure's TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
     "yesterday,5,5\n", r"c\.csv:3: TIMESTAMP='yesterday' is not a time"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374\n",
     r"c\.csv:2: expected 3 columns"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,44\n",
     r"c\.csv:2: ContextTokens='x' must be a whole number"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"c\.csv: the trace has no requests"),
])
def test_malformed_azure_csv_names_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TraceError, match=match):
        read_trace(write(tmp_path, "c.csv", text))


def test_azure_csv_from_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:48.0,10,2\n")
    records = read_trace(path)
    assert [(r.arrival_time, r.prompt_tokens) for r in records] == [(0.0, 374), (1.5, 10)]


def test_minimal_csv_with_and_without_classes(tmp_path: Path) -> None:
    path = write(tmp_path, "mine.csv", "arrival_time,prompt_tokens,output_tokens,class\n"
                 "10.5,300,40,p0\n10.0,100,20,\n12,50,1,P2\n")
    records = read_trace(path)
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens, r.priority) for r in records] \
        == [(0.0, 100, 20, None), (0.5, 300, 40, Priority.P0), (2.0, 50, 1, Priority.P2)]
    # Columns in any order, aliases, extra columns ignored, ISO dates as times.
    path = write(tmp_path, "b.csv", "output_tokens,user,Timestamp,prompt_tokens,priority\n"
                 "7,alice,2024-01-01 00:00:01,70,p1\n9,bob,2024-01-01 00:00:03,90,p1\n")
    records = read_trace(path)
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in records] == [
        (0.0, 70, 7), (2.0, 90, 9)]


@pytest.mark.parametrize("text, match", [
    ("arrival_time,prompt_tokens,output_tokens\n1,5\n", r"m\.csv:2: expected 3 columns"),
    ("arrival_time,prompt_tokens,output_tokens,class\n1,5,5,urgent\n",
     r"m\.csv:2: class: priority 'urgent' is not a class"),
    ("arrival_time,prompt_tokens,output_tokens\n1,0,5\n",
     r"m\.csv:2: prompt_tokens='0' must be a whole number >= 1"),
    ("arrival_time,prompt_tokens,output_tokens\n-1,5,5\n",
     r"m\.csv:2: arrival_time='-1' is not a time"),
])
def test_malformed_minimal_csv_names_file_line_and_field(tmp_path: Path, text: str,
                                                         match: str) -> None:
    with pytest.raises(TraceError, match=match):
        read_trace(write(tmp_path, "m.csv", text))


@pytest.mark.parametrize("fmt", ["csv", "azure-csv"])
@pytest.mark.parametrize("text", ["", "\n\n", " \r\n"])
def test_an_empty_csv_says_the_file_is_empty(tmp_path: Path, fmt: str, text: str) -> None:
    # It said "the header '' lacks arrival_time, ..." (Azure's: "got None").
    path = write(tmp_path, "e.csv", text)
    with pytest.raises(TraceError) as info:
        read_trace(path, fmt=fmt)
    assert str(info.value).startswith(f"{path}: the file is empty; a CSV trace starts with ")
    assert "lacks" not in str(info.value) and "None" not in str(info.value)


def test_errors_quote_only_an_excerpt_of_a_hostile_row(tmp_path: Path) -> None:
    huge = "x" * 10_000
    path = write(tmp_path, "h.csv", f"arrival_time,prompt_tokens,output_tokens\n{huge},1,1\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert len(str(info.value)) < 300 and "..." in str(info.value)


def test_unknown_trace_is_refused_with_the_shipped_names() -> None:
    with pytest.raises(TraceError, match="azure-llm-2023-conv"):
        read_trace("azure-2099")


def test_a_prompt_no_deployment_holds_is_rejected_without_drawing_its_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 16M tokens (within the parse bound, far past one H100's KV cache): hundreds of MB
    # as a Python list, for a request the engine can only reject.
    path = write(tmp_path, "p.jsonl",
                 '{"arrival_time": 0, "prompt_tokens": 16000000, "output_tokens": 1}\n'
                 '{"arrival_time": 1, "prompt_tokens": 20, "output_tokens": 2}\n')
    drawn: list[int] = []
    real = TokenSampler.sample

    def sample(self: TokenSampler, rng: np.random.Generator, n: int) -> list[int]:
        drawn.append(n)
        return real(self, rng, n)

    monkeypatch.setattr(TokenSampler, "sample", sample)
    sc = with_trace(load_scenario("azure-conv-2023"), TraceOptions(path=str(path)))
    run = simulate(sc, measure=replay_measure(sc))
    assert run.summary.run is not None and run.summary.run.rejected == 1
    assert run.summary.overall.requests_finished == 1
    assert drawn and max(drawn) == 20


def test_the_same_trace_replays_the_same_tokens_however_it_is_read(
        azure: list[TraceRecord]) -> None:
    records = window(azure, max_requests=50)
    specs = list(TraceWorkload(records, seed=3).initial())
    again = list(TraceWorkload(records, seed=3).initial())
    # Read in reverse: a prompt's tokens do not depend on which prompt was drawn first.
    assert [list(s.prompt_token_ids) for s in reversed(again)] == [
        list(s.prompt_token_ids) for s in reversed(specs)]


@pytest.mark.parametrize("value", ["1e12", "300000000", "16777217"])
def test_a_length_beyond_any_models_context_is_refused_at_parse_time(
        tmp_path: Path, value: str) -> None:
    path = write(tmp_path, "h.jsonl",
                 f'{{"arrival_time": 0, "prompt_tokens": {value}, "output_tokens": 1}}\n')
    with pytest.raises(TraceError, match=r"h\.jsonl:1: prompt_tokens=.* exceeds 16,777,216"):
        read_trace(path)
    out = write(tmp_path, "o.csv",
                f"arrival_time,prompt_tokens,output_tokens\n0,5,{int(float(value))}\n")
    with pytest.raises(TraceError, match=r"o\.csv:2: output_tokens=.* exceeds 16,777,216"):
        read_trace(out)


@pytest.mark.parametrize("text", [
    "\ufeffarrival_time,prompt_tokens,output_tokens\n0,100,10\n1,100,10\n",
    "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,100,10\r\n2023-11-16 18:15:47.6805900,100,10\r\n",
])
def test_a_csv_saved_with_a_byte_order_mark_reads(tmp_path: Path, text: str) -> None:
    # Excel and PowerShell write a UTF-8 BOM ahead of the header.
    path = tmp_path / "bom.csv"
    path.write_bytes(text.encode("utf-8"))
    records = read_trace(path)
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in records] == [
        (0.0, 100, 10), (1.0, 100, 10)]


@pytest.mark.parametrize("name, text", [
    ("u.jsonl", '{"arrival_time": 0, "prompt_tokens": 100, "output_tokens": 10, '
                '"note": "a\u2028b\x85c"}\n'
                '{"arrival_time": 1, "prompt_tokens": 100, "output_tokens": 10}\r\n'),
    ("u.csv", 'arrival_time,prompt_tokens,output_tokens,note\n0,100,10,"a\u2028b"\n'
              '1,100,10,a\x0cb\x1dc\x85d\r\n'),
])
def test_only_newlines_end_a_row(tmp_path: Path, name: str, text: str) -> None:
    # str.splitlines() also splits on U+2028, form feeds and other separators, which a
    # JSON string or a CSV field may hold.
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    records = read_trace(path)
    assert [(r.arrival_time, r.prompt_tokens) for r in records] == [(0.0, 100), (1.0, 100)]


def test_a_quoted_field_across_lines_is_not_glued_into_a_number(tmp_path: Path) -> None:
    path = write(tmp_path, "q.csv", 'arrival_time,prompt_tokens,output_tokens\n"0","1\n00",10\n')
    # Told at the row's first line, where it starts.
    with pytest.raises(TraceError, match=r"q\.csv:2: prompt_tokens='1\\n00' must be a whole"):
        read_trace(path)


def test_jsonl_takes_the_csvs_class_name(tmp_path: Path) -> None:
    path = write(tmp_path, "c.jsonl",
                 '{"arrival_time": 0, "prompt_tokens": 10, "output_tokens": 1, "class": "p0"}\n'
                 '{"arrival_time": 1, "prompt_tokens": 10, "output_tokens": 1, "priority": 2}\n')
    assert [r.priority for r in read_trace(path)] == [Priority.P0, Priority.P2]
    both = write(tmp_path, "b.jsonl", '{"arrival_time": 0, "prompt_tokens": 10, '
                 '"output_tokens": 1, "class": "p0", "priority": "p2"}\n')
    with pytest.raises(TraceError, match=r"b\.jsonl:1: class and priority both given"):
        read_trace(both)
    bad = write(tmp_path, "x.jsonl", '{"arrival_time": 0, "prompt_tokens": 10, '
                '"output_tokens": 1, "class": "gold"}\n')
    with pytest.raises(TraceError, match=r"x\.jsonl:1: class: "):
        read_trace(bad)


def test_a_timestamp_past_any_clock_is_refused_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "t.jsonl", '{"arrival_time": 0, "prompt_tokens": 5, '
                 '"output_tokens": 1}\n{"arrival_time": 1' + "0" * 400 +
                 ', "prompt_tokens": 5, "output_tokens": 1}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:2: arrival_time=.* is not a time"):
        read_trace(path)


def test_epoch_milliseconds_are_refused_as_seconds(tmp_path: Path) -> None:
    # 1,714,564,800,000 read as seconds is the year 56,000: the unit, not the time, is off.
    path = write(tmp_path, "ms.csv", "arrival_time,prompt_tokens,output_tokens\n"
                 "1714564800000,100,10\n1714564800500,100,10\n")
    with pytest.raises(TraceError, match=r"ms\.csv:2: arrival_time='1714564800000' .*"
                                         r"milliseconds.*divide"):
        read_trace(path)


@pytest.mark.parametrize(("text", "line"), [
    ("0,100,10\n2024-05-01 12:00:02,100,10\n", 3),
    ("2024-05-01 12:00:02,100,10\n3,100,10\n", 3),
])
def test_a_trace_mixing_seconds_and_dates_is_refused(tmp_path: Path, text: str,
                                                     line: int) -> None:
    path = write(tmp_path, "m.csv", "arrival_time,prompt_tokens,output_tokens\n" + text)
    with pytest.raises(TraceError, match=rf"m\.csv:{line}: arrival_time=.* mixes"):
        read_trace(path)


@pytest.mark.parametrize(("text", "line"), [
    ("2024-05-01 12:00:00,100,10\n2024-05-01 12:00:01+02:00,100,10\n", 3),
    ("2024-05-01 12:00:00+00:00,100,10\n2024-05-01 12:00:01,100,10\n", 3),
])
def test_a_trace_mixing_dates_with_and_without_a_zone_is_refused(
        tmp_path: Path, text: str, line: int) -> None:
    """Written 1 s apart, the two rows replayed 7,201 s apart: the date without a zone
    read as UTC beside one two hours east of it. Which clock the naive dates were on is
    the user's to say."""
    path = write(tmp_path, "z.csv", "arrival_time,prompt_tokens,output_tokens\n" + text)
    with pytest.raises(TraceError, match=rf"z\.csv:{line}: arrival_time=.* dates with and "
                                         "without a zone"):
        read_trace(path)


def test_dates_all_in_other_zones_are_one_kind(tmp_path: Path) -> None:
    path = write(tmp_path, "z.csv", "arrival_time,prompt_tokens,output_tokens\n"
                 "2024-05-01 12:00:00+02:00,100,10\n2024-05-01 10:00:01Z,100,10\n")
    assert [r.arrival_time for r in read_trace(path)] == [0.0, 1.0]


def test_a_time_scale_past_any_clock_is_refused(azure: list[TraceRecord]) -> None:
    with pytest.raises(TraceError, match="time_scale=1e\\+308"):
        rescale(azure, time_scale=1e308)


@pytest.mark.parametrize(("name", "text", "where"), [
    ("z.csv", "arrival_time,prompt_tokens,output_tokens\n0,5,3\n1,5,0\n", "3: output_tokens"),
    ("z.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:46,5,3\n2023-11-16 18:15:47,5,0\n", "3: GeneratedTokens"),
    ("z.jsonl", '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 3}\n'
                '{"arrival_time": 1, "prompt_tokens": 5, "output_tokens": 0}\n',
     "2: output_tokens"),
])
def test_zero_output_tokens_are_refused_not_replayed_as_one(
        tmp_path: Path, name: str, text: str, where: str) -> None:
    # The engine always generates the prefill's token, so a replay of 0 would run 1 and
    # its figures would count a token the trace never had.
    with pytest.raises(TraceError, match=rf"z\.\w+:{where}='?0'? must be a whole number "
                                         r">= 1.*at least one token"):
        read_trace(write(tmp_path, name, text))


def test_a_jsonl_row_nested_past_the_parsers_depth_names_its_line(tmp_path: Path) -> None:
    # json.loads recurses once per bracket: a few kB of "[" overflow the stack.
    good = '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}'
    path = write(tmp_path, "t.jsonl", f"{good}\n{'[' * 100_000}\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:2: not valid JSON \(nested too deep"):
        read_trace(path)


@pytest.mark.parametrize("header", ["arrival_time,prompt_tokens,output_tokens",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens"])
def test_a_csv_field_past_the_csv_modules_limit_names_its_line(tmp_path: Path,
                                                               header: str) -> None:
    # The csv module refuses a field over 131,072 characters with its own csv.Error.
    path = write(tmp_path, "c.csv", f"{header}\n0,5,5\n1,{'7' * 200_000},5\n")
    with pytest.raises(TraceError, match=r"c\.csv:3: field larger than field limit") as info:
        read_trace(path)
    assert len(str(info.value)) < 300


def test_a_trace_past_the_size_limit_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Read whole and parsed into records, a multi-GB trace was bounded only by RAM (an
    # OOM kill, nothing said). Past the limit it is refused from its size, unread.
    from slopilot.engine.sim import trace

    path = tmp_path / "big.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "0,10,5\n" * 200)
    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TraceError, match=r"big.csv: the trace is 1\.41 KiB \(1,441 bytes\); "
                                         r"at most 1,000 bytes is read .*cut it to the span "
                                         r"you replay"):
        trace.read_trace(path)


def test_the_size_limit_is_said_in_the_units_it_is_set_in(tmp_path: Path) -> None:
    # 1,100 MiB read "the trace is 1.2 GB; at most 1.1 GB is read": the limit is 1 GiB,
    # which docs/traces.md called "1 GB". A sparse file: its size, not its bytes, counts.
    path = tmp_path / "big.csv"
    with path.open("wb") as f:
        f.truncate(1100 << 20)
    with pytest.raises(TraceError, match=r"big.csv: the trace is 1\.07 GiB \(1,153,433,600 "
                                         r"bytes\); at most 1 GiB \(1,073,741,824 bytes\) "
                                         r"is read \(whole"):
        read_trace(path)
    docs = (Path(__file__).parents[3] / "docs" / "traces.md").read_text()
    assert "files over 1 GiB (1,073,741,824 bytes)" in " ".join(docs.split())


def test_the_size_limit_holds_for_a_file_whose_size_says_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Bounded by stat().st_size alone, a /proc file (or /dev/zero, were it a file) was
    # read whole whatever it held.
    from slopilot.engine.sim import trace

    monkeypatch.setattr(trace, "MAX_TRACE_BYTES", 16)
    with pytest.raises(TraceError, match=r"maps: the trace is over 16 bytes; at most 16 "
                                         r"bytes is read .*cut it"):
        trace.read_trace("/proc/self/maps")


@pytest.mark.parametrize(("data", "where", "why"), [
    (b"arrival_time,prompt_tokens,output_tokens\n0,100,10,caf\xe9\n", ":2: ",
     "not UTF-8 text (byte 0xe9)"),
    (bytes(range(256)) * 4, ":2: ", "not UTF-8 text (byte 0x80)"),  # 0x0a ends line 1
    ("arrival_time,prompt_tokens,output_tokens\n0,5,5\n".encode("utf-16"), ": ",
     "UTF-16 text (its byte-order mark says so)"),
], ids=["latin-1", "binary", "utf-16"])
def test_a_trace_that_is_not_utf8_names_the_line_and_the_fix(
        tmp_path: Path, data: bytes, where: str, why: str) -> None:
    # It read "cannot read the trace: 'utf-8' codec can't decode byte 0xe9 in position
    # 53: invalid continuation byte": Python's words, an offset in bytes, no fix.
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}{where}{why}"), message
    assert "save it as UTF-8" in message and "codec" not in message, message


def test_a_trace_that_cannot_be_read_says_why_in_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens\n0,5,5\n")

    from slopilot.engine.sim import trace

    def refused(path: Path, limit: int) -> bytes:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(trace, "read_bounded", refused)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value) == f"{path}: this user may not read it (permission denied)"


def test_a_time_past_any_clock_is_said_in_a_few_digits(tmp_path: Path) -> None:
    # 1e300 s read "the year 31,688,738,506,811,432,819,241,178,...": 400 characters of
    # year, and a guess (epoch milliseconds) that no unit explains.
    import re

    path = write(tmp_path, "h.csv", "arrival_time,prompt_tokens,output_tokens\n"
                 "0,100,10\n1e300,100,10\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: arrival_time='1e300' as seconds is past any "
                              "clock"), message
    assert not re.search(r"\d{7}", message) and "milliseconds" not in message, message
    assert "trace times are seconds" in message


@pytest.mark.parametrize(("value", "unit", "by"), [
    ("1714564800000", "milliseconds", "1,000"),
    ("1714564800000000", "microseconds", "1,000,000"),
    ("1714564800000000000", "nanoseconds", "1,000,000,000"),
])
def test_an_epoch_in_a_finer_unit_names_the_divisor_that_fixes_it(
        tmp_path: Path, value: str, unit: str, by: str) -> None:
    # All said "milliseconds (or finer): divide the column by 1000"; nanoseconds divided
    # by 1000 are still a million times too late.
    path = write(tmp_path, "e.csv", f"arrival_time,prompt_tokens,output_tokens\n{value},5,5\n")
    with pytest.raises(TraceError, match=rf"looks like epoch {unit}: divide the column by "
                                         rf"{by} \(trace times"):
        read_trace(path)


@pytest.mark.parametrize(("header", "said"), [
    ("arrival_time,timestamp,prompt_tokens,output_tokens",
     "arrival_time twice (columns 1 and 2: 'arrival_time', 'timestamp')"),
    ("arrival_time,prompt_tokens,output_tokens,class,priority",
     "class twice (columns 4 and 5: 'class', 'priority')"),
    ("arrival_time,prompt_tokens,Prompt_Tokens,output_tokens",
     "prompt_tokens twice (columns 2 and 3: 'prompt_tokens', 'Prompt_Tokens')"),
])
def test_a_csv_header_giving_a_column_twice_is_refused(tmp_path: Path, header: str,
                                                       said: str) -> None:
    # The first was read and the other silently dropped (a JSONL row giving class and
    # priority is refused): which one the user meant is theirs to say.
    path = write(tmp_path, "d.csv", f"{header}\n0,1,5,5,p1\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value) == f"{path}:1: the header gives {said}; keep one"


@pytest.mark.parametrize(("text", "fields"), [
    ("arrival_time,prompt_tokens,output_tokens\n0,100,10\n1,1,500,10\n", "4 fields"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,100,10\n"
     "2023-11-16 18:15:47,1,500,10\n", "4 fields"),
])
def test_a_row_with_more_fields_than_its_header_is_refused(tmp_path: Path, text: str,
                                                           fields: str) -> None:
    # A length written with a thousands separator (1,500) split in two, and the row was
    # replayed as prompt 1, output 500, the 10 dropped: wrong lengths, nothing said.
    path = write(tmp_path, "w.csv", text)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value).startswith(f"{path}:3: {fields}, the header has 3: "), info.value
    assert "write 1500" in str(info.value)


def test_trailing_empty_fields_are_read(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "arrival_time,prompt_tokens,output_tokens\n0,5,5,\n1,6,6,,\n")
    assert [r.prompt_tokens for r in read_trace(path)] == [5, 6]


@pytest.mark.parametrize(("sep", "said"), [(";", "';'"), ("\t", "tabs")])
def test_a_csv_separated_by_semicolons_or_tabs_says_so(tmp_path: Path, sep: str,
                                                       said: str) -> None:
    # It read "the header 'arrival_time;prompt_tokens;output_tokens' lacks arrival_time,
    # prompt_tokens, output_tokens": the very names the user can see in it.
    path = write(tmp_path, "s.csv", sep.join(("arrival_time", "prompt_tokens",
                                              "output_tokens")) + "\n" + sep.join("055") + "\n")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:1: the header "), message
    assert f"is separated by {said}, not commas" in message and "lacks" not in message
    assert "save it with commas" in message


@pytest.mark.parametrize(("name", "text"), [
    ("t.txt", "arrival_time,prompt_tokens,output_tokens\n0,5,5\n1,6,6\n"),
    ("trace", "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:46,5,5\n2023-11-16 18:15:47,6,6\n"),
    ("t.log", '\n{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
              '{"arrival_time": 1, "prompt_tokens": 6, "output_tokens": 6}\n'),
])
def test_a_trace_without_a_known_suffix_is_told_by_its_first_line(
        tmp_path: Path, name: str, text: str) -> None:
    # docs/traces.md: "told by the file's suffix and header"; a CSV named .txt, or named
    # with no suffix, read "not valid JSON (Expecting value)".
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert [r.prompt_tokens for r in read_trace(path)] == [5, 6]


@pytest.mark.parametrize("header", ["arrival_time,prompt_tokens,output_tokens",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens"])
def test_a_quote_never_closed_names_the_line_it_opens_on(tmp_path: Path,
                                                          header: str) -> None:
    # It read "c.csv:4: expected 3 columns (...), got 1: ['0,100,10\n1,100,10\n...']":
    # the last line, and a row the user never wrote.
    path = write(tmp_path, "c.csv", f'{header}\n"0,100,10\n1,100,10\n2,100,10\n')
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(info.value) == (f'{path}:2: a quote (") opened on this line is never closed, '
                               "so the rest of the file reads as one field; close it or "
                               "remove it")


def test_a_jsonl_row_giving_both_times_is_refused_as_the_csvs_header_is(
        tmp_path: Path) -> None:
    """Which of two times the user meant is theirs to say: the CSV refuses the two
    columns, and a JSONL row giving both was read with arrival_time, the other dropped."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_time": 0, "timestamp": 5000, "prompt_tokens": 10, '
                    '"output_tokens": 3}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:1: arrival_time and timestamp both"):
        read_trace(path)


@pytest.mark.parametrize("value", ["1_000", "１", "1e3_0", " ٣ "])
def test_a_time_is_a_plain_number_as_a_token_count_is(tmp_path: Path, value: str) -> None:
    """float() takes Python's digit grouping and any script's digits, which the token
    fields refuse: a malformed time column was read (1_000 as 1000 s, a full-width 1 as
    1 s)."""
    path = tmp_path / "t.csv"
    path.write_text(f"arrival_time,prompt_tokens,output_tokens\n0,10,3\n{value},10,3\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: arrival_time"):
        read_trace(path)


def test_a_trace_of_more_rows_than_memory_holds_is_refused_before_it_is_parsed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the size limit, a compact trace still held too many rows: 12 bytes of CSV a
    row become ~260 bytes of records while parsing (measured: 1M rows, 11.9 MB, 258 MB
    at peak), so 1 GB of file was ~22 GB of memory, the kernel's OOM kill the size limit
    claimed to prevent. The lines are counted before any is parsed."""
    from slopilot.engine.sim import trace

    assert trace.MAX_TRACE_ROWS * 260 < 2 * 2**30  # the shipped bound: under 2 GiB
    monkeypatch.setattr(trace, "MAX_TRACE_ROWS", 100)
    path = tmp_path / "compact.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "0,1,1\n" * 101)
    with pytest.raises(TraceError, match=(
            r"compact.csv: the trace has 102 lines; at most 100 are read .*cut it to the "
            r"span you replay, e.g. with head -n 101")):
        trace.read_trace(path)
    # The header and MAX_TRACE_ROWS rows are read, a last line without its newline too.
    path.write_text("arrival_time,prompt_tokens,output_tokens\n" + "0,1,1\n" * 99 + "0,1,1")
    assert len(trace.read_trace(path)) == 100


@pytest.mark.parametrize("end", ["\r", "\r\n"], ids=["cr", "crlf"])
def test_rows_ended_by_a_carriage_return_count_against_the_row_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: str) -> None:
    """The csv module ends a row at a bare CR too (an old Mac's, or a hostile file's), so
    counted by their LFs such a file's rows were one line: 7M rows of 6 bytes, over the
    5M limit, were read (1.76 GB resident), and 1 GB of them would be ~45 GB."""
    from slopilot.engine.sim import trace

    monkeypatch.setattr(trace, "MAX_TRACE_ROWS", 100)
    path = tmp_path / "old-mac.csv"
    path.write_bytes(f"arrival_time,prompt_tokens,output_tokens{end}".encode()
                     + f"0,1,1{end}".encode() * 101)
    with pytest.raises(TraceError, match=r"old-mac.csv: the trace has 102 lines; at most 100"):
        trace.read_trace(path)
    path.write_bytes(f"arrival_time,prompt_tokens,output_tokens{end}".encode()
                     + f"0,1,1{end}".encode() * 99 + b"0,1,1")
    assert len(trace.read_trace(path)) == 100


class _CountedText(str):
    """A trace's text that counts the scans of it whole."""

    scans = 0

    def count(self, *args: object) -> int:  # type: ignore[override]
        type(self).scans += 1
        return super().count(*args)  # type: ignore[arg-type]


def test_rows_of_quoted_newlines_are_read_in_one_pass_of_the_text() -> None:
    """Each row that ran over several lines counted the whole text's newlines and quotes
    again (whether its quote ran to the end): 200,000 rows of a two-line note, 3.3 MB,
    took 3 min 32 s to read, and a gigabyte within the limits would take days."""
    from slopilot.engine.sim.trace_formats import parse_csv

    rows = "".join(f'{i},1,1,"a\nb"\n' for i in range(1000))
    text = _CountedText("arrival_time,prompt_tokens,output_tokens,note\n" + rows)
    assert len(parse_csv(text, "notes.csv")) == 1000
    assert _CountedText.scans <= 4  # its line ends, once, and its quotes


@pytest.mark.parametrize("name", ["csv", "burstgpt"])
def test_a_csv_trace_is_read_without_a_wide_copy_of_its_text(tmp_path: Path, name: str) -> None:
    """The csv reader read the text through io.StringIO, which holds it as 4 bytes a
    character: within the limits (1 GB, 5M rows) a CSV was ~6x its size in memory while
    parsed (measured: 5M rows, 1.01 GB, 6.56 GB resident, where docs/traces.md says about
    1.3 GB). Its lines are now handed to the reader one at a time."""
    pad = "x" * 190
    header = ("arrival_time,prompt_tokens,output_tokens,note" if name == "csv" else
              "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,note")
    row = "{i},1,1,{pad}" if name == "csv" else "{i},ChatGPT,1,1,2,Conversation log,{pad}"
    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "".join(row.format(i=i, pad=pad) + "\n"
                                            for i in range(20_000)))
    size = path.stat().st_size
    records, peak = read_with_peak(path)
    assert len(records) == 20_000
    # Its bytes and its text while decoded (2.00 x); 5.6 x before.
    assert peak < 2.3 * size, f"{peak / size:.2f} x the file's size"


@pytest.mark.parametrize("magic, kind, command", [
    (b"\x1f\x8b", "gzip", "gunzip -c"),
    (b"PK\x03\x04", "zip", "unzip -p"),
    (b"(\xb5/\xfd", "zstd", "zstd -dc"),
    (b"BZh9", "bzip2", "bzip2 -dc"),
    (b"\xfd7zXZ\x00", "xz", "xz -dc"),
], ids=["gzip", "zip", "zstd", "bzip2", "xz"])
@pytest.mark.parametrize("name, unpacked", [("t.csv.gz", "t.csv"), ("t.csv", "t.unpacked.csv"),
                                            ("my trace.jsonl.xz", "my trace.jsonl")])
def test_a_compressed_trace_is_refused_naming_its_compression_and_the_fix(
        tmp_path: Path, magic: bytes, kind: str, command: str, name: str,
        unpacked: str) -> None:
    # A gzip trace read "not UTF-8 text (byte 0x8b)": true, and no help. The command
    # said writes to stdout: "gunzip it" of a gzip file named .csv is refused by gunzip
    # ("unknown suffix -- ignored"), as unxz and bunzip2 refuse theirs.
    path = tmp_path / name
    path.write_bytes(magic + bytes(range(128, 256)))
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {kind}-compressed"), message
    fix = f"{command} {shlex.quote(str(path))} > {shlex.quote(str(tmp_path / unpacked))}"
    assert fix in message and "byte 0x" not in message, message


def test_the_unpack_command_is_safe_to_paste(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with a leading dash was read as an option (gunzip's ``-x``), the ``>``
    having made an empty trace already; a file of the unpacked name was written over."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-x.csv.gz").write_bytes(b"\x1f\x8b" + bytes(range(128, 256)))
    with pytest.raises(TraceError) as info:
        read_trace(Path("-x.csv.gz"))
    assert "gunzip -c ./-x.csv.gz > ./-x.csv" in str(info.value), str(info.value)
    (tmp_path / "t.csv.gz").write_bytes(b"\x1f\x8b" + bytes(range(128, 256)))
    (tmp_path / "t.csv").write_text("the user's own file\n")
    with pytest.raises(TraceError) as info:
        read_trace(Path("t.csv.gz"))
    assert "gunzip -c t.csv.gz > t.unpacked.csv" in str(info.value), str(info.value)


@pytest.mark.parametrize("value, written", [("true", "true"), ("false", "false"),
                                            ("null", "null")])
def test_a_json_literal_in_a_token_field_is_quoted_as_json_writes_it(
        tmp_path: Path, value: str, written: str) -> None:
    path = write(tmp_path, "t.jsonl",
                 f'{{"timestamp": 0, "prompt_tokens": {value}, "output_tokens": 5}}\n')
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert f"prompt_tokens={written} " in message, message
    assert "True" not in message and "False" not in message and "None" not in message
