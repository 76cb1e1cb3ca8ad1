"""Stores that misbehave on purpose, as some S3 clones do: they take the condition headers of
a conditional put and ignore them."""

from __future__ import annotations

from tiered.store import FileStore


class IgnoresConditions(FileStore):
    """A store like some S3 clones: takes If-Match / If-None-Match and ignores them."""

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        return super().put(key, data)


class IgnoresIfMatch(FileStore):
    """Honours If-None-Match only: CAS replaces of a manifest would still lose updates."""

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        return super().put(key, data, if_none_match=if_none_match)
