"""Sizes and durations as written in configuration files (tiered.config.units)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiered.config.units import (
    UnitError,
    format_duration_ms,
    format_size,
    parse_duration_ms,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("0", 0),
        ("4096", 4096),
        ("16MiB", 16 * 1024 * 1024),
        ("1 GiB", 1024**3),
        ("500MB", 500_000_000),
        ("4KiB", 4096),
        ("4KB", 4000),
        ("2 TiB", 2 * 1024**4),
        ("1PB", 10**15),
        ("16mib", 16 * 1024 * 1024),
        ("  8 kib  ", 8192),
        ("10B", 10),
        ("1.5KiB", 1536),
        ("0.5 MiB", 512 * 1024),
        (".5KB", 500),
    ],
)
def test_parse_size_accepts_ints_and_unit_strings(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "negative"),
        ("-5MiB", "negative"),
        (1.5, "float"),
        (16.0, "float"),
        ("1.1KiB", "not a whole number"),
        ("1.5", "not a whole number"),
        ("abc", "is not a size"),
        ("16 MiB extra", "is not a size"),
        ("", "is not a size"),
        ("16M", "ambiguous"),
        ("1 k", "ambiguous"),
        ("16 XB", "unknown unit"),
        ("16 bytes", "unknown unit"),
        (True, "boolean"),
        (None, "NoneType"),
        ([16], "list"),
    ],
)
def test_parse_size_rejects_with_a_precise_message(value: object, message: str) -> None:
    with pytest.raises(UnitError, match=message) as info:
        parse_size(value)
    # the message quotes the input so the operator sees what was wrong
    if isinstance(value, str) and value:
        assert repr(value) in str(info.value)


def test_ambiguous_size_unit_names_both_meanings() -> None:
    with pytest.raises(UnitError) as info:
        parse_size("16M")
    assert "MiB" in str(info.value) and "MB" in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (500, 500),
        ("250", 250),
        ("500ms", 500),
        ("30s", 30_000),
        ("15m", 900_000),
        ("2min", 120_000),
        ("1h", 3_600_000),
        ("1h30m", 5_400_000),
        ("1h 30m", 5_400_000),
        ("7d", 604_800_000),
        ("1w", 604_800_000),
        ("0.5s", 500),
        ("1.5h", 5_400_000),
        ("1D", 86_400_000),
    ],
)
def test_parse_duration_ms(text: object, expected: int) -> None:
    assert parse_duration_ms(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "negative"),
        ("-1h", "negative"),
        (1.5, "float"),
        ("1h30", "number without a unit"),
        ("30 30s", "number without a unit"),
        ("7 days", "unknown unit"),
        ("1fortnight", "unknown unit"),
        ("0.0005s", "not a whole number"),
        ("", "empty"),
        ("h", "not a duration"),
        (False, "boolean"),
        ({"ms": 1}, "dict"),
    ],
)
def test_parse_duration_rejects_with_a_precise_message(value: object, message: str) -> None:
    with pytest.raises(UnitError, match=message):
        parse_duration_ms(value)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1000, "1000 B"),
        (1024, "1 KiB"),
        (16 * 1024 * 1024, "16 MiB"),
        (1536 * 1024 * 1024, "1.5 GiB"),
        (5 * 1024**3, "5 GiB"),
        (1024**5, "1 PiB"),
    ],
)
def test_format_size_for_humans(n: int, text: str) -> None:
    assert format_size(n) == text


def test_exact_formatted_sizes_parse_back() -> None:
    for n in (0, 1, 1024, 16 * 1024 * 1024, 5 * 1024**3):
        assert parse_size(format_size(n).replace(" ", "")) == n


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (500, "500ms"),
        (604_800_000, "7d"),
        (5_400_000, "1h30m"),
        (90_061_001, "1d1h1m1s1ms"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text


@given(st.integers(min_value=0, max_value=10**15))
def test_formatted_durations_parse_back_exactly(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["", "B", "KiB", "MiB", "GB"]))
def test_sizes_with_any_unit_are_exact_multiples(count: int, unit: str) -> None:
    scale = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GB": 10**9}[unit]
    assert parse_size(f"{count}{unit}") == count * scale


def test_negative_formatting_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        format_size(-1)
    with pytest.raises(ValueError):
        format_duration_ms(-1)


def test_timestamps_parse_from_ms_or_iso_8601_with_a_zone() -> None:
    from tiered.config.units import format_timestamp_ms, parse_timestamp_ms

    assert parse_timestamp_ms("1793491200000") == 1793491200000
    assert parse_timestamp_ms("2026-11-01T00:00:00Z") == 1793491200000
    assert parse_timestamp_ms("2026-11-01T09:00:00+09:00") == 1793491200000
    assert parse_timestamp_ms("2026-11-01T00:00:00.250Z") == 1793491200250
    assert format_timestamp_ms(1793491200250) == "2026-11-01T00:00:00.250Z"
    for bad, words in (("2026-11-01T00:00:00", "no time zone"), ("soon", "not a timestamp"),
                       ("-1", "not a timestamp"), ("1969-12-31T00:00:00Z", "before 1970")):
        with pytest.raises(UnitError, match=words):
            parse_timestamp_ms(bad)
