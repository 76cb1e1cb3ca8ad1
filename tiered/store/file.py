"""Local-directory backend (`file:///abs/path`): the embedded default and the test double.

Each key is a file under the root. Guarantees match S3's where tiered relies on them:

* a reader sees a whole old or a whole new object, never a torn one: writes go to a temp file
  in the same directory, are fsynced, then `os.replace`d (and the directory fsynced);
* conditional puts hold across processes: the condition is checked and the object swapped in
  while holding an exclusive `flock` on one of `LOCK_STRIPES` lock files, chosen by key hash,
  under `.tiered-locks/` (held only for the check and the rename, never during the copy);
  `if_none_match` additionally publishes with `os.link`, atomic even for a writer that skips
  the lock;
* the ETag is the MD5 of the content (S3's single-part ETag), remembered in a side file under
  `.tiered-etags/` together with the data file's (inode, size, mtime_ns); a side file that
  does not describe the current data file (a crash between the two renames, a file copied in
  by hand) is ignored and the hash recomputed.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from tiered.errors import ConfigError
from tiered.store.base import (
    Blob,
    ObjectInfo,
    ObjectStore,
    RangeStream,
    StoreSettings,
    file_window,
)
from tiered.store.errors import AccessDenied, ObjectNotFound, PreconditionFailed, StoreError

log = logging.getLogger(__name__)

LOCK_DIR = ".tiered-locks"
ETAG_DIR = ".tiered-etags"
#: marks temp files (`.<name>.tiered-tmp-<hex>`); never a valid key, skipped by `list`
TMP_MARK = ".tiered-tmp-"
#: lock files in all; keys hash onto them, so the count stays fixed however many keys exist
LOCK_STRIPES = 256
#: copy and hash in pieces this big (bytes), so a segment is never held whole in memory
COPY_CHUNK = 1024 * 1024
#: S3's key length limit (UTF-8 bytes), kept here so a key valid in one backend is in both
MAX_KEY_BYTES = 1024
NAME_MAX = 255


class _Identity(NamedTuple):
    """What pins one version of a data file: a replaced file has a new inode or mtime."""

    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Identity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


def key_problem(key: str) -> str | None:
    """Why `key` cannot name a file under the root, or None when it can."""
    if not key:
        return "it is empty"
    if "\x00" in key:
        return "it contains NUL"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"it is longer than {MAX_KEY_BYTES} bytes"
    segments = key.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return "it is absolute or has an empty, '.' or '..' segment (it would escape the root)"
    if segments[0] in (LOCK_DIR, ETAG_DIR):
        return f"{segments[0]}/ is reserved for the file store's own bookkeeping"
    if any(TMP_MARK in s for s in segments):
        return f"{TMP_MARK!r} is reserved for temp files"
    if any(len(s.encode("utf-8", "surrogatepass")) > NAME_MAX for s in segments):
        return f"a segment is longer than {NAME_MAX} bytes"
    return None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quiet(path: str) -> None:
    """Remove a file that may be missing; a directory there, or a file on its parent path,
    means no such file either."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
        os.unlink(path)


class _NotReady(Exception):
    """Carries the error of a `put_file` `ready` callback past the OSError -> StoreError
    mapping of `_write`: a failed verification is the caller's, not the store's."""


class _FileRange:
    """Bytes [begin, end) of an open file, read on demand (one version: writers replace
    objects by rename, so the open file never changes under the reader)."""

    def __init__(self, f: IO[bytes], begin: int, end: int) -> None:
        self._f = f
        self._pos = begin
        self._end = end

    def read(self, n: int = -1, /) -> bytes:
        left = self._end - self._pos
        data = os.pread(self._f.fileno(), left if n < 0 else min(n, left), self._pos)
        self._pos += len(data)
        return data

    def readinto(self, b: memoryview, /) -> int:
        n = os.preadv(self._f.fileno(), [b[:self._end - self._pos]], self._pos)
        self._pos += n
        return n

    def close(self) -> None:
        self._f.close()


