"""``safe_load_bounded``: what a value's own conversion raises is the loader's error.

PyYAML's constructors turn a plain scalar into the type its text resolves to, and what
that conversion raises (``datetime.date``'s ValueError for ``2026-02-30``, ``int``'s
for 5,000 digits, a KeyError for ``!!bool maybe``) left the loader as it was: past every
``yaml.YAMLError`` handler, printed as Python's words alone, with no file or field.
"""

from __future__ import annotations

import pytest

from slopilot.engine.sim.yaml_load import (
    MAX_VALUES,
    YAMLDuplicateKeyError,
    YAMLShapeError,
    YAMLValueError,
    safe_load_bounded,
)


@pytest.mark.parametrize(("text", "field", "kind", "reason"), [
    ("name: x\ncreated: 2026-02-30\n", "created", "date", "day is out of range for month"),
    ("model:\n  shape:\n    num_layers: " + "9" * 5000 + "\n", "model.shape.num_layers",
     "whole number", "5000 digits"),
    ("flags:\n  - !!bool maybe\n", "flags[0]", "boolean", "not a word YAML reads"),
    ("at: !!timestamp soon\n", "at", "date", "soon"),
    ("n: !!int twelve\n", "n", "whole number", "twelve"),
])
def test_a_value_its_type_cannot_hold_is_a_yaml_error_naming_the_field(
        text: str, field: str, kind: str, reason: str) -> None:
    with pytest.raises(YAMLValueError) as err:
        safe_load_bounded(text)
    message = str(err.value)
    assert message.startswith(f"{field} (line "), message
    assert f"is no {kind}" in message and reason in message, message
    assert "quote it" in message, message  # the fix
    assert "sys.set_int_max_str_digits" not in message  # Python's fix is not the user's
    assert len(message) < 400, message  # 5,000 digits are not quoted back
    assert err.value.field == field and err.value.problem_mark is not None


def test_the_quoted_value_stays_text() -> None:
    assert safe_load_bounded("created: '2026-02-30'\n") == {"created": "2026-02-30"}


def test_a_large_document_without_aliases_is_said_to_be_values_not_aliases() -> None:
    with pytest.raises(YAMLShapeError) as err:
        safe_load_bounded("a: [" + ", ".join(["1"] * (MAX_VALUES + 10)) + "]\n")
    assert "alias" not in str(err.value) and "more than 100,000 values" in str(err.value)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"b{i}: &b{i} [{', '.join([f'*{prev}'] * 10)}]\n"
        for i, prev in enumerate(["a", "b0", "b1", "b2", "b3"]))
    with pytest.raises(YAMLShapeError, match=r"its aliases \(\*name\) expand it"):
        safe_load_bounded(bomb)


@pytest.mark.parametrize(("text", "field", "lines"), [
    ("name: x\nduration_s: 60\nseed: 0\nduration_s: 5\n", "duration_s", (2, 4)),
    ("workload:\n  arrivals: {process: poisson, rate: 2, rate: 20}\n",
     "workload.arrivals.rate", (2, 2)),
    ("classes:\n  - {p0: 1}\n  - p1: 1\n    p1: 2\n", "classes[1].p1", (3, 4)),
])
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(
        text: str, field: str, lines: tuple[int, int]) -> None:
    # YAML kept the last silently: a scenario's duration_s: 60 ran 5 s.
    with pytest.raises(YAMLDuplicateKeyError) as err:
        safe_load_bounded(text)
    message = str(err.value)
    assert message.startswith(f"{field} given twice (line {lines[0]}, then line "
                              f"{lines[1]})"), message
    assert "keep the one you mean" in message
    assert err.value.field == field and err.value.problem_mark.line + 1 == lines[1]


def test_a_merge_key_overridden_is_no_duplicate() -> None:
    # ``<<: *base`` then a key of the base's is how YAML says "this one, not the base's".
    text = "base: &b {rate: 2, mean: 100}\nshift:\n  <<: *b\n  rate: 20\n"
    assert safe_load_bounded(text)["shift"] == {"rate": 20, "mean": 100}
    with pytest.raises(YAMLDuplicateKeyError, match=r"shift\.rate given twice"):
        safe_load_bounded(text + "  rate: 30\n")


def test_keys_that_differ_in_type_or_spelling_are_distinct() -> None:
    assert safe_load_bounded("1: a\n'1': b\nx: c\nX: d\n") == {1: "a", "1": "b", "x": "c",
                                                                 "X": "d"}
