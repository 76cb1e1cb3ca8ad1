"""Store URLs: `s3://bucket[/prefix]` and `file:///absolute/path`, parsed and checked before
any backend is built, so a bad URL is one clear configuration error naming it (with any
credentials blanked out)."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse

from tiered.errors import ConfigError

#: the URL schemes a backend serves (`tiered.store.STORES` maps them to the backends)
SCHEMES = ("file", "s3")

_EXPECTED = "expected s3://bucket[/prefix] or file:///absolute/path"
#: AWS's rules for new buckets: 3..63 of [a-z0-9.-], starting and ending with a letter or digit
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", "--x-s3", ".mrap")


def parse_store_url(url: str) -> tuple[str, str, str]:
    """Split a store URL into (scheme, bucket or root directory, key prefix).

    `s3://bucket/a/b/` gives ("s3", "bucket", "a/b"); `file:///srv/tiered` gives
    ("file", "/srv/tiered", ""). Raises `ConfigError` naming the URL (with any user:password
    part blanked out) for anything a backend could not serve safely.
    """
    shown = _redact(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"store URL {shown!r} does not parse: {exc}; {_EXPECTED}") from exc
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigError(
            f"store URL {shown!r}: unknown scheme {scheme or '(none)'!r}; known: {known} "
            f"({_EXPECTED})"
        )
    if "@" in parts.netloc:
        raise ConfigError(
            f"store URL {shown!r}: credentials do not belong in the URL; set "
            "cloud_storage_access_key / cloud_storage_secret_key or use the standard AWS chain"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"store URL {shown!r}: '?query' and '#fragment' are not allowed")
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket:
            raise ConfigError(f"store URL {shown!r} names no bucket; {_EXPECTED}")
        problem = bucket_name_problem(bucket)
        if problem:
            raise ConfigError(f"store URL {shown!r}: bad bucket name {bucket!r}: {problem}")
        return "s3", bucket, _prefix(parts.path, shown)
    return "file", _file_root(parts, shown), ""


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is not a valid S3 bucket name, or None when it is."""
    if not _BUCKET_RE.fullmatch(name):
        return (
            "use 3 to 63 lowercase letters, digits, '.' and '-', starting and ending with a "
            "letter or digit"
        )
    if ".." in name or ".-" in name or "-." in name:
        return "'.' may not be next to another '.' or a '-'"
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        pass
    else:
        return "it may not look like an IP address"
    if name.startswith(_BUCKET_RESERVED_PREFIXES) or name.endswith(_BUCKET_RESERVED_SUFFIXES):
        return "the prefix or suffix is reserved by AWS"
    return None


def _prefix(path: str, shown: str) -> str:
    """The key prefix of an s3 URL, without leading or trailing '/'."""
    prefix = urllib.parse.unquote(path).strip("/")
    if not prefix:
        return ""
    for segment in prefix.split("/"):
        if segment in ("", ".", ".."):
            raise ConfigError(
                f"store URL {shown!r}: the prefix may not contain empty, '.' or '..' segments"
            )
    if ":" in prefix:
        raise ConfigError(f"store URL {shown!r}: the prefix may not contain ':'")
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in prefix):
        raise ConfigError(f"store URL {shown!r}: the prefix may not contain control characters")
    return prefix


def _file_root(parts: urllib.parse.SplitResult, shown: str) -> str:
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"store URL {shown!r}: file URLs take an absolute path with three slashes, "
            f"file:///abs/path; {parts.netloc!r} was read as a host name (relative paths are "
            "not allowed)"
        )
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/"):
        raise ConfigError(f"store URL {shown!r}: the path must be absolute (file:///abs/path)")
    segments = [s for s in path.split("/") if s]
    if any(s in (".", "..") for s in segments) or "\x00" in path:
        raise ConfigError(f"store URL {shown!r}: the path may not contain '.', '..' or NUL")
    return "/" + "/".join(segments)


def _redact(url: str) -> str:
    """The URL with any `user:password@` blanked, so an error never prints a secret."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{tail}"
