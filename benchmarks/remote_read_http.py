"""Remote reads through the daemon's HTTP endpoint, against what the store and a trivial server
give in the same run (`python benchmarks/remote_read.py http`).

Set-up: a moto_server child process; partition 0 of a topic holds `--segments` closed segments
of `--segment-mb` MiB (incompressible 64 KiB batches) archived into the bucket by the real
archiver and deleted locally, plus a small active segment; partitions 1 and 2 hold one
archived segment each and an active segment of 16 MiB (1) or `--big-active-mb` MiB whose
`.index` is empty (2: the log end must not cost a scan of it per fetch). A real `tiered run`
child process serves `GET /v1/topics/T/partitions/P/records` with
`cloud_storage_chunk_prefetch = --prefetch`, or with the key not set at all (the default: the
adaptive read-ahead window, docs/remote-read.md) when `--prefetch` is not given.

Measures (MB/s are 10**6 bytes per second; every byte read is compared with the log):
* sequential: one new consumer session reads a segment start to end in 1 MiB fetches over one
  keep-alive connection, its last fetch ending where the segment does (the bytes of the
  object, no more); baseline: a boto3 streamed GET of the same object (1 MiB reads), run just
  before it, once the daemon is idle (the previous run's read-ahead into the segment after
  its own has settled). Three segments, medians reported. Also the daemon's CPU seconds per
  MB and, per run, the CPU milliseconds of the store server, the client and the daemon for
  each contender, and the daemon's store GETs and MB (its read-ahead into the next segment
  included). For reference, the same consumer reads the same segment through a naive
  read-through proxy (`NAIVE_PROXY`: one streamed GET, bytes staged in memory or in a file
  beside the cache, on its filesystem, and sent as they arrive, nothing checked, cached or
  read ahead), each against a boto3 GET of its own: `naive_proxy_memory_ratio` and
  `naive_proxy_file_ratio` say how far any daemon on this machine could get with this
  consumer. `naive_proxy_checked_ratio` is the file-staging proxy doing, the plainest way,
  what the daemon cannot leave out (every batch checked before it is served, the next
  segment's first chunk read ahead, answers through http.server): the gap between it and
  `ratio` is the cost of the daemon's own code. `protocol_ceiling_*`: the same consumer
  against a minimal HTTP server (`DISK_SERVER`, its own process) serving the segment's file
  from local disk in the same 1 MiB fetches (sendfile), no store at all: the ceiling of the
  protocol itself on this machine (`--no-naive` leaves the proxies and the ceiling out).
* sequential_catch_up: one consumer session reads `CATCH_UP` consecutive segments start to end,
  as a consumer that fell behind does (read-ahead carries it across segment boundaries);
  baseline: boto3 streamed GETs of the same objects one after the other.
* concurrent: 8 consumer sessions at once, one segment each; baseline: 8 boto3 threads reading
  the same 8 objects in chunk-sized ranged GETs.
* warm: the same 1 MiB fetch again (chunk cached), median latency; baseline: a minimal
  keep-alive HTTP server (http.server in its own process) returning the same bytes, the two
  requests alternating. Both through http.client.
* cold: a 1 MiB fetch of a chunk nobody read yet (empty cache for it), median; baseline: a
  boto3 GET of one chunk-sized range of the same object.
* active segment: warm fetch latency of archived offsets of partition 2 (big active segment,
  empty index) over partition 1's (16 MiB active segment), interleaved on one connection.

moto reads the whole object for every GET, ranged or not (a 1 MiB range of a 64 MiB object
costs about what the whole object does). Each figure therefore compares like with like where it
can: the sequential baseline is one GET, as tiered's read-ahead stream from byte 0 is one GET,
and the cold baseline is the same single ranged GET tiered makes. `moto_get_ms` reports the
cost of a 1-byte ranged GET of the segment object, the floor of every GET here. The consumers
and the boto3 baselines run in this process: each throughput figure's clocks start with the
harness's own objects collected and frozen (`settle_heap`), so no contender pays for them.

Every session starts on segments no other session touched: a session reading towards the end
of its segment reads ahead into the next one, so a run starting on a segment another session
read ahead would find its first chunk cached and stream the rest with a ranged GET, which moto
serves by copying the object's tail (about 20 ms more for a 62 MiB segment). With
`--segments` at its default every role gets its own segments with an unread one after them
(the concurrent consumers' segments are consecutive, as they always were: they start
together, so none finds its first chunk read ahead by another); fewer segments (tiny runs)
share them.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    MB,
    MIB,
    SHM,
    DaemonProcess,
    MotoServer,
    archive_everything,
    at_least,
    daemon_config,
    free_port,
    own_cpu_s,
    progress,
    settle_heap,
    versions,
)

from tiered.config import parse_config
from tiered.kafka.builder import encode_batch
from tiered.kafka.checkpoints import TopicPartition
from tiered.kafka.log_writer import LogWriter, write_high_watermarks
from tiered.kafka.records import Record

TOPIC = "bench"
BUCKET = "remote-read-http"
RECORDS_PER_BATCH = 16
RECORD_BYTES = 4096
FETCH = 1 << 20
#: the active segment of the partition the big one is compared with
SMALL_ACTIVE = 16 * MIB
#: sequential runs (one segment each); the report gives their medians
SEQUENTIAL_RUNS = 3
#: segments the catching-up consumer reads in one session
CATCH_UP = 3
CONSUMERS = 8


def _template() -> bytearray:
    rng = random.Random(7)
    records = [Record(i, 1_700_000_000_000 + i, None, rng.randbytes(RECORD_BYTES))
               for i in range(RECORDS_PER_BATCH)]
    return bytearray(encode_batch(records, base_offset=0))


def write_partition(log_dir: Path, partition: int, closed: list[int], active: int,
                    empty_index: bool) -> tuple[list[Path], int]:
    """Closed segments of the given sizes and an active one; returns the closed segments'
    paths and the log end offset. One batch is copied with new base offsets (the CRC does not
    cover them)."""
    template = _template()
    writer = LogWriter(log_dir / f"{TOPIC}-{partition}", segment_bytes=(1 << 31) - 1,
                       fsync=False, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, TOPIC))
    paths: list[Path] = []
    with writer:
        for size in [*closed, active]:
            start = writer.log_end_offset
            written = 0
            while written < size:
                template[:8] = writer.log_end_offset.to_bytes(8, "big")
                writer.append_batches(bytes(template))
                written += len(template)
            if len(paths) < len(closed):
                paths.append(log_dir / f"{TOPIC}-{partition}" / f"{start:020d}.log")
                writer.roll()
        end = writer.log_end_offset
    if empty_index:  # the active segment's index, as a broker that preallocates it leaves it
        for index in (log_dir / f"{TOPIC}-{partition}").glob("*.index"):
            if index.with_suffix(".log") not in paths:
                index.write_bytes(b"")
    return paths, end


def config_text(work: Path, endpoint: str, prefetch: int | None, chunk: int,
                cache_dir: Path) -> str:
    """The daemon's configuration; `prefetch` None leaves `cloud_storage_chunk_prefetch` out
    (the default, adaptive read-ahead)."""
    prefetch_line = "" if prefetch is None else f"cloud_storage_chunk_prefetch = {prefetch}"
    return daemon_config(
        bucket=BUCKET, endpoint=endpoint, log_dir=work / "logs", cache_dir=cache_dir,
        cluster=textwrap.dedent(f"""\
            cloud_storage_cache_size = {64 * 1024 * MIB}
            cloud_storage_cache_chunk_size = {chunk}
            {prefetch_line}
            cloud_storage_chunk_eviction_strategy = "eager"
            cloud_storage_segment_max_upload_interval_sec = 86400
            log_retention_ms = -1
            """))


class Consumer:
    """One keep-alive connection fetching raw batches."""

    def __init__(self, port: int, name: str | None, partition: int = 0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.name = name
        self.partition = partition

    def fetch(self, offset: int, max_bytes: int = FETCH, *, partition: int | None = None,
              name: str | None = None) -> tuple[bytes, int]:
        """Raw batches from `offset`; `partition` and `name` (the session) default to the
        connection's."""
        query = f"offset={offset}&max_bytes={max_bytes}"
        name = self.name if name is None else name
        if name is not None:
            query += f"&consumer={name}"
        partition = self.partition if partition is None else partition
        self.conn.request("GET", f"/v1/topics/{TOPIC}/partitions/{partition}/records?" + query)
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise SystemExit(f"fetch at {offset}: HTTP {resp.status}: {body[:300]!r}")
        return body, int(resp.headers["X-Next-Offset"])

    def close(self) -> None:
        self.conn.close()


