"""`tiered log dump`: reports for a good file, a batch with a bad CRC (the walk goes on), a
truncated file, index files, and the CLI's exit code."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from tiered.cli.main import cli
from tiered.errors import TieredError
from tiered.kafka.dump import dump_file
from tiered.kafka.log_writer import LogWriter, ProducerRecord
from tiered.kafka.records import Header
from tiered.kafka.segment import Segment

T0 = 1_700_000_000.0


@pytest.fixture()
def segment(tmp_path: Path) -> Segment:
    with LogWriter(tmp_path / "t-0", index_interval_bytes=100, clock=lambda: T0,
                   fsync=False) as w:
        for i in range(5):
            w.append([ProducerRecord(f"value-{i}-{j}".encode(), key=f"key{j}".encode(),
                                     headers=(Header("trace", b"abc"),))
                      for j in range(3)], compression="gzip" if i == 1 else "none")
        w.append([ProducerRecord(None, key=b"\x00\xff\x10")])  # binary key, tombstone
        w.append([ProducerRecord(b"x", timestamp=5)], producer_id=7, producer_epoch=0,
                 base_sequence=0, transactional=True)
        w.append_control("commit", producer_id=7, producer_epoch=0)
    return Segment.in_dir(tmp_path / "t-0", 0)


def test_good_log(segment: Segment) -> None:
    report = dump_file(segment.log_path, records=False)
    assert report.ok and report.kind == "log" and report.base_offset == 0
    headers = list(segment.iter_batch_headers())
    assert [b.header for b in report.batches] == headers
    assert all(b.crc_ok and b.records is None for b in report.batches)
    lines = list(report.lines())
    assert lines[0] == f"Dumping {segment.log_path}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 ")
    assert "position: 0 " in lines[2] and "crcStatus: OK" in lines[2]
    assert f"crc: 0x{headers[0].crc:08x} " in lines[2] and "compresscodec: none" in lines[2]
    assert "compresscodec: gzip" in lines[3]
    assert "isTransactional: true isControl: true" in lines[-2]
    assert lines[-1] == f"{len(headers)} batches, OK"
    data = json.loads(json.dumps(report.to_json()))
    assert data["ok"] is True and len(data["batches"]) == len(headers)
    first = data["batches"][0]
    assert (first["base_offset"], first["last_offset"], first["count"]) == (0, 2, 3)
    assert first["first_timestamp"] == first["max_timestamp"] == int(T0 * 1000)
    assert first["crc_status"] == "OK" and first["crc"] == first["computed_crc"]
    assert first["position"] == 0 and first["size"] == headers[0].size
    assert data["batches"][6]["transactional"] and not data["batches"][6]["control"]
    assert "records" not in first


def test_records_are_printed_readably(segment: Segment) -> None:
    report = dump_file(segment.log_path, records=True)
    assert report.ok
    lines = list(report.lines())
    assert lines[3] == (f"| offset: 0 CreateTime: {int(T0 * 1000)} keySize: 4 valueSize: 9 "
                        "sequence: -1 headerKeys: [trace] key: key0 payload: value-0-0")
    binary = next(line for line in lines if line.startswith("| offset: 15 "))
    assert "key: base64:AP8Q payload: null" in binary and "valueSize: -1" in binary
    assert any("sequence: 0 " in line and "offset: 16 " in line for line in lines)
    assert any(line.startswith("| offset: 17 ") and "controlType: commit" in line
               for line in lines)
    data = report.to_json()
    record = data["batches"][5]["records"][0]
    assert record["key"] == "AP8Q" and record["key_encoding"] == "base64"
    assert record["value"] is None and record["value_size"] == -1
    assert data["batches"][0]["records"][1]["headers"] == [
        {"key": "trace", "value": "abc", "value_encoding": "utf-8"}]
    assert data["batches"][7]["records"][0]["control_type"] == "commit"


def test_bad_crc_is_reported_and_the_walk_goes_on(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    victim = headers[2]
    data = bytearray(segment.log_path.read_bytes())
    data[victim.position + 65] ^= 0x40
    segment.log_path.write_bytes(bytes(data))
    report = dump_file(segment.log_path, records=True)
    assert not report.ok
    assert len(report.batches) == len(headers)  # every batch, including those after it
    assert [b.crc_ok for b in report.batches] == [i != 2 for i in range(len(headers))]
    assert report.batches[2].records is None and report.batches[3].records is not None
    (problem,) = report.problems
    assert problem.position == victim.position and "CRC" in problem.message
    lines = list(report.lines())
    assert sum("crcStatus: BAD" in line for line in lines) == 1
    assert f"error: byte {victim.position}: CRC-32C mismatch" in "\n".join(lines)
    assert report.to_json()["batches"][2]["crc_status"] == "BAD"


def test_truncated_log(segment: Segment) -> None:
    headers = list(segment.iter_batch_headers())
    data = segment.log_path.read_bytes()
    segment.log_path.write_bytes(data[: headers[-1].position + 40])
    report = dump_file(segment.log_path, records=False)
    assert not report.ok
    assert len(report.batches) == len(headers) - 1
    (problem,) = report.problems
    assert problem.position == headers[-1].position and "truncated" in problem.message
    segment.log_path.write_bytes(data[: headers[-1].position + 5])
    report = dump_file(segment.log_path, records=False)
    assert "5 bytes at the end" in report.problems[0].message


def test_zero_tail_of_a_preallocated_log_is_only_a_note(segment: Segment) -> None:
    with open(segment.log_path, "ab") as f:
        f.write(b"\x00" * 10_000)
    report = dump_file(segment.log_path, records=False)
    assert report.ok
    assert "10000 zero bytes" in report.notes[0]


def test_garbage_length_stops_the_walk(segment: Segment) -> None:
    data = bytearray(segment.log_path.read_bytes())
    second = list(segment.iter_batch_headers())[1].position
    data[second + 8: second + 12] = struct.pack(">i", 5)
    segment.log_path.write_bytes(bytes(data))
    report = dump_file(segment.log_path)
    assert not report.ok and len(report.batches) == 1
    assert report.problems[0].position == second


def test_index_dump(segment: Segment) -> None:
    report = dump_file(segment.index_path)
    assert report.ok and report.kind == "index"
    assert report.offset_entries == list(segment.offset_index())
    assert len(report.offset_entries) > 2
    lines = list(report.lines())
    first = report.offset_entries[0]
    assert lines[1] == f"offset: {first.offset} position: {first.position}"
    assert report.to_json()["entries"][0] == {"offset": first.offset,
                                              "position": first.position}


def test_index_dump_checks_entries_against_the_log(segment: Segment) -> None:
    data = bytearray(segment.index_path.read_bytes())
    (position,) = struct.unpack_from(">i", data, 12)
    struct.pack_into(">i", data, 12, position + 3)
    segment.index_path.write_bytes(bytes(data))
    report = dump_file(segment.index_path)
    assert not report.ok
    assert report.problems[0].position == 8 and "no batch" in report.problems[0].message


def test_malformed_and_preallocated_indexes(segment: Segment) -> None:
    good = segment.index_path.read_bytes()
    segment.index_path.write_bytes(good + b"\x00" * 800)
    report = dump_file(segment.index_path)
    assert report.ok and "zero-filled" in report.notes[0]
    assert len(report.offset_entries) == len(good) // 8
    segment.index_path.write_bytes(good + b"\x01\x02")
    report = dump_file(segment.index_path)
    assert not report.ok and report.problems[0].position == len(good)
    segment.index_path.write_bytes(good[8:16] + good[:8])
    report = dump_file(segment.index_path)
    assert not report.ok and "does not follow" in report.problems[0].message


def test_timeindex_dump(segment: Segment) -> None:
    report = dump_file(segment.timeindex_path)
    assert report.ok and report.time_entries == list(segment.time_index())
    assert list(report.lines())[1].startswith("timestamp: ")
    data = segment.timeindex_path.read_bytes()
    segment.timeindex_path.write_bytes(struct.pack(">qi", 9 * 10**12, 1) + data)
    report = dump_file(segment.timeindex_path)
    assert not report.ok and report.problems[0].position == 12


def test_files_that_are_not_segments(tmp_path: Path, segment: Segment) -> None:
    other = tmp_path / "leader-epoch-checkpoint"
    other.write_text("0\n0\n")
    with pytest.raises(TieredError, match="cannot dump"):
        dump_file(other)
    deleted = segment.log_path.with_name(segment.log_path.name + ".deleted")
    deleted.write_bytes(segment.log_path.read_bytes())
    assert dump_file(deleted).ok


def test_cli_exit_codes(segment: Segment) -> None:
    runner = CliRunner()
    good = runner.invoke(cli, ["log", "dump", str(segment.log_path), "--json"])
    assert good.exit_code == 0, good.output
    assert json.loads(good.output)["ok"] is True
    data = bytearray(segment.log_path.read_bytes())
    data[70] ^= 1
    segment.log_path.write_bytes(bytes(data))
    bad = runner.invoke(cli, ["log", "dump", str(segment.log_path), "--records"])
    assert bad.exit_code == 1
    assert "crcStatus: BAD" in bad.output


def test_an_index_bundle_from_the_bucket_dumps_each_index(segment: Segment,
                                                           tmp_path: Path) -> None:
    from manifests import segment_indexes

    sections = {"index": segment.index_path.read_bytes(),
                "timeindex": segment.timeindex_path.read_bytes()}
    bundle = tmp_path / "0-17-3.indexes"
    bundle.write_bytes(segment_indexes.encode_bundle(sections))
    runner = CliRunner()
    good = runner.invoke(cli, ["log", "dump", str(bundle), "--json"])
    assert good.exit_code == 0, good.output
    docs = json.loads(good.output)
    assert [d["kind"] for d in docs] == ["index", "timeindex"]
    assert all(d["ok"] for d in docs)
    assert docs[0] == {**dump_file(segment.index_path).to_json(), "path": docs[0]["path"]}
    bundle.write_bytes(bundle.read_bytes()[:-1])  # a truncated download
    bad = runner.invoke(cli, ["log", "dump", str(bundle)])
    assert bad.exit_code != 0 and "not an index bundle" in bad.output
