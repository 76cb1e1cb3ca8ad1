"""Errors of the manifest layer.

Every refusal is a `TieredError` whose message names the partition, the offsets or the object
key involved, so an operator can act on it without a traceback. Offsets past the ends of a
partition reuse `tiered.errors.OffsetOutOfRange`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiered.errors import TieredError

if TYPE_CHECKING:
    from manifests.manifest import PartitionManifest


class ManifestError(TieredError):
    """Base of every manifest-layer refusal."""


class InvalidName(ManifestError):
    """A topic, partition, revision or object name cannot become part of an object key."""

    exit_code = 2


class InvalidTopicName(InvalidName):
    """Not a legal Kafka topic name (1..249 of `[a-zA-Z0-9._-]`, not `.` or `..`)."""


class CorruptManifest(ManifestError):
    """Manifest bytes do not parse, miss a field, or describe an impossible partition.

    `key` is the object key the bytes came from (None for bytes given directly)."""

    exit_code = 3

    def __init__(self, reason: str, *, key: str | None = None) -> None:
        self.reason = reason
        self.key = key
        super().__init__(f"{key}: {reason}" if key else reason)


class UnsupportedManifestVersion(CorruptManifest):
    """The manifest was written by a newer format than this reader knows; refusing it is
    safer than guessing at fields (a newer writer may have changed their meaning)."""

    def __init__(self, version: int, supported: int, *, key: str | None = None) -> None:
        self.version = version
        self.supported = supported
        super().__init__(
            f"manifest format version {version} is newer than this reader understands "
            f"(at most {supported}); upgrade tiered to read it",
            key=key,
        )


class InvalidUpdate(ManifestError):
    """An operation would break a manifest invariant (bad segment, misaligned merge, term
    going backwards, retention past the end, an object name reused)."""


class OffsetGap(InvalidUpdate):
    """A new segment starts after the next expected offset: offsets would be missing."""

    def __init__(self, expected: int, got: int, where: str) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"{where}: gap: segment starts at offset {got} but the manifest continues at "
            f"{expected} (offsets {expected}..{got - 1} would be missing)"
        )


class OffsetOverlap(InvalidUpdate):
    """A new segment starts at or before the last offset already covered."""

    def __init__(self, expected: int, got: int, where: str) -> None:
        self.expected = expected
        self.got = got
        super().__init__(
            f"{where}: overlap: segment starts at offset {got} but offsets up to "
            f"{expected - 1} are already covered (next expected offset {expected})"
        )


class CollectedName(InvalidUpdate):
    """A change would newly reference an object that garbage collection may have deleted (it
    is no younger than the manifest's `gc_cutoff_ms`): upload it again under a fresh name."""

    def __init__(self, name: str, uploaded_at_ms: int | None, cutoff_ms: int, where: str) -> None:
        self.name = name
        age = "of unknown age" if uploaded_at_ms is None else f"last modified at {uploaded_at_ms}"
        super().__init__(
            f"{where}: object {name} ({age} ms) is not younger than the garbage-collection "
            f"cutoff {cutoff_ms} ms; it may be deleted, so it is not referenced"
        )


class ManifestConflict(ManifestError):
    """A compare-and-swap commit lost a race: the stored head manifest changed since it was
    read. `current`/`etag` are the freshly re-read manifest and its version, so the caller can
    re-apply its change on top; nothing was overwritten."""

    def __init__(self, key: str, current: PartitionManifest | None, etag: str | None) -> None:
        self.key = key
        self.current = current
        self.etag = etag
        state = "is gone" if current is None else f"is now at sequence {current.sequence}"
        super().__init__(f"{key}: lost a commit race; the stored manifest {state}")


class ManifestContention(ManifestConflict):
    """Commits kept losing their race until the caller's deadline passed: other writers are
    changing the manifest faster than this one can re-apply its change. Nothing was written;
    try again later."""

    def __init__(self, conflict: ManifestConflict, attempts: int, deadline_s: float) -> None:
        super().__init__(conflict.key, conflict.current, conflict.etag)
        self.attempts = attempts
        self.args = (
            f"{conflict.key}: lost the commit race {attempts} times within {deadline_s:g} s; "
            "other writers keep changing the manifest",
        )


class StaleTerm(ManifestError):
    """The stored manifest was written by a newer term: this writer has been fenced off and
    must stop writing the partition (its leadership moved on)."""

    def __init__(self, key: str, stored_term: int, writer_term: int) -> None:
        self.key = key
        self.stored_term = stored_term
        self.writer_term = writer_term
        super().__init__(
            f"{key}: fenced: the stored manifest has term {stored_term}, newer than this "
            f"writer's term {writer_term}"
        )


class ArchiveKeyCollision(ManifestError):
    """An archived manifest key already holds different bytes. Keys carry a checksum of the
    content, so this means a checksum collision or tampering; nothing is overwritten."""


class HistoryWithoutHead(ManifestError):
    """A writer found no head manifest (or only a damaged one) over objects of ours it could
    not prove a restore complete for: it stops the partition rather than start it afresh over
    that history (docs/format.md, "Losing objects")."""

    def __init__(self, key: str, detail: str, topic: str) -> None:
        self.key = key
        super().__init__(
            f"{key}: no usable head manifest, but the bucket holds this partition's history "
            f"({detail}); refusing to start the partition afresh over it. Repair it with "
            f"`tiered recover --rebuild-manifests --config FILE --topic {topic}`")
