"""stream_usage_cost.py ends, with its figures on one ``RESULT key=value`` line.

Its chat streams once waited for a role chunk before any token was pushed; the writer
sends that chunk with the first token, so the script waited for ever.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest

import benchmarks.stream_usage_cost as suc

APIS = ("completions", "chat")
OPTIONS = ("none", "include_usage", "continuous")


def test_every_variant_ends_and_reports_on_one_result_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["stream_usage_cost.py", "--rounds", "1",
                                      "--tokens", "20"])
    assert suc.main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    pairs = [kv.split("=") for kv in last.split()[1:]]
    assert all(len(pair) == 2 for pair in pairs), last
    result = {key: float(value) for key, value in pairs}
    assert set(result) == {f"{api}_{option}_us_per_chunk"
                           for api in APIS for option in OPTIONS}
    assert all(value > 0 for value in result.values())


async def _waits_for_ever() -> AsyncIterator[str]:
    yield "a chunk"
    await asyncio.Event().wait()  # nothing will set it
    yield "never"


def test_a_writer_that_waits_for_what_is_never_pushed_is_refused() -> None:

    async def drive() -> None:
        events = _waits_for_ever()
        assert suc.next_chunk(events) == "a chunk"
        with pytest.raises(RuntimeError, match="waited"):
            suc.next_chunk(events)

    asyncio.run(drive())