class LeanConsumer:
    """The same requests over a raw keep-alive socket, answers read straight into memory the
    caller has ready (as a consumer reusing its buffers does): the throughput runs use it so
    that, on a 2-core machine, they measure the server rather than the client (http.client's
    header parsing costs 1-3 ms of client CPU per 1 MiB answer; faulting in fresh memory for
    every answer about 0.3 ms per MB)."""

    def __init__(self, port: int, name: str, partition: int = 0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.prefix = f"GET /v1/topics/{TOPIC}/partitions/{partition}/records?consumer={name}"
        self.buffer = b""

    def fetch(self, offset: int, max_bytes: int = FETCH, into: memoryview | None = None
              ) -> tuple[memoryview, int]:
        """The answer's bytes (in `into` when given) and the next offset."""
        self.sock.sendall(f"{self.prefix}&offset={offset}&max_bytes={max_bytes} HTTP/1.1\r\n"
                          "Host: bench\r\n\r\n".encode())
        while b"\r\n\r\n" not in self.buffer:
            got = self.sock.recv(65536)
            if not got:
                raise SystemExit("the daemon closed the connection")
            self.buffer += got
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 200"):
            raise SystemExit(f"fetch at {offset}: {lines[0]}")
        fields = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        size = int(fields["content-length"])
        if into is not None and len(into) < size:
            raise SystemExit(f"fetch at {offset}: {size} bytes do not fit in {len(into)}")
        view = memoryview(bytearray(size)) if into is None else into[:size]
        n = min(len(rest), size)
        view[:n] = rest[:n]
        self.buffer = rest[n:]
        while n < size:
            count = self.sock.recv_into(view[n:])
            if not count:
                raise SystemExit("the daemon closed the connection mid-answer")
            n += count
        return view, int(fields["x-next-offset"])

    def close(self) -> None:
        self.sock.close()


def minimal_server(payload_size: int) -> tuple[subprocess.Popen[bytes], int]:
    """A trivial keep-alive HTTP server in its own process returning `payload_size` bytes."""
    port = free_port()
    code = textwrap.dedent(f"""\
        import http.server, os
        body = os.urandom({payload_size})
        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def log_message(self, *a):
                pass
        http.server.ThreadingHTTPServer(("127.0.0.1", {port}), H).serve_forever()
        """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the minimal server did not start")


#: The part of a minimal server's script that `NAIVE_PROXY` and `DISK_SERVER` share: the one
#: keep-alive connection's fetches (`offset` a byte position, `max_bytes` its length) each
#: answered, once `ready(pos, n)` returns, with the header in one write and then
#: `send(conn, pos, n)`'s body; `send_file` sends it from the script's file `fd` by sendfile.
SERVE_FETCHES = textwrap.dedent("""\
    import os, socket, urllib.parse
    HEADER = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nX-Next-Offset: %d\\r\\n\\r\\n"
    def send_file(sock, pos, n):
        sent = 0
        while sent < n:
            put = os.sendfile(sock.fileno(), fd, pos + sent, n - sent)
            if not put:
                raise EOFError(f"the staged file ends at {pos + sent}")
            sent += put
    def serve_fetches(server, ready, send):
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        requests = conn.makefile("rb")
        while True:
            line = requests.readline()
            if not line:
                break
            while requests.readline() not in (b"\\r\\n", b""):
                pass
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(line.split()[1].decode()).query)
            pos, n = int(query["offset"][0]), int(query["max_bytes"][0])
            ready(pos, n)
            conn.sendall(HEADER % (n, pos + n))
            send(conn, pos, n)
    """)


#: A naive read-through proxy, the most any daemon on this machine could do for one sequential
#: consumer: one streamed GET of the object from byte 0 (sent at the first fetch,
#: as the daemon's is), its bytes kept in memory or written to a file as they arrive,
#: each 1 MiB fetch answered once its bytes are in (from memory with sendall, or from the file
#: with sendfile). It checks nothing, caches nothing for anyone else, parses no record batch
#: and reads nothing ahead: what it costs is moving the bytes, and nothing else.
#:
#: Staging "checked" adds, to the file staging, the work the daemon cannot leave out, done the
#: plainest way: every run of whole batches is checked (CRC-32C and structure, with the
#: codec's header walk) before a fetch may have it; once the download reaches the object's
#: last `chunk` bytes, the first `chunk` bytes of the next object are read ahead (own GET,
#: own file, checked too); and the answers go through http.server, as the daemon's do. What
#: separates it from the daemon is the daemon's own code: the cache, sessions, routing.
NAIVE_PROXY = SERVE_FETCHES + textwrap.dedent("""\
    import http.client, os, socket, sys, threading, urllib.parse
    url, size, staging, spool = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    checked = staging == "checked"
    where = urllib.parse.urlsplit(url)
    if checked:
        import http.server
        from cache.chunks import whole_batches
        from tiered.kafka.records import iter_batch_headers
        next_url, chunk = sys.argv[5], int(sys.argv[6])
    else:
        server = socket.create_server(("127.0.0.1", 0))
        print(server.getsockname()[1], flush=True)
    def buffer(length):
        view = memoryview(bytearray(length))
        view[:] = bytes(length)  # touched: no page faults while measured
        return view
    memory = buffer(size if staging == "memory" else 2 << 20)
    fd = -1 if staging == "memory" else os.open(os.path.join(spool, "object"),
                                                  os.O_CREAT | os.O_RDWR | os.O_TRUNC)
    arrived = 0
    cond = threading.Condition()
    def fail(err):  # the consumer sees the connection close
        sys.stderr.write(f"naive proxy: the store read failed: {err!r}\\n")
        os._exit(1)
    def receive(link, length, out, view, checks, arrive):
        # the first `length` bytes of the object at `link` into file `out` through `view`
        # (or into `view`, all the object's memory); with `checks`, whole batches are
        # checked before `arrive` counts them (the leftover of a piece is one batch's start:
        # 64 KiB here, so a 2 MiB view always has room for the next piece)
        store = http.client.HTTPConnection(link.hostname, link.port)
        store.request("GET", link.path + "?" + link.query)
        answer = store.getresponse()
        got = held = 0
        while got < length:
            into = (view[got:got + (1 << 20)] if out < 0
                    else view[held:held + min(1 << 20, length - got)])
            n = answer.readinto(into)
            if not n:
                raise EOFError(f"HTTP {answer.status}, {got} of {length} bytes")
            put = n if out < 0 else 0
            while put < n:
                put += os.write(out, into[put:n])
            got += n
            done = n
            if checks:
                held += n
                done = whole_batches(view[:held])
                for _batch in iter_batch_headers(view[:done]):
                    pass
                view[:held - done] = view[done:held]
                held -= done
            arrive(done)
        if checks and held and length == size:  # a fetch would wait for it for ever
            raise EOFError(f"the object ends inside a batch ({held} bytes left over)")
        store.close()
    def arrive(n):
        global arrived
        with cond:
            arrived += n
            cond.notify_all()
    def read_ahead():
        out = os.open(os.path.join(spool, "next"), os.O_CREAT | os.O_RDWR | os.O_TRUNC)
        try:
            receive(urllib.parse.urlsplit(next_url), chunk, out, buffer(2 << 20), True,
                    lambda n: None)
        except Exception as err:
            fail(err)
        os.close(out)
    def download():
        ahead = not checked  # read ahead already (or never)
        def counted(n):
            nonlocal ahead
            arrive(n)
            if not ahead and arrived >= size - chunk:
                ahead = True
                threading.Thread(target=read_ahead, daemon=True).start()
        try:
            receive(where, size, fd, memory, checked, counted)
        except Exception as err:
            fail(err)
    started = False
    def wait_for(pos, n):
        global started
        if not started:
            threading.Thread(target=download, daemon=True).start()
            started = True
        with cond:
            while arrived < pos + n:
                cond.wait()
    if checked:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True
            def do_GET(self):
                query = urllib.parse.parse_qs(self.path.partition("?")[2])
                pos, n = int(query["offset"][0]), int(query["max_bytes"][0])
                wait_for(pos, n)
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.send_header("X-Next-Offset", str(pos + n))
                self.end_headers()
                send_file(self.connection, pos, n)
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        print(server.server_address[1], flush=True)
        server.handle_request()  # the one keep-alive connection
        sys.exit(0)
    def send_memory(conn, pos, n):
        conn.sendall(memory[pos:pos + n])
    serve_fetches(server, wait_for, send_memory if fd < 0 else send_file)
    """)


#: The ceiling of the protocol: a minimal keep-alive HTTP server answering each 1 MiB fetch
#: (`offset` is a byte position, as for the naive proxy) from a file on local disk with
#: sendfile, the answer's header in one write. No store, no cache, no check.
DISK_SERVER = SERVE_FETCHES + textwrap.dedent("""\
    import sys
    fd = os.open(sys.argv[1], os.O_RDONLY)
    server = socket.create_server(("127.0.0.1", 0))
    print(server.getsockname()[1], flush=True)
    serve_fetches(server, lambda pos, n: None, send_file)
    """)


def disk_server(path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`DISK_SERVER` over `path` in its own process; (process, port). It serves one
    connection."""
    proc = subprocess.Popen([sys.executable, "-c", DISK_SERVER, str(path)],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None  # noqa: S101 - stdout=PIPE
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the disk server did not start (exit {proc.wait()})")
    return proc, int(line)


def naive_proxy(url: str, size: int, staging: str, spool: Path, next_url: str = "",
                chunk: int = 0) -> tuple[subprocess.Popen[bytes], int]:
    """`NAIVE_PROXY` for the object at presigned `url` (`size` bytes) in its own process,
    staging in "memory", a "file" in `spool`, or "checked" (a file, reading `chunk` bytes of
    the object at `next_url` ahead); (process, port). It serves one connection."""
    extra = [next_url, str(chunk)] if staging == "checked" else []
    proc = subprocess.Popen([sys.executable, "-c", NAIVE_PROXY, url, str(size), staging,
                             str(spool), *extra], stdout=subprocess.PIPE)
    assert proc.stdout is not None  # noqa: S101 - stdout=PIPE
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the naive proxy did not start (exit {proc.wait()})")
    return proc, int(line)


def disk_write_rate(work: Path, total: int = 512 * MIB) -> float:
    """Sustained buffered write rate of the work directory's disk (16 MiB files, as chunks)."""
    data = os.urandom(16 * MIB)
    target = work / "write-rate"
    target.mkdir()
    start = time.perf_counter()
    for n in range(total // len(data)):
        (target / str(n)).write_bytes(data)
    took = time.perf_counter() - start
    shutil.rmtree(target)
    return round(total / took / MB, 1)


@dataclass(frozen=True)
class Roles:
    """Which segments of partition 0 each measurement reads."""

    warm: int
    sequential: list[int]
    catch_up: list[int]
    concurrent: list[int]
    cold: int


#: segments for every role to have its own, each followed by one nobody reads (a session
#: reads ahead into the segment after its own: see the module docstring); the concurrent
#: consumers read consecutive segments, as they always did: they start together, so none
#: finds its first chunk read ahead by another
ROLES_SPACED = 2 + 2 * SEQUENTIAL_RUNS + CATCH_UP + 1 + CONSUMERS + 1 + 1


def plan_roles(count: int) -> Roles:
    """Segments for each measurement out of `count`: spaced when there are enough, else
    shared (a tiny run checks the bytes, not the speed)."""
    if count >= ROLES_SPACED:
        catch_up = 2 + 2 * SEQUENTIAL_RUNS
        concurrent = catch_up + CATCH_UP + 1
        return Roles(0, [2 + 2 * i for i in range(SEQUENTIAL_RUNS)],
                     list(range(catch_up, catch_up + CATCH_UP)),
                     list(range(concurrent, concurrent + CONSUMERS)), count - 1)
    middle = list(range(1, count - 1))
    return Roles(0, [middle[i % len(middle)] for i in range(SEQUENTIAL_RUNS)],
                 middle[:CATCH_UP], [middle[i % len(middle)] for i in range(CONSUMERS)],
                 count - 1)


#: the read path's store traffic in the daemon's /metrics
READ_GETS = 'tiered_store_operations_total{path="read"}'
READ_BYTES = 'tiered_store_bytes_total{direction="read",path="read"}'


class CpuUse:
    """CPU time each process spent over a `with` block: the store server, this process (the
    client) and, given one, the daemon, with the daemon's store requests and bytes on its read
    path. On 2 cores every process competes with the others, so what one contender makes
    the store server do slows it down too: the report shows where its time went."""

    def __init__(self, moto: MotoServer, daemon: DaemonProcess | None) -> None:
        self.moto = moto
        self.daemon = daemon
        self.used: dict[str, float] = {}
        self.gets = self.store_bytes = 0

    def _sample(self) -> dict[str, float]:
        now = {"store_server": self.moto.cpu_s(), "client": own_cpu_s()}
        if self.daemon is not None:
            now |= {"daemon": self.daemon.cpu_s(), "gets": self.daemon.metric(READ_GETS),
                    "bytes": self.daemon.metric(READ_BYTES)}
        return now

    def __enter__(self) -> CpuUse:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        used = {k: end[k] - self._start[k] for k in end}
        self.gets, self.store_bytes = int(used.pop("gets", 0)), int(used.pop("bytes", 0))
        self.used = used

    def ms(self) -> dict[str, int]:
        return {k: round(v * 1000) for k, v in self.used.items()}


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


class Run:
    def __init__(self, args: argparse.Namespace, work: Path, moto: MotoServer) -> None:
        self.args = args
        self.work = work
        self.moto = moto
        self.chunk = args.chunk_mb * MIB
        self.client = moto.client(max_pool_connections=16)
        self.truth: dict[tuple[int, int], Path] = {}  # (partition, base offset) -> local copy
        self.segments: list[tuple[int, int, int, str]] = []  # (base, end, size, key) of p0
        # the cache on tmpfs (as moto's objects are) unless asked otherwise: on a VM disk,
        # writeback throttling caps any disk cache (see `disk_write_mb_per_s` in the report)
        shm = Path(SHM)
        self.cache_dir = (work / "cache" if args.cache_on_disk or not shm.is_dir()
                          else Path(tempfile.mkdtemp(prefix="tiered-bench-cache-", dir=shm)))

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        logs = self.work / "logs"
        seg = self.args.segment_mb * MIB
        progress(f"writing {self.args.segments} x {self.args.segment_mb} MiB segments")
        p0, end0 = write_partition(logs, 0, [seg] * self.args.segments, 64 * 1024, False)
        p1, end1 = write_partition(logs, 1, [seg], SMALL_ACTIVE, False)
        p2, end2 = write_partition(logs, 2, [seg], self.args.big_active_mb * MIB, True)
        write_high_watermarks(logs, {TopicPartition(TOPIC, 0): end0,
                                     TopicPartition(TOPIC, 1): end1,
                                     TopicPartition(TOPIC, 2): end2}, fsync=False)
        progress("archiving them")
        (self.work / "tiered.toml").write_text(
            config_text(self.work, self.moto.endpoint, self.args.prefetch, self.chunk,
                        self.cache_dir))
        config = parse_config(
            __import__("tomllib").loads((self.work / "tiered.toml").read_text()),
            source="benchmark", base_dir=self.work)
        keys = [key for key, _size in archive_everything(config)]
        truth = self.work / "truth"
        truth.mkdir()
        for partition, paths in ((0, p0), (1, p1), (2, p2)):
            for path in paths:
                base = int(path.stem)
                copy = truth / f"{partition}-{base}.log"
                shutil.move(path, copy)
                for suffix in (".index", ".timeindex"):
                    path.with_suffix(suffix).unlink(missing_ok=True)
                self.truth[(partition, base)] = copy
                if partition == 0:
                    key = next(k for k in keys if f"/{TOPIC}/0_" in k
                               and k.rsplit("/", 1)[1].startswith(f"{base}-"))
                    last = int(key.rsplit("/", 1)[1].split("-")[1])
                    self.segments.append((base, last + 1, copy.stat().st_size, key))
        self.segments.sort()

    def check(self, partition: int, base: int, position: int, data: bytes) -> None:
        with open(self.truth[(partition, base)], "rb") as f:
            if os.pread(f.fileno(), len(data), position) != data:
                raise SystemExit(f"bytes served differ from the log at {position}")

    # -- contenders -----------------------------------------------------------------------
    def consume(self, port: int, name: str, segments: list[int]) -> tuple[int, float]:
        """Read `segments` (consecutive) start to end as one consumer session; (bytes,
        seconds). The bytes are compared with the log afterwards, outside the time."""
        total, took, pieces = self.read_segments(port, name, segments)
        self.check_segments(segments[0], pieces)
        return total, took

    def space_for(self, segments: list[int]) -> memoryview:
        """Memory for a consumer to read `segments` into, touched: no page faults while
        measured."""
        size = sum(self.segments[i][2] for i in segments)
        space = memoryview(bytearray(size))
        space[:] = bytes(size)
        return space

    def read_segments(self, port: int, name: str, segments: list[int],
                      space: memoryview | None = None) -> tuple[int, float, list[memoryview]]:
        """Fetch consecutive `segments` start to end in 1 MiB fetches, the last one ending
        where the last segment does: the consumer reads those objects' bytes, no more, into
        memory it has ready before the clock starts (`space`, from `space_for`, or its own)."""
        first, last = self.segments[segments[0]], self.segments[segments[-1]]
        space = self.space_for(segments) if space is None else space
        size = len(space)
        consumer = LeanConsumer(port, name)
        offset, total = first[0], 0
        start = time.perf_counter()
        pieces = []
        while offset < last[1]:
            body, offset = consumer.fetch(offset, min(FETCH, size - total), space[total:])
            pieces.append(body)
            total += len(body)
        took = time.perf_counter() - start
        consumer.close()
        return total, took, pieces

    def check_segments(self, segment: int, pieces: list[memoryview]) -> None:
        position = 0
        served = b"".join(pieces)
        for seg_base, _end, size, _key in self.segments[segment:]:
            if position >= len(served):
                break
            self.check(0, seg_base, 0, served[position:position + size])
            position += size
        if position != len(served):
            raise SystemExit(f"served {len(served)} bytes, the segments hold {position}")

    def read_through(self, proc: subprocess.Popen[bytes], port: int, name: str, size: int,
                     space: memoryview) -> float:
        """Seconds for a consumer (session `name`) to read `size` bytes into `space` in 1 MiB
        fetches from the one-connection server `proc` listening on `port`; the server exits
        when the consumer closes, and is waited for (killed after 30 s) whatever happened."""
        consumer = None
        try:
            consumer = LeanConsumer(port, name)
            position = 0
            start = time.perf_counter()
            while position < size:
                _body, position = consumer.fetch(position, min(FETCH, size - position),
                                                 space[position:])
            return time.perf_counter() - start
        finally:
            if consumer is not None:
                consumer.close()  # the server serves one connection: it exits now
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def naive(self, segment: int, staging: str) -> float:
        """Seconds for a consumer to read `segment` start to end in 1 MiB fetches through a
        `naive_proxy` staging in `staging` (started before the clock); the bytes are compared
        with the log afterwards."""
        _base, _end, size, key = self.segments[segment]
        _b, _e, next_size, next_key = self.segments[min(segment + 1, len(self.segments) - 1)]
        url, next_url = (self.client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=600)
            for k in (key, next_key))
        space = self.space_for([segment])
        proc, port = naive_proxy(url, size, staging, self.cache_dir, next_url,
                                 min(self.chunk, next_size))
        try:
            took = self.read_through(proc, port, "naive", size, space)
        finally:
            for name in ("object", "next"):
                (self.cache_dir / name).unlink(missing_ok=True)
        self.check_segments(segment, [space])
        return took

    def ceiling(self, segment: int) -> float:
        """Seconds for a consumer to read `segment`'s file from local disk in 1 MiB fetches
        through `DISK_SERVER` (the file read once before, so the page cache holds it, as the
        daemon's cache holds its chunks); the bytes are compared afterwards."""
        base, _end, size, _key = self.segments[segment]
        path = self.truth[(0, base)]
        path.read_bytes()
        space = self.space_for([segment])
        proc, port = disk_server(path)
        took = self.read_through(proc, port, "ceiling", size, space)
        self.check_segments(segment, [space])
        return took

    def boto3_stream(self, segment: int) -> tuple[int, float]:
        key = self.segments[segment][3]
        start = time.perf_counter()
        body = self.client.get_object(Bucket=BUCKET, Key=key)["Body"]
        total = sum(len(piece) for piece in body.iter_chunks(FETCH))
        return total, time.perf_counter() - start

    def boto3_ranged(self, segment: int) -> int:
        _base, _end, size, key = self.segments[segment]
        total = 0
        for begin in range(0, size, self.chunk):
            end = min(size, begin + self.chunk) - 1
            total += len(self.client.get_object(Bucket=BUCKET, Key=key,
                                                Range=f"bytes={begin}-{end}")["Body"].read())
        return total

    def parallel(self, work: Callable[[int], Any], count: int) -> tuple[list[Any], float]:
        results: list[Any] = [None] * count

        def run(i: int) -> None:
            results[i] = work(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, time.perf_counter() - start


def run_http(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="remote_read.py http", description=__doc__)
    parser.add_argument("--segment-mb", type=at_least(1), default=62)
    parser.add_argument("--segments", type=at_least(1), default=ROLES_SPACED,
                        help="archived segments of partition 0: warm, 3 sequential, 3 "
                             "catching up, 8 concurrent, cold; each role's own with an unread "
                             f"one after it at {ROLES_SPACED} or more, shared below")
    parser.add_argument("--chunk-mb", type=at_least(1), default=16)
    parser.add_argument("--prefetch", type=at_least(0), default=None,
                        help="cloud_storage_chunk_prefetch; not given: the key is left out "
                             "(the default, adaptive read-ahead)")
    parser.add_argument("--no-naive", action="store_true",
                        help="leave out the naive proxies and the protocol ceiling (shorter)")
    parser.add_argument("--big-active-mb", type=at_least(1), default=256)
    parser.add_argument("--trials", type=at_least(1), default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache-on-disk", action="store_true",
                        help="put the read cache in the work directory, not on tmpfs")
    args = parser.parse_args(argv)
    if args.segments < CATCH_UP + 3:
        parser.error(f"--segments must be at least {CATCH_UP + 3}")
    work = Path(tempfile.mkdtemp(prefix="tiered-remote-read-http-"))
    report: dict[str, Any] = {"benchmark": "remote_read http", "segment_bytes":
                              args.segment_mb * MIB, "chunk_bytes": args.chunk_mb * MIB,
                              "fetch_bytes": FETCH, "prefetch_chunks": args.prefetch,
                              "read_ahead": "adaptive" if args.prefetch is None
                              else "off" if args.prefetch == 0 else "fixed"}
    try:
        with MotoServer() as moto:
            moto.create_bucket(BUCKET)
            run = Run(args, work, moto)
            run.prepare()
            daemon = DaemonProcess(work / "tiered.toml", work / "daemon.log")
            progress(f"daemon settled after {daemon.settle()} s")
            try:
                report.update(measure(run, daemon, args))
            finally:
                daemon.stop()
            report["cache_dir_filesystem"] = "disk" if run.cache_dir.is_relative_to(work) else (
                "tmpfs")
            shutil.rmtree(run.cache_dir, ignore_errors=True)
            report["disk_write_mb_per_s"] = disk_write_rate(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["versions"] = versions("boto3", "moto")
    return report


def measure(run: Run, daemon: DaemonProcess, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rng = random.Random(args.seed)
    roles = plan_roles(len(run.segments))
    seg0 = run.segments[roles.warm]
    # the floor of any GET on moto: a 1-byte range of the segment object
    floor = []
    for _ in range(3):
        t = time.perf_counter()
        run.client.get_object(Bucket=BUCKET, Key=seg0[3], Range="bytes=0-0")["Body"].read()
        floor.append(time.perf_counter() - t)
    out["moto_get_ms"] = median_ms(floor)

    progress("cold 1 MiB fetches")
    cold, chunk_get = [], []
    last_segment = run.segments[roles.cold]
    chunks = list(range(0, last_segment[2] - FETCH, run.chunk))
    for begin in rng.sample(chunks, min(args.trials, len(chunks))):
        # an offset in that chunk (every batch has the same size)
        batch = len(_template())
        offset = last_segment[0] + ((begin + MIB) // batch + 1) * RECORDS_PER_BATCH
        consumer = Consumer(daemon.port, None)
        t = time.perf_counter()
        body, _next = consumer.fetch(offset)
        cold.append(time.perf_counter() - t)
        consumer.close()
        position = (offset - last_segment[0]) // RECORDS_PER_BATCH * batch
        # the answer may run on into the local log after the last archived segment
        run.check(0, last_segment[0], position, body[:last_segment[2] - position])
        t = time.perf_counter()
        run.client.get_object(Bucket=BUCKET, Key=last_segment[3],
                              Range=f"bytes={begin}-{begin + run.chunk - 1}")["Body"].read()
        chunk_get.append(time.perf_counter() - t)
    out["cold"] = {"tiered_ms": median_ms(cold), "boto3_chunk_get_ms": median_ms(chunk_get),
                   "ratio": ratio(statistics.median(cold), statistics.median(chunk_get))}

    progress("warm 1 MiB fetches")
    consumer = Consumer(daemon.port, "warm")  # a session: its chunk stays held between fetches
    body, _next = consumer.fetch(seg0[0])
    proc, port = minimal_server(len(body))
    warm, minimal = [], []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for _ in range(args.trials * 40):  # interleaved, so a passing disturbance hits both
            t = time.perf_counter()
            consumer.fetch(seg0[0])
            warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            conn.request("GET", "/")
            conn.getresponse().read()
            minimal.append(time.perf_counter() - t)
        conn.close()
    finally:
        consumer.close()
        proc.terminate()
        proc.wait()
    out["warm"] = {"tiered_ms": median_ms(warm), "minimal_http_server_ms": median_ms(minimal),
                   "ratio": ratio(statistics.median(warm), statistics.median(minimal))}

    progress("active segment: small vs big with an empty index")
    lat: dict[int, list[float]] = {1: [], 2: []}
    # one connection for both partitions (a session each): a connection's thread stays where
    # the scheduler put it, and on 2 cores where that is can double a fetch's latency
    consumer = Consumer(daemon.port, None)
    for partition in lat:
        consumer.fetch(0, partition=partition, name=f"active{partition}")
    for _ in range(args.trials * 20):  # interleaved, so a passing disturbance hits both
        for partition, samples in lat.items():
            t = time.perf_counter()
            consumer.fetch(0, partition=partition, name=f"active{partition}")
            samples.append(time.perf_counter() - t)
    consumer.close()
    out["active_segment"] = {
        "small_active_ms": median_ms(lat[1]), "small_active_bytes": SMALL_ACTIVE,
        "big_active_empty_index_ms": median_ms(lat[2]),
        "big_active_bytes": args.big_active_mb * MIB,
        "ratio": ratio(statistics.median(lat[2]), statistics.median(lat[1]))}

    progress("sequential consumer")
    runs: list[dict[str, Any]] = []
    for segment in roles.sequential:  # each its own segment, baseline first
        daemon.settle()  # the last run's read-ahead into the next segment is over
        settle_heap()
        with CpuUse(run.moto, None) as base_cpu:
            total, took = run.boto3_stream(segment)
        space = run.space_for([segment])  # outside the CPU figures, as boto3's buffers are
        settle_heap()
        with CpuUse(run.moto, daemon) as use:
            mine, mine_s, pieces = run.read_segments(daemon.port, f"sequential{segment}",
                                                     [segment], space)
        run.check_segments(segment, pieces)
        naive: dict[str, float] = {}
        for staging in () if args.no_naive else ("memory", "file", "checked"):
            daemon.settle()
            _total, base_s = run.boto3_stream(segment)
            naive[f"naive_proxy_{staging}_ratio"] = round(base_s / run.naive(segment, staging), 3)
        if not args.no_naive:
            _total, base_s = run.boto3_stream(segment)
            ceiling_s = run.ceiling(segment)
            naive["protocol_ceiling_mb_per_s"] = round(total / ceiling_s / MB, 1)
            naive["protocol_ceiling_ratio"] = round(base_s / ceiling_s, 3)
        runs.append(naive | {"tiered_mb_per_s": round(mine / mine_s / MB, 1),
                     "boto3_streamed_get_mb_per_s": round(total / took / MB, 1),
                     "ratio": round(mine / mine_s / (total / took), 3),
                     "daemon_cpu_s_per_mb": round(use.used["daemon"] / (mine / MB), 4),
                     "cpu_ms": {"boto3": base_cpu.ms(), "tiered": use.ms()},
                     "store_gets": use.gets, "store_mb": round(use.store_bytes / MB, 1)})
    out["sequential"] = {
        key: statistics.median(float(r[key]) for r in runs)
        for key in runs[0] if not isinstance(runs[0][key], dict)
    } | {"runs": runs}

    progress(f"a consumer catching up over {CATCH_UP} segments")
    daemon.settle()
    settle_heap()
    start = time.perf_counter()
    total = sum(run.boto3_stream(segment)[0] for segment in roles.catch_up)
    took = time.perf_counter() - start
    settle_heap()
    cpu0 = daemon.cpu_s()
    mine, mine_s = run.consume(daemon.port, "catch-up", roles.catch_up)
    cpu = daemon.cpu_s() - cpu0
    out["sequential_catch_up"] = {
        "segments": len(roles.catch_up), "tiered_mb_per_s": round(mine / mine_s / MB, 1),
        "boto3_streamed_gets_mb_per_s": round(total / took / MB, 1),
        "ratio": ratio(mine / mine_s, total / took),
        "daemon_cpu_s_per_mb": round(cpu / (mine / MB), 4)}

    progress(f"{CONSUMERS} concurrent consumers")
    targets = roles.concurrent
    settle_heap()
    with CpuUse(run.moto, None) as base_cpu:
        ranged, ranged_s = run.parallel(lambda i: run.boto3_ranged(targets[i]), CONSUMERS)
    daemon.settle()
    settle_heap()
    with CpuUse(run.moto, daemon) as use:
        reads, took = run.parallel(
            lambda i: run.read_segments(daemon.port, f"c{i}", [targets[i]]), CONSUMERS)
    for target, (_total, _took, pieces) in zip(targets, reads, strict=True):
        run.check_segments(target, pieces)
    mine = sum(r[0] for r in reads)
    out["concurrent"] = {
        "consumers": CONSUMERS,
        "tiered_mb_per_s": round(mine / took / MB, 1),
        "boto3_ranged_get_threads_mb_per_s": round(sum(ranged) / ranged_s / MB, 1),
        "ratio": ratio(mine / took, sum(ranged) / ranged_s),
        # where the time went: on 2 cores the processes share them (see CpuUse)
        "daemon_cpu_s_per_mb": round(use.used["daemon"] / (mine / MB), 4),
        "daemon_cores_busy": round(use.used["daemon"] / took, 2),
        "store_server_cores_busy": round(use.used["store_server"] / took, 2),
        "cpu_ms": {"boto3": base_cpu.ms(), "tiered": use.ms()},
        "store_gets": use.gets, "store_mb": round(use.store_bytes / MB, 1)}
    return out
