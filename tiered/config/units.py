"""Values as people write them in configuration files: sizes, durations, percentages,
booleans, choices and text, each parsed from what TOML hands over (int, float, str, bool, list).

A size is a whole number of bytes: a plain integer, or a string with a unit, ``"16MiB"``,
``"1 GiB"``, ``"500MB"``, ``"4KiB"``, ``"0"``. Binary units (KiB, MiB, GiB, TiB, PiB) are powers
of 1024, decimal units (KB, MB, GB, TB, PB) powers of 1000, as IEC 80000-13 has them; unit
letters are case-insensitive. A bare ``K``/``M``/``G`` is refused as ambiguous rather than
guessed. A decimal number is accepted only when it comes out at a whole number of bytes
(``"1.5KiB"`` is 1536; ``"1.1KiB"`` is refused).

A duration is whole milliseconds: a plain integer (already milliseconds, as every ``*_ms``
property in Redpanda's documentation), or a string of one or more number-unit pairs,
``"500ms"``, ``"30s"``, ``"15m"``, ``"1h30m"``, ``"7d"``, ``"2w"``.

Negative values are refused here; Kafka's ``-1`` ("no limit") is the caller's business, because
only some properties mean anything by it (see `tiered.config.properties`).

A percentage is a number from TOML or a string ``"20%"``; a boolean is TOML's true / false or
the strings "true" / "false" that Kafka tools write; a choice is one of a fixed set of strings,
where a comma list (``"delete,compact"``, or a TOML array) names a set and is normalised to its
sorted form (``"compact,delete"``).

Every failure is a `UnitError` (a `ValueError`) whose message quotes the input and says what
would have been accepted, so the configuration loader can show it as is.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

__all__ = [
    "UnitError",
    "describe",
    "format_duration_ms",
    "format_size",
    "parse_bool",
    "parse_choice",
    "parse_duration_ms",
    "parse_int",
    "parse_number",
    "parse_percent",
    "parse_size",
    "parse_text",
    "format_timestamp_ms",
    "parse_timestamp_ms",
]


class UnitError(ValueError):
    """A size or duration that does not parse; the message is meant for the operator."""


KIB = 1024

#: unit (lower case) -> bytes
SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": KIB,
    "mib": KIB**2,
    "gib": KIB**3,
    "tib": KIB**4,
    "pib": KIB**5,
}

#: unit (lower case) -> milliseconds
DURATION_UNITS: dict[str, int] = {
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
}

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(rf"^\s*(?P<num>{_NUMBER})\s*(?P<unit>[A-Za-z]*)\s*$")
_DURATION_PART_RE = re.compile(rf"\s*(?P<num>{_NUMBER})\s*(?P<unit>[A-Za-z]*)")

_SIZE_HINT = "write a whole number of bytes or a size like '16MiB', '1 GiB', '500MB'"
_DURATION_HINT = "write milliseconds or a duration like '500ms', '30s', '15m', '1h30m', '7d'"


def _whole(number: Decimal, scale: int, text: str, what: str) -> int:
    """`number * scale` as an int, refusing fractions and negatives with `text` quoted."""
    if number < 0:
        raise UnitError(f"{text!r} is negative; a {what} cannot be")
    total = number * scale
    if total != total.to_integral_value():
        unit = "bytes" if what == "size" else "milliseconds"
        raise UnitError(f"{text!r} is {total.normalize():f} {unit}, not a whole number")
    return int(total)


def _decimal(text: str, whole_input: str, hint: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - the regexes only pass valid numbers
        raise UnitError(f"{whole_input!r} is not a number; {hint}") from None


def _int_or_text(value: object, kind: str, whole: str, hint: str) -> int | str:
    """A non-negative int passed through, or the string to parse; anything else (booleans,
    floats, other types) refused with a message naming `kind`."""
    if isinstance(value, bool):
        raise UnitError(f"expected a {kind}, got boolean {str(value).lower()}; {hint}")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"{value} is negative; a {kind} cannot be")
        return value
    if isinstance(value, float):
        raise UnitError(f"expected {whole}, got float {value!r}; {hint}")
    if not isinstance(value, str):
        raise UnitError(f"expected a {kind}, got {type(value).__name__}; {hint}")
    return value


def parse_size(value: object) -> int:
    """Bytes from an int or a size string; see the module docstring for the accepted forms."""
    value = _int_or_text(value, "size", "a whole number of bytes", _SIZE_HINT)
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise UnitError(f"{value!r} is not a size; {_SIZE_HINT}")
    unit = match["unit"].lower()
    scale = SIZE_UNITS.get(unit)
    if scale is None:
        if unit in ("k", "m", "g", "t", "p"):
            letter = match["unit"].upper()
            raise UnitError(
                f"{value!r}: unit {match['unit']!r} is ambiguous; write {letter}iB "
                f"(powers of 1024) or {letter}B (powers of 1000)"
            )
        raise UnitError(
            f"{value!r}: unknown unit {match['unit']!r}; use B, KiB, MiB, GiB, TiB, PiB "
            "(powers of 1024) or KB, MB, GB, TB, PB (powers of 1000)"
        )
    return _whole(_decimal(match["num"], value, _SIZE_HINT), scale, value, "size")


def parse_duration_ms(value: object) -> int:
    """Milliseconds from an int (already ms) or a duration string such as ``"1h30m"``."""
    value = _int_or_text(value, "duration", "whole milliseconds", _DURATION_HINT)
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text:
        raise UnitError(f"{value!r} is empty; {_DURATION_HINT}")
    total = 0
    pos = 0
    parts = 0
    while pos < len(text):
        match = _DURATION_PART_RE.match(text, pos)
        if match is None:
            raise UnitError(f"{value!r} is not a duration; {_DURATION_HINT}")
        unit = match["unit"].lower()
        if not unit:
            # a bare number is milliseconds, but only on its own: "1h30" is a typo, not 1h+30ms
            if parts or match.end() != len(text):
                raise UnitError(f"{value!r}: number without a unit; {_DURATION_HINT}")
            unit = "ms"
        scale = DURATION_UNITS.get(unit)
        if scale is None:
            raise UnitError(
                f"{value!r}: unknown unit {match['unit']!r}; use ms, s, m (minutes), h, d, w"
            )
        total += _whole(_decimal(match["num"], value, _DURATION_HINT), scale, value, "duration")
        pos = match.end()
        parts += 1
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return total


def describe(raw: object) -> str:
    """A value as TOML names its type, for messages: ``string 'abc'``, ``boolean true``."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array"}
    if isinstance(raw, dict):
        return "a table"
    kind = names.get(type(raw), type(raw).__name__)
    shown = str(raw).lower() if isinstance(raw, bool) else repr(raw)
    return f"{kind} {shown}"


