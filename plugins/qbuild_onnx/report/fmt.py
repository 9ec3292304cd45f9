"""The one number format of the report pages (``report.html`` of ``evaluate`` and
``auto_quantize``): sizes as "68 KB" / "1.2 MB", speed ratios as "1.23×", percentages,
decibels with one decimal, F1-like scores with three decimals, times in ms or µs, and
counts with thousands separators. Never an exponent (``6.8e+04``), whatever the value.

Every function takes what a report JSON may hold (a number, the strings "inf", "-inf" and
"nan" that stand for infinities there, or None) and returns plain text (the caller
escapes it); a missing value is "–".
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"
TIMES = "×"


def number(v: Any) -> float | None:
    """A report value as a float (the strings "inf", "-inf", "nan" included), or None."""
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _special(x: float, unit: str = "") -> str | None:
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return ("∞" if x > 0 else "−∞") + (f" {unit}" if unit else "")
    return None


def fixed(v: Any, decimals: int) -> str:
    """``v`` with exactly ``decimals`` decimals (and thousands separators)."""
    x = number(v)
    if x is None:
        return MISSING
    special = _special(x)
    if special is not None:
        return special
    return f"{x:,.{decimals}f}".replace("-", "−")


def _sig(x: float, significant: int = 3) -> str:
    """``x`` to ``significant`` digits in fixed notation (whole numbers at and above
    10 ** significant): 0.000123, 1.23, 123, 12,345."""
    if x == 0:
        return "0"
    digits = max(0, significant - 1 - math.floor(math.log10(abs(x))))
    text = f"{round(x, digits):,.{digits}f}"
    # rounding up may add a digit (9.996 -> "10.00"): one decimal fewer then
    if digits and len(text.lstrip("-").replace(",", "").replace(".", "").lstrip("0")) > \
            significant:
        text = f"{round(x, digits - 1):,.{digits - 1}f}"
    return text.replace("-", "−")


def plain(v: Any) -> str:
    """A number of unknown kind: three significant digits, no exponent (an integer as is)."""
    x = number(v)
    if x is None:
        return MISSING
    special = _special(x)
    if special is not None:
        return special
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}".replace("-", "−")
    return _sig(x)


def count(v: Any) -> str:
    """An integer count: "1,234"."""
    x = number(v)
    return MISSING if x is None or not math.isfinite(x) else f"{round(x):,}"


_SIZE_UNITS = ("KB", "MB", "GB", "TB")


def size(v: Any) -> str:
    """Bytes in decimal units: "900 B", "6.8 KB", "68 KB", "1.2 MB" (two significant
    digits below 10 of a unit, whole units above)."""
    x = number(v)
    if x is None or not math.isfinite(x):
        return MISSING
    if abs(round(x)) < 1000:
        return f"{round(x)} B"
    for i, unit in enumerate(_SIZE_UNITS):
        scaled = x / 1000 ** (i + 1)
        # rounding may carry into the next unit (999,999 bytes is "1.0 MB", not "1000 KB")
        if abs(round(scaled)) < 1000 or unit == _SIZE_UNITS[-1]:
            return (f"{scaled:.1f} {unit}" if abs(scaled) < 9.95 else
                    f"{round(scaled)} {unit}")
    return MISSING  # unreachable: the last unit returns


def ratio(v: Any) -> str:
    """A speed ratio: "1.23×"."""
    x = number(v)
    if x is None:
        return MISSING
    return _special(x) or f"{x:.2f}{TIMES}"


def ratio_pm(v: Any, noise: Any) -> str:
    """A speed ratio with its spread: "1.23× ± 0.02" (just the ratio without a spread)."""
    n = number(noise)
    if number(v) is None or n is None or not math.isfinite(n):
        return ratio(v)
    return f"{ratio(v)} ± {n:.2f}"


def percent(v: Any, decimals: int = 1) -> str:
    """A fraction as a percentage: 0.123 -> "12.3 %"."""
    x = number(v)
    if x is None:
        return MISSING
    return _special(x, "%") or f"{x * 100:.{decimals}f} %".replace("-", "−")


def db(v: Any) -> str:
    """Decibels with one decimal: "35.7 dB" ("∞ dB": identical outputs)."""
    x = number(v)
    if x is None:
        return MISSING
    return _special(x, "dB") or f"{x:.1f} dB".replace("-", "−")


def score(v: Any) -> str:
    """A score in [0, 1] (F1, AP50, agreement): three decimals, "0.963"."""
    return fixed(v, 3)


def ms(v: Any) -> str:
    """Milliseconds: "76.7 ms", "1.23 ms", "76.3 µs" below a millisecond."""
    x = number(v)
    if x is None:
        return MISSING
    special = _special(x, "ms")
    if special is not None:
        return special
    if x and abs(x) < 1:
        return f"{_sig(x * 1000)} µs"
    return f"{_sig(x)} ms"
