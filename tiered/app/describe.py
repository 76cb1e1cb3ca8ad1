"""Human rendering of `tiered describe-storage` rows (`Archiver.describe()`).

A row is the JSON object `--json` prints, one per partition:

    topic, partition, high_watermark,
    local  {start_offset, last_offset, size_bytes, segments},
    remote {start_offset, last_offset, size_bytes, segments, archived_manifests,
            dirty_ratio (compacted topics: the head's share not compacted yet)},
    pending_bytes, safe_to_delete_below,
    uploader (node holding the upload lease, or None), role ("uploader" | "standby")

Offsets are inclusive; None (JSON null) means "none" (no local segment, nothing in the
bucket, no high watermark checkpoint). A partition whose manifest could not be read has an
`error` in `remote`; it is listed under the table. Rendering never fails on a missing field:
it shows "-".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tiered.config.units import format_size

__all__ = ["COLUMNS", "render_rows", "summary_line"]

#: column header -> how a row renders in it
COLUMNS: tuple[str, ...] = (
    "PARTITION", "HIGH WATERMARK", "LOCAL OFFSETS", "LOCAL SIZE", "REMOTE OFFSETS",
    "REMOTE SIZE", "DIRTY", "PENDING", "SAFE TO DELETE BELOW", "UPLOADER", "ROLE",
)
#: columns whose values are numbers, aligned right
_RIGHT = frozenset({"HIGH WATERMARK", "LOCAL SIZE", "REMOTE SIZE", "DIRTY", "PENDING",
                    "SAFE TO DELETE BELOW"})


def _section(row: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = row.get(name)
    return value if isinstance(value, Mapping) else {}


def _num(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _size(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return format_size(value)
    return "-"


def _ratio(value: object) -> str:
    """A compacted topic's dirty ratio as a percentage; "-" for other topics."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:.0%}"
    return "-"


def _offsets(part: Mapping[str, Any]) -> str:
    start, last = part.get("start_offset"), part.get("last_offset")
    if not isinstance(start, int) or not isinstance(last, int) or last < start:
        return "-"
    return f"{start}..{last}"


def _segments(part: Mapping[str, Any], size: str) -> str:
    count = part.get("segments")
    if not isinstance(count, int) or count == 0:
        return "-" if size in ("-", "0 B") else size
    text = f"{size} in {count} seg"
    archived = part.get("archived_manifests")
    if isinstance(archived, int) and archived:
        text += f" (+{archived} archived manifest{'s' if archived != 1 else ''})"
    return text


def _name(row: Mapping[str, Any]) -> str:
    return f"{row.get('topic', '?')}-{_num(row.get('partition'))}"


def _cells(row: Mapping[str, Any]) -> dict[str, str]:
    local, remote = _section(row, "local"), _section(row, "remote")
    return {
        "PARTITION": _name(row),
        "HIGH WATERMARK": _num(row.get("high_watermark")),
        "LOCAL OFFSETS": _offsets(local),
        "LOCAL SIZE": _segments(local, _size(local.get("size_bytes"))),
        "REMOTE OFFSETS": "error (below)" if remote.get("error") else _offsets(remote),
        "REMOTE SIZE": _segments(remote, _size(remote.get("size_bytes"))),
        "DIRTY": _ratio(remote.get("dirty_ratio")),
        "PENDING": _size(row.get("pending_bytes")),
        "SAFE TO DELETE BELOW": _num(row.get("safe_to_delete_below")),
        "UPLOADER": str(row.get("uploader") or "-"),
        "ROLE": str(row.get("role") or "-"),
    }


def render_rows(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rows as an aligned text table, header first; one line saying so when empty."""
    if not rows:
        return ["no partitions found"]
    table = [_cells(r) for r in rows]
    # DIRTY only where a compacted topic is listed: other deployments see the table unchanged
    columns = [c for c in COLUMNS if c != "DIRTY" or any(t[c] != "-" for t in table)]
    widths = {c: max(len(c), *(len(t[c]) for t in table)) for c in columns}

    def line(cells: Mapping[str, str]) -> str:
        parts = [cells[c].rjust(widths[c]) if c in _RIGHT else cells[c].ljust(widths[c])
                 for c in columns]
        return "  ".join(parts).rstrip()

    errors = [f"{_name(r)}: cannot read the manifest: {_section(r, 'remote')['error']}"
              for r in rows if _section(r, "remote").get("error")]
    return [line({c: c for c in columns}), *(line(t) for t in table), *errors]


def summary_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line of totals: partitions, local and remote bytes, bytes waiting for upload."""

    def total(section: str | None, key: str) -> int:
        values = (r.get(key) if section is None else _section(r, section).get(key) for r in rows)
        return sum(v for v in values if isinstance(v, int) and not isinstance(v, bool))

    return (
        f"{len(rows)} partition{'s' if len(rows) != 1 else ''}: "
        f"{format_size(total('local', 'size_bytes'))} local, "
        f"{format_size(total('remote', 'size_bytes'))} in the bucket, "
        f"{format_size(total(None, 'pending_bytes'))} waiting for upload"
    )
