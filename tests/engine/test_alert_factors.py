"""The alert factors file: what ``slopilot serve`` and ``slopilot meter`` learn of a
deployment's ``spec.alerts``, so that every threshold the rules judge is an edge."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from slopilot.engine.alert_factors import (
    ALERTS_FILE_ENV,
    DEFAULT_FACTORS,
    MAX_FACTORS,
    AlertFactors,
    AlertFactorsError,
    alert_factors_from_env,
    read_alert_factors,
)


def test_the_defaults_are_the_seeds_factors_the_only_edges_before() -> None:
    assert DEFAULT_FACTORS.factors(ttft=True) == DEFAULT_FACTORS.factors(ttft=False) \
        == (1.0, 2.0)


def test_the_slo_itself_is_always_a_factor_and_none_is_counted_twice() -> None:
    f = AlertFactors(ttft_warning=1.0, ttft_retune=1.0, tbt_scale=1.0)
    assert f.factors(ttft=True) == f.factors(ttft=False) == (1.0,)
    f = AlertFactors(ttft_warning=1.2, ttft_retune=1.37, tbt_scale=3)
    assert f.factors(ttft=True) == (1.0, 1.2, 1.37)
    assert f.factors(ttft=False) == (1.0, 3.0)
    assert max(len(f.factors(ttft=t)) for t in (True, False)) <= MAX_FACTORS


def test_the_file_reads_back_what_it_was_written_from() -> None:
    f = AlertFactors(ttft_warning=1.1, ttft_retune=1.37, tbt_scale=2.5)
    assert AlertFactors.from_dict(f.to_dict()) == f
    assert f.to_dict() == {"ttftWarningFactor": 1.1, "ttftRetuneFactor": 1.37,
                           "tbtScaleFactor": 2.5}
    # A factor not given keeps its default; one this image does not know is left
    # alone (a newer operator's file), read judged as before it was an edge.
    assert AlertFactors.from_dict({"ttftRetuneFactor": 3, "ttftFutureFactor": 9}) \
        == AlertFactors(ttft_retune=3)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.5, 0, -2, True, "2", None])
def test_a_factor_that_is_no_multiple_of_the_slo_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(AlertFactorsError, match=r"tbtScaleFactor=.*>= 1") as info:
        AlertFactors.from_dict({"tbtScaleFactor": bad})
    assert info.value.field == "tbtScaleFactor"


def test_a_warning_after_the_retune_is_refused() -> None:
    with pytest.raises(AlertFactorsError, match=r"ttftWarningFactor=3.*exceeds"):
        AlertFactors.from_dict({"ttftWarningFactor": 3, "ttftRetuneFactor": 2})


@pytest.mark.parametrize(("text", "says"), [
    ("[1, 2]", "expected a mapping"), ("{", "not valid JSON"),
    ('{"tbtScaleFactor": 2, "tbtScaleFactor": 3}', "tbtScaleFactor"),
    ('{"ttftRetuneFactor": "x"}', "ttftRetuneFactor='x'")])
def test_a_file_that_holds_no_factors_is_refused_naming_it(tmp_path: Path, text: str,
                                                           says: str) -> None:
    path = tmp_path / "alerts.json"
    path.write_text(text)
    with pytest.raises(AlertFactorsError, match=says) as info:
        read_alert_factors(path)
    assert str(path) in str(info.value)


def test_the_environment_names_the_file_or_leaves_the_defaults(tmp_path: Path) -> None:
    assert alert_factors_from_env({}) is DEFAULT_FACTORS
    assert alert_factors_from_env({ALERTS_FILE_ENV: ""}) is DEFAULT_FACTORS
    path = tmp_path / "alerts.json"
    path.write_text('{"ttftRetuneFactor": 1.37}')
    assert alert_factors_from_env({ALERTS_FILE_ENV: str(path)}) \
        == AlertFactors(ttft_retune=1.37)
    with pytest.raises(AlertFactorsError, match=rf"\${ALERTS_FILE_ENV} .*no such file"):
        alert_factors_from_env({ALERTS_FILE_ENV: str(tmp_path / "none.json")})