def parse_int(value: object) -> int:
    """A TOML integer (not a boolean, not a float, not a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnitError(f"expected an integer, got {describe(value)}")
    return value


def parse_number(value: object) -> float:
    """A finite number from a TOML int or float (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnitError(f"expected a number, got {describe(value)}")
    if value != value or value in (float("inf"), float("-inf")):
        raise UnitError(f"expected a finite number, got {value}")
    return float(value)


def parse_percent(value: object) -> float:
    """A percentage from a number (``20``, ``12.5``) or a string (``"20%"``); range is the
    caller's, since some percentages are shares of 100 and others are not."""
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1].strip()
        try:
            value = float(text)
        except ValueError:
            raise UnitError(f"{text!r} is not a percentage; write e.g. 20 or '20%'") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnitError(f"expected a percentage like 20 or '20%', got {describe(value)}")
    return parse_number(value)


def parse_bool(value: object) -> bool:
    """TOML's true / false, or exactly the strings "true" / "false" (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise UnitError(f"expected true or false, got {describe(value)}")


def parse_choice(value: object, choices: tuple[str, ...]) -> str:
    """One of `choices`; a comma list or array is a set, normalised to sorted order."""
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        value = ",".join(value)
    quoted = [repr(c) for c in choices]
    expected = ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)
    if not isinstance(value, str):
        raise UnitError(f"expected one of {expected}, got {describe(value)}")
    canonical = ",".join(sorted({part.strip() for part in value.split(",")}))
    if canonical not in choices:
        raise UnitError(f"{value!r} is not one of {expected}")
    return canonical


def parse_text(value: object) -> str:
    """A non-blank string. Blank is refused: Redpanda's documentation warns that "" does not
    reset a property."""
    if not isinstance(value, str):
        raise UnitError(f"expected a string, got {describe(value)}")
    if not value.strip():
        raise UnitError("empty string; remove the key to use the default")
    return value


def format_size(n: int) -> str:
    """A byte count for humans in binary units: ``16 MiB``, ``1.5 GiB``, ``500 B``.

    Exact multiples print without decimals; others are rounded to one decimal place, so the
    output is for reading, not for parsing back."""
    if n < 0:
        raise ValueError(f"format_size: negative size {n}")
    for unit in ("PiB", "TiB", "GiB", "MiB", "KiB"):
        scale = SIZE_UNITS[unit.lower()]
        if n >= scale:
            if n % scale == 0:
                return f"{n // scale} {unit}"
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_duration_ms(ms: int) -> str:
    """Milliseconds for humans, largest units first and exact: ``7d``, ``1h30m``, ``500ms``.

    The output parses back with `parse_duration_ms` to the same value."""
    if ms < 0:
        raise ValueError(f"format_duration_ms: negative duration {ms}")
    if ms == 0:
        return "0ms"
    parts = []
    rest = ms
    for unit in ("d", "h", "m", "s", "ms"):
        scale = DURATION_UNITS[unit]
        count, rest = divmod(rest, scale)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


_TIMESTAMP_HINT = ("give milliseconds since the epoch (1793491200000) or an ISO-8601 time with "
                   "its zone (2026-11-01T00:00:00Z, 2026-11-01T09:00:00+09:00)")


def parse_timestamp_ms(text: str) -> int:
    """A record timestamp, as Kafka keeps it (ms since the Unix epoch), from the digits of one
    or from an ISO-8601 time. A time without a zone is refused: read as local time or as UTC
    it would silently pick the wrong records for half the world."""
    text = text.strip()
    if re.fullmatch(r"[0-9]{1,16}", text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UnitError(f"{text!r} is not a timestamp; {_TIMESTAMP_HINT}") from None
    if moment.tzinfo is None:
        raise UnitError(f"{text!r} has no time zone; add Z for UTC or an offset such as "
                        "+02:00")
    ms = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if ms < 0:
        raise UnitError(f"{text!r} is before 1970; {_TIMESTAMP_HINT}")
    return ms


def format_timestamp_ms(ms: int) -> str:
    """A record timestamp as ISO-8601 UTC, for messages ("2026-11-01T00:00:00.000Z")."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
