"""The fields of a trace's rows, read alike in every format (``trace_formats.py``,
``trace_public.py``): a time (seconds, or a date; ``Clock`` keeps one file to one kind), a
token count, a column's canonical name; and the error every reader raises.

Errors name the file, the line and the field, and quote at most a short excerpt of the
offending value: a trace is data a user (or an attacker) supplies, never echoed whole.
"""

from __future__ import annotations

import datetime
import math
import re

from slopilot.engine.request import Priority
from slopilot.engine.sim.quote import excerpt

# Azure's names too, read in any order beside other columns: a slice of Azure's trace
# saved by pandas (``df.to_csv(path)``) has its index as an unnamed first column.
ALIASES = {"timestamp": "arrival_time", "priority": "class",
           "contexttokens": "prompt_tokens", "generatedtokens": "output_tokens"}
MAX_SECONDS = 1e11
"""The largest numeric timestamp, in seconds (the year 5138 as epoch seconds): epoch
milliseconds (1.7e12 in 2024) would otherwise replay as seconds, a trace of centuries."""
MAX_TOKENS = 2**24
"""The longest prompt or output a trace may give (16,777,216 tokens): above every model's
context window (the longest hold 10M), so a larger one is a wrong column or a hostile
file. The deployment's own limit is judged at replay, where too long a prompt is
rejected as the engine would (unread: ``workload.SyntheticPrompt``)."""


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file and line."""


def canonical(column: str) -> str:
    """A header's column as the CSV format names it (``ContextTokens``: ``prompt_tokens``)."""
    name = column.strip().lower()
    return ALIASES.get(name, name)


class Clock:
    """The timestamps of one file: all numbers (seconds), all dates with a zone or all
    dates without one. Mixed, a date reads as seconds since 1970 next to a number's own
    origin, and the trace would span 54 years; a date without a zone reads as UTC next
    to one with its own; which kind was meant is the user's to say."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.kind: str | None = None
        self.since = 0

    def read(self, value: object, line: int, name: str) -> float:
        seconds, kind = trace_time(value, self.label, line, name)
        if self.kind is None:
            self.kind, self.since = kind, line
        elif kind != self.kind:
            # Dates with and without a zone: the naive ones read as UTC, and two rows
            # written a second apart replayed two hours apart beside a +02:00 one.
            mix = ("dates with and without a zone; give every date its zone, or none"
                   if kind in DATES and self.kind in DATES
                   else "seconds and dates; give every row the same kind")
            raise TraceError(
                f"{self.label}:{line}: {name}={excerpt(value)} is {kind}, but line "
                f"{self.since} (and each row since) gives {self.kind}: the trace mixes "
                + mix)
        return seconds


_SECONDS = "a number of seconds"
DATE, NAIVE_DATE = "a date with a zone", "a date without a zone (read as UTC)"
DATES = (DATE, NAIVE_DATE)
_PER_SECOND = {"seconds": 1.0, "milliseconds": 1e3}
_FINEST_EPOCH = 1e20
"""Above every epoch count in a unit down to nanoseconds (1.7e18 in 2024): a time past
this is no time in any unit, not milliseconds to divide."""
_EPOCH_UNITS = (("milliseconds", 1e3), ("microseconds", 1e6), ("nanoseconds", 1e9),
                ("nanoseconds or finer", _FINEST_EPOCH / MAX_SECONDS))


_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NOT_FINITE = ("nan", "inf", "infinity")
"""Read as numbers, so that the bounds below name them (trace times are finite)."""


def trace_time(value: object, label: str, line: int, name: str, *,
               unit: str = "seconds") -> tuple[float, str]:
    """Seconds, and whether they came as a number (of ``unit``: seconds, or milliseconds as
    Mooncake's) or as a date."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int past any float: no time
            number = None
    elif isinstance(value, str):
        text = value.strip()
        try:
            # A plain number, as a token count is one: float() also takes Python's digit
            # grouping ("1_000") and any script's digits (a full-width "1"), which would
            # read a malformed column rather than refuse it.
            if not (_PLAIN_NUMBER.fullmatch(text) or text.lower().lstrip("+-") in _NOT_FINITE):
                raise ValueError(text)
            number = float(text)
        except ValueError:
            try:
                stamp = datetime.datetime.fromisoformat(text)
            except ValueError:
                pass
            else:
                if stamp.tzinfo is None:  # trace timestamps without a zone are UTC (Azure's)
                    return stamp.replace(tzinfo=datetime.UTC).timestamp(), NAIVE_DATE
                return stamp.timestamp(), DATE
    if number is not None and math.isfinite(number) and number >= 0:
        if number > _FINEST_EPOCH:
            # No unit makes this a time, and its year would print in hundreds of digits.
            raise TraceError(
                f"{label}:{line}: {name}={excerpt(value)} as {unit} is past any clock "
                f"(above {MAX_SECONDS:g} s, the year 5138); trace times are {unit}: check "
                "that the column holds times")
        per_second = _PER_SECOND[unit]
        seconds = number / per_second
        if seconds > MAX_SECONDS:
            # The unit that brings it under the bound: "divide by 1000" on nanoseconds
            # left a time still a million times too late.
            finer, by = next((u, d) for u, d in _EPOCH_UNITS
                             if d > per_second and number / d <= MAX_SECONDS)
            raise TraceError(
                f"{label}:{line}: {name}={excerpt(value)} as {unit} is the year "
                f"{1970 + seconds / 31_556_952:,.0f}; it looks like epoch {finer}: divide "
                f"the column by {by / per_second:,.0f} (trace times are {unit})")
        return seconds, _SECONDS
    dates = " or an ISO date like 2023-11-16 18:15:46.680" if unit == "seconds" else ""
    raise TraceError(f"{label}:{line}: {name}={excerpt(value)} is not a time; use {unit} "
                     f"(>= 0){dates}")


_BEYOND = 1e12
"""Past any bound on a count: a whole float above it is not made an int to compare."""


def token_count(value: object, label: str, line: int, name: str, *, lo: int) -> int:
    number: int | None = None
    fraction: float | None = None  # a number given with a fractional part
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value):
        number, fraction = _whole(value)
    elif isinstance(value, str):
        text = value.strip()
        # ASCII digits only: str.isdigit() also takes "²" and other digits int() refuses;
        # a sign is no length ("-5" reads as below the minimum, "--5" as no number).
        digits = text[1:] if text[:1] in "+-" else text
        if digits.isascii() and digits.isdigit():
            # Past 12 digits it is beyond the bound either way, so the int is not built
            # (Python refuses int() of a digit string past 4,300 digits).
            magnitude = int(digits) if len(digits) <= 12 else MAX_TOKENS + 1
            number = -magnitude if text.startswith("-") else magnitude
        elif _PLAIN_NUMBER.fullmatch(text) and math.isfinite(float(text)):
            # "374.0", as pandas writes a length once its column held a NaN, or "2e2": a
            # whole number, as the same value in a JSONL row is.
            number, fraction = _whole(float(text))
    if fraction is not None and fraction >= lo:  # below it, the bound is what to say
        down = math.floor(fraction)
        raise TraceError(f"{label}:{line}: {name}={excerpt(value)} is not a whole number of "
                         f"tokens; a length counts tokens: round it ({down:,} or "
                         f"{down + 1:,})")
    if number is None or number < lo:
        # An output of 0 cannot be replayed: the engine generates the prefill's token,
        # and replaying it as 1 would count a token the trace never had.
        why = ("; a request generates at least one token (its prefill's): drop the row "
               "or give 1") if canonical(name) == "output_tokens" and number == 0 else ""
        raise TraceError(f"{label}:{line}: {name}={excerpt(value)} must be a whole number "
                         f">= {lo}{why}")
    if number > MAX_TOKENS:
        raise TraceError(f"{label}:{line}: {name}={excerpt(value)} exceeds {MAX_TOKENS:,} "
                         "tokens, longer than any model's context; check that the column "
                         "holds a length in tokens")
    return number


