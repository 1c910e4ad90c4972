"""Every column of a CSV trace is read or named: a class beside Azure's or BurstGPT's
exact header, a column no format reads, a row of only empty fields; and a class given as
pandas writes a whole number once its column held a NaN (``1.0``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.trace import TraceError, read_trace
from tests.engine.sim.test_trace import write

LOGGERS = ("slopilot.engine.sim.trace_formats", "slopilot.engine.sim.trace_public")


@pytest.mark.parametrize("header, fmt", [
    # Azure's exact header went to Azure's own reader, which read its three columns only.
    ("TIMESTAMP,ContextTokens,GeneratedTokens,class", None),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,class", "csv"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,priority", "azure-csv"),
    # BurstGPT's header with a class column beside it.
    ("Timestamp,Request tokens,Response tokens,class", None),
    ("Timestamp,Request tokens,Response tokens,Priority", "burstgpt"),
])
def test_a_class_beside_a_public_header_is_read(tmp_path: Path, header: str,
                                                fmt: str | None) -> None:
    path = write(tmp_path, "t.csv", f"{header}\n0,100,10,p0\n1,100,10,p2\n2,100,10,\n")
    assert [r.priority for r in read_trace(path, fmt=fmt)] == [Priority.P0, Priority.P2, None]


@pytest.mark.parametrize("header, fmt", [
    ("arrival_time,prompt_tokens,output_tokens,user,tenant", None),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,user,tenant", None),
    ("TIMESTAMP,ContextTokens,GeneratedTokens,user,tenant", "azure-csv"),
    ("Timestamp,Model,Request tokens,Response tokens,user,tenant", None),
])
def test_a_column_no_format_reads_is_named_once(tmp_path: Path, header: str, fmt: str | None,
                                               caplog: pytest.LogCaptureFixture) -> None:
    n = header.count(",") - 4
    rows = "".join(f"{i},{'m,' * n}100,10,a,b\n" for i in range(3))
    path = write(tmp_path, "t.csv", f"{header}\n{rows}")
    with caplog.at_level(logging.WARNING):
        assert len(read_trace(path, fmt=fmt)) == 3
    said = [r.getMessage() for r in caplog.records if r.name in LOGGERS]
    assert len(said) == 1, said
    assert "t.csv: 2 columns not read: 'user', 'tenant'" in said[0]


def test_known_columns_raise_no_warning(tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    # BurstGPT's own columns are documented as unread: no warning for its own file.
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,"
                  "Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n")
    other = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,5,5\n")
    with caplog.at_level(logging.WARNING):
        read_trace(path)
        read_trace(other)
    assert [r for r in caplog.records if r.name in LOGGERS] == []


@pytest.mark.parametrize("value, expected", [
    ("1.0", Priority.P1), ("2.0", Priority.P2), ("0e0", Priority.P0), ("+0.0", Priority.P0)])
def test_a_whole_float_is_a_class_as_it_is_a_length(tmp_path: Path, value: str,
                                                    expected: Priority) -> None:
    # pandas writes a class column of numbers as 1.0 once it held a NaN, as it does a
    # length (374.0), which is read.
    path = write(tmp_path, "c.csv", "arrival_time,prompt_tokens,output_tokens,priority\n"
                  f"0,100,10,{value}\n")
    assert read_trace(path)[0].priority == expected
    path = write(tmp_path, "c.jsonl", '{"arrival_time": 0, "prompt_tokens": 5, '
                  f'"output_tokens": 5, "priority": {float(value)}}}\n')
    assert read_trace(path)[0].priority == expected


def test_a_fractional_class_is_refused_with_both_roundings(tmp_path: Path) -> None:
    path = write(tmp_path, "c.csv", "arrival_time,prompt_tokens,output_tokens,priority\n"
                  "0,100,10,1.5\n")
    with pytest.raises(TraceError, match=r"c\.csv:2: priority='1\.5' is not a whole class; "
                       r"round it \(1 or 2\)"):
        read_trace(path)
    path = write(tmp_path, "c.jsonl",
                  '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5, "class": 0.5}\n')
    with pytest.raises(TraceError, match=r"c\.jsonl:1: class=0\.5 is not a whole class; "
                       r"round it \(0 or 1\)"):
        read_trace(path)


def test_blank_rows_are_skipped_and_counted(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, "q.csv", "arrival_time,prompt_tokens,output_tokens\n"
                  "0,100,10\n,,\n2,100,10\n , ,\n3,100,10\n")
    with caplog.at_level(logging.WARNING):
        assert len(read_trace(path)) == 3
    said = [r.getMessage() for r in caplog.records if r.name in LOGGERS]
    assert said == [f"{path}: skipped 2 blank rows (no value in any field; the first on "
                    "line 3)"]


def test_a_row_across_lines_is_told_at_its_first_line(tmp_path: Path) -> None:
    path = write(tmp_path, "q.csv", 'arrival_time,prompt_tokens,output_tokens\n0,100,10\n'
                  '1,"10\n0",10\n2,100,10\n')
    with pytest.raises(TraceError, match=r"q\.csv:3: prompt_tokens='10\\n0' must be a whole"):
        read_trace(path)


def test_a_csvs_sessions_are_read_as_a_jsonl_rows_are(tmp_path: Path) -> None:
    # A session_id column in a CSV was left unread: its turns shared no prefix.
    path = write(tmp_path, "s.csv", "arrival_time,prompt_tokens,output_tokens,session_id\n"
                  "0,100,5,1\n1,30,1,\n2,150,6,1.0\n3,40,2,alice\n4,80,2,alice\n")
    rows = [{"arrival_time": 0, "prompt_tokens": 100, "output_tokens": 5, "session_id": 1},
            {"arrival_time": 1, "prompt_tokens": 30, "output_tokens": 1},
            {"arrival_time": 2, "prompt_tokens": 150, "output_tokens": 6, "session_id": 1.0},
            {"arrival_time": 3, "prompt_tokens": 40, "output_tokens": 2, "session_id": "alice"},
            {"arrival_time": 4, "prompt_tokens": 80, "output_tokens": 2, "session_id": "alice"}]
    other = write(tmp_path, "s.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert [r.session_id for r in read_trace(path)] == [0, None, 0, 1, 1]
    assert read_trace(path) == read_trace(other)


def test_a_csvs_64_bit_session_ids_stay_apart_as_a_jsonl_rows_do(tmp_path: Path) -> None:
    # Keyed by float(text), 9223372036854775806 and ...807 (a hash's or a snowflake's ids)
    # were one session, one token stream: prefix hits that never happened. "0042" (an id
    # string) and "42" were one too. 1e3 and 1000 are one number, as JSON reads them.
    ids: list[tuple[str, object]] = [
        ("9223372036854775806", 9223372036854775806), ("9223372036854775807", 9223372036854775807),
        ("0042", "0042"), ("42", 42), ("1e3", 1e3), ("1000", 1000), ("1.0", 1.0), ("+1", 1)]
    csv_rows, json_rows = [], []
    for i, (text, value) in enumerate(ids + ids):
        t, prompt = float(i), 100 * (i + 1)
        csv_rows.append(f"{t},{prompt},5,{text}\n")
        json_rows.append(json.dumps({"arrival_time": t, "prompt_tokens": prompt,
                                     "output_tokens": 5, "session_id": value}) + "\n")
    path = write(tmp_path, "s.csv", "arrival_time,prompt_tokens,output_tokens,session_id\n"
                  + "".join(csv_rows))
    other = write(tmp_path, "s.jsonl", "".join(json_rows))
    assert [r.session_id for r in read_trace(path)] == [0, 1, 2, 3, 4, 4, 5, 5] * 2
    assert read_trace(path) == read_trace(other)


@pytest.mark.parametrize("text", ["1.5", "9007199254740993.0", "1e400", "nan", "inf", "1_0",
                                  "١٢"])
def test_a_session_id_no_integer_is_no_integer_ids_session(tmp_path: Path,
                                                          text: str) -> None:
    # Past 2**53 a float is no longer exact: 9007199254740993.0 reads as ...992.0, which
    # is kept apart from the integer id 9007199254740992; the rest are no numbers.
    path = write(tmp_path, "s.csv", "arrival_time,prompt_tokens,output_tokens,session_id\n"
                  f"0,100,5,{text}\n1,200,5,{text}\n2,300,5,9007199254740992\n")
    assert [r.session_id for r in read_trace(path)] == [0, 0, 1]


def test_a_trailing_comma_is_named_an_empty_header_name_not_pandas_index(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Column 4 was warned of as "unnamed: pandas' index?"; pandas writes its index first.
    path = write(tmp_path, "t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,\n0,374,44,\n")
    index = write(tmp_path, "i.csv", ",TIMESTAMP,ContextTokens,GeneratedTokens\n7,0,374,44\n")
    with caplog.at_level(logging.WARNING):
        read_trace(path)
        read_trace(index)
    said = [r.getMessage() for r in caplog.records if r.name in LOGGERS]
    assert len(said) == 2, said
    assert "1 column not read: column 4 (an empty header name)" in said[0]
    assert "pandas" not in said[0]
    assert "1 column not read: column 1 (unnamed: pandas' index?)" in said[1]


def test_the_same_session_ids_group_alike_in_a_csv_and_a_jsonl(tmp_path: Path) -> None:
    # A CSV keyed 1.5 and 1.50 as two texts, two sessions, where JSON reads both as the
    # number 1.5, one: the same trace written two ways replayed two ways. The 64-bit ids
    # stay exact and apart, 0042 stays text (apart from 42), and a double past 2**53 (which
    # may have been rounded) apart from the integer it rounds to, in both.
    ids = ["1.5", "1.50", "15e-1", "0.5", "5E-1", "2", "2.0", "9223372036854775806",
           "9223372036854775807", "42", '"0042"', '"abc"', "9007199254740993.0",
           "9007199254740992"]
    csv_rows, json_rows = [], []
    for i, text in enumerate(ids):
        csv_rows.append(f"{i},{100 * (i + 1)},5,{text.strip(chr(34))}\n")
        json_rows.append(f'{{"arrival_time": {i}, "prompt_tokens": {100 * (i + 1)}, '
                         f'"output_tokens": 5, "session_id": {text}}}\n')
    path = write(tmp_path, "s.csv", "arrival_time,prompt_tokens,output_tokens,session_id\n"
                  + "".join(csv_rows))
    other = write(tmp_path, "s.jsonl", "".join(json_rows))
    assert [r.session_id for r in read_trace(path)] == [0, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9]
    assert read_trace(path) == read_trace(other)


def test_a_jsonl_key_no_trace_reads_is_named_once(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    # A JSONL row's other keys were dropped silently, where a CSV's other columns are
    # named: "sesion_id" replayed every turn as a session of its own, with no hint.
    rows = [{"arrival_time": 0, "prompt_tokens": 100, "output_tokens": 5, "sesion_id": 1},
            {"arrival_time": 1, "prompt_tokens": 150, "output_tokens": 5, "sesion_id": 1,
             "user": "a"},
            {"timestamp": 2, "prompt_tokens": 40, "output_tokens": 2, "priority": "p0",
             "session_id": 2, "sesion_id": 2, "Class": "p1"}]
    path = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        assert len(read_trace(path)) == 3
    said = [r.getMessage() for r in caplog.records if r.name in LOGGERS]
    assert len(said) == 1, said
    assert ("t.jsonl: 3 keys not read: 'sesion_id' (first on line 1; session_id?), 'user' "
            "(first on line 2), 'Class' (first on line 3; class?); a JSONL trace reads "
            ) in said[0], said
    assert "rename a key meant as one of them" in said[0]


def test_a_jsonl_of_known_keys_raises_no_warning(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    rows = [{"arrival_time": 0, "prompt_tokens": 100, "output_tokens": 5, "class": "p0",
             "session_id": "a"},
            {"timestamp": 1, "prompt_tokens": 100, "output_tokens": 5, "priority": 2,
             "session_id": None}]
    path = write(tmp_path, "k.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        read_trace(path)
    assert [r for r in caplog.records if r.name in LOGGERS] == []


def test_a_jsonl_of_many_other_keys_names_some_and_holds_no_list(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Each row a key of its own (an id used as a key): named up to a count, not all held.
    rows = [{"arrival_time": i, "prompt_tokens": 5, "output_tokens": 5, f"k{i}": 1}
            for i in range(30)]
    path = write(tmp_path, "m.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        read_trace(path)
    said = [r.getMessage() for r in caplog.records if r.name in LOGGERS]
    assert len(said) == 1, said
    assert "m.jsonl: over 20 keys not read: 'k0' (first on line 1), " in said[0]
    assert "'k19' (first on line 20), and others; a JSONL trace reads" in said[0]
    assert "'k20'" not in said[0]


@pytest.mark.parametrize(("first", "second"), [
    ("1701388800.1234567", "1701388800.1234568"),  # an epoch with a fraction, 17 digits
    ("1e-400", "0"),  # under a double's range: it read 0.0, the session of the id 0
    ("0.10000000000000000001", "0.1")])
def test_a_csvs_decimal_ids_a_double_cannot_tell_apart_stay_apart(
        tmp_path: Path, first: str, second: str) -> None:
    # Keyed as the double JSON reads them, two ids that differ past a double's 17
    # significant digits were one session: two conversations replayed as one token
    # stream, silently. A CSV holds the text: an id a double does not give back is keyed
    # by its exact value (a JSONL number is a double already: write such ids as strings).
    path = write(tmp_path, "s.csv", "arrival_time,prompt_tokens,output_tokens,session_id\n"
                  f"0,100,5,{first}\n1,200,5,{second}\n2,300,5,{first}\n")
    assert [r.session_id for r in read_trace(path)] == [0, 1, 0]
