"""Object-store errors, shared by every backend so callers never see a boto3 or OS exception."""

from __future__ import annotations

from tiered.errors import TieredError


class StoreError(TieredError):
    """An object-store operation failed for good (after any retries)."""

    exit_code = 5


class ObjectNotFound(StoreError):
    """The key does not exist (HTTP 404 / NoSuchKey / missing file)."""


class PreconditionFailed(StoreError):
    """A conditional put lost: the object exists (`If-None-Match: *`) or its ETag moved on
    (`If-Match`). Compare-and-swap callers re-read and retry; nothing was written."""


class BucketNotFound(StoreError):
    """The configured bucket does not exist (S3 NoSuchBucket, or a `file://` root that is
    missing and cannot be created). Never retried: a typo or a bucket not created yet."""


class AccessDenied(StoreError):
    """Credentials are missing or not allowed to do this (HTTP 401/403). Never retried."""


class ConditionalWritesUnsupported(StoreError):
    """The store accepted a conditional put it should have refused: it ignores `If-Match` /
    `If-None-Match`, so compare-and-swap manifest commits would silently lose updates."""
