"""``--trace`` and the trace options on a scenario's deployment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slopilot.engine.request import Priority
from slopilot.engine.sim.scenario import ScenarioError, load_scenario
from slopilot.engine.sim.trace_scenario import (
    TraceOptions,
    parse_classes,
    parse_window,
    with_trace,
)
from slopilot.engine.sim.workload_spec import TraceSpec

AZURE = load_scenario("azure-conv-2023")


def test_a_user_trace_replaces_the_workload_and_sets_the_duration(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,10,5\n41.5,10,5\n")
    sc = with_trace(load_scenario("tiny-cpu"), TraceOptions(path=str(trace)))
    assert isinstance(sc.workload, TraceSpec) and sc.duration_s == 42.0
    assert sc.name == "tiny-cpu+mine" and sc.gpu == "A100" and sc.slo.p0.ttft_p99_ms == 300
    assert sc.workload.classes.shares[Priority.P1] == 1.0


def test_options_recut_a_trace_scenarios_own_trace() -> None:
    sc = with_trace(AZURE, TraceOptions(start_s=600.0, end_s=900.0, time_scale=0.5))
    assert isinstance(sc.workload, TraceSpec)
    assert sc.workload.trace == "azure-llm-2023-conv" and sc.workload.time_scale == 0.5
    assert sc.duration_s <= 150.0 + 1.0
    fast = with_trace(AZURE, TraceOptions(target_rate=20.0))
    assert isinstance(fast.workload, TraceSpec)
    assert fast.workload.target_rate == 20.0 and fast.workload.time_scale is None


def test_no_options_no_change() -> None:
    assert with_trace(AZURE, TraceOptions()) is AZURE


@pytest.mark.parametrize(("options", "match"), [
    (lambda: TraceOptions(time_scale=0.5, target_rate=3.0), "give one"),
    (lambda: TraceOptions(time_scale=0.0), "--time-scale 0"),
    (lambda: TraceOptions(start_s=10.0, end_s=5.0), "end must come after the start"),
    (lambda: TraceOptions(target_rate=float("nan")), "--target-rate nan"),
])
def test_bad_options_name_the_flag(options: object, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        options()  # type: ignore[operator]


def test_options_on_a_generated_workload_point_to_trace() -> None:
    with pytest.raises(ScenarioError, match=r"pass --trace FILE\.csv"):
        with_trace(load_scenario("tiny-cpu"), TraceOptions(time_scale=0.5))


def test_a_missing_trace_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        with_trace(AZURE, TraceOptions(path=str(tmp_path / "gone.csv")))


@pytest.mark.parametrize(("options", "words"), [
    # 0 and a negative scale are refused alike: saying ">= 0" for -1 sent users to try 0
    (lambda: TraceOptions(time_scale=-1.0), "--time-scale -1: expected a number > 0"),
    (lambda: TraceOptions(time_scale=0.0), "--time-scale 0: expected a number > 0"),
    (lambda: TraceOptions(target_rate=-2.0), "--target-rate -2: expected a number > 0"),
    (lambda: TraceOptions(start_s=-1.0), "--trace-window start -1: trace seconds count from "
     "the first request, so 0 is its start; give a number >= 0, e.g. 0:10"),
    (lambda: TraceOptions(target_rate=2e6), "--target-rate 2e+06: above 1,000,000 req/s, "
     "past any deployment (the whole trace in an instant); give requests per second, e.g. 5"),
])
def test_a_scale_or_rate_out_of_range_says_the_range_it_accepts(options: object,
                                                                 words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        options()  # type: ignore[operator]
    assert str(err.value) == words


def test_a_folder_given_as_the_trace_is_called_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as err:
        with_trace(AZURE, TraceOptions(path=str(tmp_path)))
    assert str(err.value) == (f"--trace {tmp_path}: is a folder, not a trace file; name a "
                              ".csv or .jsonl file in it")


@pytest.mark.parametrize("kind", ["pipe", "device"])
def test_a_pipe_or_a_device_given_as_the_trace_is_called_so(tmp_path: Path,
                                                              kind: str) -> None:
    # Both read "no such file" though they are there: --trace <(zcat t.csv.gz) and
    # --trace /dev/null sent the user looking for a file that exists.
    if kind == "pipe":
        path = tmp_path / "fifo.csv"
        os.mkfifo(path)  # never opened: a read would wait for a writer
    else:
        path = Path("/dev/null")
    with pytest.raises(ScenarioError) as err:
        with_trace(AZURE, TraceOptions(path=str(path)))
    assert str(err.value) == (f"--trace {path}: not a regular file (a pipe, or a device); "
                              "a trace is read more than once: save it to a file and give "
                              "that")


def test_a_window_past_the_trace_names_the_traces_span(tmp_path: Path) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text("arrival_time,prompt_tokens,output_tokens\n0,10,5\n41.5,10,5\n")
    with pytest.raises(ScenarioError) as err:
        with_trace(AZURE, TraceOptions(path=str(trace), start_s=100.0))
    assert "no requests in the window [100, end)" in str(err.value)
    assert "None" not in str(err.value)
    assert "the trace's requests arrive at 0-41.5 s" in str(err.value)


def test_an_unknown_class_in_classes_is_named() -> None:
    with pytest.raises(ScenarioError, match="priority 'p9' is not a class"):
        parse_classes("p9=1")


@pytest.mark.parametrize(("text", "named"), [
    ("p0=1,p0=2", "p0 is given twice"),
    # The same class by another of its names.
    ("p0=1,realtime=2", "'realtime' is p0, given twice"),
])
def test_a_class_given_twice_in_classes_is_named(text: str, named: str) -> None:
    """The last share won silently: p0=1,p0=2 ran as p0=2 alone."""
    with pytest.raises(ScenarioError, match=f"--classes {text!r}: {named}; give each "
                                            "class once"):
        parse_classes(text)


def test_classes_are_shares_and_the_rest_goes_to_p1() -> None:
    """``--classes p0=0.2`` sent every request as p0: the values were weights, scaled to
    sum to 1, where the help said shares and a user meant 20 % p0, the rest the default
    class."""
    mix = parse_classes("p0=0.2")
    assert mix is not None
    assert mix.shares == pytest.approx({Priority.P0: 0.2, Priority.P1: 0.8,
                                        Priority.P2: 0.0})
    mix = parse_classes("p0=0.1,p2=0.3")
    assert mix is not None
    assert mix.shares == pytest.approx({Priority.P0: 0.1, Priority.P1: 0.6,
                                        Priority.P2: 0.3})
    # Shares that sum to 1 run as they always did (docs/tuning.md's p0=0.2,p1=0.8), as
    # does tune's own command line, the shares it read written back (to the ulp).
    mix = parse_classes("p0=0.1,p1=0.2,p2=0.7")
    assert mix is not None and mix.shares[Priority.P1] == pytest.approx(0.2)
    assert parse_classes("p0=0") == parse_classes("p1=1")  # no p0: all p1


@pytest.mark.parametrize(("text", "said"), [
    # Accepted silently and scaled: p0 ran 45 %, not the 50 % given.
    ("p0=0.5,p1=0.6", "the shares sum to 1.1, more than every request; give shares that "
                      "sum to 1 or less (the rest go to p1), e.g. p0=0.455,p1=0.545 (the "
                      "same scaled to 1)"),
    ("p0=1,p1=3", "p1=3 is not a share; give each class's fraction of the requests, from "
                  "0 to 1 (the rest go to p1), e.g. p0=0.25,p1=0.75 (the same scaled to 1)"),
    ("p0=1e308,p1=1e308", "p0=1e+308 is not a share"),
    ("p0=-0.1", "p0=-0.1 is not a share"),
    ("p0=nan", "p0=nan is not a share"),
])
def test_classes_that_are_not_shares_are_refused_naming_the_fix(text: str, said: str
                                                                ) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_classes(text)
    assert str(e.value).startswith(f"--classes {text!r}: {said}"), str(e.value)


def test_window_and_classes_parse() -> None:
    assert parse_window("600:900") == (600.0, 900.0)
    assert parse_window(":900") == (None, 900.0)
    assert parse_window(None) == (None, None)
    mix = parse_classes("p0=0.25,p1=0.75")
    assert mix is not None and mix.shares[Priority.P0] == 0.25
    for bad in ("600-900", "a:b"):
        with pytest.raises(ScenarioError, match="--trace-window"):
            parse_window(bad)
    for bad in ("p0", "p9=1", "p0=x", "p0=2"):
        with pytest.raises(ScenarioError, match="--classes"):
            parse_classes(bad)


def test_a_trace_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    """A long-lived process (a tune's worker, a notebook) that replays a file the user
    has since rewritten replays the new rows, not the first read's."""
    from slopilot.engine.sim.distribution_spec import read_cached

    path = tmp_path / "t.csv"
    path.write_text("arrival_time,prompt_tokens,output_tokens\n0,10,5\n1,20,5\n")
    assert [r.prompt_tokens for r in read_cached(str(path), None).records] == [10, 20]
    path.write_text("arrival_time,prompt_tokens,output_tokens\n0,30,5\n1,40,5\n2,50,5\n")
    assert [r.prompt_tokens for r in read_cached(str(path), None).records] == [30, 40, 50]
