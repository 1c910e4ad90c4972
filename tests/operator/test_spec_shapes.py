"""A spec whose sections are the wrong shape is refused by name, never half read.

The CRD's schema types every section, but an LLMDeployment can reach the parser without
it (an older CRD installed, ``kubectl`` with validation off, a test client): a section
of another type was read as absent, so ``spec.alerts: "x"`` ran with the default alerts
and said nothing, and ``spec.resources: 1`` raised an AttributeError.
"""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.spec import SpecError, parse_spec


def parse(**spec: Any) -> Any:
    return parse_spec({"metadata": {"name": "chat", "namespace": "ns"},
                       "spec": {"model": {"name": "m"}, **spec}})


@pytest.mark.parametrize(("spec", "needle"), [
    ({"alerts": "x"}, "spec.alerts='x': expected a mapping"),
    ({"resources": 1}, "spec.resources=1: expected a mapping"),
    ({"tuning": ["enabled"]}, "spec.tuning=['enabled']: expected a mapping"),
    ({"tuning": {"bounds": 5}}, "spec.tuning.bounds=5: expected a mapping"),
    ({"slo": True}, "spec.slo=true: expected a mapping"),
    ({"model": "m"}, "spec.model='m': expected a mapping"),
    ({"resources": {"cpu": ["2"]}}, "spec.resources.cpu=['2']: expected"),
])
def test_a_section_of_another_type_is_named(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(**spec)
    assert any(needle in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(("window", "needle"), [
    ("0s", "spec.tuning.window='0s'"), ("0.0001ms", "spec.tuning.window='0.0001ms'"),
    ("999999999h", "spec.tuning.window='999999999h'")])
def test_a_trial_window_outside_what_a_trial_can_measure_is_refused(window: str,
                                                                     needle: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(tuning={"window": window})
    assert any(needle in p and "between" in p for p in info.value.problems), \
        info.value.problems


def test_a_huge_value_is_cut_in_the_message() -> None:
    with pytest.raises(SpecError) as info:
        parse(alerts="x" * 100_000)
    assert max(len(p) for p in info.value.problems) < 300


def test_well_shaped_sections_still_parse() -> None:
    spec = parse(resources={"cpu": 2, "memory": "4Gi"}, tuning={"window": "90s"})
    assert (spec.cpu, spec.memory, spec.tuning.window_s) == ("2", "4Gi", 90.0)


@pytest.mark.parametrize("window", ["1s", "30s", "59s"])
def test_a_window_of_under_four_scrapes_is_warned_of(window: str) -> None:
    """A window's range holds the ServiceMonitor's 15 s scrapes: under four of them a
    replica may leave one sample in it, and a rate of one sample is nothing, so its
    requests are in none of the window's figures (the loop rejects such a window)."""
    spec = parse(tuning={"window": window})
    said = [w for w in spec.warnings if "spec.tuning.window" in w]
    assert len(said) == 1, spec.warnings
    assert f"spec.tuning.window={window!r}" in said[0] and "15 s" in said[0] \
        and "1m" in said[0], said


@pytest.mark.parametrize("window", ["1m", "2m", "90s"])
def test_a_window_of_four_scrapes_or_more_is_not_warned_of(window: str) -> None:
    spec = parse(tuning={"window": window})
    assert not [w for w in spec.warnings if "spec.tuning.window" in w], spec.warnings


def test_a_window_under_four_of_the_scrape_interval_said_is_warned_of() -> None:
    """``spec.alerts.scrapeInterval: 30s``: a 1m window holds two scrapes, one failed
    or late leaves one."""
    spec = parse(tuning={"window": "1m"}, alerts={"scrapeInterval": "30s"})
    said = [w for w in spec.warnings if "spec.tuning.window" in w]
    assert len(said) == 1 and "30 s" in said[0] and "2m" in said[0], spec.warnings
    spec = parse(tuning={"window": "2m"}, alerts={"scrapeInterval": "30s"})
    assert not [w for w in spec.warnings if "spec.tuning.window" in w], spec.warnings


def test_a_default_window_under_four_scrapes_says_it_is_the_default() -> None:
    """The window left out is 2m: the warning says so, and what to set."""
    spec = parse(alerts={"scrapeInterval": "1m"})
    said = [w for w in spec.warnings if "spec.tuning.window" in w]
    assert len(said) == 1 and "the default" in said[0] \
        and "set spec.tuning.window to at least 4m" in said[0], spec.warnings


def test_a_window_written_as_the_default_is_not_said_to_be_left_out() -> None:
    """The schema stores the default in every CR, so 2m written and 2m left out read the
    same: the warning said "(the default where it is left out)" to a user who wrote it."""
    spec = parse(tuning={"window": "2m"}, alerts={"scrapeInterval": "1m"})
    said = [w for w in spec.warnings if "spec.tuning.window" in w]
    assert len(said) == 1 and "left out" not in said[0], said
    assert "as written, or the default" in said[0], said
