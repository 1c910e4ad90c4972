"""The too-long warning's share reads true at its own threshold: above 1 % it fires, and
a whole percent rounded 2 of 199 to "1%" and 3 of 200 to "2%"."""

from __future__ import annotations

import pytest

from slopilot.engine.sim.too_long import ServableLimit, TooLong

LIMIT = ServableLimit(8192, "context", "llama-3-8b", 100_000)


@pytest.mark.parametrize("requests, of, shown", [
    # Never rounded onto the threshold it is above, nor onto all of them.
    (2, 199, "(just over 1%)"), (3, 200, "(1.5%)"), (19, 200, "(9.5%)"),
    (199, 2000, "(10%)"), (90, 100, "(90%)"), (1999, 2000, "(over 99.9%)"),
    (2000, 2000, "(100%)")])
def test_the_share_has_a_decimal_below_ten_percent(requests: int, of: int,
                                                    shown: str) -> None:
    said = TooLong(requests, of, LIMIT)
    assert said.warns
    assert f"{requests:,} of {of:,} requests {shown} exceed" in said.text(), said.text()
    assert f"{requests:,} of {of:,} requests {shown} exceed" in said.clause(), said.clause()
