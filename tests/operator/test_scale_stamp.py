"""The stamp a scale leaves on the Deployment (scale_stamp.py), read back as written.

The loop state a stamp names is compared as written by the operator and as read back
from the API server, which keeps no trailing ``.0`` on a number; and the annotation is
anyone's with patch rights on the Deployment, so what is not a stamp reads as none.
"""

from __future__ import annotations

from typing import Any

import pytest

from slopilot.operator.scale_stamp import SCALE_ANNOTATION, ScaleStamp, read_stamp, record_digest


def deployment(annotation: str | None) -> dict[str, Any]:
    annotations = {} if annotation is None else {SCALE_ANNOTATION: annotation}
    return {"metadata": {"annotations": annotations}, "spec": {"replicas": 2}}


def test_a_state_as_written_and_as_read_back_has_one_digest() -> None:
    written = {"state": "steady", "since": 1000.0, "trial_starts": [5.0, 6.5],
               "twin": {"at": 12.0, "trusted": True}}
    read_back = {"twin": {"trusted": True, "at": 12}, "trial_starts": [5, 6.5],
                 "since": 1000, "state": "steady"}
    assert record_digest(written) == record_digest(read_back)
    assert record_digest(written) != record_digest({**written, "since": 1000.5})
    assert record_digest(None) != record_digest({})


def test_a_stamp_reads_back_as_written() -> None:
    stamp = ScaleStamp(record_digest({"state": "steady"}), 1, 2)
    assert read_stamp(deployment(stamp.annotation()[SCALE_ANNOTATION])) == stamp


@pytest.mark.parametrize("annotation", [
    None, "", "not json", "[1, 2]", '{"over": 1, "before": 1, "to": 2}',
    '{"over": "x", "before": -1, "to": 2}', '{"over": "x", "before": 1, "to": true}',
    '{"over": "x", "before": 1}', '{"over": "x", "before": 1.5, "to": 2}'])
def test_an_annotation_that_is_no_stamp_reads_as_none(annotation: str | None) -> None:
    assert read_stamp(deployment(annotation)) is None
