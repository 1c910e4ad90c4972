"""Resource quantities as the API server keeps them, and compared as amounts.

The API server parses every ``resources.requests`` / ``limits`` value into a
resource.Quantity and serves it back in its canonical form: a JSON number becomes a string
(``1`` -> ``"1"``), a decimal takes the largest SI suffix that keeps it whole
(``0.5`` -> ``"500m"``, ``1000`` -> ``"1k"``), a binary amount the largest binary suffix
(``1.5Gi`` -> ``"1536Mi"``). A drift check that compared what it rendered with what it
reads back as written found a difference on every reconcile of such a spec, and patched
the Deployment each time; so the operator renders the canonical form and compares
quantities by amount (``same_quantity``), which also holds for a form an API server of
another version might choose.
"""

from __future__ import annotations

import decimal
from decimal import ROUND_UP, Decimal

from kubernetes.utils.quantity import parse_quantity

from slopilot.operator.validation import QUANTITY

_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T",
                     15: "P", 18: "E"}
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_NANO = Decimal("1e-9")
# Wide enough for any amount a quantity can name (Ei and e18 are 19 digits, plus 9
# for the nanos), so no step below rounds.
_EXACT = decimal.Context(prec=60)


def _text(value: object) -> str:
    # bool is an int to Python, never a quantity to the API server.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a quantity")
    text = str(value)
    if not QUANTITY.fullmatch(text):  # also NaN, Infinity, 1_000: Decimal reads those
        raise ValueError(f"{text!r} is not a quantity")
    return text


def amount(value: object) -> Decimal:
    """The amount ``value`` names (``kubernetes.utils.quantity.parse_quantity``), rounded
    up to a nano as the API server rounds it; ValueError where it is no quantity."""
    text = _text(value)
    with decimal.localcontext(_EXACT):
        parsed = parse_quantity(text)
        if parsed.as_tuple().exponent < -9:
            parsed = parsed.quantize(_NANO, rounding=ROUND_UP)
        return parsed


def same_quantity(live: object, desired: object) -> bool:
    """Whether two resource values name the same amount (``"1"`` and ``1``, ``"500m"``
    and ``"0.5"``); values that are not both quantities compare as they are."""
    try:
        return amount(live) == amount(desired)
    except ValueError:
        return live == desired


def canonical(value: object) -> str:
    """``value`` as the API server stores it (resource.Quantity's CanonicalizeBytes)."""
    text, whole = _text(value), amount(value)
    if whole == 0:
        return "0"
    suffix = QUANTITY.fullmatch(text).group(3) or ""  # type: ignore[union-attr]
    # A binary suffix is kept where the amount is whole and at least 1Ki; below, or with
    # a fraction, the amount is shown in decimal (apimachinery: "avoids rounding").
    if suffix.endswith("i") and abs(whole) >= 1024 and whole == whole.to_integral_value():
        mantissa, power = int(whole), 0
        while mantissa % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            mantissa, power = mantissa // 1024, power + 1
        return f"{mantissa}{_BINARY_SUFFIXES[power]}"
    sign, digits, exponent = whole.as_tuple()
    mantissa, power = int("".join(map(str, digits))), int(exponent)
    while mantissa % 10 == 0:
        mantissa, power = mantissa // 10, power + 1
    mantissa, power = mantissa * 10 ** (power % 3), power - power % 3  # SI steps of 1000
    number = f"{'-' if sign else ''}{mantissa}"
    if suffix[:1] in ("e", "E") and suffix[1:]:  # the exponent form stays one
        return number if power == 0 else f"{number}e{power}"
    if power in _DECIMAL_SUFFIXES:
        return number + _DECIMAL_SUFFIXES[power]
    return f"{number}e{power}"


def stored_form(value: str) -> str:
    """``canonical(value)``, or ``value`` as it is where it is no quantity: the API
    server refuses that with its own message (which reconcile's checks name first)."""
    try:
        return canonical(value)
    except ValueError:
        return value