class FileStore(ObjectStore):
    """Objects as files under one root directory (created if missing). Safe to share between
    threads and between processes on one host (flock does not protect NFS)."""

    scheme = "file"

    def __init__(self, settings: StoreSettings) -> None:
        from tiered.store import parse_store_url

        super().__init__(settings)
        scheme, self.root, _ = parse_store_url(settings.url)
        if scheme != self.scheme:
            raise ConfigError(f"FileStore cannot serve {settings.url!r}: not a file:// URL")
        #: the root was missing and this store made it (see `create_bucket`)
        self._made_root = not os.path.isdir(self.root)
        try:
            os.makedirs(os.path.join(self.root, LOCK_DIR), exist_ok=True)
            os.makedirs(os.path.join(self.root, ETAG_DIR), exist_ok=True)
        except OSError as exc:
            raise self._os_error("open", "", exc) from exc

    def create_bucket(self) -> bool:
        """The root directory is made when the store opens; True when it was missing then."""
        return self._made_root

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.settings,))

    # -- paths, locks, errors --------------------------------------------------------------

    def _check(self, key: str) -> str:
        """The data file path of `key`; refuses keys that could escape the root."""
        problem = key_problem(key)
        if problem:
            raise StoreError(f"invalid object key {key!r}: {problem}")
        return os.path.join(self.root, *key.split("/"))

    def _etag_path(self, key: str) -> str:
        return os.path.join(self.root, ETAG_DIR, *key.split("/"))

    def _lock_path(self, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        stripe = int.from_bytes(digest[:4], "big") % LOCK_STRIPES
        return os.path.join(self.root, LOCK_DIR, f"{stripe:03d}.lock")

    @contextlib.contextmanager
    def _lock(self, key: str) -> Iterator[None]:
        """Exclusive across threads and processes: each call opens its own file description,
        and flock excludes other descriptions even within one process. Not re-entrant."""
        fd = os.open(self._lock_path(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _where(self, key: str) -> str:
        return f"file://{self.root}/{key}"

    def _os_error(
        self, operation: str, key: str, exc: OSError, *, reading: bool = False
    ) -> StoreError:
        """The domain error for `exc`; `reading` means a path through or at a non-file
        (`a/b` where `a` is an object) just does not name an object."""
        where = self._where(key)
        if exc.errno == errno.ENOENT or (reading and exc.errno in (errno.ENOTDIR, errno.EISDIR)):
            return ObjectNotFound(f"{operation} {where}: no such object")
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return AccessDenied(
                f"{operation} {where}: permission denied on {exc.filename or self.root}; "
                "the service user cannot read or write the store directory"
            )
        if exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
            return StoreError(
                f"{operation} {where}: the key collides with another object used as a "
                "directory (the file store cannot hold both 'a' and 'a/b')"
            )
        return StoreError(f"{operation} {where} failed: {exc.strerror or exc}")

    # -- writes ----------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        self.check_conditions(if_none_match, if_match)

        def fill(f: IO[bytes]) -> str:
            f.write(data)
            return hashlib.md5(data).hexdigest()

        return self._write("put", key, fill, if_none_match=if_none_match, if_match=if_match)

    def put_file(
        self, key: str, path: Path | str, *, ready: Callable[[], None] | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> str:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed below, error mapped first
            begin, end = file_window(path, os.fstat(src.fileno()).st_size, byte_range,
                                     self._where(key))
        except OSError as exc:
            raise StoreError(f"put_file {self._where(key)}: cannot read {path}: {exc}") from exc

        def fill(f: IO[bytes]) -> str:
            digest = hashlib.md5()
            src.seek(begin)
            left = end - begin
            while left > 0 and (chunk := src.read(min(COPY_CHUNK, left))):
                digest.update(chunk)
                f.write(chunk)
                left -= len(chunk)
            if left:
                raise StoreError(f"put_file {self._where(key)}: {path} shrank while read")
            if ready is not None:  # the bytes wait in the temporary file, not yet visible
                try:
                    ready()
                except BaseException as exc:
                    raise _NotReady from exc
            return digest.hexdigest()

        with src:
            try:
                return self._write("put_file", key, fill)
            except _NotReady as held:
                assert held.__cause__ is not None
                raise held.__cause__ from None  # ready()'s own error, not a store fault

    def _write(
        self,
        operation: str,
        key: str,
        fill: Callable[[IO[bytes]], str],
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        dest = self._check(key)
        if if_none_match and os.path.lexists(dest):  # fast path; re-checked under the lock
            raise PreconditionFailed(f"{operation} {self._where(key)}: already exists")
        parent, name = os.path.split(dest)
        try:
            tmp, fd = self._create_temp(parent, name)
        except OSError as exc:
            raise self._os_error(operation, key, exc) from exc
        try:
            with os.fdopen(fd, "wb") as f:
                etag = fill(f)
                f.flush()
                os.fsync(f.fileno())
                ident = _Identity.of(os.fstat(f.fileno()))
            with self._lock(key):
                if if_none_match and os.path.lexists(dest):
                    raise PreconditionFailed(f"{operation} {self._where(key)}: already exists")
                if if_match is not None:
                    current = self._current_etag_locked(dest, key)
                    if current != if_match.strip('"'):
                        state = "is gone" if current is None else f"is at version {current}"
                        raise PreconditionFailed(
                            f"{operation} {self._where(key)}: expected version {if_match}, "
                            f"object {state}"
                        )
                # side file first: if we die before the rename it describes no live file
                self._write_sidecar(key, etag, ident)
                if if_none_match:
                    try:
                        os.link(tmp, dest)  # fails if a lock-less writer got there first
                    except FileExistsError as exc:
                        raise PreconditionFailed(
                            f"{operation} {self._where(key)}: already exists"
                        ) from exc
                else:
                    os.replace(tmp, dest)
                _fsync_dir(parent)
        except OSError as exc:
            raise self._os_error(operation, key, exc) from exc
        finally:
            _unlink_quiet(tmp)
        return etag

    def _create_temp(self, parent: str, name: str) -> tuple[str, int]:
        """A new temp file beside `name`, creating directories as needed. Retries when a
        concurrent delete prunes the directory between mkdir and open."""
        for _ in range(10):
            self._makedirs(parent)
            tmp = os.path.join(parent, f".{name}{TMP_MARK}{uuid.uuid4().hex}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                continue
            return tmp, fd
        raise OSError(errno.ENOENT, "directory keeps disappearing", parent)

    def _makedirs(self, path: str) -> None:
        """mkdir -p, fsyncing each new directory's parent so the entry survives a crash."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise OSError(
                        errno.ENOTDIR, "is an object, not a directory", directory
                    ) from None
                continue
            _fsync_dir(os.path.dirname(directory))

    # -- ETags -----------------------------------------------------------------------------

    def _write_sidecar(self, key: str, etag: str, ident: _Identity) -> None:
        """Record the ETag of one data file version. Best effort, not fsynced: it is a cache
        checked against the data file's identity, so a lost or stale one costs a re-hash."""
        path = self._etag_path(key)
        parent, name = os.path.split(path)
        tmp = ""
        try:
            tmp, fd = self._create_temp(parent, name)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(f"{etag} {ident.ino} {ident.size} {ident.mtime_ns}\n")
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("no ETag side file for %s: %s", self._where(key), exc)
            # an old one must not outlive its version: a reused inode could match it
            with contextlib.suppress(OSError):
                _unlink_quiet(path)
        finally:
            if tmp:
                _unlink_quiet(tmp)

    def _read_sidecar(self, key: str) -> tuple[str, _Identity] | None:
        try:
            with open(self._etag_path(key), encoding="ascii") as f:
                etag, ino, size, mtime_ns = f.read().split()
            return etag, _Identity(int(ino), int(size), int(mtime_ns))
        except (OSError, ValueError, UnicodeDecodeError):
            return None  # missing or unreadable: the caller re-hashes

    def _rehash_locked(self, dest: str, key: str) -> tuple[os.stat_result, str]:
        """Hash the current data file and remember the result; caller holds the key's lock."""
        with open(dest, "rb") as f:
            st = os.fstat(f.fileno())
            digest = hashlib.md5()
            while chunk := f.read(COPY_CHUNK):
                digest.update(chunk)
        etag = digest.hexdigest()
        self._write_sidecar(key, etag, _Identity.of(st))
        return st, etag

    def _current_etag_locked(self, dest: str, key: str) -> str | None:
        try:
            st = os.stat(dest)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        side = self._read_sidecar(key)
        if side is not None and side[1] == _Identity.of(st):
            return side[0]
        return self._rehash_locked(dest, key)[1]

    def _stat_and_etag(self, dest: str, key: str) -> tuple[os.stat_result, str]:
        """Size/mtime and ETag of one consistent version; raises FileNotFoundError."""
        st = os.stat(dest)
        if not stat.S_ISREG(st.st_mode):
            raise FileNotFoundError(errno.ENOENT, "not an object", dest)
        side = self._read_sidecar(key)
        if side is not None and side[1] == _Identity.of(st):
            return st, side[0]
        with self._lock(key):  # so the re-hash cannot record a version a writer replaced
            return self._rehash_locked(dest, key)

    # -- reads -----------------------------------------------------------------------------

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> Blob:
        dest = self._check(key)
        if byte_range is not None:
            begin, end = byte_range
            if begin < 0 or end < begin:
                raise ValueError(f"get {self._where(key)}: bad byte range [{begin}, {end})")
        try:
            with open(dest, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise FileNotFoundError(errno.ENOENT, "not an object", dest)
                if byte_range is None:
                    # the open file is one version (writers replace by rename), so the MD5
                    # of what was read is that version's ETag
                    data = f.read()
                    return Blob(data, hashlib.md5(data, usedforsecurity=False).hexdigest())
                part = os.pread(f.fileno(), end - begin, begin)
                return Blob(part, self._etag_of_open(f, st, key))
        except OSError as exc:
            raise self._os_error("get", key, exc, reading=True) from exc

    def open_range(self, key: str, begin: int, end: int, *, to_end: bool = False
                   ) -> RangeStream:
        dest = self._check(key)
        if begin < 0 or end <= begin:
            raise ValueError(f"open_range {self._where(key)}: bad byte range [{begin}, {end})")
        try:
            f = open(dest, "rb")  # noqa: SIM115 - the caller closes the stream
        except OSError as exc:
            raise self._os_error("get", key, exc, reading=True) from exc
        return _FileRange(f, begin, end)

    def _etag_of_open(self, f: IO[bytes], st: os.stat_result, key: str) -> str:
        """The ETag of the version `f` has open: the sidecar's when it pins this very file,
        else the MD5 of the open file's bytes."""
        side = self._read_sidecar(key)
        if side is not None and side[1] == _Identity.of(st):
            return side[0]
        digest = hashlib.md5(usedforsecurity=False)
        offset = 0
        while chunk := os.pread(f.fileno(), COPY_CHUNK, offset):
            digest.update(chunk)
            offset += len(chunk)
        return digest.hexdigest()

    def head(self, key: str) -> ObjectInfo:
        dest = self._check(key)
        try:
            st, etag = self._stat_and_etag(dest, key)
        except OSError as exc:
            raise self._os_error("head", key, exc, reading=True) from exc
        return ObjectInfo(key=key, size=st.st_size, etag=etag, last_modified=st.st_mtime)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        head = prefix.rpartition("/")[0]
        if head and key_problem(head) is None:
            # start at the deepest directory the prefix names whole: listing one partition
            # reads that partition's directories, not every top-level directory of the bucket
            # (one per partition under the hashed prefixes, docs/format.md)
            yield from self._walk(os.path.join(self.root, *head.split("/")), head + "/", prefix)
            return
        yield from self._walk(self.root, "", prefix)

    def _walk(self, directory: str, key_prefix: str, prefix: str) -> Iterator[ObjectInfo]:
        """Depth-first in key order: a directory `d` sorts as `d/`, which is where its keys
        fall among its siblings' (so `a-b` comes before `a/x`, as in S3's byte order)."""
        try:
            with os.scandir(directory) as it:
                entries = builtins.list(it)
        except (FileNotFoundError, NotADirectoryError):
            return  # pruned by a concurrent delete
        except OSError as exc:
            raise self._os_error("list", key_prefix + "*", exc) from exc
        children = []
        for entry in entries:
            if TMP_MARK in entry.name or (not key_prefix and entry.name in (LOCK_DIR, ETAG_DIR)):
                continue
            if entry.is_dir(follow_symlinks=False):
                sort_key = f"{key_prefix}{entry.name}/"
                if sort_key.startswith(prefix) or prefix.startswith(sort_key):
                    children.append((sort_key, True, entry.path))
            elif entry.is_file(follow_symlinks=False):
                sort_key = key_prefix + entry.name
                if sort_key.startswith(prefix):
                    children.append((sort_key, False, entry.path))
        children.sort()
        for sort_key, is_dir, path in children:
            if is_dir:
                yield from self._walk(path, sort_key, prefix)
                continue
            try:
                st, etag = self._stat_and_etag(path, sort_key)
            except FileNotFoundError:
                continue  # deleted since the scan
            except OSError as exc:
                raise self._os_error("list", sort_key, exc) from exc
            yield ObjectInfo(key=sort_key, size=st.st_size, etag=etag, last_modified=st.st_mtime)

    # -- deletes ---------------------------------------------------------------------------

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        failed: builtins.list[str] = []
        for key in keys:
            dest = self._check(key)
            try:
                # under the lock, so a delete cannot fall between a CAS's check and its rename
                with self._lock(key):
                    # missing is not an error; a directory is not an object
                    with contextlib.suppress(
                        FileNotFoundError, IsADirectoryError, NotADirectoryError
                    ):
                        os.unlink(dest)
                    _unlink_quiet(self._etag_path(key))
            except OSError as exc:
                log.warning("could not delete %s: %s", self._where(key), exc)
                failed.append(key)
                continue
            self._prune(os.path.dirname(dest), self.root)
            self._prune(os.path.dirname(self._etag_path(key)), os.path.join(self.root, ETAG_DIR))
        return failed

    @staticmethod
    def _prune(directory: str, stop: str) -> None:
        """Remove now-empty directories from `directory` up to (not including) `stop`."""
        while directory != stop and directory.startswith(stop + os.sep):
            try:
                os.rmdir(directory)
            except OSError:
                return  # not empty (or already gone): S3 has no directories to leave behind
            directory = os.path.dirname(directory)
