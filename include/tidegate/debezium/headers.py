"""A key struct as Kafka Connect's default header converter (SimpleHeaderConverter) writes it in
the ``__debezium.newkey``/``oldkey`` headers of a primary-key change: JSON-like text whose values
are Java's own renderings, not the record's JSON converter's (docs/compat.md). Found field by
field by the generated comparison with Debezium (tests/compat/test_generated.py):

- a Decimal: BigDecimal.toString at the column's scale (Python's str of a Decimal matches it);
- a double: Double.toString (``4.484906333172532E8``, ``100.0``);
- Connect's Date, Time and Timestamp (``time.precision.mode: connect``): ISO text, unquoted,
  in a format chosen by the value (a date before 1970-01-02 is a time of day).
"""

from __future__ import annotations

import math
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from .values import DECIMAL_SCHEMA, at_scale

DATE, TIME, TIMESTAMP = (f"org.apache.kafka.connect.data.{n}" for n in ("Date", "Time", "Timestamp"))
DAY_MS = 86_400_000


def java_double(x: float) -> str:
    """Double.toString: plain from 10^-3 up to 10^7, else d.dddE<n>; the shortest digits."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0.0" if math.copysign(1, x) < 0 else "0.0"
    d = Decimal(repr(x))
    if 1e-3 <= abs(x) < 1e7:
        text = format(d, "f")
        return text if "." in text else text + ".0"
    sign, digits, _ = d.as_tuple()
    mantissa = "".join(map(str, digits)).rstrip("0") or "0"
    return f"{'-' if sign else ''}{mantissa[0]}.{mantissa[1:] or '0'}E{d.adjusted()}"


def _date_text(epoch_day: int) -> str:
    # only from 1970-01-02 on (_instant_text): java.util's calendar is Gregorian there too
    return (date(1970, 1, 1) + timedelta(days=epoch_day)).isoformat()


def _time_text(ms_of_day: int) -> str:
    s, ms = divmod(ms_of_day, 1000)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{ms:03d}Z"


def _instant_text(ms: int) -> str:
    """A java.util.Date as Connect's Values writes it: the format is chosen by the value, not the
    schema: before 1970-01-02 as a time of day, on a midnight as a date, else as a timestamp."""
    day, ms_of_day = divmod(ms, DAY_MS)
    if ms < DAY_MS:
        return _time_text(ms_of_day)
    if ms_of_day == 0:
        return _date_text(day)
    return f"{_date_text(day)}T{_time_text(ms_of_day)}"


def header_value(schema: dict[str, Any], raw: Any, value: Any, dumps: Any) -> str:
    """One field's text; ``raw``: the source's value, ``value``: the record's (converted) one."""
    if value is None:
        return "null"
    name = schema.get("name")
    if name == DECIMAL_SCHEMA:
        return str(at_scale(Decimal(str(raw)), int(schema.get("parameters", {}).get("scale", 0))))
    if name in (DATE, TIME, TIMESTAMP):
        return _instant_text(int(value) * DAY_MS if name == DATE else int(value))
    if name is None and schema.get("type") == "double" and isinstance(value, (int, float)):
        return java_double(float(value))
    return dumps(value).decode()