def trace_class(value: object, label: str, line: int, name: str) -> Priority:
    """A row's class (``p0``, ``1``, ``realtime``...), a whole float taken as its number:
    pandas writes a column of classes ``1.0`` once it held a NaN, as it writes a length
    ``374.0``, which ``token_count`` reads."""
    number: float | None = None
    if isinstance(value, float) and math.isfinite(value):
        number = value
    elif isinstance(value, str) and _PLAIN_NUMBER.fullmatch(value.strip()):
        number = float(value.strip())
    if number is not None and math.isfinite(number):
        if not number.is_integer():
            down = math.floor(number)
            near = [str(n) for n in (down, down + 1) if n in (0, 1, 2)]
            if near:
                raise TraceError(f"{label}:{line}: {name}={excerpt(value)} is not a whole "
                                 f"class; round it ({' or '.join(near)}), or give p0, p1 "
                                 "or p2")
        elif number in (0, 1, 2):
            return Priority(int(number))
    try:
        return Priority.parse(value)
    except ValueError as e:
        # Priority.parse names "priority" itself; another column's name is said too.
        field = "" if name.strip().lower() == "priority" else f"{name}: "
        raise TraceError(f"{label}:{line}: {field}{e}") from None


def _whole(value: float) -> tuple[int | None, float | None]:
    """A finite float as a count: ``(the int, None)`` where it is whole, ``(None, it)``
    where it has a fractional part."""
    if not value.is_integer():
        return None, value
    if abs(value) > _BEYOND:
        return (MAX_TOKENS + 1 if value > 0 else -(MAX_TOKENS + 1)), None
    return int(value), None
