"""strict_json: NaN and infinities as null, wherever they sit, and nothing else changed."""

from __future__ import annotations

import json
import math

import numpy as np

from slopilot.engine import strict_json


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def test_every_non_finite_number_is_null_and_the_rest_as_json_writes_it() -> None:
    value = {"a": math.nan, "b": [1, 2.5, -math.inf, (math.inf, np.float32("nan"))],
             "c": {"d": np.float64(0.25), "e": True, "f": None, "g": "NaN"}}
    text = strict_json.dumps(value, sort_keys=True)
    assert json.loads(text, parse_constant=_refuse) == {
        "a": None, "b": [1, 2.5, None, [None, None]],
        "c": {"d": 0.25, "e": True, "f": None, "g": "NaN"}}
